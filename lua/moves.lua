-- moves.lua: the intents of moves between the segments of one channel's pool of an item.
-- A move takes units from one segment (`take_for_return.lua`, keyed by the move id) and
-- refills another (`refill.lua`, the same id). The intent is written before the take and
-- deleted after the refill, so whoever reads the pool next (a restarted agent, a resync)
-- finishes a move a crash interrupted by replaying both steps, each once per id.
--
-- KEYS (segment 0's hash tag, `<prefix>{channel:item}:<name>`):
--   1 moves  hash  move_id -> "<from> <to> <quantity>"
-- ARGV:
--   1 op: "record" | "list" | "clear"
--   2 move_id (record, clear)
--   3 "<from> <to> <quantity>" (record)
-- Returns: record, clear: 1; list: a flat array move_id, intent, move_id, intent, ...

local op = ARGV[1]
if op == 'record' then
  redis.call('HSET', KEYS[1], ARGV[2], ARGV[3])
  return 1
elseif op == 'clear' then
  redis.call('HDEL', KEYS[1], ARGV[2])
  return 1
elseif op == 'list' then
  return redis.call('HGETALL', KEYS[1])
end
return redis.error_reply('unknown op ' .. tostring(op))
