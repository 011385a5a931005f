#!/bin/bash
# Run a command on emulated node I: launch/slurm/multinode-exec.sh I CMD...
# (e.g. `multinode-exec.sh 2 ip link set eth0 down` takes node2 off the network)
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=/dev/null
. "$here/multinode-common.sh"
i=${1:?usage: multinode-exec.sh NODE_INDEX CMD...}
shift
mn_exec "$i" "$@"
