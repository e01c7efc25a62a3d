-- reservation.lua: one reservation by id or by idempotency key. Read-only: a reservation
-- past its expiry stays 'reserved' until the sweeper, a confirm or a cancel expires it.
--
-- KEYS (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 res   hash  record field (ids.lua) -> record (codec.lua) {s = state, q = quantity, e = expires_at_ms, u = user_id, k = idempotency_key,
--                                  r = requested quantity when fewer were reserved (allow_partial), p = the id's prefix}
--   2 idem  hash  idempotency_key -> reservation_id, only for records addressed by id
--   3 pool  hash  generation, keys
--   4..11         the pool's structures, checked for their markers (intact.lua, prepended)
-- ARGV:
--   1 'id' | 'key'
--   2 the reservation id or the idempotency key
-- Returns {reservation_id, state, quantity, expires_at_ms, user_id, idempotency_key, requested}
-- (requested: '0' when the reservation has what was asked), or
-- nil when unknown (never existed, or forgotten after its retention), or 'lost' when the
-- pool lost one of its structures: what it would say is not known.

if pool_state(KEYS[3], structures_from(4)) == 'partial' then
  return 'lost'
end
local field, rec
if ARGV[1] == 'key' then
  field, rec = find_by_key(KEYS[1], KEYS[2], ARGV[2], key_field(ARGV[2]))
else
  field, rec = find_by_id(KEYS[1], ARGV[2])
end
if not field then
  return false
end
return {record_id(field, rec), rec.s, string.format('%d', rec.q), string.format('%d', rec.e), rec.u, rec.k, string.format('%d', rec.r or 0)}
