-- Decode-cluster upstream filter: write the decode DP rank that duet put in
-- the HEADER header into this leg's JSON body as routed_dp_rank. Only PD
-- /generate requests carry the header (SGLang ignores X-Data-Parallel-Rank
-- there); the mirrored prefill leg goes through the prefill cluster and
-- keeps the shared body. duet removed any client routed_dp_rank already.
function envoy_on_request(h)
  local rank = h:headers():get("HEADER")
  if rank == nil or string.match(rank, "^%d+$") == nil then return end
  local body = h:body()
  if body == nil then return end
  local s = body:getBytes(0, body:length())
  local i = string.find(s, "{", 1, true)
  if i == nil then return end
  local rest = string.sub(s, i + 1)
  local sep = ","
  if string.match(rest, "^%s*}") then sep = "" end
  local out = string.sub(s, 1, i) .. '"routed_dp_rank":' .. rank .. sep .. rest
  body:setBytes(out)
  h:headers():replace("content-length", tostring(#out))
end
