#!/bin/bash
# An emulated N-node Slurm cluster on this machine (root; Debian's slurm-wlm and munge):
#   PGC_MN_DIR=/tmp/pgc-multinode launch/slurm/multinode-up.sh [N] [CPUS]
# N nodes (default 3), each advertising CPUS CPUs (default 4: more than this machine has, so
# MPI jobs with more ranks than cores fit). Every node is a set of namespaces (see
# multinode-common.sh) running its own slurmd; one slurmctld and one munged serve them all from
# the root namespace, so sbatch/srun/sinfo work from here with SLURM_CONF=$PGC_MN_DIR/etc/slurm.conf.
# MPI between nodes goes over the bridge (TCP), within a node over its own /dev/shm.
# Stop it with multinode-down.sh (by recorded pid; removes namespaces, links and state).
set -euo pipefail
n=${1:-3}
cpus=${2:-4}
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
. "$here/multinode-common.sh"
log() { echo "[multinode-up $(date +%T)] $*"; }
for tool in ip nsenter unshare munged slurmctld slurmd sinfo; do
  command -v "$tool" >/dev/null || { echo "multinode-up: $tool is missing (apt-get install iproute2 util-linux munge slurmctld slurmd slurm-client)" >&2; exit 1; }
done
mountpoint -q /sys/fs/cgroup || { echo "multinode-up: /sys/fs/cgroup is not mounted (slurmd needs it)" >&2; exit 1; }
if [ -f "$PGC_MN_DIR/N" ] && [ "$(cat "$PGC_MN_DIR/N")" != "$n" ]; then
  echo "multinode-up: a cluster of $(cat "$PGC_MN_DIR/N") nodes is up in $PGC_MN_DIR; run multinode-down.sh first" >&2
  exit 1
fi
mkdir -p "$PGC_MN_DIR"/{etc,munge,ctld/state}
echo "$n" > "$PGC_MN_DIR/N"

{ echo "127.0.0.1 localhost"; echo "$MN_CTL_IP pgcctl"
  for i in $(seq 1 "$n"); do echo "$(mn_ip "$i") node$i"; done; } > "$PGC_MN_DIR/etc/hosts"
cat > "$SLURM_CONF" <<CONF
ClusterName=pgcmulti
SlurmctldHost=pgcctl($MN_CTL_IP)
SlurmctldPort=$MN_CTL_PORT
SlurmdPort=$MN_SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$PGC_MN_DIR/munge/munge.socket
StateSaveLocation=$PGC_MN_DIR/ctld/state
SlurmctldPidFile=$PGC_MN_DIR/ctld/slurmctld.pid
SlurmctldLogFile=$PGC_MN_DIR/ctld/slurmctld.log
SlurmdSpoolDir=$PGC_MN_DIR/%n/spool
SlurmdPidFile=$PGC_MN_DIR/%n/slurmd.pid
SlurmdLogFile=$PGC_MN_DIR/%n/slurmd.log
MpiDefault=pmi2
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_min_interval=0
InactiveLimit=0
KillWait=5
MinJobAge=60
SlurmdTimeout=60
SlurmctldTimeout=60
NodeName=DEFAULT CPUs=$cpus RealMemory=1000 State=UNKNOWN
CONF
for i in $(seq 1 "$n"); do echo "NodeName=node$i NodeAddr=$(mn_ip "$i") NodeHostname=node$i"; done >> "$SLURM_CONF"
echo "PartitionName=debug Nodes=node[1-$n] Default=YES MaxTime=INFINITE State=UP" >> "$SLURM_CONF"

# one munged for every node: its socket is a path, reachable from every network namespace
if ! mn_alive "$PGC_MN_DIR/munge/munged.pid"; then
  [ -f "$PGC_MN_DIR/etc/munge.key" ] || dd if=/dev/urandom of="$PGC_MN_DIR/etc/munge.key" bs=1 count=1024 status=none
  chown munge:munge "$PGC_MN_DIR/etc/munge.key" "$PGC_MN_DIR/munge"
  chmod 0400 "$PGC_MN_DIR/etc/munge.key"
  chmod 0700 "$PGC_MN_DIR/munge"
  # --force: munged refuses a world-writable parent (/tmp) otherwise
  runuser -u munge -- munged --force --socket="$PGC_MN_DIR/munge/munge.socket" \
    --key-file="$PGC_MN_DIR/etc/munge.key" --pid-file="$PGC_MN_DIR/munge/munged.pid" \
    --log-file="$PGC_MN_DIR/munge/munged.log" --seed-file="$PGC_MN_DIR/munge/munged.seed"
  chmod 0755 "$PGC_MN_DIR/munge"
