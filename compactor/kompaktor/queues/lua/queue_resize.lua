-- Set the queue bound and evict last entries of every queue until each fits (§6.3 resize).
-- ARGV: new max
local refused = refuse_stale(ARGV) if refused then return refused end  -- the fencing token (lib.lua)
local max = tonumber(ARGV[1])
redis.call('SET', K.queue_max, max)
local evicted = 0
for _, group in ipairs(redis.call('SMEMBERS', K.queue_groups)) do
  local g = queue_keys(group)
  while redis.call('ZCARD', g.qk) > max do
    take_entry(g, redis.call('ZRANGE', g.qk, -1, -1)[1])
    redis.call('HINCRBY', g.sk, 'rejected', 1)
    evicted = evicted + 1
  end
end
return evicted
