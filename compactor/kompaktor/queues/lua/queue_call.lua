-- One Redis command on the queues' keys, fenced like every queue script. ARGV: the command.
return redis.call(unpack(ARGV))
