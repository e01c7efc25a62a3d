-- reservation_state.lua: the stored state of one reservation. Read-only: a reservation
-- past its expiry stays 'reserved' until the sweeper, a confirm or a cancel expires it.
--
-- KEYS (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 res  hash  record field -> record (codec.lua) {s = state, q = quantity, e = expires_at_ms, u = user_id, k = idempotency_key};
--              the field of reservation_id: ids.lua
--   2 pool hash  generation
--   3..10      the pool's structures, checked for their markers (intact.lua, prepended)
-- ARGV:
--   1 reservation_id
-- Returns 'reserved' | 'confirmed' | 'cancelled' | 'expired' | 'refunded', or nil when unknown (never
-- existed, or forgotten after its retention), or 'lost' when the pool lost one of its structures.

if pool_state(KEYS[2], structures_from(3)) == 'partial' then
  return 'lost'
end
local field, rec = find_by_id(KEYS[1], ARGV[1])
if not field then
  return false
end
return rec.s
