"""What one worker death costs a run (docs/BENCHMARKS.md §19).

A pgc-cr run (s = 1, 3 workers, --checkpoint-every 50) whose worker 1 dies at step --die-at, per
seed, four ways:
  undisturbed  the same run without the fault (the reference: its wall time and final loss);
  today        plain `mpiexec -n 4`: MPICH ends the whole job at the death; then, at once (the
               best a requeue or a user can do), `mpiexec -n 3 ... --resume auto` on the workers left;
  local.sh     launch/local.sh 3: mpiexec -disable-auto-cleanup, the master stops with a checkpoint
               on hydra's SIGUSR1 and the script starts the run again at once on 2 workers;
  slurm        (with --slurm, inside a Slurm cluster) sbatch --wait launch/slurm/train.sbatch: srun
               --kill-on-bad-exit=0, the run goes on without the dead worker within the same start;
               its reference is the same job without the fault (slurm-undisturbed), and its wall
               time the job's own, from its log's first line to its last (1 s resolution), not
               sbatch's, whose return after the job's end varies by seconds.
Time lost is the run's wall time (launch to end, every start) minus the undisturbed run's with the
same seed; steps lost are the steps a start computed and the next one did again.

    python benchmarks/worker_death.py --seeds 0 1 2 --extra "--compute-time 0.03 --grace 5" [--slurm]

(--compute-time makes every partition gradient take 30 ms, as on a cluster's node rather than 4 ranks
on 2 cores; the end-of-run shutdown waits --grace only for workers heard from within the last
--grace seconds, so a worker that died long enough before the end costs no wait there.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MPIEXEC = str(Path(sys.executable).parent / "mpiexec")


def _summary(out: Path) -> dict:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"summary"' in x][-1]


def _steps(out: Path) -> int:
    return sum(1 for x in (out / "metrics.jsonl").read_text().splitlines() if x.startswith('{"step"'))


def run(mode: str, args: list[str], out: Path, env: dict) -> tuple[float, int]:
    """(wall seconds of every start together, steps computed twice) of one run."""
    train = [sys.executable, "-m", "pgc_mpi", "train", *args, "--out", str(out)]
    began = time.monotonic()
    lost = 0
    if mode in ("undisturbed", "today"):
        first = subprocess.run([MPIEXEC, "-n", "4", *train], env=env, capture_output=True, text=True)
        if mode == "today":
            assert first.returncode != 0, "the worker did not die"
            done = _steps(out)
            again = subprocess.run([MPIEXEC, "-n", "3", *train, "--resume", "auto"], env=env, capture_output=True,
                                   text=True)
            assert again.returncode == 0, again.stderr[-2000:]
            lost = done - json.loads((out / "config.json").read_text())["resumed_from_step"]
        else:
            assert first.returncode == 0, first.stderr[-2000:]
    elif mode == "local.sh":
        proc = subprocess.run([str(ROOT / "launch" / "local.sh"), "3", *args, "--out", str(out)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.returncode == 0, proc.stdout[-2000:]
        lost = _lost_in_log(proc.stdout)
    else:  # slurm, slurm-undisturbed
        log = Path(str(out) + ".log")
        proc = subprocess.run(["sbatch", "--wait", "-n", "4", "--time=20", "--export=ALL", "-o", str(log),
                               str(ROOT / "launch" / "slurm" / "train.sbatch"), *args, "--out", str(out)], env=env,
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr + (log.read_text()[-2000:] if log.exists() else "")
        stamps = re.findall(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) pgc: ", log.read_text(), re.MULTILINE)
        first, last = (time.mktime(time.strptime(x, "%Y-%m-%d %H:%M:%S")) for x in (stamps[0], stamps[-1]))
        assert _summary(out)["status"] == "completed" and _steps(out) == 400
        return last - first, 0
    wall = time.monotonic() - began
    assert _summary(out)["status"] == "completed" and _steps(out) == 400
    return wall, lost


def _lost_in_log(log: str) -> int:
    """Steps local.sh's first start recorded past the step its second start resumed at (its report
    says how many it did; the resume's warning where it went on)."""
    done = re.search(r"pgc-train: pgc-cr \(n=3, s=1\)[^:]*: (\d+) steps in", log)
    resumed = re.search(r"resuming at step (\d+) with 2 workers", log)
    assert done and resumed, log[-2000:]
    return int(done.group(1)) - int(resumed.group(1))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--die-at", type=int, default=200)
    p.add_argument("--extra", default="", help="more pgc-train flags for every run")
    p.add_argument("--slurm", action="store_true", help="also through train.sbatch (SLURM_CONF set, a cluster up)")
    a = p.parse_args()
    modes = ["undisturbed", "today", "local.sh"] + (["slurm-undisturbed", "slurm"] if a.slurm else [])
    env = {**os.environ, "MPIEXEC_TIMEOUT": "600", "OMP_NUM_THREADS": "1"}
    rows: dict[str, list[tuple[float, int, float]]] = {m: [] for m in modes}
    # runs go to a temporary folder: under the repository's ignored bench/ when a Slurm job must see it
    shared = ROOT / "bench" if a.slurm else None
    if shared:
        shared.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="worker-death-", dir=shared) as root:
        for seed in a.seeds:
            for mode in modes:
                args = ["--scheme", "pgc-cr", "-s", "1", "--steps", "400", "--checkpoint-every", "50",
                        "--eval-every", "50", "--seed", str(seed), *a.extra.split()]
                if "undisturbed" not in mode:
                    args += ["--fault", f"die:1@{a.die_at}"]
                out = Path(root) / f"{mode}-{seed}"
                wall, lost = run(mode, args, out, env)
                rows[mode].append((wall, lost, _summary(out)["final_train_loss"]))
                print(f"seed {seed} {mode}: {wall:.1f} s, {lost} steps lost, final train loss "
                      f"{rows[mode][-1][2]:.4f}", flush=True)
    base = rows["undisturbed"]
    losses = [r[2] for r in base]
    print(f"\nundisturbed final train loss {statistics.mean(losses):.4f} ± {statistics.stdev(losses):.4f} (sd over "
          f"seeds {a.seeds}); wall {statistics.mean(r[0] for r in base):.1f} s")
    print("| path | time lost (s), mean ± sd | steps lost, by seed | final train loss | every seed within the "
          "undisturbed mean ± 2 sd |")
    print("|---|---|---|---|---|")
    centre, spread = statistics.mean(losses), 2 * statistics.stdev(losses)
    for mode in (m for m in modes if "undisturbed" not in m):
        reference = rows["slurm-undisturbed" if mode == "slurm" else "undisturbed"]
        lost_time = [r[0] - b[0] for r, b in zip(rows[mode], reference)]
        final = [r[2] for r in rows[mode]]
        inside = all(abs(f - centre) <= spread for f in final)
        print(f"| {mode} | {statistics.mean(lost_time):.1f} ± {statistics.stdev(lost_time):.1f} | "
              f"{', '.join(str(r[1]) for r in rows[mode])} | {statistics.mean(final):.4f} ± "
              f"{statistics.stdev(final):.4f} | {'yes' if inside else 'no'} |")


if __name__ == "__main__":
    main()
