-- Failed jobs (metadata/failures.py), each operation one atomic step.
-- ARGV[1] = the caller's fencing token ('' = none: a compactor), ARGV[2] = operation.
--   record  ARGV[3] fingerprint, ARGV[4] JSON {tablet, group, files, last_error}, ARGV[5] now (s),
--           ARGV[6] base backoff (s), ARGV[7] max backoff (s), ARGV[8] max attempts
--           -> {count, 1 if dead-lettered else 0}
--   redirty ARGV[3] now (s) -> tablet ids whose backoff has passed, now marked dirty (once each)
if ARGV[1] ~= '' and tonumber(redis.call('GET', K.fence) or '0') > tonumber(ARGV[1]) then
  return redis.error_reply('FENCED fencing token ' .. ARGV[1] .. ' is stale')
end
local op = ARGV[2]
if op == 'record' then
  local fp, now = ARGV[3], tonumber(ARGV[5])
  local base, maxb, attempts = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
  local raw = redis.call('HGET', K.failures, fp)
  local prev = 0
  if raw then prev = cjson.decode(raw).count or 0 end
  local rec = cjson.decode(ARGV[4])
  rec.count = prev + 1
  rec.retry_at = now + math.min(maxb, base * 2 ^ prev)
  rec.redirtied = false
  if rec.count >= attempts then
    redis.call('HSET', K.deadletter, fp, cjson.encode(rec))
    redis.call('HDEL', K.failures, fp)
    redis.call('HINCRBY', K.counters, 'dead_lettered', 1)
    return {rec.count, 1}
  end
  redis.call('HSET', K.failures, fp, cjson.encode(rec))
  return {rec.count, 0}
elseif op == 'redirty' then
  local now = tonumber(ARGV[3])
  local due = {}
  local all = redis.call('HGETALL', K.failures)
  for i = 1, #all, 2 do
    local rec = cjson.decode(all[i + 1])
    if rec.retry_at <= now and not rec.redirtied then
      rec.redirtied = true
      redis.call('HSET', K.failures, all[i], cjson.encode(rec))
      redis.call('SADD', K.dirty, rec.tablet)
      table.insert(due, rec.tablet)
    end
  end
  return due
end
return redis.error_reply('unknown failures operation ' .. tostring(op))
