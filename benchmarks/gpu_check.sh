#!/bin/bash
# The GPU checks of pgc-mpi, in under 8 minutes, on a machine with an NVIDIA GPU: the CUDA path of
# device selection, of the models and of pgc-train end to end (tests/runtime/test_gpu.py, which skips
# without a GPU), then the worker's step time for resnet18 on the CPU and the GPU, with and
# without page-locked staging (benchmarks/gpu_check.py). Run from the project root with its
# environment active and a CUDA build of torch installed (the project's pinned torch is the CPU
# build: pip install torch==<the same version> from the CUDA wheel index your site uses).
#
#   bash benchmarks/gpu_check.sh             the checks, on a GPU machine
#   bash benchmarks/gpu_check.sh --dry-run   on any machine, in well under a minute: every import and
#                                            every step that a CPU can take, up to the first CUDA call,
#                                            and no GPU figure (CI runs it: tests/runtime/test_gpu_check.py)
#
# Why a dry run: GPU machines are rare here, so this script can rot unseen (a module moves, a function
# is renamed) and only fail on the day a GPU is found. The dry run keeps each step of the real run, in
# the same order, and swaps only what needs a GPU: no CUDA check and no GPU name, pytest collects the
# GPU tests instead of running them, and gpu_check.py --dry-run runs the cuda rows on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: bash benchmarks/gpu_check.sh [--dry-run]"
dry_run=false
if [[ $# -gt 1 ]]; then
  echo "$usage" >&2
  exit 2
elif [[ $# -eq 1 ]]; then
  case "$1" in
    --dry-run) dry_run=true ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
fi

if $dry_run; then
  echo "gpu_check: DRY RUN: nothing runs on a GPU and no GPU figure is measured"
  # torch.cuda.device_count() only counts (0 on a CPU-only build) and leaves CUDA uninitialized in
  # torch; get_device_name(0) is the real run's first CUDA call, so the dry run leaves it out
  python -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "GPUs", torch.cuda.device_count())'
else
  python -c 'import sys, torch; sys.exit(None if torch.cuda.is_available() else "gpu_check: torch sees no CUDA GPU (a CPU-only torch build, or no driver)")'
  python -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "GPUs", torch.cuda.device_count(), torch.cuda.get_device_name(0))'
fi
# --device auto is the device-selection path a worker takes (cuda:0 on a GPU machine, cpu in a dry run
# without one)
python -c 'from pgc_mpi.job.devices import cuda_aware_mpi, select_device
print("MPI CUDA-aware:", cuda_aware_mpi())
print("--device auto:", select_device("auto", "worker").describe())'
if $dry_run; then
  # collection imports the test modules and everything they import: a moved name fails here
  timeout 120 python -m pytest -qq -p no:cacheprovider --collect-only tests/runtime/test_gpu.py tests/runtime/test_devices.py
  timeout 150 python benchmarks/gpu_check.py --dry-run
  echo "gpu_check: DRY RUN passed: every import and CPU-side step ran; no GPU figure was measured"
else
  timeout 300 python -m pytest -q -p no:cacheprovider tests/runtime/test_gpu.py tests/runtime/test_devices.py
  timeout 150 python benchmarks/gpu_check.py --batch-size 64 --reps 20
fi
