-- idempotency_keys.lua: every idempotency key the pool remembers (each one reserved).
-- Read-only. The agent loads them when a pool sells out, so replays of keys that reserved
-- still get their reservation while other sold-out answers come from memory.
--
-- KEYS (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 res  hash  record field -> record (codec.lua, prepended), which holds its key,
--                whether the record is addressed by its key or by id (ids.lua)
-- ARGV: none
-- Returns the list of keys (bounded by the pool's reservations within the retention).

local keys = {}
for _, raw in ipairs(redis.call('HVALS', KEYS[1])) do
  -- The structure's marker (intact.lua) holds a generation: no key.
  local key = record_key(raw)
  if key then
    keys[#keys + 1] = key
  end
end
return keys
