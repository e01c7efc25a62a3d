-- intact.lua: whether a pool still has every structure it was created with. Prepended by
-- the store to every script that reads or writes a pool's structures, so each checks
-- before its first write.
--
-- Redis deletes an empty hash or sorted set, so a structure lost on its own (evicted,
-- deleted by hand) could not be told from an empty one, and the scripts would quietly
-- create it again, empty: reservations forgotten, idempotency keys reserving anew. So
-- refill.lua, when it creates a pool, marks the pool hash (`marked`) and puts a marker
-- carrying the pool's generation into each structure, which stays there for the pool's
-- life:
--   res, held, idem, grants, takes   hash field ' gen' = generation
--   due, gc                          member ' gen:<generation>' scored +inf (never due)
--   outbox                           the stream exists (created empty)
-- A marker's name starts with a space, which no reservation id, idempotency key, user id
-- (0x21-0x7E), grant id or take id can. A pool hash without `marked` (created before the
-- markers) is only checked for its generation.

local MARK = ' gen'

local function has_mark(key, kind, gen)
  if kind == 'hash' then
    return redis.call('HGET', key, MARK) == gen
  elseif kind == 'zset' then
    return redis.call('ZSCORE', key, MARK .. ':' .. gen) ~= false
  end
  return redis.call('EXISTS', key) == 1
end

-- The pool's state: 'ok', 'missing' (no pool hash) or 'partial' (created with markers and
-- one of `structures`, {key, 'hash' | 'zset' | 'stream'} pairs, has lost its own); and
-- the generation as stored (a decimal string), nil when missing. A partial pool is a lost
-- pool, answered as one: nothing of it is read or written.
local function pool_state(k_pool, structures)
  local v = redis.call('HMGET', k_pool, 'generation', 'marked')
  local gen = v[1]
  if not gen then
    return 'missing', nil
  end
  if v[2] then
    for _, s in ipairs(structures) do
      if not has_mark(s[1], s[2], gen) then
        return 'partial', gen
      end
    end
  end
  return 'ok', gen
end

-- The eight structures as the store passes them, from KEYS[first] on: res, due, held,
-- idem, gc, grants, takes, outbox. Every script checks them all, so a pool that lost any
-- one is lost for each of them alike.
local function structures_from(first)
  return {
    {KEYS[first], 'hash'}, {KEYS[first + 1], 'zset'}, {KEYS[first + 2], 'hash'}, {KEYS[first + 3], 'hash'},
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
    elseif redis.call('EXISTS', s[1]) == 0 then
      -- An empty stream: an entry added and deleted leaves the key, with last id 0-1.
      redis.call('XADD', s[1], '0-1', 'm', gen)
      redis.call('XDEL', s[1], '0-1')
    end
  end
end
