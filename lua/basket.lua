-- basket.lua: the recorded intents of one channel's baskets (see inventory_core::basket).
--
-- An intent is opaque here (a JSON document the agent writes); this script only keeps its
-- version for compare-and-set, when it was written, and the index of open intents.
--
-- KEYS (all share the channel's hash tag, `<prefix>{channel}:<name>`):
--   1 basket  hash  `<prefix>{channel}:basket:<basket_id>`: v (version), body, at (ms,
--                   Redis TIME); expires ttl_ms after its last write
--   2 open    zset  `<prefix>{channel}:baskets:open`: ids of open intents (pending or
--                   releasing) scored by `at`
-- ARGV[1] is the operation:
--   get                                 -> {v, body, at, now}; v = 0 when there is none
--   put <id> <expected_v> <body> <open> <ttl_ms>
--                                       -> {1, v, now} written with version v, or
--                                          {0, v, body, at, now}: the stored version was
--                                          not expected_v (v = 0: none); nothing written
--   open <max>                          -> up to max open ids, least recently written first
--                                          (KEYS[1] unused)

local K_BASKET, K_OPEN = KEYS[1], KEYS[2]
local op = ARGV[1]

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local function current()
  local f = redis.call('HMGET', K_BASKET, 'v', 'body', 'at')
  if not f[1] then
    return 0, '', 0
  end
  return tonumber(f[1]), f[2], tonumber(f[3])
end

if op == 'get' then
  local v, body, at = current()
  return {v, body, at, now}
elseif op == 'put' then
  local id, expected, body, open, ttl = ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], tonumber(ARGV[6])
  local v, old, at = current()
  if v ~= expected then
    return {0, v, old, at, now}
  end
  v = v + 1
  redis.call('HSET', K_BASKET, 'v', v, 'body', body, 'at', now)
  redis.call('PEXPIRE', K_BASKET, ttl)
  if open == '1' then
    redis.call('ZADD', K_OPEN, now, id)
  else
    redis.call('ZREM', K_OPEN, id)
  end
  return {1, v, now}
elseif op == 'open' then
  return redis.call('ZRANGE', K_OPEN, 0, tonumber(ARGV[2]) - 1)
end
return redis.error_reply('basket.lua: unknown operation ' .. tostring(op))
