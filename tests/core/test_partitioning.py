"""--partitioning (pgc_mpi.core.sampling): iid (today's split, bit for bit), by-label and
dirichlet:ALPHA, each a pure function of the labels, n and the seed; the one-line errors; what
config.json and the data fingerprint record, and a resume that would cut the data otherwise."""

from __future__ import annotations

import numpy as np
import pytest

from pgc_mpi.config import SimConfig, TrainConfig
from pgc_mpi.core.sampling import parse_partitioning, partition_indices
from pgc_mpi.errors import ConfigError
from pgc_mpi.learning.datasets import load_digits
from pgc_mpi.runs import run_folder


@pytest.fixture(scope="module")
def digits_labels() -> np.ndarray:
    return np.asarray(load_digits(0).read_split("train")[1])


def _covers_once(parts: list[np.ndarray], size: int) -> None:
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(size))
    assert all(len(p) > 0 and np.array_equal(p, np.sort(p)) for p in parts)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1  # equal weights in the decoded mean


def test_iid_is_today_s_split_bit_for_bit():
    for samples, n, seed in ((1437, 10, 0), (600, 12, 7), (13, 4, 2**40)):
        perm = np.random.default_rng([seed, 0x5A3D]).permutation(samples)  # the split before --partitioning
        today = [np.sort(part) for part in np.array_split(perm, n)]
        for got in (partition_indices(samples, n, seed), partition_indices(samples, n, seed, "iid"),
                    partition_indices(samples, n, seed, "iid", np.zeros(samples, np.int64))):
            assert all(np.array_equal(a, b) for a, b in zip(got, today, strict=True))


def test_by_label_gives_each_partition_one_or_two_classes(digits_labels):
    y = digits_labels
    parts = partition_indices(len(y), 10, 0, "by-label", y)
    _covers_once(parts, len(y))
    assert all(len(np.unique(y[p])) <= 2 for p in parts)
    # consecutive runs of the class order: partition j's classes come before partition j + 1's
    assert all(y[a].max() <= y[b].min() for a, b in zip(parts, parts[1:]))
    again = partition_indices(len(y), 10, 0, "by-label", y)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = partition_indices(len(y), 10, 1, "by-label", y)  # the seed orders the ties
    assert any(not np.array_equal(a, b) for a, b in zip(parts, other))


def _skew(parts: list[np.ndarray], y: np.ndarray) -> float:
    """The mean total-variation distance of each partition's class mix from the whole set's."""
    whole = np.bincount(y, minlength=10) / len(y)
    return float(np.mean([0.5 * np.abs(np.bincount(y[p], minlength=10) / len(p) - whole).sum() for p in parts]))


def test_dirichlet_is_seeded_covers_every_sample_once_and_skews_with_small_alpha(digits_labels):
    y = digits_labels
    iid = _skew(partition_indices(len(y), 10, 0, "iid"), y)
    skews = {}
    for alpha in (0.1, 0.5, 1000.0):
        parts = partition_indices(len(y), 10, 0, f"dirichlet:{alpha}", y)
        _covers_once(parts, len(y))
        again = partition_indices(len(y), 10, 0, f"dirichlet:{alpha}", y)
        assert all(np.array_equal(a, b) for a, b in zip(parts, again))
        skews[alpha] = _skew(parts, y)
    other = partition_indices(len(y), 10, 1, "dirichlet:0.5", y)
    assert any(not np.array_equal(a, b) for a, b in zip(partition_indices(len(y), 10, 0, "dirichlet:0.5", y), other))
    assert skews[1000.0] < 2 * iid + 0.02  # alpha large: close to an iid class mix
    assert skews[0.1] > 0.5 > skews[1000.0]  # alpha 0.1: most of a partition's mix is off the whole's
    assert skews[0.1] > skews[0.5] > skews[1000.0]


def test_dirichlet_with_many_partitions_and_few_classes_leaves_none_empty():
    y = np.array([0] * 50 + [1] * 3)
    for seed in range(20):
        _covers_once(partition_indices(len(y), 17, seed, "dirichlet:0.05", y), len(y))


