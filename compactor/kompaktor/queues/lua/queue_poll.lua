-- Remove and return the first job of a group's queue (docs/planner.md §6.4 poll), or nil.
-- ARGV: group
local g = queue_keys(ARGV[1])
local first = redis.call('ZRANGE', g.qk, 0, 0)[1]
if not first then return nil end
redis.call('HINCRBY', g.sk, 'dequeued', 1)
-- the group's virtual time moves to the entry served: a table that was idle starts from here
local vt = entry_vt(first)
if vt and vt > tonumber(redis.call('HGET', g.sk, 'vnow') or '0') then redis.call('HSET', g.sk, 'vnow', vt) end
return take_entry(g, first)
