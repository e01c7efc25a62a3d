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
-- What the batch touches more than once is read once and written once at the end (the
-- script is atomic, so nobody sees the intermediate values): the pool's counters and event
-- sequence (one HSET), users' holdings (one HSET), the due list (one RPUSH) and the
-- idempotency index of records addressed by id (one HSET, none for prefixed ids: ids.lua);
-- a later request reads what an earlier one wrote from the batch's own tables. Per reservation there remain the record (HSETNX, which also answers
-- duplicate_id) and its event (XADD); the outbox is trimmed once.
--
-- KEYS: as acquire.lua (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 pool    hash  available, reserved, sold, generation, event_seq, events_dropped, keys
--   2 res     hash  record field (ids.lua) -> record (codec.lua), as in acquire.lua
--   3 due     list  record fields in the order made (due.lua, prepended); one made out of
--                   the list's order is an exception in gc, the fifth structure (KEYS[11])
--   4 held    hash  user_id -> units held (reserved + confirmed)
--   5 idem    hash  idempotency_key -> reservation_id, only for records addressed by id
--   6 outbox  stream the pool's events (see outbox.lua, prepended to this script)
--   7..14     the pool's structures, checked for their markers (intact.lua, prepended)
-- ARGV:
--   1 n, the number of requests
--   2 outbox_max: how many events the outbox keeps at most
--   then n groups of eight, acquire.lua's ARGV per request:
--     user_id, quantity, idempotency_key, new_reservation_id (a prefix or an id, as in
--     acquire.lua), per_user_limit,
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
-- gc, among the structures (res, due, held, idem, gc, ...) from KEYS[7]: the exceptions.
local K_GC = KEYS[11]
local n = tonumber(ARGV[1])
local outbox_max = tonumber(ARGV[2])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- A pool that lost one of its structures (intact.lua, prepended) is answered as a pool
-- that does not exist, without a look at its keys: every request refused by an expected
-- generation, or sold out.
local state = pool_state(K_POOL, structures_from(7))
if state == 'partial' then
  local out = {}
  for i = 1, n do
    local expect = ARGV[2 + (i - 1) * 8 + 7]
    if expect ~= '0' then
      out[i] = {'generation', expect, '0'}
    else
      out[i] = {'sold_out', 0}
    end
  end
  return out
end

local fields = redis.call('HMGET', K_POOL, 'generation', 'available', 'reserved', 'event_seq', 'due_tail')
local available = tonumber(fields[2] or '0')
local taken = 0
local seq = tonumber(fields[4] or '0')
-- Compared as decimal strings, as in acquire.lua (a u64 above 2^53 would lose digits).
local stored = fields[1] or '0'
local generation = tonumber(stored)

-- What this batch wrote, read back by its later requests: holdings by user (and the users
-- in first-touch order), new reservations' ids and records by idempotency key.
local held_by, held_users = {}, {}
local new_ids, new_recs = {}, {}
-- The fields for the due list (and the expiry of the last), the exceptions (due.lua), the
-- idempotency index's new entries.
local due, due_tail, excepts, idem = {}, fields[5], {}, {}

local function acquire(user, qty, key, new_id, limit, ttl, expect, partial)
  if expect ~= '0' and expect ~= stored then
    return {'generation', expect, stored}
  end
  local existing, rec = new_ids[key], new_recs[key]
  local field = key_field(key)
  if not existing then
    local found
    found, rec = find_by_key(K_RES, K_IDEM, key, field)
    existing = found and record_id(found, rec)
  end
  if rec then
    return replay_answer(existing, rec, user, qty, generation)
  end

  local held = held_by[user]
  if not held then
    held = tonumber(redis.call('HGET', K_HELD, user) or '0')
  end
  local requested = qty
  local refusal
  qty, refusal = acquirable(qty, held, limit, available, partial)
  if not qty then
    return refusal
  end
  local expires_at = now + ttl
  rec = new_record(user, key, qty, requested, expires_at)
  local id, by_id = new_id, not is_id_prefix(new_id)
  if by_id then
    field = new_id
  else
    rec.p = new_id
    id = record_id(field, rec)
  end
  -- The record first, and only if the field is new: nothing else is written otherwise.
  if redis.call('HSETNX', K_RES, field, record_encode(rec)) == 0 then
    return {'duplicate_id'}
  end
  available = available - qty
  taken = taken + qty
  if not held_by[user] then
    held_users[#held_users + 1] = user
  end
  held_by[user] = held + qty
  new_ids[key], new_recs[key] = id, rec
  if due_in_order(due_tail, expires_at) then
    due[#due + 1] = field
    due_tail = expires_at
  else
    excepts[#excepts + 1] = -expires_at
    excepts[#excepts + 1] = DUE_EXCEPTION .. field
  end
  if by_id then
    idem[#idem + 1] = key
    idem[#idem + 1] = id
  end
  seq = seq + 1
  outbox_add(K_OUTBOX, seq, id, rec, nil, now)
  return {'reserved', id, qty, expires_at, 0, generation}
end

local out = {}
for i = 1, n do
  local b = 2 + (i - 1) * 8
  out[i] = acquire(ARGV[b + 1], tonumber(ARGV[b + 2]), ARGV[b + 3], ARGV[b + 4], tonumber(ARGV[b + 5]),
    tonumber(ARGV[b + 6]), ARGV[b + 7], ARGV[b + 8] == '1')
end

if taken > 0 then
  local counters = {'available', string.format('%d', available),
    'reserved', string.format('%d', tonumber(fields[3] or '0') + taken), 'event_seq', string.format('%d', seq)}
  if #due > 0 then
    redis.call('RPUSH', K_DUE, unpack(due))
    counters[#counters + 1] = 'due_tail'
    counters[#counters + 1] = string.format('%d', due_tail)
  end
  if #excepts > 0 then
    redis.call('ZADD', K_GC, unpack(excepts))
  end
  redis.call('HSET', K_POOL, unpack(counters))
  local holdings = {}
  for _, user in ipairs(held_users) do
    holdings[#holdings + 1] = user
    holdings[#holdings + 1] = string.format('%d', held_by[user])
  end
  redis.call('HSET', K_HELD, unpack(holdings))
  if #idem > 0 then
    redis.call('HSET', K_IDEM, unpack(idem))
    if keys_derived then
      redis.call('HDEL', K_POOL, 'keys')
    end
  end
  outbox_trim(K_POOL, K_OUTBOX, outbox_max)
end

return out