fi

# `ip netns add` makes /run/netns a bind mount: remember whether we did, so down can undo it
if [ ! -f "$PGC_MN_DIR/netns-mount-ours" ] && ! mountpoint -q /run/netns; then
  if [ -d /run/netns ]; then echo dir-existed; else echo dir-created; fi > "$PGC_MN_DIR/netns-mount-ours"
fi
if ! ip link show "$MN_BR" >/dev/null 2>&1; then
  ip link add "$MN_BR" type bridge
  ip addr add "$MN_CTL_IP/24" dev "$MN_BR"
  ip link set "$MN_BR" up
fi

for i in $(seq 1 "$n"); do
  ns=$(mn_ns "$i")
  d=$PGC_MN_DIR/node$i
  mkdir -p "$d/spool" "$d/cgroup"
  if ! ip netns list | grep -qw "$ns"; then
    ip netns add "$ns"
    ip link add "pgcv-node$i" type veth peer name eth0 netns "$ns"
    ip link set "pgcv-node$i" master "$MN_BR" up
    ip -n "$ns" addr add "$(mn_ip "$i")/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
  fi
  if ! mn_alive "$d/holder.pid"; then
    # Not `ip netns exec`: it remounts /sys and hides /sys/fs/cgroup, without which slurmd
    # 22.05 does not start. The holder keeps the namespaces alive; daemons and jobs nsenter it.
    nsenter --net=/run/netns/"$ns" unshare --uts --ipc --mount --propagation private \
      sh -c "mount --rbind /sys/fs/cgroup $d/cgroup; mount -t sysfs pgc-sys /sys; \
             mount --move $d/cgroup /sys/fs/cgroup; hostname node$i; \
             mount -t tmpfs -o mode=1777,size=2g pgc-shm /dev/shm; mount -t tmpfs -o mode=755 pgc-run /run; \
             mount --bind $PGC_MN_DIR/etc/hosts /etc/hosts; echo \$\$ > $d/holder.pid; exec sleep infinity" \
      </dev/null >/dev/null 2>&1 &
    for _ in $(seq 50); do mn_alive "$d/holder.pid" && break; sleep 0.1; done
  fi
done

if ! mn_alive "$PGC_MN_DIR/ctld/slurmctld.pid"; then
  # its own hostname namespace: slurmctld must run on the host named in SlurmctldHost
  unshare --uts --mount --propagation private sh -c \
    "hostname pgcctl; mount --bind $PGC_MN_DIR/etc/hosts /etc/hosts; exec slurmctld -f $SLURM_CONF -i" </dev/null
  for _ in $(seq 50); do mn_alive "$PGC_MN_DIR/ctld/slurmctld.pid" && break; sleep 0.1; done
fi
for i in $(seq 1 "$n"); do
  if ! mn_alive "$PGC_MN_DIR/node$i/slurmd.pid"; then
    mn_exec "$i" env SLURM_CONF="$SLURM_CONF" slurmd -f "$SLURM_CONF" -N "node$i" </dev/null
    for _ in $(seq 50); do mn_alive "$PGC_MN_DIR/node$i/slurmd.pid" && break; sleep 0.1; done
  fi
done
idle=0
for _ in $(seq 120); do
  idle=$(sinfo -h -N -o '%N %T' 2>/dev/null | grep -c ' idle$' || true)
  [ "$idle" -ge "$n" ] && break
  sleep 0.5
done
[ "$idle" -ge "$n" ] || { echo "multinode-up: nodes not idle; see $PGC_MN_DIR/node*/slurmd.log and $PGC_MN_DIR/ctld/slurmctld.log" >&2; exit 1; }
# A fresh link's IPv6 address stays tentative for a second or two (duplicate address detection);
# an MPI job started meanwhile once failed in MPI_Init (UCX's address exchange between nodes), so
# wait until every node's addresses are settled, as a booted machine's are.
for i in $(seq 1 "$n"); do
  for _ in $(seq 100); do
    [ -z "$(mn_exec "$i" ip -6 addr show tentative)" ] && break
    sleep 0.1
  done
done
log "$n nodes up; export SLURM_CONF=$SLURM_CONF"
