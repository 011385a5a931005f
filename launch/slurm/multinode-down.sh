#!/bin/bash
# Stop the emulated cluster of multinode-up.sh: daemons by their recorded pids, every process
# left inside a node's namespaces, then the namespaces, links, bridge and state folder.
# Safe to run repeatedly: PGC_MN_DIR=/tmp/pgc-multinode launch/slurm/multinode-down.sh
set -u
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
. "$here/multinode-common.sh"
log() { echo "[multinode-down $(date +%T)] $*"; }
stop_pidfile() {  # TERM, wait, KILL: only the pid recorded in the file
  local file=$1 pid
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  if [ -n "$pid" ] && mn_alive "$file"; then
    kill -TERM "$pid" 2>/dev/null
    for _ in $(seq 100); do mn_alive "$file" || break; sleep 0.1; done
    mn_alive "$file" && kill -KILL "$pid" 2>/dev/null
  fi
  rm -f "$file"
}
# every process sharing a holder's mount namespace (job steps, MPI ranks): never chosen by name
kill_node_processes() {
  local holder=$1 mnt pid
  mnt=$(readlink "/proc/$holder/ns/mnt" 2>/dev/null) || return 0
  for pid in /proc/[0-9]*; do
    pid=${pid#/proc/}
    [ "$pid" != "$holder" ] && [ "$(readlink "/proc/$pid/ns/mnt" 2>/dev/null)" = "$mnt" ] && kill -KILL "$pid" 2>/dev/null
  done
}
n=$(cat "$PGC_MN_DIR/N" 2>/dev/null || echo 0)
for d in "$PGC_MN_DIR"/node*; do
  [ -d "$d" ] || continue
  i=${d##*/node}
  [ "$i" -gt "$n" ] 2>/dev/null && n=$i
done
for i in $(seq 1 "$n"); do stop_pidfile "$PGC_MN_DIR/node$i/slurmd.pid"; done
stop_pidfile "$PGC_MN_DIR/ctld/slurmctld.pid"
for i in $(seq 1 "$n"); do
  holder_file=$PGC_MN_DIR/node$i/holder.pid
  mn_alive "$holder_file" && kill_node_processes "$(cat "$holder_file")"
  stop_pidfile "$holder_file"
done
stop_pidfile "$PGC_MN_DIR/munge/munged.pid"
for i in $(seq 1 "$n"); do
  ip link del "pgcv-node$i" 2>/dev/null
  ip netns list | grep -qw "$(mn_ns "$i")" && ip netns del "$(mn_ns "$i")"
done
ip link show "$MN_BR" >/dev/null 2>&1 && ip link del "$MN_BR"
if [ -f "$PGC_MN_DIR/netns-mount-ours" ] && [ -z "$(ip netns list)" ] && mountpoint -q /run/netns; then
  umount /run/netns
  [ "$(cat "$PGC_MN_DIR/netns-mount-ours")" = dir-created ] && rmdir /run/netns 2>/dev/null
fi
rm -rf "${PGC_MN_DIR:?}"
log "done"
