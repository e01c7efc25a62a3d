-- channel.lua: coordination of the agent replicas of one channel sharing this store.
--
-- One replica at a time leads the channel: it alone registers with the center, borrows,
-- returns, reports and follows the channel's events. Every replica sells from the shared
-- pools while the channel's lease (published by the leader) runs. Followers tell the
-- leader which items want stock.
--
-- KEYS (all share the channel's hash tag, `<prefix>{channel}:<name>`):
--   1 leader  string  the leading replica's id, with a TTL (the leadership lease)
--   2 lease   string  present (with a TTL) while the channel may sell: the leader's lease
--                     with the center, minus its safety margin
--   3 wants   set     item ids that followers saw short of stock (or loaded first)
--   4 replicas zset   replica ids scored by the ms (Redis TIME) until which they are alive
-- ARGV[1] is the operation:
--   lead <replica> <ttl_ms>     claim or renew the leadership; 1 if held by <replica> now
--   resign <replica>            drop the leadership if held; 1 if it was
--   publish <replica> <ttl_ms>  set the channel's lease, only by the leader; 1 if set
--   lease_left                  ms left of the channel's lease (0: none)
--   want <item_id>              add an item to the wants
--   take_wants <max>            remove and return up to <max> wanted item ids
--   leader                      the leader's id, or false
--   present <replica> <ttl_ms>  <replica> is alive for ttl_ms; returns how many others are
--   absent <replica>            <replica> is gone; returns how many others are alive

local K_LEADER, K_LEASE, K_WANTS, K_REPLICAS = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local op = ARGV[1]

local function others_alive(replica)
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', K_REPLICAS, '-inf', now)
  local n = redis.call('ZCARD', K_REPLICAS)
  if redis.call('ZSCORE', K_REPLICAS, replica) then
    n = n - 1
  end
  return n, now
end

if op == 'lead' then
  local current = redis.call('GET', K_LEADER)
  if current == ARGV[2] then
    redis.call('PEXPIRE', K_LEADER, ARGV[3])
    return 1
  end
  if not current then
    redis.call('SET', K_LEADER, ARGV[2], 'PX', ARGV[3])
    return 1
  end
  return 0
elseif op == 'resign' then
  if redis.call('GET', K_LEADER) == ARGV[2] then
    redis.call('DEL', K_LEADER)
    return 1
  end
  return 0
elseif op == 'publish' then
  if redis.call('GET', K_LEADER) ~= ARGV[2] then
    return 0
  end
  redis.call('SET', K_LEASE, '1', 'PX', ARGV[3])
  return 1
elseif op == 'lease_left' then
  return math.max(0, redis.call('PTTL', K_LEASE))
elseif op == 'want' then
  redis.call('SADD', K_WANTS, ARGV[2])
  return 1
elseif op == 'take_wants' then
  return redis.call('SPOP', K_WANTS, ARGV[2])
elseif op == 'leader' then
  return redis.call('GET', K_LEADER)
elseif op == 'present' then
  local n, now = others_alive(ARGV[2])
  redis.call('ZADD', K_REPLICAS, now + tonumber(ARGV[3]), ARGV[2])
  return n
elseif op == 'absent' then
  redis.call('ZREM', K_REPLICAS, ARGV[2])
  local n = others_alive(ARGV[2])
  return n
end
return redis.error_reply('channel.lua: unknown operation ' .. tostring(op))
