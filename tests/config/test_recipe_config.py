"""The recipe's options (CoreConfig, TrainConfig): every bad value is one line naming the option."""

from __future__ import annotations

import pytest

from pgc_mpi.config import config_from_args
from pgc_mpi.errors import ConfigError


@pytest.mark.parametrize("flags,message", [
    (["--clip-grad-norm", "0"], "--clip-grad-norm must be a number > 0"),
    (["--accumulate", "0"], "--accumulate must be a positive integer"),
    (["--autocast", "fp16"], "--autocast fp16 needs --device cuda"),
    (["--lr-schedule", "step"], "--lr-schedule step needs --lr-milestones"),
    (["--optimizer", "rmsprop"], "--optimizer 'rmsprop' is not one of"),
    (["--early-stop", "test_accuracy"], "--early-stop"),
    (["--betas", "0.9"], "--betas must be two numbers"),
    (["--scheduler", "x.py:f", "--lr-schedule", "cosine"], "both set the learning rate"),
    (["--adapt", "--scheme", "pbs", "--warmup-steps", "5"], "both set the"),
    (["--servers", "2", "--clip-grad-norm", "1"], "--clip-grad-norm with --servers 2"),
    (["--accumulate", "2", "--problem", "quadratic"], "--accumulate 2 averages micro-batches of --batch-size"),
])
def test_bad_recipes_are_refused_in_one_line(flags, message):
    with pytest.raises(ConfigError) as caught:
        config_from_args(flags).validate(4)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_good_recipe_passes_and_reaches_config_json():
    cfg = config_from_args(["--optimizer", "adamw", "--betas", "0.9,0.95", "--lr-schedule", "step", "--lr-milestones",
                            "10,20", "--clip-grad-norm", "1", "--accumulate", "2", "--autocast", "bf16",
                            "--early-stop", "test_accuracy:3", "--keep-best", "test_accuracy"])
    cfg.validate(4)
    saved = cfg.to_dict()
    assert saved["betas"] == "0.9,0.95" and saved["lr_milestones"] == "10,20" and saved["accumulate"] == 2
