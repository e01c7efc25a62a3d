-- acquire_batch.lua: several purchase attempts against one pool, atomically as a whole.
--
-- The group-commit variant of acquire.lua: the store sends the Acquires of one pool that
-- arrived while a call for that pool was in flight together. Each request is answered as
-- acquire.lua would answer it had the requests been called one after the other in ARGV
-- order: the same checks in the same order (expected pool generation, idempotency key,
-- per-user limit, availability), the same writes, the same replies. A later request sees the writes of the
-- earlier ones, so a second copy of an idempotency key replays the first copy's
-- reservation. All requests share one Redis TIME.
--
-- The pool's counters are read once and written once at the end (one HSET; the script is
-- atomic, so nobody sees the intermediate values); everything else is written per
-- reservation as acquire.lua writes it.
--
-- KEYS: as acquire.lua (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 pool    hash  available, reserved, sold, generation, event_seq, events_dropped
--   2 res     hash  reservation_id -> cjson {s = state, q = quantity, e = expires_at_ms, u = user_id, k = idempotency_key,
--                                  r = requested quantity, only when fewer were reserved}
--   3 due     zset  reservation_id scored by expires_at_ms (RESERVED ones only)
--   4 held    hash  user_id -> units held (reserved + confirmed)
--   5 idem    hash  idempotency_key -> reservation_id
--   6 outbox  stream the pool's events (see outbox.lua, prepended to this script)
-- ARGV:
--   1 n, the number of requests
--   2 outbox_max: how many events the outbox keeps at most
--   then n groups of eight, acquire.lua's ARGV per request:
--     user_id, quantity, idempotency_key, new_reservation_id, per_user_limit,
--     reservation_ttl_ms, expected pool generation (0: not checked), allow_partial ('1' | '0')
-- Each new reservation writes its 'reserved' event, in request order; replays write none.
-- Returns an array of n replies, the i-th answering the i-th request, each one of acquire.lua's:
--   {'reserved', reservation_id, quantity, expires_at_ms, replayed (0|1), generation}
--   {'generation', expected, actual}   both as decimal strings
--   {'sold_out', available}
--   {'limit', held}
--   {'conflict'}
--   {'duplicate_id'}

local K_POOL, K_RES, K_DUE, K_HELD, K_IDEM, K_OUTBOX = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local n = tonumber(ARGV[1])
local outbox_max = tonumber(ARGV[2])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local fields = redis.call('HMGET', K_POOL, 'generation', 'available', 'reserved')
local available = tonumber(fields[2] or '0')
local taken = 0
-- Compared as decimal strings, as in acquire.lua (a u64 above 2^53 would lose digits).
local stored = fields[1] or '0'
local generation = tonumber(stored)

local function acquire(user, qty, key, new_id, limit, ttl, expect, partial)
  if expect ~= '0' and expect ~= stored then
    return {'generation', expect, stored}
  end
  local existing = redis.call('HGET', K_IDEM, key)
  if existing then
    local raw = redis.call('HGET', K_RES, existing)
    if raw then
      local rec = cjson.decode(raw)
      if rec.u == user and tonumber(rec.r or rec.q) == qty then
        return {'reserved', existing, tonumber(rec.q), tonumber(rec.e), 1, generation}
      end
      return {'conflict'}
    end
  end

  local held = tonumber(redis.call('HGET', K_HELD, user) or '0')
  local room = limit - held
  if room < 0 then room = 0 end
  local requested = qty
  if partial then
    qty = math.min(qty, room, available)
  end
  if room == 0 or (not partial and qty > room) then
    return {'limit', held}
  end
  if qty == 0 or available < qty then
    return {'sold_out', available}
  end
  local expires_at = now + ttl
  local rec = {s = 'reserved', q = qty, e = expires_at, u = user, k = key}
  if requested ~= qty then
    rec.r = requested
  end
  -- The record first, and only if the id is new: nothing else is written otherwise.
  if redis.call('HSETNX', K_RES, new_id, cjson.encode(rec)) == 0 then
    return {'duplicate_id'}
  end
  available = available - qty
  taken = taken + qty
  redis.call('HINCRBY', K_HELD, user, qty)
  redis.call('ZADD', K_DUE, expires_at, new_id)
  redis.call('HSET', K_IDEM, key, new_id)
  outbox_emit(K_POOL, K_OUTBOX, outbox_max, new_id, rec, nil, now)
  return {'reserved', new_id, qty, expires_at, 0, generation}
end

local out = {}
for i = 1, n do
  local b = 2 + (i - 1) * 8
  out[i] = acquire(ARGV[b + 1], tonumber(ARGV[b + 2]), ARGV[b + 3], ARGV[b + 4], tonumber(ARGV[b + 5]),
    tonumber(ARGV[b + 6]), ARGV[b + 7], ARGV[b + 8] == '1')
end

if taken > 0 then
  redis.call('HSET', K_POOL, 'available', string.format('%d', available),
    'reserved', string.format('%d', tonumber(fields[3] or '0') + taken))
end

return out
