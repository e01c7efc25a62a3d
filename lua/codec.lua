-- codec.lua: a reservation's record as the pool's `res` hash holds it, said once;
-- prepended by the store to every script that reads or writes records.
--
-- Compact: `<state letter><quantity>|<expires_at_ms>|<requested>|<idempotency key>|<user id>`,
-- state letters r reserved, c confirmed, x cancelled, e expired, f refunded; `requested`
-- empty unless fewer were reserved than asked (allow_partial). The user id comes last, as
-- the only field that may hold '|' (user ids are 0x21-0x7E); an idempotency key is a token
-- ([A-Za-z0-9._:-]), and one that holds '|' anyway is written as JSON.
-- A record addressed by its key (ids.lua) starts with the id's prefix and '=':
-- `<prefix>=<state letter>...`; the prefix is [A-Za-z0-9.], and a record without it holds
-- no '=' before its first '|'.
-- Records written before the compact encoding are JSON (cjson {s, q, e, u, k, r}, `p` as
-- the prefix); they are read as such, and expire.lua rewrites them compact (see there).

local RECORD_LETTER = {reserved = 'r', confirmed = 'c', cancelled = 'x', expired = 'e', refunded = 'f'}
local RECORD_STATE = {r = 'reserved', c = 'confirmed', x = 'cancelled', e = 'expired', f = 'refunded'}

-- The record `rec` ({s, q, e, u, k, r, p}) as stored.
local function record_encode(rec)
  local letter = RECORD_LETTER[rec.s]
  if not letter or string.find(rec.k, '|', 1, true) then
    return cjson.encode(rec)
  end
  local requested = ''
  if rec.r then
    requested = string.format('%d', rec.r)
  end
  local prefix = ''
  if rec.p then
    prefix = rec.p .. '='
  end
  return prefix .. letter .. string.format('%d', rec.q) .. '|' .. string.format('%d', rec.e) .. '|' .. requested .. '|' ..
    rec.k .. '|' .. rec.u
end

-- A stored record, compact or JSON, as {s, q, e, u, k, r, p} (q, e, r numbers; r nil unless
-- fewer were reserved than asked; p nil unless the record is addressed by its key).
local function record_decode(raw)
  if string.sub(raw, 1, 1) == '{' then
    return cjson.decode(raw)
  end
  local p, rest = string.match(raw, '^([^|=]*)=(.*)$')
  if p then
    raw = rest
  end
  local letter, q, e, r, k, u = string.match(raw, '^(%a)(%d+)|(%d+)|(%d*)|([^|]*)|(.*)$')
  return {s = RECORD_STATE[letter], q = tonumber(q), e = tonumber(e), u = u, k = k, r = tonumber(r), p = p}
end

-- The idempotency key of a stored record, without decoding the rest (nil for what is not a
-- record, such as a marker's value: intact.lua).
local function record_key(raw)
  if string.sub(raw, 1, 1) == '{' then
    return cjson.decode(raw).k
  end
  return string.match(raw, '^[^|]*|[^|]*|[^|]*|([^|]*)|')
end
