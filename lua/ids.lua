-- ids.lua: where a reservation's record is in the pool's `res` hash, and its id, said
-- once; prepended by the store (after codec.lua) to every script that reads or writes
-- records.
--
-- A new reservation's record is addressed by its idempotency key: the field is '=' .. h,
-- h the first 24 hex digits of SHA-1(key) (96 bits: the record keeps its key, and one
-- whose key differs is no record of this key, so a clash needs a second preimage). No
-- per-reservation index from key to id is kept. The acquire scripts get the id's prefix,
-- <segment tag> .. 'k' .. 8 hex digits of randomness (so a key reused after its record
-- was forgotten gets another id: order sinks dedupe by id), and the id is prefix .. h.
-- The record keeps the prefix (codec.lua's `p`), so a script holding only the field (the
-- due list, gc's members) rebuilds the id, and a lookup by id checks it: an id with the
-- right h and another prefix names no reservation.
--
-- A pool written before (the pool hash without `keys` = 'derived') may still hold records
-- addressed by their id, each with its entry key -> id in `idem`; so may any pool an
-- acquire gave an id of its own (not a prefix: what the store's callers did before),
-- which clears the flag. Lookups by key fall back to `idem` until the sweeper finds
-- `idem` holding its marker alone and sets the flag again (expire.lua); refill.lua sets
-- it on a new pool. '=' is outside the charset of ids and keys at the API
-- ([A-Za-z0-9._:-]), so a derived field is never such an id.

local KEYED = '='
local HEX8 = string.rep('[0-9a-f]', 8)
-- The own part of a derived id (after its segment tag): 'k', 8 + 24 hex digits.
local KEYED_ID = 'k' .. HEX8 .. string.rep('[0-9a-f]', 24) .. '$'

-- The field of key `key`'s record in a pool that derives it.
local function key_field(key)
  return KEYED .. string.sub(redis.sha1hex(key), 1, 24)
end

-- Whether acquire's new id is a prefix to complete (<tag>k<8 hex>, the tag 's<segment>.'
-- or none) rather than an id of the caller's own.
local function is_id_prefix(new_id)
  return string.find(new_id, '^k' .. HEX8 .. '$') ~= nil or string.find(new_id, '^s[1-9]%d*%.k' .. HEX8 .. '$') ~= nil
end

-- The id of the record `rec` stored at `field`.
local function record_id(field, rec)
  if rec.p then
    return rec.p .. string.sub(field, #KEYED + 1)
  end
  return field
end

-- Reservation `id`'s field and decoded record, or nil when the pool has none.
local function find_by_id(k_res, id)
  if #id >= 33 and string.find(id, KEYED_ID) then
    local field = KEYED .. string.sub(id, -24)
    local raw = redis.call('HGET', k_res, field)
    local rec = raw and record_decode(raw)
    if rec and rec.p and rec.p == string.sub(id, 1, -25) then
      return field, rec
    end
    if keys_derived then
      return nil
    end
  end
  local raw = redis.call('HGET', k_res, id)
  if raw then
    return id, record_decode(raw)
  end
  return nil
end

-- Key `key`'s field and decoded record, or nil when the pool has none; `field` is
-- key_field(key).
local function find_by_key(k_res, k_idem, key, field)
  local raw = redis.call('HGET', k_res, field)
  local rec = raw and record_decode(raw)
  if rec and rec.p and rec.k == key then
    return field, rec
  end
  if not keys_derived then
    local id = redis.call('HGET', k_idem, key)
    raw = id and redis.call('HGET', k_res, id)
    if raw then
      return id, record_decode(raw)
    end
  end
  return nil
end
