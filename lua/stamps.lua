-- stamps.lua: each pool's stamp, its generation and write sequence, from its pool hash
-- alone. No structure's marker is checked: a quiet heartbeat reads a pool whole (with
-- snapshot.lua, which checks them all) only when its stamp moved, or when its last whole
-- read is older than a bound (core::channel::quiet). Read-only.
--
-- KEYS: the pool hashes (all on one server; on a Redis Cluster one pool a call).
-- Returns, per pool in the order of KEYS, {generation, wseq, behind}, each 0 when absent:
-- `behind` is intact.lua's mark of a pool found below a caller's floor (a lost pool).

local out = {}
for i = 1, #KEYS do
  local v = redis.call('HMGET', KEYS[i], 'generation', 'wseq', 'behind')
  out[i] = {tonumber(v[1] or '0'), tonumber(v[2] or '0'), tonumber(v[3] or '0')}
end
return out
