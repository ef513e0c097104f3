-- Remove and return the first job of a group's queue (docs/planner.md §6.4 poll), or nil.
-- ARGV: group
local refused = refuse_stale(ARGV) if refused then return refused end  -- the fencing token (lib.lua)
local raw = poll_first(queue_keys(ARGV[1]))
return raw
