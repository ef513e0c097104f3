-- Add jobs of many tablets to group queues (docs/planner.md §6.2, §6.3), atomically. For each
-- (group, tablet) in turn: replace the tablet's entries in that group's queue by its new jobs,
-- under the bound. One call per batch of tablets: the same result as one call per tablet in order.
-- ARGV: generation, max, now_ms, then per (group, tablet): group, tablet, n, and n times
--       priority, nfiles, job JSON (stored as given)
local gen, max, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
-- per group touched by this call: its keys, rejections to count, and while its queue is known to be
-- full and unchanged since, the priority of its last entry (a job not above it is rejected at once)
local groups = {}

local function add(group, tablet, first, n)  -- the jobs are in ARGV[first .. first + 3n - 1]
  local g = groups[group]
  if not g then
    redis.call('SADD', K.queue_groups, group)
    g = queue_keys(group)
    g.rejected, g.lowest, g.admitted = 0, nil, 0
    groups[group] = g
  end
  local qk, jk, ik, ak = g.qk, g.jk, g.ik, g.ak

  -- 1. remove every entry this tablet has in this queue; its queued age (the time it was first
  --    queued) carries over to the new entries: a re-plan does not make a job young again
  local first_added = redis.call('ZSCORE', ak, tablet)
  if drop_tablet(g, tablet) > 0 then g.lowest = nil end

  -- 2. insert under the bound
  local admitted = {}
  for a = first, first + 3 * (n - 1), 3 do
    local prio = tonumber(ARGV[a])
    local ok = true
    if g.lowest and prio <= g.lowest then
      g.rejected = g.rejected + 1
      ok = false
    elseif redis.call('ZCARD', qk) >= max then
      local last = redis.call('ZRANGE', qk, -1, -1)[1]
      local last_prio = PRIORITY_MAX - tonumber(string.sub(last, 1, 5))
      g.rejected = g.rejected + 1
      if prio <= last_prio then
        g.lowest = last_prio
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
          drop_from_index(g, lj.tablet, last)
        end
      end
    end
    if ok then
      local nf = tonumber(ARGV[a + 1])
      if nf > 9999 then nf = 9999 end
      local seq = redis.call('INCR', K.queue_seq)
      local member = string.format('%05d%04d%012d', PRIORITY_MAX - prio, 9999 - nf, seq)
      redis.call('ZADD', qk, 0, member)
      redis.call('HSET', jk, member, ARGV[a + 2])
      table.insert(admitted, member)
      g.lowest = nil
    end
  end

  g.admitted = g.admitted + #admitted
  -- 3. index
  if #admitted > 0 then
    local added = now
    if first_added and tonumber(first_added) < now then added = tonumber(first_added) end
    redis.call('HSET', ik, tablet, cjson.encode({gen = gen, ids = admitted, added = added}))
    redis.call('ZADD', ak, added, tablet)
  end
  return #admitted
end

local total, i = 0, 4
while i <= #ARGV do
  local n = tonumber(ARGV[i + 2])
  total = total + add(ARGV[i], ARGV[i + 1], i + 3, n)
  i = i + 3 + 3 * n
end
for group, g in pairs(groups) do
  if g.rejected > 0 then redis.call('HINCRBY', g.sk, 'rejected', g.rejected) end
  if g.admitted > 0 then
    -- wake idle compactors: a token per job queued (at most WAKE_MAX), short-lived (an idle
    -- system keeps none); each idle compactor's BLPOP takes one and it reserves at once
    local wk = K.wake(group)
    local tokens = {}
    for _ = 1, math.min(g.admitted, WAKE_MAX) do table.insert(tokens, '1') end
    redis.call('LPUSH', wk, unpack(tokens))
    redis.call('LTRIM', wk, 0, WAKE_MAX - 1)
    redis.call('PEXPIRE', wk, WAKE_TTL_MS)
  end
end
return total
