-- One Redis command on the queues' keys, fenced like every queue script. ARGV: the command.
local refused = refuse_stale(ARGV) if refused then return refused end  -- the fencing token (lib.lua)
return redis.call(unpack(ARGV))
