"""The runtime layer: the step loop and its wire over MPI. The servers' loop (`master`, `following`,
`servers`) and the workers' (`worker`), the messages between them (`transport`, `links`, `tags`),
the signs of life and lost workers (`heartbeat`, `lost`), --abandon-late and --drop-compute auto
(`abandon`, `drop_threshold`), when to evaluate, checkpoint and stop (`control`, `signals`) and the
ddp baseline (`ddp`). The job around the loop (pgc-train, pgc_mpi.fit) is pgc_mpi.job, above it."""
