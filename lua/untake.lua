-- untake.lua: puts back the units a take_for_return took (its Return was refused or never
-- applied by the center), once per take_id.
--
-- KEYS (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 pool   hash  available, reserved, sold, generation, event_seq, events_dropped
--   2 takes  hash  take_id -> cjson {n = units taken, b = 0|1 (put back by untake)}
--   3 fence  string  the highest center epoch that fenced the pool (see fence.lua)
--   4..11    the pool's structures, checked for their markers (intact.lua, prepended)
-- ARGV:
--   1 take_id
--   2 epoch: the caller's center epoch; refused if the pool was fenced with a later one
-- Returns the units put back now: 0 on a replay, for an unknown take_id, or when the pool
-- is gone or lost one of its structures (intact.lua, prepended; the units are then in
-- doubt, not resold); -2 if fenced (the
-- channel's new incarnation counts these units through its resync instead).

local K_POOL, K_TAKES, K_FENCE = KEYS[1], KEYS[2], KEYS[3]
local take_id = ARGV[1]
local epoch = tonumber(ARGV[2])

if tonumber(redis.call('GET', K_FENCE) or '0') > epoch then
  return -2
end

if pool_state(K_POOL, structures_from(4)) ~= 'ok' then
  return 0
end
local raw = redis.call('HGET', K_TAKES, take_id)
if not raw then
  return 0
end
local rec = cjson.decode(raw)
local units = tonumber(rec.n)
if tonumber(rec.b) == 1 or units == 0 then
  return 0
end
rec.b = 1
redis.call('HSET', K_TAKES, take_id, cjson.encode(rec))
redis.call('HINCRBY', K_POOL, 'available', units)
pool_wrote()
return units
