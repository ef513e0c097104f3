-- Add one tablet's jobs to one group's queue (PLANNER.md §6.2, §6.3), atomically.
-- ARGV: group, tablet, generation, max, now_ms, jobs JSON [{priority, nfiles, job}]
local P = 'kz:queue:'
local group, tablet, gen, max, now = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local jobs = cjson.decode(ARGV[6])
local qk, jk, ik, sk, ak = P .. group, P .. group .. ':jobs', P .. group .. ':tablets', P .. group .. ':stats', P .. group .. ':ages'
redis.call('SADD', 'kz:queue:groups', group)

local function drop_from_index(tab, member)
  local raw = redis.call('HGET', ik, tab)
  if not raw then return end
  local idx = cjson.decode(raw)
  local keep = {}
  for _, m in ipairs(idx.ids) do if m ~= member then table.insert(keep, m) end end
  if #keep == 0 then
    redis.call('HDEL', ik, tab)
    redis.call('ZREM', ak, tab)
  else
    idx.ids = keep
    redis.call('HSET', ik, tab, cjson.encode(idx))
  end
end

-- 1. remove every entry this tablet has in this queue
local old = redis.call('HGET', ik, tablet)
if old then
  local idx = cjson.decode(old)
  for _, m in ipairs(idx.ids) do
    redis.call('ZREM', qk, m)
    redis.call('HDEL', jk, m)
  end
  redis.call('HDEL', ik, tablet)
  redis.call('ZREM', ak, tablet)
end

-- 2. insert under the bound
local admitted = {}
for _, j in ipairs(jobs) do
  local prio = tonumber(j.priority)
  local inv_p = 20767 - prio
  local nf = tonumber(j.nfiles)
  if nf > 9999 then nf = 9999 end
  local ok = true
  if redis.call('ZCARD', qk) >= max then
    local last = redis.call('ZRANGE', qk, -1, -1)[1]
    local last_prio = 20767 - tonumber(string.sub(last, 1, 5))
    if prio <= last_prio then
      redis.call('HINCRBY', sk, 'rejected', 1)
      ok = false
    else
      local lj = cjson.decode(redis.call('HGET', jk, last))
      redis.call('ZREM', qk, last)
      redis.call('HDEL', jk, last)
      if lj.tablet == tablet then
        -- one of this add's own jobs: it is no longer queued, so not in the tablet's index
        for i, m in ipairs(admitted) do
          if m == last then table.remove(admitted, i); break end
        end
      else
        drop_from_index(lj.tablet, last)
      end
      redis.call('HINCRBY', sk, 'rejected', 1)
    end
  end
  if ok then
    local seq = redis.call('INCR', 'kz:queue:seq')
    local member = string.format('%05d%04d%012d', inv_p, 9999 - nf, seq)
    redis.call('ZADD', qk, 0, member)
    redis.call('HSET', jk, member, cjson.encode(j.job))
    table.insert(admitted, member)
  end
end

-- 3. index
if #admitted > 0 then
  redis.call('HSET', ik, tablet, cjson.encode({gen = gen, ids = admitted, added = now}))
  redis.call('ZADD', ak, now, tablet)
end
return #admitted
