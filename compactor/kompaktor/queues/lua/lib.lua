-- Shared by every queue function (the preamble of a library, after the key names K from
-- keyspace.py; kompaktor/redisfunctions.py).

-- ARGV[1] of every queue function is the caller's fencing token ('' = none: a compactor, a tool).
-- A coordinator's call is refused, nothing written, once a newer coordinator has taken over (a
-- higher token in K.fence). The token is removed here: the function's own arguments start at
-- ARGV[1]. Each function begins with
--   local refused = refuse_stale(ARGV) if refused then return refused end
local function refuse_stale(ARGV)
  local token = table.remove(ARGV, 1)
  if token ~= '' and tonumber(redis.call('GET', K.fence) or '0') > tonumber(token) then
    return redis.error_reply('FENCED fencing token ' .. token .. ' is stale: a newer coordinator leads')
  end
  return nil
end

-- The keys of one group's queue: the ordered entries, their jobs, the per-tablet index
-- ({gen, ids, added}), the statistics and the tablets' queued ages.
local function queue_keys(group)
  return {qk = K.queue(group), jk = K.queue_jobs(group), ik = K.queue_index(group), sk = K.queue_stats(group),
          ak = K.queue_ages(group), vk = K.queue_vt(group)}
end

-- An entry's sort key: inverted priority (5 digits), inverted file count (4), then the virtual
-- time of its table (12) and the insertion sequence (12). Within one priority and file count,
-- entries go by virtual time: start-time fair queuing by table, so one table's burst cannot hold
-- another table's jobs behind it (each table's jobs get 1, 2, 3, ... from the group's current
-- virtual time on; the tables' jobs interleave), and FIFO within a table.
local function entry_vt(member)
  return tonumber(string.sub(member, 10, 21))
end

-- The bytes of input an entry's job reads: the member's last 15 digits, after the sort key (the
-- group's total is the 'bytes' field of its statistics, kept by every insert and removal).
local function entry_bytes(member)
  return tonumber(string.sub(member, 34)) or 0
end

local function remove_member(g, member)
  redis.call('ZREM', g.qk, member)
  redis.call('HDEL', g.jk, member)
  local b = entry_bytes(member)
  if b > 0 then redis.call('HINCRBY', g.sk, 'bytes', -b) end
end

-- Remove one member from its tablet's index entry; the entry goes when it has no member left.
-- Returns the time (ms) the tablet was first queued (the index's 'added'), or nil.
local function drop_from_index(g, tab, member)
  local raw = redis.call('HGET', g.ik, tab)
  if not raw then return nil end
  local idx = cjson.decode(raw)
  local keep = {}
  for _, m in ipairs(idx.ids) do if m ~= member then table.insert(keep, m) end end
  if #keep == 0 then
    redis.call('HDEL', g.ik, tab)
    redis.call('ZREM', g.ak, tab)
  else
    idx.ids = keep
    redis.call('HSET', g.ik, tab, cjson.encode(idx))
  end
  return idx.added
end

-- Remove every entry of a tablet (and its index entry); returns how many entries went.
local function drop_tablet(g, tab)
  local raw = redis.call('HGET', g.ik, tab)
  if not raw then return 0 end
  local idx = cjson.decode(raw)
  for _, m in ipairs(idx.ids) do remove_member(g, m) end
  redis.call('HDEL', g.ik, tab)
  redis.call('ZREM', g.ak, tab)
  return #idx.ids
end

-- Remove one entry (a member of the sorted set) and return its job's JSON.
local function take_entry(g, member)
  local raw = redis.call('HGET', g.jk, member)
  remove_member(g, member)
  if raw then drop_from_index(g, cjson.decode(raw).tablet, member) end
  return raw
end

-- Poll (docs/planner.md §6.4): remove the first entry of a group's queue and return its job's JSON,
-- the job decoded, true and the time (ms) its tablet was first queued (nil if unknown); nil, nil,
-- false when the queue is empty (an entry whose job is missing is removed all the same: nil, nil, true).
local function poll_first(g)
  -- every member's score is 0: the lowest is the first in lexicographic order (ZRANGE 0 0)
  local first = redis.call('ZPOPMIN', g.qk)[1]
  if not first then return nil, nil, false end
  -- the statistics in one read and one write: dequeued + 1, the entry's bytes out, and the group's
  -- virtual time moved to the entry served (a table that was idle starts from here)
  local st = redis.call('HMGET', g.sk, 'dequeued', 'vnow', 'bytes')
  local upd = {'HSET', g.sk, 'dequeued', (tonumber(st[1]) or 0) + 1}
  local vt = entry_vt(first)
  if vt and vt > (tonumber(st[2]) or 0) then
    upd[#upd + 1] = 'vnow'
    upd[#upd + 1] = vt
  end
  local b = entry_bytes(first)
  if b > 0 then
    upd[#upd + 1] = 'bytes'
    upd[#upd + 1] = (tonumber(st[3]) or 0) - b
  end
  redis.call(unpack(upd))
  local raw = redis.call('HGET', g.jk, first)
  redis.call('HDEL', g.jk, first)
  local job, added = nil, nil
  if raw then
    job = cjson.decode(raw)
    added = drop_from_index(g, job.tablet, first)
  end
  return raw, job, true, added
end
