-- record.lua: a new reservation's record, prepended by the store to the acquire scripts.
--
-- The record as cjson.encode writes it (the same JSON every script
-- decodes), built by concatenation where no field needs escaping: the idempotency key is
-- a token ([A-Za-z0-9._:-]); a user id may hold '"' or '\', and then cjson encodes it.
local function reservation_json(rec)
  if string.find(rec.u, '["\\]') then
    return cjson.encode(rec)
  end
  local json = '{"s":"' .. rec.s .. '","q":' .. string.format('%d', rec.q) .. ',"e":' ..
    string.format('%d', rec.e) .. ',"u":"' .. rec.u .. '","k":"' .. rec.k .. '"'
  if rec.r then
    json = json .. ',"r":' .. string.format('%d', rec.r)
  end
  return json .. '}'
end
