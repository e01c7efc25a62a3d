-- release.lua: "a reserved reservation goes back to available", said once; prepended by
-- the store (after outbox.lua) to the scripts that change reservation states. cancel.lua,
-- expire.lua and the expired branches of confirm.lua and extend.lua call it.
--
-- k: the pool's keys {pool, res, due, held, gc, outbox}; rec: the decoded record stored
-- at `field` (ids.lua), in state 'reserved'; to: 'cancelled' | 'expired'. Its units leave
-- reserved for available, the user's allowance is freed, it leaves the exceptions (due.lua), is
-- forgotten after `retention` ms, and its event (previous state 'reserved') is written.
-- Returns the units put back.
local function release_reserved(k, field, rec, to, now, retention, outbox_max)
  local qty = tonumber(rec.q)
  rec.s = to
  due_forget(k, field)
  redis.call('ZADD', k.gc, now + retention, 'r:' .. field)
  redis.call('HINCRBY', k.pool, 'reserved', -qty)
  redis.call('HINCRBY', k.pool, 'available', qty)
  if redis.call('HINCRBY', k.held, rec.u, -qty) <= 0 then
    redis.call('HDEL', k.held, rec.u)
  end
  redis.call('HSET', k.res, field, record_encode(rec))
  outbox_emit(k.pool, k.outbox, outbox_max, record_id(field, rec), rec, 'reserved', now)
  return qty
end
