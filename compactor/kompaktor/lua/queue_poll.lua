-- Remove and return the first job of a group's queue (PLANNER.md §6.4 poll), or nil.
-- ARGV: group
local P = 'kz:queue:'
local group = ARGV[1]
local qk, jk, ik, sk, ak = P .. group, P .. group .. ':jobs', P .. group .. ':tablets', P .. group .. ':stats', P .. group .. ':ages'
local first = redis.call('ZRANGE', qk, 0, 0)[1]
if not first then return nil end
local raw = redis.call('HGET', jk, first)
redis.call('ZREM', qk, first)
redis.call('HDEL', jk, first)
redis.call('HINCRBY', sk, 'dequeued', 1)
local job = cjson.decode(raw)
local iraw = redis.call('HGET', ik, job.tablet)
if iraw then
  local idx = cjson.decode(iraw)
  local keep = {}
  for _, m in ipairs(idx.ids) do if m ~= first then table.insert(keep, m) end end
  if #keep == 0 then
    redis.call('HDEL', ik, job.tablet)
    redis.call('ZREM', ak, job.tablet)
  else
    idx.ids = keep
    redis.call('HSET', ik, job.tablet, cjson.encode(idx))
  end
end
return raw
