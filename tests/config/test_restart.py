"""The worker count a run that lost workers starts again on (pgc_mpi.config.restart): the largest
count, at most the workers left, that pgc-train's own checks accept, or none with why and what to
run instead. The launch scripts' use of it, end to end, is in tests/runtime/test_faults_mpiexec.py."""

from __future__ import annotations

import pytest

from pgc_mpi.config import config_from_args
from pgc_mpi.config.restart import restart_count


def count(available: int, *options: str) -> int | None:
    return restart_count(config_from_args(list(options)), available).workers


@pytest.mark.parametrize(("options", "available", "expected"), [
    (["--scheme", "pgc-fr", "-s", "1"], 3, 2),  # c = s + 1 = 2 must divide n
    (["--scheme", "pgc-fr", "-s", "1"], 4, 4),
    (["--scheme", "gc-fr", "-s", "2"], 8, 6),  # c = 3
    (["--scheme", "is-gc-fr", "-s", "1"], 5, 4),  # c = 2 (IS_GC_DEFAULT_C)
    (["--scheme", "is-gc-fr", "-s", "1", "--c", "3"], 5, 3),
    (["--scheme", "is-gc-cr", "-s", "1", "--c", "3"], 2, None),  # c <= n, and only 1 < 3 below it
    (["--scheme", "gc-cr", "-s", "2"], 3, 3),
    (["--scheme", "gc-cr", "-s", "2"], 2, None),  # s < n
    (["--scheme", "pgc-cr", "-s", "1"], 2, 2),
    (["--scheme", "dgd"], 3, 3),
    (["--scheme", "dgd"], 1, None),  # s = 1 by default, and s < n
    (["--scheme", "dgd", "-s", "0"], 1, 1),
    (["--scheme", "pbs", "-s", "1"], 3, 3),
    (["--scheme", "pbs", "-s", "1", "--replication", "3"], 2, None),  # every partition on 3 workers
    (["--scheme", "pgc-fr", "-s", "1", "--servers", "2"], 3, 2),
    (["--scheme", "pgc-cr", "-s", "1", "--fault", "nan:2@5"], 3, 3),
    (["--scheme", "pgc-cr", "-s", "1", "--fault", "nan:2@5"], 2, None),  # a --fault naming worker 2
    (["--scheme", "pgc-cr", "--delay", "fixed:3:0.5"], 3, None),  # a --delay naming worker 3
])
def test_the_largest_count_the_options_accept(options, available, expected):
    assert count(available, *options) == expected


def test_why_fewer_says_how_many_are_left_the_reason_and_how_many_are_left_out():
    answer = restart_count(config_from_args(["--scheme", "pgc-fr", "-s", "1"]), 3)
    assert answer.workers == 2
    assert answer.why.startswith("3 workers left, and pgc-fr with s = 1 does not run on 3 (pgc-fr needs n divisible "
                                 "by c = 2")
    assert answer.why.endswith(": starting it again on 2, leaving 1 out")
    assert "\n" not in answer.why
    assert restart_count(config_from_args(["--scheme", "pgc-fr", "-s", "1"]), 4).why == ""  # all of them fit


def test_no_count_says_why_and_what_to_run_instead():
    answer = restart_count(config_from_args(["--scheme", "gc-cr", "-s", "2", "--out", "runs/x", "--resume",
                                             "auto"]), 2)
    assert answer.workers is None and "\n" not in answer.why
    assert answer.why.startswith("2 workers left and gc-cr with s = 2 runs on none of 1..2 (on 2: s must be smaller "
                                 "than n")
    assert answer.why.endswith("resume it on 3 workers (4 ranks), the fewest above 2 that it runs on: the same "
                               "options with --resume auto --out runs/x")
    # one reason that no count changes is said once, and there is no count to suggest
    bad = restart_count(config_from_args(["--scheme", "pgc-cr", "--betas", "2,2"]), 3)
    assert bad.workers is None and bad.why.count("--betas must be") == 1
    assert bad.why.endswith("change the options that every count refuses, then resume the run (--resume auto)")


def test_no_worker_left_and_ddp_are_never_started_again():
    assert "no worker is left" in restart_count(config_from_args(["--scheme", "pgc-cr"]), 0).why
    ddp = restart_count(config_from_args(["--scheme", "ddp"]), 3)
    assert ddp.workers is None and "no checkpoints" in ddp.why


def test_a_config_file_counts_as_pgc_train_reads_it_flags_over_it(tmp_path):
    toml = tmp_path / "run.toml"
    toml.write_text('scheme = "pgc-fr"\nstragglers = 2\n')  # c = 3
    assert count(5, "--config", str(toml)) == 3
    assert count(5, "--config", str(toml), "-s", "1") == 4  # the flag wins, as in pgc-train
