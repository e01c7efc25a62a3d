-- events.lua: a page of the pool's outbox (see outbox.lua). Read-only.
--
-- KEYS (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 pool    hash  available, reserved, sold, generation, event_seq, events_dropped
--   2 outbox  stream the pool's events, ids `<sequence>-0`
-- ARGV:
--   1 from_sequence (decimal)
--   2 max: at most this many events (0: none, only the counters)
-- Returns {generation, last_sequence, first_kept, kept, dropped, entries}: first_kept is
-- last_sequence + 1 when nothing is kept; entries as XRANGE answers them.

local K_POOL, K_OUTBOX = KEYS[1], KEYS[2]
local max = math.min(tonumber(ARGV[2]), 1000000)

local v = redis.call('HMGET', K_POOL, 'generation', 'event_seq', 'events_dropped')
local last = tonumber(v[2] or '0')
local first_kept = last + 1
local first = redis.call('XRANGE', K_OUTBOX, '-', '+', 'COUNT', 1)
if #first > 0 then
  first_kept = tonumber(string.match(first[1][1], '^(%d+)'))
end
local entries = {}
if max > 0 then
  entries = redis.call('XRANGE', K_OUTBOX, ARGV[1] .. '-0', '+', 'COUNT', max)
end
return {tonumber(v[1] or '0'), last, first_kept, redis.call('XLEN', K_OUTBOX), tonumber(v[3] or '0'), entries}
