-- trim_events.lua: forgets the outbox entries with sequence <= through_sequence (the relay
-- calls it once the broker acknowledged them).
--
-- KEYS (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 outbox  stream the pool's events, ids `<sequence>-0`
-- ARGV:
--   1 through_sequence (decimal)
-- Returns how many entries were removed.

return redis.call('XTRIM', KEYS[1], 'MINID', ARGV[1] .. '-1')