@pytest.mark.parametrize("spec", ["random", "dirichlet", "dirichlet:0", "dirichlet:-1", "dirichlet:nan",
                                  "dirichlet:x", "by_label", 3])
def test_a_bad_spec_is_one_line(spec):
    with pytest.raises(ConfigError, match=r"^--partitioning must be iid, by-label or dirichlet:ALPHA") as err:
        parse_partitioning(spec)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="--partitioning"):
        SimConfig(workers=4, partitioning=spec)


def test_a_partitioning_by_class_needs_class_labels():
    with pytest.raises(ConfigError, match=r"^--partitioning by-label cuts .* classification data set .*"
                                          r"--problem quadratic has none: use --partitioning iid$"):
        TrainConfig(problem="quadratic", partitioning="by-label").validate(4)
    floats = np.linspace(0, 1, 20)
    with pytest.raises(ConfigError, match="needs a classification data set"):
        partition_indices(20, 4, 0, "dirichlet:1", floats)


def test_regression_data_with_by_label_is_refused_in_one_line():
    from pgc_mpi.learning.torch_problem import torch_problem

    x, y = np.zeros((20, 3), np.float32), np.linspace(0, 1, 20).astype(np.float32)
    with pytest.raises(ConfigError) as err:
        torch_problem("logreg", (x, y), workers=4, partitioning="by-label")
    assert str(err.value) == ("--partitioning by-label cuts the training data by class and needs a classification "
                              "data set (integer labels); data set 'arrays' (regression) has none: use "
                              "--partitioning iid")


def test_config_json_records_it_and_a_resume_with_another_is_refused():
    cfg = TrainConfig(partitioning="dirichlet:0.5")
    assert cfg.to_dict()["partitioning"] == "dirichlet:0.5"
    assert TrainConfig().to_dict()["partitioning"] == "iid"
    recorded = {"config": cfg.to_dict(), "workers": 4}
    assert run_folder.differences(cfg, 4, recorded) == []
    diff = run_folder.differences(TrainConfig(partitioning="by-label"), 4, recorded)
    assert diff == ["partitioning 'dirichlet:0.5' (this run: 'by-label')"]
    # and by the data fingerprint (a record before --partitioning was iid)
    data = {"train": "blake2b:aa", "test": None}
    assert run_folder.data_differences({"data_fingerprint": data}, data) == []
    assert run_folder.data_differences({"data_fingerprint": data}, {**data, "partitioning": "by-label"}) == [
        "partitioning iid (this run: by-label)"]


def test_the_fingerprint_names_a_partitioning_by_class_only():
    from pgc_mpi.learning.fingerprint import problem_fingerprint
    from pgc_mpi.learning.torch_problem import torch_problem

    x, y = np.random.default_rng(0).standard_normal((40, 4)).astype(np.float32), np.arange(40) % 4
    iid = problem_fingerprint(torch_problem("logreg", (x, y), workers=4))
    assert set(iid) == {"train", "test"}
    cut = problem_fingerprint(torch_problem("logreg", (x, y), workers=4, partitioning="by-label"))
    assert cut == {**iid, "partitioning": "by-label"}


def test_every_entry_point_takes_it(tmp_path):
    """pgc-train's flag and TOML file, pgc_mpi.fit's keyword, and pgc-bench's [train] table."""
    from pgc_mpi.commands.bench import load_experiment
    from pgc_mpi.config import config_from_args, config_from_options

    toml = tmp_path / "run.toml"
    toml.write_text('partitioning = "dirichlet:0.1"\n')
    assert config_from_args(["--partitioning", "by-label"]).partitioning == "by-label"
    assert config_from_args(["--config", str(toml)]).partitioning == "dirichlet:0.1"
    assert config_from_options({"partitioning": "by-label"}).partitioning == "by-label"
    experiment = tmp_path / "e.toml"
    experiment.write_text('workers = 4\nschemes = ["dgd"]\n[train]\npartitioning = "by-label"\n')
    assert load_experiment(experiment)["train"]["partitioning"] == "by-label"
    with pytest.raises(ConfigError, match="--partitioning"):
        config_from_options({"partitioning": "dirichlet:-2"}).validate(4)
