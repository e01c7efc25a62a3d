-- refund.lua: CONFIRMED -> REFUNDED (sold -> available, frees the user's allowance),
-- idempotently, with its 'refunded' event in the same call.
--
-- The refunded record keeps the retention it got at its confirm (its `gc` entry is left
-- as it is). Reserved, cancelled and expired reservations are refused.
--
-- KEYS (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 pool    hash  available, reserved, sold, generation, event_seq, events_dropped
--   2 res     hash  record field -> record (codec.lua) {s = state, q = quantity, e = expires_at_ms, u = user_id, k = idempotency_key};
--                   the field of reservation_id: ids.lua
--   3 held    hash  user_id -> units held (reserved + confirmed)
--   4 outbox  stream the pool's events (see outbox.lua, prepended to this script)
--   5..12     the pool's structures, checked for their markers (intact.lua, prepended)
-- ARGV:
--   1 reservation_id
--   2 outbox_max: how many events the outbox keeps at most
-- Returns {verdict, state}: verdict 'done' | 'refused' | 'not_found', state the
-- reservation's ('' with not_found); or {'lost'} when the pool lost a structure, or its
-- hash while the record is left (nothing written).

local K_POOL, K_RES, K_HELD, K_OUTBOX = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id = ARGV[1]
local outbox_max = tonumber(ARGV[2])

-- Checked before any write (intact.lua, prepended).
local state = pool_state(K_POOL, structures_from(5))
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
if rec.s == 'refunded' then
  return {'done', 'refunded'}
elseif rec.s ~= 'confirmed' then
  return {'refused', rec.s}
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local qty = tonumber(rec.q)
rec.s = 'refunded'
redis.call('HINCRBY', K_POOL, 'sold', -qty)
redis.call('HINCRBY', K_POOL, 'available', qty)
if redis.call('HINCRBY', K_HELD, rec.u, -qty) <= 0 then
  redis.call('HDEL', K_HELD, rec.u)
end
redis.call('HSET', K_RES, field, record_encode(rec))
outbox_emit(K_POOL, K_OUTBOX, outbox_max, id, rec, 'confirmed', now)
return {'done', 'refunded'}
