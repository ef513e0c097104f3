"""Local mode: `kompaktor up` and `kompaktor demo`, the system on one machine."""

#: where `kompaktor up` serves the status page when the port is free (here, where the CLI's help
#: reads it without importing the local cluster)
UP_STATUS_PORT = 8090
