-- fence.lua: raises the pool's fence to the caller's center epoch (never lowers it).
--
-- A channel's new incarnation (a new registration, possibly by another replica sharing
-- this store) fences each pool before it reads it to resync with the center. From then
-- on refill, take_for_return and untake carrying an older epoch are refused, so a call
-- begun by the previous incarnation can no longer move units the resync has counted.
--
-- KEYS (shares the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 fence  string  the highest epoch seen
-- ARGV:
--   1 epoch
-- Returns the fence found before the call: at or above the caller's epoch, that epoch was
-- handed out before (a center whose ledger went back in time), and the caller registers
-- again above it.

local K_FENCE = KEYS[1]
local epoch = tonumber(ARGV[1])
local current = tonumber(redis.call('GET', K_FENCE) or '0')
if epoch > current then
  redis.call('SET', K_FENCE, epoch)
end
return current
