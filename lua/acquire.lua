-- acquire.lua: one purchase attempt against one pool, atomically.
--
-- Order of checks: the pool's structures (intact.lua, prepended: a pool that lost one is
-- answered as a pool that does not exist, without a look at its keys, so a replay never
-- reserves anew), the expected pool generation, idempotency key (replay or conflict),
-- per-user limit, availability. A refused, sold-out or limit answer writes nothing. Time
-- comes from Redis TIME only.
--
-- KEYS (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 pool    hash  available, reserved, sold, generation, event_seq, events_dropped, keys
--   2 res     hash  record field (ids.lua: '=' .. h of the idempotency key, or an id of the
--                   caller's own) -> record (codec.lua) {s = state, q = quantity,
--                   e = expires_at_ms, u = user_id, k = idempotency_key, r = requested
--                   quantity, only when fewer were reserved, p = the id's prefix}
--   3 due     list  record fields in the order made (due.lua, prepended); one made out of
--                   the list's order is an exception in gc, the fifth structure (KEYS[11])
--   4 held    hash  user_id -> units held (reserved + confirmed)
--   5 idem    hash  idempotency_key -> reservation_id, only for records addressed by id
--   6 outbox  stream the pool's events (see outbox.lua, prepended to this script with
--             record.lua, which builds the new record)
--   7..14     the pool's structures, checked for their markers (intact.lua, prepended)
-- ARGV:
--   1 user_id
--   2 quantity
--   3 idempotency_key
--   4 new_reservation_id (used only if this call reserves): the id's prefix, completed
--     with h of the key (ids.lua), or an id of the caller's own
--   5 per_user_limit
--   6 reservation_ttl_ms
--   7 expected pool generation (0: not checked); a pool of another generation (0 when it
--     does not exist) lost the keys of that one, so the call is refused before the key
--     lookup
--   8 outbox_max: how many events the outbox keeps at most
--   9 allow_partial ('1' | '0'): reserve min(quantity, available, limit - held) when that
--     is positive instead of answering sold out / over the limit; a replay matches on the
--     requested quantity
-- A new reservation writes its 'reserved' event; a replay writes none.
-- Returns one of:
--   {'reserved', reservation_id, quantity, expires_at_ms, replayed (0|1), generation}
--   {'generation', expected, actual}   both as decimal strings
--   {'sold_out', available}
--   {'limit', held}
--   {'conflict'}
--   {'duplicate_id'}   new_reservation_id names an existing reservation (a caller bug), or
--                      the key's field holds another key's record

local K_POOL, K_RES, K_DUE, K_HELD, K_IDEM, K_OUTBOX = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
-- gc, among the structures (res, due, held, idem, gc, ...) from KEYS[7]: the exceptions.
local K_GC = KEYS[11]
local outbox_max = tonumber(ARGV[8])
local user, key, new_id = ARGV[1], ARGV[3], ARGV[4]
local qty = tonumber(ARGV[2])
local limit = tonumber(ARGV[5])
local ttl = tonumber(ARGV[6])

-- Compared as decimal strings (as ARGV carries it and as refill.lua stored it): a u64
-- above 2^53 would lose digits as a Lua number.
local expect = ARGV[7]
-- The pool's fields this call reads, in one command; written back in one HSET below.
local state = pool_state(K_POOL, structures_from(7))
if state == 'partial' then
  if expect ~= '0' then
    return {'generation', expect, '0'}
  end
  return {'sold_out', 0}
end
local fields = redis.call('HMGET', K_POOL, 'generation', 'available', 'reserved', 'event_seq', 'due_tail')
local stored = fields[1] or '0'
if expect ~= '0' and expect ~= stored then
  return {'generation', expect, stored}
end
local generation = tonumber(stored)

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- Replay: the key already reserved; return that reservation whatever its state now.
local field = key_field(key)
local found, existing = find_by_key(K_RES, K_IDEM, key, field)
if found then
  return replay_answer(record_id(found, existing), existing, user, qty, generation)
end

local held = tonumber(redis.call('HGET', K_HELD, user) or '0')
local available = tonumber(fields[2] or '0')
local requested = qty
local refusal
qty, refusal = acquirable(qty, held, limit, available, ARGV[9] == '1')
if not qty then
  return refusal
end
local expires_at = now + ttl
local rec = new_record(user, key, qty, requested, expires_at)
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
local seq = tonumber(fields[4] or '0') + 1
local counters = {'available', string.format('%d', available - qty),
  'reserved', string.format('%d', tonumber(fields[3] or '0') + qty), 'event_seq', string.format('%d', seq)}
if due_in_order(fields[5], expires_at) then
  redis.call('RPUSH', K_DUE, field)
  counters[#counters + 1] = 'due_tail'
  counters[#counters + 1] = string.format('%d', expires_at)
else
  due_except(K_GC, field, expires_at)
end
redis.call('HSET', K_POOL, unpack(counters))
redis.call('HINCRBY', K_HELD, user, qty)
if by_id then
  redis.call('HSET', K_IDEM, key, id)
  if keys_derived then
    redis.call('HDEL', K_POOL, 'keys')
  end
end
outbox_add(K_OUTBOX, seq, id, rec, nil, now)
outbox_trim(K_POOL, K_OUTBOX, outbox_max)

return {'reserved', id, qty, expires_at, 0, generation}
