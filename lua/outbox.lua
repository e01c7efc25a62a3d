-- outbox.lua: the pool's outbox, prepended by the store to every script that changes a
-- reservation's state, so each writes its events in the same atomic call as the change.
--
-- The outbox is a stream `<prefix>{channel:item}:outbox` (the pool's hash tag) with one
-- entry per event under the explicit id `<sequence>-0`. The last sequence is the pool
-- hash's `event_seq`, raised in the same call, so the events are numbered without gaps.
-- Past `max` entries the oldest are dropped here (a sale never fails on the outbox) and
-- counted in the pool hash's `events_dropped`.
--
-- Entry fields: r reservation_id, k idempotency_key, u user_id, q quantity, s state,
-- p previous state ('' for the event that created the reservation), t Redis TIME in ms.
--
-- A script with one event calls outbox_emit. A script with many (acquire_batch.lua) reads
-- `event_seq` once, calls outbox_add per event with the next sequence, writes `event_seq`
-- back once and calls outbox_trim once at the end: trimming once to `max` drops the same
-- oldest entries as trimming after every event would.

local function outbox_add(k_outbox, seq, id, rec, previous, now)
  pool_wrote()
  redis.call('XADD', k_outbox, string.format('%d-0', seq), 'r', id, 'k', rec.k, 'u', rec.u,
    'q', string.format('%d', rec.q), 's', rec.s, 'p', previous or '', 't', string.format('%d', now))
end

local function outbox_trim(k_pool, k_outbox, max)
  if redis.call('XLEN', k_outbox) > max then
    local dropped = redis.call('XTRIM', k_outbox, 'MAXLEN', max)
    redis.call('HINCRBY', k_pool, 'events_dropped', dropped)
  end
end

local function outbox_emit(k_pool, k_outbox, max, id, rec, previous, now)
  outbox_add(k_outbox, redis.call('HINCRBY', k_pool, 'event_seq', 1), id, rec, previous, now)
  outbox_trim(k_pool, k_outbox, max)
end
