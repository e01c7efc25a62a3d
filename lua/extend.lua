-- extend.lua: pushes a RESERVED reservation's expiry out, for a payment still in flight.
--
-- New expiry: max(current, now + min(extend_ms, ttl_ms)) by Redis TIME. Not a state
-- transition, so no event. A reservation already past its expiry is expired on the spot
-- (units back to available, the allowance freed, an 'expired' event) and refused, as
-- confirm.lua does.
--
-- KEYS (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 pool    hash  available, reserved, sold, generation, event_seq, events_dropped
--   2 res     hash  record field -> record (codec.lua) {s = state, q = quantity, e = expires_at_ms, u = user_id, k = idempotency_key};
--                   the field of reservation_id: ids.lua
--   3 due     list  record fields in the order made, and exceptions in gc (due.lua)
--   4 held    hash  user_id -> units held (reserved + confirmed)
--   5 gc      zset  "r:<field>" / "g:<id>" / "t:<id>" scored by the ms after which the record may be forgotten;
--                   "d:<field>" the expiry exceptions (due.lua): an extended reservation becomes one
--   6 outbox  stream the pool's events (see outbox.lua, prepended to this script)
--   7..14     the pool's structures, checked for their markers (intact.lua, prepended)
-- ARGV:
--   1 reservation_id
--   2 extend_ms
--   3 ttl_ms: the item's reservation TTL, the most one extend grants from now
--   4 retention_ms: how long a finished reservation (and its idempotency key) is remembered
--   5 outbox_max: how many events the outbox keeps at most
-- Returns {'extended', expires_at_ms} | {'refused', state} | {'not_found'} | {'lost'} (the
-- pool lost a structure, or its hash while the record is left: nothing written).

local K_POOL, K_RES, K_DUE, K_HELD, K_GC, K_OUTBOX = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local id = ARGV[1]
-- At most 1e13 ms, as the pool model (MAX_EXTEND_MS): the expiry stays an exact integer
-- (cjson keeps 14 significant digits).
local extend_ms = math.min(tonumber(ARGV[2]), tonumber(ARGV[3]), 1e13)
local retention = tonumber(ARGV[4])
local outbox_max = tonumber(ARGV[5])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Checked before any write (intact.lua, prepended): a pool that lost one of these
-- structures, or whose hash is gone while the record is left, is lost.
local state = pool_state(K_POOL, structures_from(7))
if state == 'partial' then
  return {'lost'}
end
local field, rec = find_by_id(K_RES, id)
if not field then
  return {'not_found'}
end
if state == 'missing' then
  return {'lost'}
end
if rec.s ~= 'reserved' then
  return {'refused', rec.s}
end

if tonumber(rec.e) <= now then
  local k = {pool = K_POOL, res = K_RES, due = K_DUE, held = K_HELD, gc = K_GC, outbox = K_OUTBOX}
  release_reserved(k, field, rec, 'expired', now, retention, outbox_max)
  return {'refused', 'expired'}
end

local expires_at = math.max(tonumber(rec.e), now + extend_ms)
if expires_at ~= tonumber(rec.e) then
  rec.e = expires_at
  redis.call('HSET', K_RES, field, record_encode(rec))
  due_except(K_GC, field, expires_at)
  if not due_is_list then
    redis.call('ZREM', K_DUE, field)
  end
  pool_wrote()
end
return {'extended', expires_at}
