-- expire.lua: the sweeper's call. Expires up to max_count RESERVED reservations whose
-- expires_at_ms <= Redis TIME (units back to available, the users' allowance freed): the
-- exceptions first, then the due list from its head (due.lua); then forgets up to gc_batch
-- finished records whose retention ran out, so memory stays bounded, and converts up to
-- about gc_batch records of a pool written with JSON records, and of a pool whose `due`
-- is still the old sorted set, up to gc_batch of its entries. A pool whose `idem` holds
-- its marker alone has no record addressed by id left (ids.lua): its hash gets `keys` =
-- 'derived', and lookups by key stop looking in `idem`.
--
-- KEYS (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 pool    hash  available, reserved, sold, generation, event_seq, events_dropped
--   2 res     hash  record field (ids.lua) -> record (codec.lua) {s = state, q = quantity, e = expires_at_ms, u = user_id, k = idempotency_key}
--   3 due     list  record fields in the order made (due.lua, prepended)
--   4 held    hash  user_id -> units held (reserved + confirmed)
--   5 idem    hash  idempotency_key -> reservation_id, only for records addressed by id
--   6 gc      zset  "r:<field>" / "g:<id>" / "t:<id>" scored by the ms after which the record may be forgotten;
--                   "d:<field>" the expiry exceptions, scored by the expiry negated (due.lua)
--   7 grants  hash  grant_id -> units applied
--   8 takes   hash  take_id -> cjson {n = units, b = 0|1 (put back)}
--   9 outbox  stream the pool's events (see outbox.lua, prepended to this script)
-- ARGV:
--   1 max_count: at most this many reservations are expired
--   2 retention_ms: how long a finished reservation (and its idempotency key) is remembered
--   3 gc_batch: at most this many old records are forgotten
--   4 outbox_max: how many events the outbox keeps at most
-- Each expiry writes its 'expired' event.
-- Returns the number of units put back into available: 0, with nothing written, when the
-- pool does not exist or lost one of these structures (intact.lua, prepended); the
-- agent's reads see it lost.

local K_POOL, K_RES, K_DUE, K_HELD, K_IDEM, K_GC, K_GRANTS, K_TAKES, K_OUTBOX =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local outbox_max = tonumber(ARGV[4])
-- Bounded so Redis always gets an integer LIMIT (one call never sweeps more anyway).
local max_count = math.min(tonumber(ARGV[1]), 1000000000)
local retention = tonumber(ARGV[2])
local gc_batch = tonumber(ARGV[3])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local state, gen = pool_state(K_POOL, structures_from(2))
if state ~= 'ok' then
  return 0
end

-- A head of the due list dropped without being expired (finished, or extended and so an
-- exception) costs a record lookup: at most this many per call, so a list whose head is
-- a run of confirmed reservations is worked off over several calls.
local DUE_DROP_MAX = 1000
-- How many ids of the list's head are read at once.
local DUE_CHUNK = 100

local freed, expired = 0, 0
local k = {pool = K_POOL, res = K_RES, due = K_DUE, held = K_HELD, gc = K_GC, outbox = K_OUTBOX}

-- Expires the reservation at `field` if it is still reserved (the caller took it off the
-- exceptions, or the old sorted set, already).
local function expire_one(field)
  local raw = redis.call('HGET', K_RES, field)
  if raw then
    local rec = record_decode(raw)
    if rec.s == 'reserved' then
      if tonumber(rec.e) <= now then
        freed = freed + release_reserved(k, field, rec, 'expired', now, retention, outbox_max)
        expired = expired + 1
      else
        -- Not due after all (cannot happen: an extend moves the score): kept in order.
        due_except(K_GC, field, tonumber(rec.e))
      end
    end
  end
end

if max_count > 0 then
  -- The exceptions due by now: scores in [-now, 0), the earliest expiry first.
  for _, member in ipairs(redis.call('ZREVRANGEBYSCORE', K_GC, '(0', -now, 'LIMIT', 0, max_count)) do
    redis.call('ZREM', K_GC, member)
    expire_one(string.sub(member, #DUE_EXCEPTION + 1))
  end
end

if max_count > expired and not due_is_list then
  -- The old layout's sorted set, as before.
  for _, field in ipairs(redis.call('ZRANGEBYSCORE', K_DUE, '-inf', now, 'LIMIT', 0, max_count - expired)) do
    redis.call('ZREM', K_DUE, field)
    expire_one(field)
  end
elseif max_count > expired then
  -- The list from its head (index 0 is the marker) while its heads are due or done.
  local popped, dropped, stop = 0, 0, false
  while not stop do
    local fields = redis.call('LRANGE', K_DUE, popped + 1, popped + DUE_CHUNK)
    for _, field in ipairs(fields) do
      if expired >= max_count or dropped >= DUE_DROP_MAX then
        stop = true
        break
      end
      local raw = redis.call('HGET', K_RES, field)
      local rec = raw and record_decode(raw)
      if rec and rec.s == 'reserved' then
        if tonumber(rec.e) <= now then
          freed = freed + release_reserved(k, field, rec, 'expired', now, retention, outbox_max)
          expired = expired + 1
        elseif redis.call('ZSCORE', K_GC, DUE_EXCEPTION .. field) then
          -- Extended: the exceptions have it.
          dropped = dropped + 1
        else
          -- Not due yet, and nothing behind it is.
          stop = true
          break
        end
      else
        dropped = dropped + 1
      end
      popped = popped + 1
    end
    stop = stop or #fields < DUE_CHUNK
  end
  if popped > 0 then
    -- The popped fields go, the marker stays at the head (intact.lua).
    redis.call('LTRIM', K_DUE, popped, -1)
    redis.call('LSET', K_DUE, 0, MARK .. ':' .. gen)
  end
end

if gc_batch > 0 then
  -- From 0: the exceptions below it are expiries, not records to forget (due.lua).
  local old = redis.call('ZRANGEBYSCORE', K_GC, 0, now, 'LIMIT', 0, gc_batch)
  for _, member in ipairs(old) do
    local kind, id = string.sub(member, 1, 1), string.sub(member, 3)
    if kind == 'r' then
      -- A record's member holds its field (ids.lua); one addressed by id has an idem entry.
      local raw = redis.call('HGET', K_RES, id)
      if raw then
        local rec = record_decode(raw)
        if rec.s ~= 'reserved' then
          redis.call('HDEL', K_RES, id)
          if not rec.p and redis.call('HGET', K_IDEM, rec.k) == id then
            redis.call('HDEL', K_IDEM, rec.k)
          end
        end
      end
    elseif kind == 'g' then
      redis.call('HDEL', K_GRANTS, id)
    elseif kind == 't' then
      redis.call('HDEL', K_TAKES, id)
    end
    redis.call('ZREM', K_GC, member)
  end
end

-- A pool with records addressed by id (ids.lua) looks up keys in `idem` too, until `idem`
-- holds its marker alone: then it has none left, and the pool hash says `keys` =
-- 'derived' (an acquire given an id of its own clears it again).
if not keys_derived and redis.call('HLEN', K_IDEM) <= 1 then
  redis.call('HSET', K_POOL, 'keys', 'derived')
end

-- A pool written before the compact record encoding (codec.lua) holds JSON records: they
-- are rewritten compact, about gc_batch per call (an HSCAN whose cursor the pool hash
-- keeps), until a full pass of the hash is done and the pool hash says `records` =
-- 'compact'. Nothing read changes meaning: the same record in another encoding.
if gc_batch > 0 and redis.call('HGET', K_POOL, 'records') ~= 'compact' then
  local step = redis.call('HSCAN', K_RES, redis.call('HGET', K_POOL, 'records_cursor') or '0', 'COUNT', gc_batch)
  local fields = step[2]
  for i = 1, #fields, 2 do
    if string.sub(fields[i + 1], 1, 1) == '{' then
      redis.call('HSET', K_RES, fields[i], record_encode(cjson.decode(fields[i + 1])))
    end
  end
  if step[1] == '0' then
    redis.call('HSET', K_POOL, 'records', 'compact')
    redis.call('HDEL', K_POOL, 'records_cursor')
  else
    redis.call('HSET', K_POOL, 'records_cursor', step[1])
  end
end

-- A pool whose `due` is still the old sorted set: its new and extended reservations are
-- exceptions already, so the set only shrinks; up to gc_batch of its entries move to the
-- exceptions per call and, once it holds only its marker, `due` becomes the list (with
-- its marker) and the pool hash says `due` = 'list'. A call's work stays bounded however
-- many reservations the pool holds, and no answer changes: each reservation is due at the
-- same time, from one structure or the other.
if gc_batch > 0 and not due_is_list then
  local entries = redis.call('ZRANGE', K_DUE, 0, gc_batch - 1, 'WITHSCORES')
  for i = 1, #entries, 2 do
    local member = entries[i]
    if string.sub(member, 1, 1) ~= ' ' then
      due_except(K_GC, member, tonumber(entries[i + 1]))
      redis.call('ZREM', K_DUE, member)
    end
  end
  if redis.call('ZCARD', K_DUE) <= 1 then
    redis.call('DEL', K_DUE)
    redis.call('RPUSH', K_DUE, MARK .. ':' .. gen)
    redis.call('HSET', K_POOL, 'due', 'list')
    redis.call('HDEL', K_POOL, 'due_tail')
  end
end

return freed
