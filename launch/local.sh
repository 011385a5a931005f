#!/usr/bin/env bash
# Run pgc-train on this machine: launch/local.sh WORKERS [pgc-train options...]
# One rank per worker plus the master; one thread per rank (ranks share the cores);
# each start is bounded by MPIEXEC_TIMEOUT (default one hour).
# A worker that dies does not end the run. A rank that exits (a crash in Python, os._exit): mpiexec
# -disable-auto-cleanup leaves the other ranks running and tells them with SIGUSR1, on which the
# master stops with a checkpoint (exit status 3, "stopped by SIGUSR1"); a run that ends because a
# step needs lost workers ends the same way (exit status 5). A rank killed by a signal (the OOM
# killer, a segfault): hydra ends every rank, whatever the flag (status 9 or 128+signal), and the
# newest periodic checkpoint is all there is (--checkpoint-every). Each way the run starts again
# at once from its newest checkpoint (--resume auto) on the workers that are left (one fewer per
# loss), or on fewer when the scheme does not run on that many (pgc-fr with s = 1 needs a multiple
# of c = 2: of 3 left it starts on 2 and leaves 1 out): the largest count that pgc-train's own
# checks accept (python -m pgc_mpi.commands.restart_count). When none does (gc-cr with s = 2 on 2
# workers), or the scheme is ddp (no checkpoints), it says why and exits with the run's status.
# So under this script SIGUSR1 means "a rank died": stop a run with Ctrl-C (SIGINT) or
# SIGTERM. Without --out the run goes to runs/local-<time>-<pid>.
set -uo pipefail
workers=${1:-}
if ! [[ "$workers" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: launch/local.sh WORKERS [pgc-train options...]  (WORKERS: a positive integer)" >&2
  exit 2
fi
shift
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export MPIEXEC_TIMEOUT=${MPIEXEC_TIMEOUT:-3600}
say() { echo "$(date '+%Y-%m-%d %H:%M:%S') pgc: $*" >&2; }
# The Python of the pgc-train that runs (its virtual environment's), for the restart count
python=$(dirname -- "$(command -v pgc-train || echo .)")/python
[ -x "$python" ] || python=python3
out='' scheme='' previous=''
for arg in "$@"; do  # the last --out and --scheme, as pgc-train reads them
  case $previous in --out) out=$arg ;; --scheme) scheme=$arg ;; esac
  case $arg in --out=*) out=${arg#--out=} ;; --scheme=*) scheme=${arg#--scheme=} ;; esac
  previous=$arg
done
extra=()
if [ -z "$out" ]; then out="runs/local-$(date -u +%Y%m%d-%H%M%S)-$$"; extra=(--out "$out"); fi
start_status() {  # the status of the run's newest summary if this start wrote it (its "time" >= $started)
  grep -h '"event": "summary"' "$out/metrics.jsonl" 2>/dev/null | tail -n 1 | awk -v since="$started" '
    match($0, /"time": [0-9.]+/) && substr($0, RSTART + 8, RLENGTH - 8) + 0 >= since \
      && match($0, /"status": "[^"]*"/) { print substr($0, RSTART + 11, RLENGTH - 12) }'
}
while :; do
  started=$(date +%s)
  mpiexec -disable-auto-cleanup -n $((workers + 1)) pgc-train --threads "${OMP_NUM_THREADS}" "$@" ${extra[@]+"${extra[@]}"}
  rc=$?
  status=$(start_status)  # none when a rank killed by a signal took the start down
  case "$rc:$status" in
    "3:stopped by SIGUSR1") lost=1 ;;                          # hydra's word that a rank died
    "5:workers lost: ["*) lost=$(tr -cd ',' <<<"$status" | wc -c); lost=$((lost + 1)) ;;
    *)  # a rank killed by a signal took the job down; a run with a checkpoint to go on from
      if { [ "$rc" = 9 ] || { [ "$rc" -gt 128 ] && [ "$rc" -lt 255 ]; }; } && [ -z "$status" ] && ls "$out"/checkpoints/ckpt-*.h5 >/dev/null 2>&1
      then lost=1; status="the job ended with status $rc, no summary"
      else exit "$rc"
      fi ;;
  esac
  if [ "$scheme" = ddp ] || [ $((workers - lost)) -lt 1 ]; then
    say "the run in $out lost $lost worker(s) ($status); not restarting it (ddp has no checkpoints, or no worker is left)"
    exit "$rc"
  fi
  extra=(--out "$out" --no-overwrite --resume auto)
  # The scheme may not run on every count (an FR scheme needs a multiple of c, s < n, a --fault
  # names a worker id): pgc-train's parser and checks, given the next start's options exactly
  # (a --config file's too), give the largest count of ranks that they accept, and why when it
  # is fewer than are left (its second line); or, with status 1, why none is and what to run.
  left=$((workers + 1 - lost))
  answer=$("$python" -m pgc_mpi.commands.restart_count --ranks "$left" -- \
             --threads "${OMP_NUM_THREADS}" "$@" "${extra[@]}")
  counted=$?
  case $counted in
    0) { IFS= read -r ranks; IFS= read -r why; } <<<"$answer" ;;
    1) say "the run in $out lost $lost worker(s) ($status); not restarting it: $answer"; exit "$rc" ;;
    *) ranks=$left why=''  # it could not read the options (it said why): the start's pgc-train will too
       say "the restart count could not be worked out (status $counted): starting on every rank left" ;;
  esac
  workers=$((ranks - 1))
  if [ -n "$why" ]; then  # ("3 workers left, and pgc-fr ... does not run on 3 (...): starting it again on 2, ...")
    say "the run in $out lost $lost worker(s) ($status); $why"
  else
    say "the run in $out lost $lost worker(s) ($status): starting it again at once on the $workers left"
  fi
done
