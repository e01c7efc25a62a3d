-- idempotency_keys.lua: every idempotency key the pool remembers (each one reserved).
-- Read-only. The agent loads them when a pool sells out, so replays of keys that reserved
-- still get their reservation while other sold-out answers come from memory.
--
-- KEYS (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 idem  hash  idempotency_key -> reservation_id
-- ARGV: none
-- Returns the list of keys (bounded by the pool's reservations within the retention).

local keys = {}
for _, k in ipairs(redis.call('HKEYS', KEYS[1])) do
  -- The structure's marker (intact.lua) is not a key.
  if string.sub(k, 1, 1) ~= ' ' then
    keys[#keys + 1] = k
  end
end
return keys
