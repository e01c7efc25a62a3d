-- trim_events.lua: forgets the outbox entries with sequence <= through_sequence (the relay
-- calls it once the broker acknowledged them), only while the pool still has the
-- generation whose events were acknowledged: a pool lost and created anew since then
-- numbers its events from 1 again, and those were not published yet.
--
-- KEYS (all share the pool's hash tag, `<prefix>{channel:item}:<name>`):
--   1 pool    hash   generation
--   2 outbox  stream the pool's events, ids `<sequence>-0`
-- ARGV:
--   1 through_sequence (decimal)
--   2 generation (decimal) of the acknowledged events
-- Returns how many entries were removed.

if (redis.call('HGET', KEYS[1], 'generation') or '0') ~= ARGV[2] then
  return 0
end
return redis.call('XTRIM', KEYS[2], 'MINID', ARGV[1] .. '-1')
