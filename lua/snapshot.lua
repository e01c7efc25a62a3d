-- snapshot.lua: the counters of one or more pools, their generations and the Redis clock.
-- Read-only, but for the `behind` mark intact.lua writes into a pool found below its floor.
-- A full report reads thousands of pools: on one Redis server they go many to a call, so
-- the report costs a few calls instead of one per pool. On a Redis Cluster each call reads
-- one pool (a script may only touch one slot's keys).
--
-- KEYS, nine per pool (all of one pool share its hash tag, `<prefix>{channel:item}:<name>`):
--   pool    hash  available, reserved, sold, generation, event_seq, events_dropped
--   res, due, held, idem, gc, grants, takes, outbox: checked for their markers (intact.lua,
--   prepended)
-- ARGV: each pool's floor (intact.lua), in the order of KEYS; then the floor the store
--   appends to every script's ARGV (0: each pool's own comes first)
-- Returns, per pool in the order of KEYS, {available, reserved, sold, generation, now_ms,
-- wseq}; all counters, the generation and wseq are 0 when the pool does not exist (never
-- refilled, or Redis lost it), when it lost one of its structures (a partly lost pool is a
-- lost pool) and when it went back in time (its wseq below the floor). Wrapped: {0, reply}.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- The counters come with pool_state's own read of the pool hash: one command fewer a pool.
POOL_FIELDS = {'available', 'reserved', 'sold'}

local out = {}
for i = 1, #ARGV - 1 do
  local first = (i - 1) * 9 + 1
  -- intact.lua's state is per pool: its floor, and what pool_state found.
  WSEQ_FLOOR = tonumber(ARGV[i]) or 0
  wseq_found, due_is_list = 0, false
  local state, state_gen = pool_state(KEYS[first], structures_from(first + 1))
  if state ~= 'ok' then
    out[i] = {0, 0, 0, 0, now, 0}
  else
    -- An intact pool has no `behind` mark: the sequence pool_state found is its own.
    local v = pool_fields
    out[i] = {tonumber(v[1] or '0'), tonumber(v[2] or '0'), tonumber(v[3] or '0'), tonumber(state_gen), now, wseq_found}
  end
end
-- Nothing was written for any caller's floor to count (pool_reply answers {0, reply}).
wseq_pool = nil
return out
