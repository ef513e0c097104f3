-- Remove, in one group's queue, the entries of tablets stamped below a generation (§6.5), or of
-- the listed tablets when ARGV[3] is a JSON list (tablets that left the system).
-- ARGV: group, generation, tablets JSON or ''
local P = 'kz:queue:'
local group, gen = ARGV[1], tonumber(ARGV[2])
local qk, jk, ik, ak = P .. group, P .. group .. ':jobs', P .. group .. ':tablets', P .. group .. ':ages'
local removed = 0
local function drop(tab, raw)
  local idx = cjson.decode(raw)
  for _, m in ipairs(idx.ids) do
    redis.call('ZREM', qk, m)
    redis.call('HDEL', jk, m)
    removed = removed + 1
  end
  redis.call('HDEL', ik, tab)
  redis.call('ZREM', ak, tab)
end
if ARGV[3] ~= '' then
  for _, tab in ipairs(cjson.decode(ARGV[3])) do
    local raw = redis.call('HGET', ik, tab)
    if raw then drop(tab, raw) end
  end
else
  local all = redis.call('HGETALL', ik)
  for i = 1, #all, 2 do
    local idx = cjson.decode(all[i + 1])
    if idx.gen < gen then drop(all[i], all[i + 1]) end
  end
end
return removed
