"""The scheme core, pure NumPy with no MPI, torch or h5py: the schemes and their traits, the data's
placement, encoding and decoding, pbs's table, the master's per-step rules (`collector`), the
message layout and wire formats, the delay and fault models, and the plain records and rules the
MPI runtime and the simulator share. It imports only the base modules (pgc_mpi.errors, choices)."""
