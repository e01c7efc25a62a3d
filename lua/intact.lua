-- intact.lua: whether a pool still has every structure it was created with. Prepended by
-- the store to every script that reads or writes a pool's structures, so each checks
-- before its first write.
--
-- Redis deletes an empty hash, sorted set or list, so a structure lost on its own (evicted,
-- deleted by hand) could not be told from an empty one, and the scripts would quietly
-- create it again, empty: reservations forgotten, idempotency keys reserving anew. So
-- refill.lua, when it creates a pool, marks the pool hash (`marked`) and puts a marker
-- carrying the pool's generation into each structure, which stays there for the pool's
-- life:
--   res, held, idem, grants, takes   hash field ' gen' = generation
--   gc                               member ' gen:<generation>' scored +inf (never due)
--   due                              element ' gen:<generation>' at the list's head, put
--                                    back by the sweeper after each pop (due.lua); in a
--                                    pool of the old layout (a sorted set, the pool hash
--                                    without `due` = 'list') a member as gc's
--   outbox                           the stream exists (created empty)
-- A marker's name starts with a space, which no reservation id, idempotency key, user id
-- (0x21-0x7E), grant id or take id can. A pool hash without `marked` (created before the
-- markers) is only checked for its generation.
--
-- A pool that went back in time (Redis restarted from an older snapshot, a lagging replica
-- promoted) has every structure and the same generation, with older contents. So the pool
-- hash carries a write sequence, `wseq`, raised once by every call that changed the pool
-- (`pool_wrote`, then `pool_reply`), never lowered, and carried over to the pool's next
-- generation. The store appends the highest sequence its own writes of the pool were
-- answered with, its floor, as the LAST ARGV of every script below (scripts index ARGV
-- from 1 and never count it). A pool below the floor lost writes that were acknowledged:
-- it is answered as partly lost, and `behind` = the floor is written into its hash so
-- every other caller (another replica of the channel, an agent restarted without a floor)
-- finds it lost too, until refill.lua creates the pool anew. The store wraps each script
-- so its reply is {wseq, reply}: wseq the pool's sequence after this call's own change, 0
-- when it changed nothing (a read, a replay, a refusal: only the caller's own
-- acknowledged writes raise its floor).

local WSEQ_FLOOR = tonumber(ARGV[#ARGV]) or 0
-- The pool hash this call found intact (raised by pool_reply if the call wrote), and its
-- sequence as found (also for a lost pool, so its next generation continues above it).
local wseq_pool, wseq_found, wseq_wrote = nil, 0, false
-- Whether the pool's `due` is the list of due.lua (the pool hash's `due` = 'list'), or
-- still the sorted set of the layout before it; set by pool_state.
local due_is_list = false
-- Whether every record of the pool is addressed by its key (ids.lua: the pool hash's
-- `keys` = 'derived'), so lookups by key need not look in `idem`; set by pool_state.
local keys_derived = false
-- Fields of the pool hash a script reads along with pool_state's own, in the same HMGET
-- (snapshot.lua: the counters), and their values as pool_state found them.
local POOL_FIELDS, pool_fields = {}, {}

local function pool_wrote()
  wseq_wrote = true
end

-- The reply of the wrapped script: {wseq, reply}.
local function pool_reply(reply)
  if wseq_wrote and wseq_pool then
    return {redis.call('HINCRBY', wseq_pool, 'wseq', 1), reply}
  end
  return {0, reply}
end

-- refill.lua, creating the pool: its sequence continues above both the floor and the
-- lost pool's.
local function pool_created(k_pool)
  redis.call('HSET', k_pool, 'wseq', string.format('%d', math.max(WSEQ_FLOOR, wseq_found)))
  wseq_pool = k_pool
end

local MARK = ' gen'

local function has_mark(key, kind, gen)
  if kind == 'hash' then
    return redis.call('HGET', key, MARK) == gen
  elseif kind == 'zset' or (kind == 'due' and not due_is_list) then
    return redis.call('ZSCORE', key, MARK .. ':' .. gen) ~= false
  elseif kind == 'due' then
    return redis.call('LINDEX', key, 0) == MARK .. ':' .. gen
  end
  return redis.call('EXISTS', key) == 1
end

-- The pool's state: 'ok', 'missing' (no pool hash) or 'partial' (created with markers and
-- one of `structures`, {key, 'hash' | 'zset' | 'due' | 'stream'} pairs, has lost its own; or its
-- write sequence is below the caller's floor, or was found so before); and
-- the generation as stored (a decimal string), nil when missing. A partial pool is a lost
-- pool, answered as one: nothing of it is read or written.
local function pool_state(k_pool, structures)
  local v = redis.call('HMGET', k_pool, 'generation', 'marked', 'wseq', 'behind', 'due', 'keys', unpack(POOL_FIELDS))
  pool_fields = {}
  for i = 1, #POOL_FIELDS do
    pool_fields[i] = v[6 + i]
  end
  local gen = v[1]
  if not gen then
    return 'missing', nil
  end
  due_is_list = v[5] == 'list'
  keys_derived = v[6] == 'derived'
  wseq_found = math.max(tonumber(v[3] or '0'), tonumber(v[4] or '0'))
  if v[4] then
    return 'partial', gen
  end
  if tonumber(v[3] or '0') < WSEQ_FLOOR then
    redis.call('HSET', k_pool, 'behind', string.format('%d', WSEQ_FLOOR))
    wseq_found = math.max(wseq_found, WSEQ_FLOOR)
    return 'partial', gen
  end
  if v[2] then
    for _, s in ipairs(structures) do
      if not has_mark(s[1], s[2], gen) then
        return 'partial', gen
      end
    end
  end
  wseq_pool = k_pool
  return 'ok', gen
end

-- The eight structures as the store passes them, from KEYS[first] on: res, due, held,
-- idem, gc, grants, takes, outbox. Every script checks them all, so a pool that lost any
-- one is lost for each of them alike.
local function structures_from(first)
  return {
    {KEYS[first], 'hash'}, {KEYS[first + 1], 'due'}, {KEYS[first + 2], 'hash'}, {KEYS[first + 3], 'hash'},
    {KEYS[first + 4], 'zset'}, {KEYS[first + 5], 'hash'}, {KEYS[first + 6], 'hash'}, {KEYS[first + 7], 'stream'},
  }
end

-- Puts the markers of generation `gen` into `structures` (refill.lua, creating a pool).
local function mark_structures(structures, gen)
  for _, s in ipairs(structures) do
    if s[2] == 'hash' then
      redis.call('HSET', s[1], MARK, gen)
    elseif s[2] == 'zset' then
      redis.call('ZADD', s[1], 'inf', MARK .. ':' .. gen)
    elseif s[2] == 'due' then
      -- A new pool's due is the list (the caller sets the pool hash's `due` = 'list').
      redis.call('DEL', s[1])
      redis.call('RPUSH', s[1], MARK .. ':' .. gen)
    elseif redis.call('EXISTS', s[1]) == 0 then
      -- An empty stream: an entry added and deleted leaves the key, with last id 0-1.
      redis.call('XADD', s[1], '0-1', 'm', gen)
      redis.call('XDEL', s[1], '0-1')
    end
  end
end
