"""The runs layer: what a run writes and how it is read back. Metrics and the message log, the
checkpoints, the run folder and its lock, the results and statistics, the callbacks, the workers'
delays and the probes pgc-advise reads. It imports the configuration and the layers below, never
mpi4py."""
