#!/bin/bash
# Submit a whole comparison study: the job array of an experiment file's runs, then the gather
# step once they have all ended. Usage:
#   launch/slurm/submit-sweep.sh EXPERIMENT.toml OUT_DIR [extra sbatch options for the array...]
# The array's tasks get workers+1 tasks each (from the experiment file) unless you pass -n.
# With SUBMIT_WAIT=1 it waits for the gather step and exits with its status.
set -euo pipefail
exp=${1:?usage: submit-sweep.sh EXPERIMENT.toml OUT_DIR [sbatch options...]}
out=${2:?usage: submit-sweep.sh EXPERIMENT.toml OUT_DIR [sbatch options...]}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
count=$(pgc-bench "$exp" --count)
if [ "$count" -lt 1 ]; then echo "submit-sweep: $exp has no runnable combination" >&2; exit 2; fi
ranks=$(python -c "import sys; from pgc_mpi.commands.bench import load_experiment; print(load_experiment(sys.argv[1])['workers'] + 1)" "$exp")
mkdir -p "$out"
array=$(sbatch --parsable -n "$ranks" --array=0-$((count - 1)) \
  --export=ALL,PGC_EXPERIMENT="$exp",PGC_OUT="$out" --output="$out/slurm-%A_%a.out" "$@" "$here/sweep.sbatch")
gather=$(sbatch --parsable --dependency=afterany:"${array%%;*}" \
  --export=ALL,PGC_EXPERIMENT="$exp",PGC_OUT="$out" --output="$out/slurm-gather-%j.out" "$here/gather.sbatch")
gather=${gather%%;*}
echo "array job ${array%%;*} ($count runs), gather job $gather; results in $out/results.md"
if [ "${SUBMIT_WAIT:-0}" = 1 ]; then
  # look every 2 s (sbatch --wait backs off to 32 s between looks); a minute of failed looks ends it
  failed=0
  while sleep 2; do
    if ! job=$(scontrol -o show job "$gather" 2>&1); then
      failed=$((failed + 1))
      if [ "$failed" -ge 30 ]; then echo "submit-sweep: cannot see gather job $gather: $job" >&2; exit 1; fi
      continue
    fi
    failed=0
    state=$(grep -o 'JobState=[A-Z_]*' <<<"$job" | cut -d= -f2 || true)
    case $state in PENDING | CONFIGURING | RUNNING | COMPLETING | REQUEUED | RESIZING | SUSPENDED) ;; *) break ;; esac
  done
  code=$(grep -o 'ExitCode=[0-9]*:[0-9]*' <<<"$job" | cut -d= -f2 || true)
  echo "gather job $gather: $state (exit status ${code%%:*})"
  [ "$state" = COMPLETED ] && [ "${code%%:*}" = 0 ]
fi
