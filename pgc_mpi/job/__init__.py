"""The job layer: one training job around the step loop, above pgc_mpi.runtime. `pgc-train`'s
console entry (`entry`) and pgc_mpi.fit (`fitting`, with the user's recipe objects: `recipe`), the
job every rank runs (`train`: its start-up in `startup`, each rank's part in `roles`), rank 0's
run outputs (`outputs`, `provenance`), the start-up checks every rank takes part in (`checks`),
the devices (`devices`) and the clean-up of MPICH's start-up segments (`shm`). It imports the
runtime and the layers below; the runtime never imports it."""
