-- snapshot.lua: the pool counters, its generation and the Redis clock. Read-only.
--
-- KEYS (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 pool    hash  available, reserved, sold, generation, event_seq, events_dropped
--   2 res, 3 due, 4 held, 5 idem, 6 gc, 7 grants, 8 takes, 9 outbox: checked for their
--     markers (intact.lua, prepended)
-- ARGV: 1 the caller's floor (intact.lua)
-- Returns {available, reserved, sold, generation, now_ms, wseq}; all counters, the
-- generation and wseq are 0 when the pool does not exist (never refilled, or Redis lost
-- it), when it lost one of its structures (a partly lost pool is a lost pool) and when it
-- went back in time (its wseq below the floor). Wrapped: {0, reply}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local state = pool_state(KEYS[1], structures_from(2))
if state ~= 'ok' then
  return {0, 0, 0, 0, now, 0}
end
local v = redis.call('HMGET', KEYS[1], 'available', 'reserved', 'sold', 'generation', 'wseq')
return {tonumber(v[1] or '0'), tonumber(v[2] or '0'), tonumber(v[3] or '0'), tonumber(v[4]), now, tonumber(v[5] or '0')}
