#!/bin/bash
# A single-node Slurm cluster on this machine, for tests and CI (Debian's slurm-wlm, as root,
# no systemd). Usage: launch/slurm/cluster-up.sh [DIR] [CPUS]
#   DIR   state, spool, logs and slurm.conf (default /tmp/pgc-slurm)
#   CPUS  CPUs the node advertises (default 16: more than it has, so MPI jobs with more ranks
#         than cores fit; SlurmdParameters=config_overrides allows that)
# Prints the SLURM_CONF to export. Stop it with cluster-down.sh DIR.
set -euo pipefail
dir=${1:-/tmp/pgc-slurm}
cpus=${2:-16}
if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
fi
# a fresh cluster every time: jobs recovered from an earlier run's state would hold the node
rm -rf "${dir:?}"/state "${dir:?}"/spool
mkdir -p "$dir"/{state,spool,log}
install -d -o munge -g munge -m 0755 /run/munge
[ -s /etc/munge/munge.key ] || runuser -u munge -- /usr/sbin/mungekey --verbose
# munged may be on its way out (a cluster-down just now): wait until its socket answers
for _ in $(seq 1 40); do
  if [ -S /run/munge/munge.socket.2 ] && munge -n </dev/null >/dev/null 2>&1; then break; fi
  pgrep -x munged >/dev/null || runuser -u munge -- /usr/sbin/munged
  sleep 0.25
done
mem=$(( $(awk '/MemTotal/{print $2}' /proc/meminfo) * 8 / 10 / 1024 ))
cat > "$dir/slurm.conf" <<CONF
ClusterName=pgc
SlurmctldHost=localhost
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=sched_min_interval=0
MpiDefault=pmi2
SlurmdParameters=config_overrides
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
KillWait=5
MinJobAge=300
NodeName=localhost NodeAddr=127.0.0.1 CPUs=$cpus RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$dir/slurm.conf"
slurmctld -c
slurmd -N localhost
for _ in $(seq 1 60); do
  if sinfo -h -o '%T' 2>/dev/null | grep -qx idle; then
    echo "SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  sleep 0.5
done
echo "cluster-up: slurm did not come up; logs in $dir/log" >&2
tail -n 20 "$dir"/log/*.log >&2
exit 1
