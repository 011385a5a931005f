"""The names configurations accept (models, dtypes, optimizers, data sets, deadline policies), free to import."""

from __future__ import annotations

MODELS = ("logreg", "linear", "mlp", "cnn", "resnet18")
DTYPE_NAMES = ("float32", "float64")
OPTIMIZERS = ("sgd", "momentum", "adam")
BUILTIN_DATASETS = ("digits",)
DEADLINE_POLICIES = ("wait", "partial", "fail")
