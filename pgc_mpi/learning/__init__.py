"""The learning layer: the gradients and the data. Problems (synthetic and torch models), the
built-in models, the master's update (optimizer, schedule, clipping), data sets and their HDF5
layout, the user's data and plug-ins, the data's fingerprint and pbs's diagnostics. It imports the
core and the base modules, never mpi4py."""
