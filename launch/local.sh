#!/usr/bin/env bash
# Run pgc-train on this machine: launch/local.sh WORKERS [pgc-train options...]
# One rank per worker plus the master; one thread per rank (ranks share the cores);
# the whole job is bounded by MPIEXEC_TIMEOUT (default one hour).
set -euo pipefail
workers=${1:-}
if ! [[ "$workers" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: launch/local.sh WORKERS [pgc-train options...]  (WORKERS: a positive integer)" >&2
  exit 2
fi
shift
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-3600}
exec mpiexec -n $((workers + 1)) pgc-train --threads "${OMP_NUM_THREADS}" "$@"
