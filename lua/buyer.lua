-- buyer.lua: one buyer's claims on a global-limit item, in the buyer registry (the twin of
-- `core::buyers::Buyer`). One hash per (item, user), so a Redis Cluster spreads buyers.
--
-- KEYS:
--   1 claims  hash  idempotency_key -> cjson {q = quantity, c = channel, s = 'pending' |
--                   'held' | 'confirmed', d = deadline_ms (pending) or expires_at_ms (held),
--                   r = reservation_id, and for a partial claim that got less than asked:
--                   a = asked, g = granted}; `<prefix>{<item>:<user>}:claims`
-- ARGV[1] is the operation, then its arguments:
--   claim   key, channel, quantity, limit, pending_ms, partial ('1': claim what the
--           allowance has left when the quantity would pass it) ->
--           {'claimed', replayed (0|1)} | {'partial', replayed (0|1), granted} |
--           {'limit', held} | {'conflict'}
--   bind    key, reservation_id, quantity, expires_at_ms -> 1 | 0
--   confirm key, reservation_id -> 1 | 0
--   release key -> units freed
--   settle  key, found (0|1), reservation_id, state, quantity, expires_at_ms ->
--           {'untouched'} | {'held'} | {'confirmed'} | {'released', units} | {'waiting'}
--   due     channel ('' for all) -> the keys of the channel's claims due for the sweeper now
--   count   channel -> how many claims the buyer has in the channel
--   open    channel -> how many of them are not confirmed (the sweeper's to watch)
-- Time comes from Redis TIME only.

local K = KEYS[1]
local op = ARGV[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function get(key)
  local raw = redis.call('HGET', K, key)
  if raw then return cjson.decode(raw) end
  return nil
end

local function put(key, c)
  redis.call('HSET', K, key, cjson.encode(c))
end

local function is_due(c)
  return c.s ~= 'confirmed' and tonumber(c.d) <= now
end

local function release(key)
  local c = get(key)
  if not c then return 0 end
  redis.call('HDEL', K, key)
  return tonumber(c.q)
end

if op == 'claim' then
  local key, channel, qty, limit, pending = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local partial = ARGV[7] == '1'
  local c = get(key)
  if c then
    if c.c == channel and (tonumber(c.a or c.q) == qty or c.s ~= 'pending') then
      if c.g then return {'partial', 1, tonumber(c.g)} end
      return {'claimed', 1}
    end
    return {'conflict'}
  end
  local held = 0
  local all = redis.call('HVALS', K)
  for i = 1, #all do
    held = held + tonumber(cjson.decode(all[i]).q)
  end
  local room = limit - held
  if qty <= room then
    put(key, {q = qty, c = channel, s = 'pending', d = now + pending, r = ''})
    return {'claimed', 0}
  end
  if not partial or room <= 0 then
    return {'limit', held}
  end
  put(key, {q = room, c = channel, s = 'pending', d = now + pending, r = '', a = qty, g = room})
  return {'partial', 0, room}
elseif op == 'bind' then
  local key, rid, qty, expires = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
  local c = get(key)
  if not c then return 0 end
  if c.s ~= 'pending' then
    if c.r == rid then return 1 end
    return 0
  end
  c.q = math.min(tonumber(c.q), qty)
  c.s, c.r, c.d = 'held', rid, expires
  put(key, c)
  return 1
elseif op == 'confirm' then
  local key, rid = ARGV[2], ARGV[3]
  local c = get(key)
  if not c then return 0 end
  if c.s ~= 'pending' and c.r ~= rid then return 0 end
  c.s, c.r = 'confirmed', rid
  put(key, c)
  return 1
elseif op == 'release' then
  return release(ARGV[2])
elseif op == 'settle' then
  local key = ARGV[2]
  local c = get(key)
  if not c or not is_due(c) then return {'untouched'} end
  if ARGV[3] ~= '1' then
    return {'released', release(key)}
  end
  local rid, state, qty, expires = ARGV[4], ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7])
  if state == 'reserved' then
    if expires > now then
      c.q = math.min(tonumber(c.q), qty)
      c.s, c.r, c.d = 'held', rid, expires
      put(key, c)
      return {'held'}
    end
    return {'waiting'}
  elseif state == 'confirmed' then
    c.q = math.min(tonumber(c.q), qty)
    c.s, c.r = 'confirmed', rid
    put(key, c)
    return {'confirmed'}
  end
  return {'released', release(key)}
elseif op == 'due' or op == 'count' or op == 'open' then
  local channel = ARGV[2] or ''
  local out, n = {}, 0
  local all = redis.call('HGETALL', K)
  for i = 1, #all, 2 do
    local c = cjson.decode(all[i + 1])
    if (channel == '' or c.c == channel) and (op ~= 'open' or c.s ~= 'confirmed') then
      n = n + 1
      if is_due(c) then
        out[#out + 1] = all[i]
      end
    end
  end
  if op == 'count' or op == 'open' then return n end
  return out
end
return redis.error_reply('buyer.lua: unknown operation ' .. tostring(op))
