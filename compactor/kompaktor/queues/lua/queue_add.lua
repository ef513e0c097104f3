-- Add jobs of many tablets to group queues (docs/planner.md §6.2, §6.3), atomically. For each
-- (group, tablet) in turn: replace the tablet's entries in that group's queue by its new jobs,
-- under the bound. One call per batch of tablets: the same result as one call per tablet in order.
-- ARGV: generation, max, now_ms, then per (group, tablet): group, tablet, n, and n times
--       priority, nfiles, input bytes, job JSON (stored as given)
-- The bound is in jobs (max) and in input bytes (K.queue_max_bytes, 0: none), whichever is hit
-- first; a job bigger than the byte bound on its own is admitted into an empty queue.
local refused = refuse_stale(ARGV) if refused then return refused end  -- the fencing token (lib.lua)
local gen, max, now = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local max_bytes = tonumber(redis.call('GET', K.queue_max_bytes) or DEFAULT_MAX_BYTES)
-- per group touched by this call: its keys, rejections to count, and while its queue is known to be
-- full and unchanged since, the priority of its last entry (a job not above it is rejected at once)
local groups = {}
-- per table touched by this call: how far one queued job moves its virtual time, from its quota
-- (QUOTA_PROP in its properties, q in (0, 1]: round(1 / q) steps; default and quota 1: one step),
-- the same as policy.tableprops.quota_step. A table that is not there (tests) has quota 1.
local steps = {}
local function step_of(tbl)
  local s = steps[tbl]
  if s then return s end
  s = 1
  local raw = redis.call('HGET', K.table(tbl), 'props')
  if raw then
    local ok, props = pcall(cjson.decode, raw)
    local q = nil
    if ok and type(props) == 'table' and props[QUOTA_PROP] ~= nil then q = tonumber(props[QUOTA_PROP]) end
    if q and q > 0 and q < 1 then s = math.min(QUOTA_STEP_MAX, math.max(1, math.floor(1 / q + 0.5))) end
  end
  steps[tbl] = s
  return s
end

local function add(group, tablet, first, n)  -- the jobs are in ARGV[first .. first + 3n - 1]
  local g = groups[group]
  if not g then
    redis.call('SADD', K.queue_groups, group)
    g = queue_keys(group)
    g.rejected, g.lowest, g.admitted = 0, nil, 0
    g.vnow = tonumber(redis.call('HGET', g.sk, 'vnow') or '0')
    groups[group] = g
  end
  local qk, jk, ik, ak = g.qk, g.jk, g.ik, g.ak
  local tbl = string.match(tablet, '^[^;]*')
  local vt = tonumber(redis.call('HGET', g.vk, tbl) or '0')
  if vt < g.vnow then vt = g.vnow end
  local step = step_of(tbl)

  -- 1. remove every entry this tablet has in this queue; its queued age (the time it was first
  --    queued) carries over to the new entries: a re-plan does not make a job young again
  local first_added = redis.call('ZSCORE', ak, tablet)
  if drop_tablet(g, tablet) > 0 then g.lowest = nil end

  -- 2. insert under the bound
  local admitted = {}
  for a = first, first + 4 * (n - 1), 4 do
    local prio, bytes = tonumber(ARGV[a]), tonumber(ARGV[a + 2])
    local ok = true
    if g.lowest and prio <= g.lowest then
      g.rejected = g.rejected + 1
      ok = false
    else
      while true do
        local count = redis.call('ZCARD', qk)
        local full = count >= max
        if not full and (max_bytes <= 0 or count == 0 or
            tonumber(redis.call('HGET', g.sk, 'bytes') or '0') + bytes <= max_bytes) then
          break
        end
        local last = redis.call('ZRANGE', qk, -1, -1)[1]
        local last_prio = PRIORITY_MAX - tonumber(string.sub(last, 1, 5))
        g.rejected = g.rejected + 1
        if prio <= last_prio then
          if full then g.lowest = last_prio end  -- the count is full: no job up to it fits
          ok = false
          break
        end
        local lj = cjson.decode(redis.call('HGET', jk, last))
        remove_member(g, last)
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
      vt = vt + step
      local member = string.format('%05d%04d%012d%012d%015d', PRIORITY_MAX - prio, 9999 - nf, vt, seq, bytes)
      redis.call('ZADD', qk, 0, member)
      redis.call('HSET', jk, member, ARGV[a + 3])
      if bytes > 0 then redis.call('HINCRBY', g.sk, 'bytes', bytes) end
      table.insert(admitted, member)
      g.lowest = nil
    end
  end

  g.admitted = g.admitted + #admitted
  if #admitted > 0 then redis.call('HSET', g.vk, tbl, vt) end
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
  i = i + 3 + 4 * n
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
