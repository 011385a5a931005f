#!/bin/bash
# Shared by multinode-up.sh, multinode-down.sh, multinode-exec.sh and multinode-rsh (sourced).
# An emulated node I is a set of Linux namespaces held open by one "holder" process: network
# (netns pgc-nodeI, 10.78.0.I on the bridge pgcbr0), hostname (nodeI), IPC, and mount (a
# private /dev/shm and /run; /etc/hosts from the cluster's state). /tmp and the rest of the
# file system are shared, as a cluster's shared file system would be.
# The state folder: PGC_MN_DIR (default /tmp/pgc-multinode).
# shellcheck disable=SC2034  # the variables are for the scripts that source this file
PGC_MN_DIR=${PGC_MN_DIR:-/tmp/pgc-multinode}
MN_NET=${PGC_MN_NET:-10.78.0}   # a private /24, used only on our bridge and namespaces
MN_CTL_IP=$MN_NET.254           # the bridge's address in the root namespace: slurmctld's
MN_BR=pgcbr0
MN_CTL_PORT=16827               # not Slurm's defaults: a single-node test cluster can run beside it
MN_SLURMD_PORT=16828
export SLURM_CONF=$PGC_MN_DIR/etc/slurm.conf

mn_ns() { echo "pgc-node$1"; }
mn_ip() { echo "$MN_NET.$1"; }
# mn_exec I CMD...: run CMD inside node I's namespaces
mn_exec() {
  local i=$1 holder
  shift
  holder=$(cat "$PGC_MN_DIR/node$i/holder.pid")
  nsenter -t "$holder" -n -u -i -m -- "$@"
}
# mn_alive PIDFILE: the process exists and is not a zombie (orphans are reaped late here)
mn_alive() {
  local state
  [ -f "$1" ] && state=$(sed -E 's/^[0-9]+ \(.*\) (.).*/\1/' "/proc/$(cat "$1" 2>/dev/null)/stat" 2>/dev/null) && [ "$state" != Z ]
}
