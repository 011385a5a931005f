#!/bin/bash
# Stop the daemons cluster-up.sh started, by their pid files, and wait until they are gone
# (a slurmctld still saving its state would race a cluster-up.sh that wipes it).
# Usage: cluster-down.sh [DIR]
dir=${1:-/tmp/pgc-slurm}
export SLURM_CONF="$dir/slurm.conf"
scontrol shutdown 2>/dev/null || true
pids=()
for f in "$dir/slurmctld.pid" "$dir/slurmd.pid" /run/munge/munged.pid; do
  if [ -s "$f" ]; then
    pid=$(cat "$f")
    kill "$pid" 2>/dev/null && pids+=("$pid")
  fi
done
for _ in $(seq 1 100); do  # up to 10 s, then force
  alive=0
  for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
  [ "$alive" = 0 ] && exit 0
  sleep 0.1
done
for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
