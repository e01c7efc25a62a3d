-- record.lua: a new reservation's record, and the rules every acquire says the same way,
-- prepended by the store to the acquire scripts (acquire.lua, acquire_batch.lua), after
-- codec.lua, which stores the record.

-- A replay of key `key` whose record is `rec`: the same reservation when the user and the
-- quantity asked match (`r`, kept when fewer were reserved, else `q`), a conflict otherwise.
local function replay_answer(id, rec, user, qty, generation)
  if rec.u == user and tonumber(rec.r or rec.q) == qty then
    return {'reserved', id, tonumber(rec.q), tonumber(rec.e), 1, generation}
  end
  return {'conflict'}
end

-- How many of `qty` asked a user holding `held` of `limit` may reserve from `available`:
-- all or nothing, or with `partial` min(qty, room, available) when that is positive.
-- Returns the quantity, or nil and the answer that refuses it ({'limit', held} when the
-- allowance has no room, {'sold_out', available} when the pool has too few).
local function acquirable(qty, held, limit, available, partial)
  local room = limit - held
  if room < 0 then room = 0 end
  if partial then
    qty = math.min(qty, room, available)
  end
  if room == 0 or (not partial and qty > room) then
    return nil, {'limit', held}
  end
  if qty == 0 or available < qty then
    return nil, {'sold_out', available}
  end
  return qty
end

-- A new reservation's record (`r` = the quantity asked, only when fewer were reserved).
local function new_record(user, key, qty, requested, expires_at)
  local rec = {s = 'reserved', q = qty, e = expires_at, u = user, k = key}
  if requested ~= qty then
    rec.r = requested
  end
  return rec
end
