#!/bin/bash
# Give emulated node I a link of a given speed, each way: launch/slurm/multinode-link.sh I RATE
# (RATE as tc writes it: 1gbit, 200mbit, ...), or `multinode-link.sh I off` for the unlimited
# memory copy it is by default. Root, on the host that ran multinode-up.sh.
#
# Why: the emulated nodes talk through veth pairs, which move bytes as fast as the kernel copies
# them (1-2 GB/s on this machine's 2 cores), so a node's network is never the bottleneck that a
# parameter server's one link is on a real cluster. A token bucket (tc tbf) on both ends of node
# I's veth caps what enters the node (on the host's end) and what leaves it (on the node's eth0),
# as a full-duplex Ethernet port of that speed would. Slurm's own traffic shares the cap, as on a
# real node.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
. "$here/multinode-common.sh"
usage="usage: multinode-link.sh NODE_INDEX RATE|off (RATE like 1gbit or 200mbit)"
i=${1:?$usage}
rate=${2:?$usage}
[ -f "$PGC_MN_DIR/node$i/holder.pid" ] || { echo "multinode-link.sh: node$i is not up in $PGC_MN_DIR (run multinode-up.sh, or set PGC_MN_DIR)" >&2; exit 2; }
if [ "$rate" = off ]; then
  tc qdisc del dev "pgcv-node$i" root 2>/dev/null || true
  mn_exec "$i" tc qdisc del dev eth0 root 2>/dev/null || true
  echo "node$i: link unlimited"
  exit 0
fi
[[ $rate =~ ^[0-9]+(\.[0-9]+)?([kmg]?bit|[kmg]?bps)$ ]] || { echo "multinode-link.sh: RATE '$rate' is not a rate like 1gbit, 200mbit or 50mbps" >&2; exit 2; }
# burst: what the bucket lets through at once, 128 kB (two of the veth's 64 kB TSO segments: a
# smaller one drops every full segment). latency: the queue holds 50 ms of traffic; TCP sees a
# full queue as it would a switch's drops.
shape=(tbf rate "$rate" burst 128kb latency 50ms)
tc qdisc replace dev "pgcv-node$i" root "${shape[@]}"
mn_exec "$i" tc qdisc replace dev eth0 root "${shape[@]}"
echo "node$i: link $rate each way"
