"""Time to a target loss where the parameter server's link is the bottleneck: narrow messages
(--wire-dtype) and a sharded master (--servers K), real training, several seeds.

On the emulated cluster (root: the script shapes every node's link, and unshapes it at the end):

    launch/slurm/multinode-up.sh 4 8 && export SLURM_CONF=/tmp/pgc-multinode/etc/slurm.conf
    python benchmarks/slow_link.py --rate 100mbit --seeds 0 1 2 3 4 --target-loss 0.6 --out bench/slow-link -- \\
        --dataset data/fashion-mnist.h5 --model mlp --scheme pgc-cr -s 1 --steps 150 --lr 0.3 --eval-every 10

On a real cluster, inside an allocation of 2 + W nodes (salloc -N 4), without --rate.

Every variant (--variants, servers:wire pairs; the first is the reference) runs pgc-train once per
seed under srun with the same placement: server k alone on node k+1 for k < the largest K (a
variant with fewer servers leaves the rest idle), --workers-per-node workers on each remaining
node. So the variants of one seed differ only in what crosses the links, and their runs pair.
Printed, one markdown row per variant (means over the seeds with 95% confidence intervals): MB
into server 0 per step, the median step, the steps to the target, the wall time to the first evaluation at or below
--target-loss (training time: evaluations left out), that time paired seed by seed against the
reference's, the final test accuracy, and how many runs reached the target.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from pgc_mpi.core.wire import WIRE_DTYPES
from pgc_mpi.runs.results import run_completed, summarize_run
from pgc_mpi.runs.stats import interval

# a start that fails or hangs before the first step is started again: on the emulated cluster
# Slurm's pmi2 plugin now and then misreads MPICH's start-up exchange (docs/clusters.md, Across nodes; in
# the runs of docs/BENCHMARKS.md §16, 0 of 20 starts once and 9 of 15 another time); a real
# cluster may lose a node at start
START_ATTEMPTS = 3
LINK_SCRIPT = Path(__file__).resolve().parent.parent / "launch" / "slurm" / "multinode-link.sh"


def cluster_nodes() -> list[str]:
    """The allocation's nodes (SLURM_JOB_NODELIST), else every node the cluster has (sinfo)."""
    if os.environ.get("SLURM_JOB_NODELIST"):
        cmd = ["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]]
    else:
        cmd = ["sinfo", "-h", "-N", "-o", "%N"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=30).stdout.split()
    return sorted(set(out), key=out.index)


def parse_variant(text: str) -> tuple[int, str]:
    """'2:bfloat16' -> (2, 'bfloat16')."""
    servers, _, wire = text.partition(":")
    if not servers.isdigit() or int(servers) < 1 or wire not in WIRE_DTYPES:
        raise argparse.ArgumentTypeError(f"variant {text!r} is not SERVERS:WIRE, e.g. 1:float32 or 2:bfloat16 "
                                         f"(wire formats: {', '.join(WIRE_DTYPES)})")
    return int(servers), wire


def shape_links(nodes: int, rate: str) -> None:
    """Every emulated node's link at `rate` each way (launch/slurm/multinode-link.sh), or unlimited ('off')."""
    for i in range(1, nodes + 1):
        subprocess.run([str(LINK_SCRIPT), str(i), rate], check=True, timeout=60, stdout=subprocess.DEVNULL)


def run(args: argparse.Namespace, nodes: list[str], servers: int, wire: str, seed: int, out: Path) -> None:
    """One pgc-train run under srun: servers 0..servers-1 on the first nodes, the workers after the
    largest variant's servers."""
    spare = max(k for k, _ in args.variants)
    hosts = nodes[:servers] + [n for n in nodes[spare:] for _ in range(args.workers_per_node)]
    hostfile = out.with_suffix(".hosts")
    hostfile.write_text("\n".join(hosts) + "\n")
    name = f"slow-link-{out.name}"  # the job name: a hung start is cancelled by it
    cmd = ["srun", "--mpi=pmi2", "--job-name", name,
           "-N", str(len(set(hosts))), "-n", str(len(hosts)), "--distribution=arbitrary",
           "-t", str(max(1, args.timeout // 60) + 1), sys.executable, "-m", "pgc_mpi", "train", *args.train_args,
           "--servers", str(servers), "--wire-dtype", wire, "--seed", str(seed), "--overwrite", "--out", str(out)]
    env = {**os.environ, "SLURM_HOSTFILE": str(hostfile), "OMP_NUM_THREADS": "1"}
    log = out.with_suffix(".log")
    for attempt in range(1, START_ATTEMPTS + 1):
        code = _run_once(cmd, env, log, out, name, args)
        if code == 0:
            return
        if trained(out) or attempt == START_ATTEMPTS:  # trained and then failed: no start-up failure to retry
            break
        kept = log.rename(log.with_name(f"{log.name}.failed{attempt}"))
        print(f"slow_link.py: {out.name} failed before its first step ({code}; start {attempt} of "
              f"{START_ATTEMPTS}), output in {kept}", file=sys.stderr)
    raise SystemExit(f"slow_link.py: the run {out.name} failed ({code}); its output: {log}")


def _run_once(cmd: list[str], env: dict, log: Path, out: Path, name: str, args: argparse.Namespace) -> int | str:
    """One srun of the run (job `name`, writing to `out`): its exit status, or why it was cancelled
    (no first step within --start-timeout: hung in MPI_Init; or longer than --timeout)."""
    began, started = time.monotonic(), False
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, env=env, stdout=sink, stderr=subprocess.STDOUT)
        while proc.poll() is None:
            waited = time.monotonic() - began
            started = started or (waited > args.start_timeout and trained(out))  # read no more once it has
            why = ("no first step after --start-timeout" if waited > args.start_timeout and not started
                   else "longer than --timeout" if waited > args.timeout else None)
            if why:
                subprocess.run(["scancel", "--name", name], timeout=30)
                proc.wait(timeout=120)
                return why
            time.sleep(1)
    return proc.returncode


def trained(out: Path) -> bool:
    """Whether the run in `out` has written a step record."""
    metrics = out / "metrics.jsonl"
    if not metrics.is_file():
        return False
    whole = metrics.read_text().split("\n")[:-1]  # the lines written so far, not one being written
    return any("event" not in json.loads(line) for line in whole if line.strip())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", type=parse_variant, nargs="+",
                   default=[(1, "float32"), (1, "bfloat16"), (2, "float32"), (2, "bfloat16")],
                   help="SERVERS:WIRE pairs; the first is the reference of the paired ratios")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--target-loss", type=float, required=True, help="the evaluated training loss to reach")
    p.add_argument("--workers-per-node", type=int, default=2)
    p.add_argument("--rate", help="shape every emulated node's link to this rate each way (e.g. 100mbit): root, "
                                  "on the emulated cluster's host only")
    p.add_argument("--timeout", type=int, default=600, help="seconds one run may take")
    p.add_argument("--start-timeout", type=int, default=120,
                   help="seconds a run may take to its first step before it counts as hung at start")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--reuse", action="store_true", help="keep the runs in --out that completed; run only the others")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)  # after --: pgc-train's own arguments
    args = p.parse_args(argv[:split])
    args.train_args = argv[split + 1:]
    nodes = cluster_nodes()
    spare = max(k for k, _ in args.variants)
    if len(nodes) <= spare:
        raise SystemExit(f"slow_link.py: {len(nodes)} nodes leave none for the workers after {spare} servers; "
                         f"use {spare + 1} or more nodes")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.rate:
        shape_links(len(nodes), args.rate)
    try:
        for seed in args.seeds:
            for servers, wire in args.variants:
                folder = args.out / f"k{servers}-{wire}-seed{seed}"
                if not (args.reuse and run_completed(folder)):
                    run(args, nodes, servers, wire, seed, folder)
    finally:
        if args.rate:
            shape_links(len(nodes), "off")
    summaries = {v: [summarize_run(args.out / f"k{v[0]}-{v[1]}-seed{seed}", args.target_loss) for seed in args.seeds]
                 for v in args.variants}
    workers = (len(nodes) - spare) * args.workers_per_node
    print(f"{workers} workers on {len(nodes) - spare} nodes, servers alone on the first {spare}; links "
          f"{args.rate or 'as they are'}; pgc-train {' '.join(args.train_args)}; seeds {args.seeds}; target training "
          f"loss {args.target_loss}; 95% CIs over seeds\n")
    print("| servers | wire | MB into server 0 per step | median step (ms) | steps to target | time to target (s) "
          "| time / reference's (paired) | final test accuracy | runs reaching the target |")
    print("|---|---|---|---|---|---|---|---|---|")
    reference = [s.time_to_target for s in summaries[args.variants[0]]]
    for (servers, wire), runs in summaries.items():
        times = [s.time_to_target if s.time_to_target is not None else math.nan for s in runs]
        ratio = [a / b for a, b in zip(times, reference) if b and math.isfinite(a)]
        steps = [s.steps_to_target if s.steps_to_target is not None else math.nan for s in runs]
        print(f"| {servers} | {wire} | {interval([s.bytes_per_step / 1e6 for s in runs])} "
              f"| {interval([s.median_step_time * 1e3 for s in runs])} | {interval(steps)} | {interval(times)} "
              f"| {interval(ratio)} "
              f"| {interval([s.final_test_accuracy for s in runs])} "
              f"| {sum(math.isfinite(t) for t in times)}/{len(times)} |", flush=True)


if __name__ == "__main__":
    main()
