#!/bin/bash
# Stop the daemons cluster-up.sh started, by their pid files. Usage: cluster-down.sh [DIR]
dir=${1:-/tmp/pgc-slurm}
export SLURM_CONF="$dir/slurm.conf"
scontrol shutdown 2>/dev/null || true
for f in "$dir/slurmctld.pid" "$dir/slurmd.pid" /run/munge/munged.pid; do
  if [ -s "$f" ]; then kill "$(cat "$f")" 2>/dev/null || true; fi
done
