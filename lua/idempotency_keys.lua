-- idempotency_keys.lua: every idempotency key the pool remembers (each one reserved).
-- Read-only. The agent loads them when a pool sells out, so replays of keys that reserved
-- still get their reservation while other sold-out answers come from memory.
--
-- KEYS (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 res  hash  record field -> record (codec.lua, prepended), which holds its key
--                (whether addressed by its key or by id, ids.lua)
-- ARGV: none
-- Returns the list of keys (bounded by the pool's reservations within the retention).

local keys = {}
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  -- The structure's marker (intact.lua) is not a record.
  if string.sub(all[i], 1, 1) ~= ' ' then
    keys[#keys + 1] = record_decode(all[i + 1]).k
  end
end
return keys
