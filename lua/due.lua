-- due.lua: where a RESERVED reservation's expiry is kept, said once; prepended by the store
-- (after outbox.lua) to the acquire scripts and to the scripts that change reservation
-- states.
--
-- A pool's reservations are made in time order, mostly with its item's one TTL, so the
-- ids in the order made are in expiry order: `due` is a list of record fields (ids.lua:
-- '=' .. h of the key, or an id), its head the marker of intact.lua, then the fields in the
-- order made (RPUSH); the pool hash's `due_tail` is the expiry of the last one pushed. The list is never edited in the middle:
-- a reservation confirmed, cancelled or expired stays in it until the sweeper (expire.lua)
-- reaches it at the head and drops it. What would break the order goes to the exceptions
-- instead: a reservation made with an expiry before `due_tail` (a shorter TTL, Redis's
-- clock stepping back) and one whose expiry an extend moved. The exceptions are members
-- 'd:<field>' of the pool's `gc` sorted set scored by the expiry NEGATED: gc's own entries
-- (records to forget) are scored by a time >= 0, its marker +inf, so the two never meet
-- in a range of scores, and the reservations due by `now` are the scores in [-now, 0).
--
-- A pool written before this layout keeps `due` as a sorted set (id scored by expiry;
-- the pool hash without `due` = 'list'). There, every new or extended reservation is an
-- exception, so the old set only shrinks; the sweeper moves it into the exceptions a
-- batch per call and, once it holds its marker alone, makes `due` the list and sets
-- `due` = 'list' (see expire.lua). Until then the old set's entries expire as before.

local DUE_EXCEPTION = 'd:'

-- Whether a reservation made now with expiry `expires_at` goes to the list, given the
-- pool hash's `due_tail` (false when nothing was pushed yet): only in a pool of the
-- list layout, and only if it keeps the list in expiry order.
local function due_in_order(tail, expires_at)
  return due_is_list and (not tail or expires_at >= tonumber(tail))
end

-- The reservation at `field` expires at `expires_at` out of the list's order: an exception.
local function due_except(k_gc, field, expires_at)
  redis.call('ZADD', k_gc, -expires_at, DUE_EXCEPTION .. field)
end

-- The reservation at `field` leaves RESERVED: it leaves the exceptions (and the old
-- layout's sorted set). A field in the list stays there until the sweeper drops it.
local function due_forget(k, field)
  redis.call('ZREM', k.gc, DUE_EXCEPTION .. field)
  if not due_is_list then
    redis.call('ZREM', k.due, field)
  end
end
