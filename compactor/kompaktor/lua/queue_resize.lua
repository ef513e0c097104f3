-- Set the queue bound and evict last entries of every queue until each fits (§6.3 resize).
-- ARGV: new max
local max = tonumber(ARGV[1])
redis.call('SET', 'kz:queue:max', max)
local evicted = 0
for _, group in ipairs(redis.call('SMEMBERS', 'kz:queue:groups')) do
  local P = 'kz:queue:' .. group
  while redis.call('ZCARD', P) > max do
    local last = redis.call('ZRANGE', P, -1, -1)[1]
    local job = cjson.decode(redis.call('HGET', P .. ':jobs', last))
    redis.call('ZREM', P, last)
    redis.call('HDEL', P .. ':jobs', last)
    redis.call('HINCRBY', P .. ':stats', 'rejected', 1)
    local raw = redis.call('HGET', P .. ':tablets', job.tablet)
    if raw then
      local idx = cjson.decode(raw)
      local keep = {}
      for _, m in ipairs(idx.ids) do if m ~= last then table.insert(keep, m) end end
      if #keep == 0 then
        redis.call('HDEL', P .. ':tablets', job.tablet)
        redis.call('ZREM', P .. ':ages', job.tablet)
      else
        idx.ids = keep
        redis.call('HSET', P .. ':tablets', job.tablet, cjson.encode(idx))
      end
    end
    evicted = evicted + 1
  end
end
return evicted
