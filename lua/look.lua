-- look.lua: the rebalancer's look at one pool in one call: expire.lua's sweep (prepended
-- by the store as the function `sweep`), then the pool's counters as snapshot.lua reads
-- them, under the sweep's one intact check (intact.lua). Two calls would cost Redis a
-- second script run and a second check of the eight structures, for every look at every
-- idle pool.
--
-- KEYS and ARGV: expire.lua's.
-- Returns {freed, {available, reserved, sold, generation, now_ms, wseq}, outbox}: the units
-- the sweep put back, and the pool after it. The counters, the generation and wseq are 0
-- when the pool does not exist, lost one of its structures or went back in time
-- (snapshot.lua); outbox is {kept, dropped, last_sequence} as events.lua counts them, for
-- the metrics, or {} in those cases.

local freed = sweep()
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
-- pool_state (in the sweep) names the pool hash only when it found the pool intact.
if not wseq_pool then
  return {freed, {0, 0, 0, 0, now, 0}, {}}
end
local v = redis.call('HMGET', wseq_pool, 'available', 'reserved', 'sold', 'generation', 'event_seq', 'events_dropped')
-- The sequence the pool has once this call's reply raised it (intact.lua's pool_reply).
local wseq = wseq_found + (wseq_wrote and 1 or 0)
local outbox = {redis.call('XLEN', KEYS[9]), tonumber(v[6] or '0'), tonumber(v[5] or '0')}
return {freed, {tonumber(v[1] or '0'), tonumber(v[2] or '0'), tonumber(v[3] or '0'), tonumber(v[4]), now, wseq}, outbox}
