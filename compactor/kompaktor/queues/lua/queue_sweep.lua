-- Remove, in one group's queue, the entries of tablets stamped below a generation (§6.5), or of
-- the listed tablets when ARGV[3] is a JSON list (tablets that left the system).
-- ARGV: group, generation, tablets JSON or ''
local refused = refuse_stale(ARGV) if refused then return refused end  -- the fencing token (lib.lua)
local g, gen = queue_keys(ARGV[1]), tonumber(ARGV[2])
local removed = 0
if ARGV[3] ~= '' then
  for _, tab in ipairs(cjson.decode(ARGV[3])) do removed = removed + drop_tablet(g, tab) end
else
  local all = redis.call('HGETALL', g.ik)
  for i = 1, #all, 2 do
    if cjson.decode(all[i + 1]).gen < gen then removed = removed + drop_tablet(g, all[i]) end
  end
end
return removed
