-- expire.lua: the sweeper's call. Expires up to max_count RESERVED reservations whose
-- expires_at_ms <= Redis TIME (units back to available, the users' allowance freed), then
-- forgets up to gc_batch finished records whose retention ran out, so memory stays bounded,
-- and converts up to about gc_batch records of a pool written with JSON records.
--
-- KEYS (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 pool    hash  available, reserved, sold, generation, event_seq, events_dropped
--   2 res     hash  reservation_id -> record (codec.lua) {s = state, q = quantity, e = expires_at_ms, u = user_id, k = idempotency_key}
--   3 due     zset  reservation_id scored by expires_at_ms (RESERVED ones only)
--   4 held    hash  user_id -> units held (reserved + confirmed)
--   5 idem    hash  idempotency_key -> reservation_id
--   6 gc      zset  "r:<id>" / "g:<id>" / "t:<id>" scored by the ms after which the record may be forgotten
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

if pool_state(K_POOL, structures_from(2)) ~= 'ok' then
  return 0
end

local freed = 0
if max_count > 0 then
  local k = {pool = K_POOL, res = K_RES, due = K_DUE, held = K_HELD, gc = K_GC, outbox = K_OUTBOX}
  local due = redis.call('ZRANGEBYSCORE', K_DUE, '-inf', now, 'LIMIT', 0, max_count)
  for _, id in ipairs(due) do
    redis.call('ZREM', K_DUE, id)
    local raw = redis.call('HGET', K_RES, id)
    if raw then
      local rec = record_decode(raw)
      if rec.s == 'reserved' then
        freed = freed + release_reserved(k, id, rec, 'expired', now, retention, outbox_max)
      end
    end
  end
end

if gc_batch > 0 then
  local old = redis.call('ZRANGEBYSCORE', K_GC, '-inf', now, 'LIMIT', 0, gc_batch)
  for _, member in ipairs(old) do
    local kind, id = string.sub(member, 1, 1), string.sub(member, 3)
    if kind == 'r' then
      local raw = redis.call('HGET', K_RES, id)
      if raw then
        local rec = record_decode(raw)
        if rec.s ~= 'reserved' then
          redis.call('HDEL', K_RES, id)
          if redis.call('HGET', K_IDEM, rec.k) == id then
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

return freed
