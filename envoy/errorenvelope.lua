-- Connection-manager filter: give an engine's JSON error the OpenAI error
-- envelope, {"error":{"message","type","code"}}, that duet's and Envoy's own
-- errors have. SGLang answers errors on its OpenAI routes as
-- {"object":"error","message":...} and FastAPI's as {"detail":"..."}.
-- Only error statuses with a JSON body are touched (and buffered, they are
-- small); a body that already is an envelope, or has no string message,
-- passes unchanged. Streams are never buffered: their status is 200.

-- jsonString returns the JSON string token (quotes and escapes kept) that
-- follows key and a colon in s, or nil.
local function jsonString(s, key)
  local i = string.find(s, key, 1, true)
  if i == nil then return nil end
  local j = string.find(s, "^%s*:%s*\"", i + #key)
  if j == nil then return nil end
  local start = string.find(s, "\"", j, true)
  local k = start + 1
  while k <= #s do
    local c = string.sub(s, k, k)
    if c == "\\" then
      k = k + 2
    elseif c == "\"" then
      return string.sub(s, start, k)
    else
      k = k + 1
    end
  end
  return nil
end

function envoy_on_response(h)
  local status = tonumber(h:headers():get(":status"))
  if status == nil or status < 400 then return end
  local ct = h:headers():get("content-type") or ""
  if string.find(ct, "application/json", 1, true) == nil then return end
  local body = h:body()
  if body == nil or body:length() == 0 then return end
  local s = body:getBytes(0, body:length())
  if string.find(s, "^%s*{%s*\"error\"%s*:%s*{") then return end
  local msg = jsonString(s, "\"message\"") or jsonString(s, "\"detail\"")
  if msg == nil then return end
  local typ = "invalid_request_error"
  if status >= 500 then typ = "server_error" end
  local out = "{\"error\":{\"message\":" .. msg .. ",\"type\":\"" .. typ .. "\",\"code\":" .. status .. "}}"
  body:setBytes(out)
  h:headers():replace("content-length", tostring(#out))
end
