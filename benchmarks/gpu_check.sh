#!/bin/bash
# The GPU checks of pgc-mpi, in under 8 minutes, on a machine with an NVIDIA GPU: the CUDA path of
# device selection, of the models and of pgc-train end to end (tests/runtime/test_gpu.py, which skips
# without a GPU), then the worker's step time for resnet18 on the CPU and the GPU, with and
# without page-locked staging (benchmarks/gpu_check.py). Run from the project root with its
# environment active and a CUDA build of torch installed (the project's pinned torch is the CPU
# build: pip install torch==<the same version> from the CUDA wheel index your site uses).
set -euo pipefail
cd "$(dirname "$0")/.."
python -c 'import sys, torch; sys.exit(None if torch.cuda.is_available() else "gpu_check: torch sees no CUDA GPU (a CPU-only torch build, or no driver)")'
python -c 'import torch; print("torch", torch.__version__, "CUDA", torch.version.cuda, "GPUs", torch.cuda.device_count(), torch.cuda.get_device_name(0))'
python -c 'from pgc_mpi.devices import cuda_aware_mpi; print("MPI CUDA-aware:", cuda_aware_mpi())'
timeout 300 python -m pytest -q -p no:cacheprovider tests/runtime/test_gpu.py tests/runtime/test_devices.py
timeout 150 python benchmarks/gpu_check.py --batch-size 64 --reps 20
