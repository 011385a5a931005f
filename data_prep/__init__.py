"""Converters that turn data sets into pgc-mpi's HDF5 layout (`python -m data_prep --help`)."""
