-- refill.lua: adds units granted by the center to available, once per grant_id.
-- Creates the pool on first use, with a generation taken from Redis TIME in microseconds
-- (nonzero, below 2^53, and different after Redis lost the pool and it is created again),
-- and the markers of intact.lua (prepended) in every structure. A pool that lost one of
-- its structures counts as lost like a pool whose hash is gone: refused with must_exist,
-- created anew without (the agent's rules open a lost pool again only once the center
-- settled its units). Creating a pool drops what a lost one left of its reservations
-- (res, due, held, idem, its expiry exceptions in gc) and its outbox; grant and take
-- records stay, so a replay of a center call stays a replay.
--
-- KEYS (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 pool    hash  available, reserved, sold, generation, event_seq, events_dropped
--   2 grants  hash  grant_id -> units applied
--   3 gc      zset  "r:<field>" / "g:<id>" / "t:<id>" scored by the ms after which the record may be forgotten
--   4 fence   string  the highest center epoch that fenced the pool (see fence.lua)
--   5 outbox  stream  the pool's events: dropped when the pool is created, so a new
--                     generation numbers its events from 1 again
--   6..13     the pool's structures (res, due, held, idem, gc, grants, takes, outbox):
--             checked for their markers; reservations and outbox emptied on creation
-- ARGV:
--   1 grant_id
--   2 units
--   3 retention_ms: how long an applied grant_id is remembered
--   4 must_exist: '1' to refuse a pool that does not exist (a grant must never recreate a
--     pool the store lost); '0' creates it
--   5 epoch: the caller's center epoch; refused if the pool was fenced with a later one
-- ARGV[6] is the caller's floor (intact.lua). The reply is wrapped: {wseq, reply}.
-- Returns {1, ...} if applied now, {0, ...} if grant_id was applied before (a replay), -1
-- if must_exist and the pool does not exist or is partly lost, -2 if fenced (nothing is
-- recorded for -1 and -2). The table goes on with the pool as this call left it:
-- {code, available, reserved, sold, generation, now_ms, wseq}, wseq the sequence the pool
-- had before this call's own change (the wrapper's wseq, when it wrote, is the one after).
-- The pool was checked whole before the write (intact.lua), so the answer stands for a
-- whole read taken at the write (`core::channel::quiet`).

local K_POOL, K_GRANTS, K_GC, K_FENCE, K_OUTBOX = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local K_RES, K_DUE, K_HELD, K_IDEM = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local grant_id = ARGV[1]
local units = tonumber(ARGV[2])
local retention = tonumber(ARGV[3])
local must_exist = ARGV[4] == '1'
local epoch = tonumber(ARGV[5])
local structures = structures_from(6)

if tonumber(redis.call('GET', K_FENCE) or '0') > epoch then
  return -2
end

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local state, generation = pool_state(K_POOL, structures)
if must_exist and state ~= 'ok' then
  return -1
end
if state ~= 'ok' then
  generation = string.format('%d', tonumber(t[1]) * 1000000 + tonumber(t[2]))
  redis.call('DEL', K_RES, K_DUE, K_HELD, K_IDEM, K_OUTBOX, K_POOL)
  -- The lost generation's expiry exceptions (due.lua: gc's scores below 0).
  redis.call('ZREMRANGEBYSCORE', K_GC, '-inf', '(0')
  -- A new pool keeps its expiries in the due list (due.lua), `due` = 'list', and has no
  -- records addressed by id (ids.lua), `keys` = 'derived'.
  redis.call('HSET', K_POOL, 'available', 0, 'reserved', 0, 'sold', 0, 'generation', generation, 'marked', 1,
    'due', 'list', 'keys', 'derived')
  mark_structures(structures, generation)
  pool_created(K_POOL)
  pool_wrote()
end
local function answer(code)
  local v = redis.call('HMGET', K_POOL, 'available', 'reserved', 'sold', 'wseq')
  return {code, tonumber(v[1] or '0'), tonumber(v[2] or '0'), tonumber(v[3] or '0'), tonumber(generation), now,
    tonumber(v[4] or '0')}
end
if redis.call('HSETNX', K_GRANTS, grant_id, units) == 0 then
  return answer(0)
end
redis.call('ZADD', K_GC, now + retention, 'g:' .. grant_id)
redis.call('HINCRBY', K_POOL, 'available', units)
pool_wrote()
return answer(1)
