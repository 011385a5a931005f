"""The names configurations accept (models, dtypes, optimizers, data sets, deadline policies), free to
import. The schemes and their traits: pgc_mpi.core.traits."""

from __future__ import annotations

MODELS = ("logreg", "linear", "mlp", "cnn", "resnet18")
DTYPE_NAMES = ("float32", "float64")
OPTIMIZERS = ("sgd", "momentum", "nesterov", "adam", "adamw")
LR_SCHEDULES = ("constant", "cosine", "linear", "step")  # --lr-schedule (pgc_mpi.learning.optim)
AUTOCAST = ("none", "bf16", "fp16")  # --autocast: the workers' forward and backward (pgc_mpi.learning.torch_problem)
BUILTIN_DATASETS = ("digits",)
DEADLINE_POLICIES = ("wait", "partial", "fail")
DEVICE_CHOICES = ("cpu", "cuda", "auto")  # --device and --master-device (pgc_mpi.job.devices)
