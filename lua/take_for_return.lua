-- take_for_return.lua: removes min(max_units, available) from available so the agent can
-- return them to the center, once per take_id. A replay takes nothing more and returns the
-- amount recorded the first time. The take is recorded even when it took 0 units, so a
-- replay stays stable whatever the pool holds by then.
--
-- KEYS (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 pool   hash  available, reserved, sold, generation, event_seq, events_dropped
--   2 takes  hash  take_id -> cjson {n = units taken, b = 0|1 (put back by untake)}
--   3 gc     zset  "r:<field>" / "g:<id>" / "t:<id>" scored by the ms after which the record may be forgotten
--   4 fence  string  the highest center epoch that fenced the pool (see fence.lua)
--   5..12    the pool's structures, checked for their markers (intact.lua, prepended)
-- ARGV:
--   1 take_id
--   2 max_units
--   3 retention_ms: how long the take is remembered
--   4 epoch: the caller's center epoch; refused if the pool was fenced with a later one
-- Returns the units taken (by this call or, on a replay, by the first one), -2 if fenced,
-- or -1 if the pool lost one of its structures (intact.lua, prepended); nothing is taken
-- or recorded for -1 and -2.

local K_POOL, K_TAKES, K_GC, K_FENCE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local take_id = ARGV[1]
local max_units = tonumber(ARGV[2])
local retention = tonumber(ARGV[3])
local epoch = tonumber(ARGV[4])

if tonumber(redis.call('GET', K_FENCE) or '0') > epoch then
  return -2
end

if pool_state(K_POOL, structures_from(5)) == 'partial' then
  return -1
end

local raw = redis.call('HGET', K_TAKES, take_id)
if raw then
  return tonumber(cjson.decode(raw).n)
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local available = tonumber(redis.call('HGET', K_POOL, 'available') or '0')
local taken = math.min(max_units, available)
if taken > 0 then
  redis.call('HINCRBY', K_POOL, 'available', -taken)
end
redis.call('HSET', K_TAKES, take_id, cjson.encode({n = taken, b = 0}))
pool_wrote()
redis.call('ZADD', K_GC, now + retention, 't:' .. take_id)
return taken
