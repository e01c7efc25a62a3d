-- cancel.lua: RESERVED -> CANCELLED (reserved -> available, frees the user's allowance),
-- idempotently.
--
-- Refused after confirm. A reservation past its expiry by Redis TIME is expired instead
-- (same counter moves) and the answer is done/expired; cancelling an expired one is a no-op.
--
-- KEYS (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 pool  hash  available, reserved, sold, generation, event_seq, events_dropped
--   2 res   hash  record field -> record (codec.lua) {s = state, q = quantity, e = expires_at_ms, u = user_id, k = idempotency_key};
--                 the field of reservation_id: ids.lua
--   3 due   list  record fields in the order made, and exceptions in gc (due.lua)
--   4 held  hash  user_id -> units held (reserved + confirmed)
--   5 gc    zset  "r:<field>" / "g:<id>" / "t:<id>" scored by the ms after which the record may be forgotten
--   6 outbox stream the pool's events (see outbox.lua, prepended to this script with
--               release.lua, which moves a reservation back to available)
--   7..14       the pool's structures, checked for their markers (intact.lua, prepended)
-- ARGV:
--   1 reservation_id
--   2 retention_ms: how long a finished reservation (and its idempotency key) is remembered
--   3 outbox_max: how many events the outbox keeps at most
-- A transition writes its event (previous state 'reserved'); an answer that changes nothing writes none.
-- Returns {verdict, state}: verdict 'done' | 'refused' | 'not_found', state
-- 'confirmed' | 'cancelled' | 'expired' | 'refunded' ('' with not_found); or {'lost'}
-- when the pool lost a structure, or its hash while the record is left (nothing written).

local K_POOL, K_RES, K_DUE, K_HELD, K_GC, K_OUTBOX = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local outbox_max = tonumber(ARGV[3])
local id = ARGV[1]
local retention = tonumber(ARGV[2])

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
  return {'not_found', ''}
end
if state == 'missing' then
  return {'lost'}
end
if rec.s == 'confirmed' or rec.s == 'refunded' then
  return {'refused', rec.s}
elseif rec.s ~= 'reserved' then
  return {'done', rec.s}
end

local to = 'cancelled'
if tonumber(rec.e) <= now then
  to = 'expired'
end
local k = {pool = K_POOL, res = K_RES, due = K_DUE, held = K_HELD, gc = K_GC, outbox = K_OUTBOX}
release_reserved(k, field, rec, to, now, retention, outbox_max)
return {'done', rec.s}
