"""Runs across nodes, on a 3-node Slurm cluster emulated on this machine (launch/slurm/multinode-up.sh:
each node its own network, hostname, IPC and /dev/shm; MPI between nodes over TCP).

Needs root, iproute2 and Slurm; without them these tests skip, except in CI (CI=true), where
that is a failure. Every sbatch is bounded in time.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pgc_mpi.runs.run_folder import checkpoint_name

from helpers import (
    daemon_state_dir,
    events_of,
    run_train,
    sbatch_wait,
    slurm_job_gone,
    slurm_job_state,
    slurm_release_requeued,
    steps_of,
)

ROOT = Path(__file__).resolve().parents[2]
SLURM_DIR = ROOT / "launch" / "slurm"
pytestmark = pytest.mark.timeout(900)  # train.sbatch may start a job up to 3 times (PGC_START_ATTEMPTS)

NODES = ["node1", "node2", "node3"]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tools = ("slurmctld", "slurmd", "sbatch", "munged", "ip", "nsenter")
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing or os.geteuid() != 0:
        why = f"missing {missing}" if missing else "not root"
        if os.environ.get("CI"):
            pytest.fail(f"the emulated cluster cannot come up ({why}): CI must run as root with Slurm and iproute2")
        pytest.skip(f"the emulated cluster needs root, Slurm and iproute2 ({why})")
    # PGC_MN_DIR lets .ci/run take the cluster down even if this test process dies
    folder, made = daemon_state_dir("PGC_MN_DIR", "multinode")
    state = str(folder)
    env = {**os.environ, "PGC_MN_DIR": state}
    subprocess.run([str(SLURM_DIR / "multinode-down.sh")], env=env, capture_output=True, timeout=60)
    up = subprocess.run([str(SLURM_DIR / "multinode-up.sh"), "3", "8"], env=env, capture_output=True, text=True,
                        timeout=120)
    assert up.returncode == 0, up.stdout + up.stderr
    ready = {**env, "SLURM_CONF": f"{state}/etc/slurm.conf", "PGC_VENV": sys.prefix, "MPIEXEC_TIMEOUT": "240",
             "OMP_NUM_THREADS": "1"}
    _wait_for_mpi_across_nodes(ready, tmp_path_factory.mktemp("mpi-ready"))
    yield ready
    subprocess.run([str(SLURM_DIR / "multinode-down.sh")], env=env, capture_output=True, timeout=120)
    if made:
        shutil.rmtree(folder, ignore_errors=True)


def _wait_for_mpi_across_nodes(env: dict, folder: Path, attempts: int = 3) -> None:
    """Start one MPI job across the three nodes (MPI_Init and a barrier) before the tests, as a
    cluster's health check would, retried a few times (a bare srun: Slurm's pmi2 plugin may break a
    start, see START_TIMEOUT, and only train.sbatch makes one again by itself): the tests' own jobs
    then run on a cluster known to start MPI; a cluster that never does fails."""
    hello = f"{shlex.quote(sys.executable)} -c 'from mpi4py import MPI; MPI.COMM_WORLD.Barrier()'"
    failures = []
    for attempt in range(attempts):
        out = folder / f"attempt{attempt}.out"
        proc = _sbatch(env, folder, ["-N", "3", "-n", "3", "-o", str(out), "--wrap", f"srun --mpi=pmi2 {hello}"],
                       timeout=120)
        if proc.returncode == 0:
            if failures:
                print(f"MPI across nodes started at attempt {attempt + 1}; before:\n" + "\n".join(failures))
            return
        failures.append(f"attempt {attempt + 1}: exit {proc.returncode}\n{out.read_text() if out.exists() else ''}")
    pytest.fail("MPI never started across the emulated nodes:\n" + "\n".join(failures))


# Slurm's pmi2 plugin now and then breaks a start across nodes (in CI about one cross-node job per
# run): it reads a PMI-1 request in one read() of at most 1024 bytes, and MPICH's start-up exchange
# of UCX addresses sends some longer than that, depending on the addresses' bytes ("mpi/pmi2: invalid
# client request"; the job then aborts or hangs in MPI_Init). train.sbatch makes such a start again
# itself (PGC_START_ATTEMPTS, see its comments), so the tests submit its jobs once: a retry of theirs
# would hide a template that does not retry. START_TIMEOUT leaves room for the template's own retries.
START_TIMEOUT = 300


def _sbatch(env: dict, cwd: Path, args: list[str], timeout: int = START_TIMEOUT) -> subprocess.CompletedProcess:
    """sbatch and wait for the job's end, bounded here (a job still there is cancelled) and by the
    job's own --time."""
    try:
        return sbatch_wait(env, cwd, ["--time=5", *args], timeout)[0]
    except subprocess.TimeoutExpired as late:
        return subprocess.CompletedProcess(late.cmd, 1, late.output, f"not ended after {timeout} s, cancelled")


def _plant_stale_segment(env: dict, node: int) -> str:
    """A file made like an MPICH segment a killed job left on that node's /dev/shm, a minute old."""
    name = f"mpich_shm_dead{node:04x}_0"
    script = f"umask 077; head -c 4096 /dev/zero > /dev/shm/{name}; touch -d '-1 min' /dev/shm/{name}"
    subprocess.run([str(SLURM_DIR / "multinode-exec.sh"), str(node), "sh", "-c", script], env=env, check=True,
                   timeout=30)
    return name


def _on_node(env: dict, node: int, path: str) -> bool:
    return subprocess.run([str(SLURM_DIR / "multinode-exec.sh"), str(node), "test", "-e", path], env=env,
                          timeout=30).returncode == 0


def _hosts(run: Path) -> list[str]:
    return json.loads((run / "config.json").read_text())["provenance"]["hosts"]


DGD = ["--scheme", "dgd", "--steps", "20", "--dtype", "float64", "--record-params", "--eval-every", "10"]


# A stand-in for pgc-train (train.sbatch's PGC_SCRIPT) whose starts in the job steps listed in
# FLAKY_EXIT or FLAKY_HANG fail the way Slurm's pmi2 plugin makes a start fail: its error in the log,
# then every rank exits, or hangs as in MPI_Init. The other steps run pgc-train itself.
FLAKY = """import os, sys, time
step = os.environ["SLURM_STEP_ID"]
hang = step in os.environ.get("FLAKY_HANG", "").split()
if hang or step in os.environ.get("FLAKY_EXIT", "").split():
    if os.environ["SLURM_PROCID"] == "0":
        print("slurmstepd-node1: error: mpi/pmi2: invalid client request", file=sys.stderr, flush=True)
    if hang:
        time.sleep(600)
    sys.exit(1)
os.execvp("pgc-train", ["pgc-train", *sys.argv[1:]])
"""
QUICK = ["--problem", "quadratic", "--scheme", "pgc-cr", "-s", "1", "--steps", "20", "--eval-every", "10"]


def _flaky(tmp_path: Path) -> Path:
    script = tmp_path / "flaky.py"
    script.write_text(FLAKY)
    return script


def test_train_sbatch_starts_again_a_start_that_slurms_pmi2_plugin_broke(cluster, tmp_path):
    """Two starts that fail after the pmi2 plugin's error (exit before any step): train.sbatch makes
    a third, which runs the whole run once, and says why in the log each time."""
    run, log = tmp_path / "run", tmp_path / "job.out"
    env = {**cluster, "PGC_SCRIPT": str(_flaky(tmp_path)), "FLAKY_EXIT": "0 1"}
    proc = _sbatch(env, tmp_path, ["-N", "2", "-n", "3", "-o", str(log), str(SLURM_DIR / "train.sbatch"), *QUICK,
                                   "--out", str(run)])
    text = log.read_text()
    assert proc.returncode == 0, proc.stderr + text[-3000:]
    said = [line for line in text.splitlines() if "after Slurm's pmi2 plugin cut one of MPICH's" in line]
    assert len(said) == 2 and "start 1 failed before its first step (status 1)" in said[0], text[-3000:]
    assert "(start attempt 3 of 3)" in said[1]
    assert [r["step"] for r in steps_of(run)] == list(range(20))
    assert [r["status"] for r in events_of(run, "summary")] == ["completed"]


def test_train_sbatch_cancels_a_start_hung_after_the_error_and_gives_up_after_its_attempts(cluster, tmp_path):
    """A start that logs the plugin's error and then hangs is cancelled once the log has been
    silent PGC_START_HUNG seconds, not waited out; with PGC_START_ATTEMPTS=2 the second start, broken
    too (it exits), ends the job with its status: no third start."""
    run, log = tmp_path / "run", tmp_path / "job.out"
    env = {**cluster, "PGC_SCRIPT": str(_flaky(tmp_path)), "FLAKY_HANG": "0", "FLAKY_EXIT": "1",
           "PGC_START_HUNG": "5", "PGC_START_ATTEMPTS": "2"}
    began = time.monotonic()
    proc = _sbatch(env, tmp_path, ["-N", "1", "-n", "2", "-o", str(log), str(SLURM_DIR / "train.sbatch"), *QUICK,
                                   "--out", str(run)], timeout=180)
    text = log.read_text()
    assert "start 1: silent for 5 s in MPI_Init after Slurm's pmi2 plugin's error: cancelling step" in text, text
    assert "(start attempt 2 of 2)" in text
    assert "start 3" not in text and "the job ends with status 1" in text
    assert proc.returncode != 0 and time.monotonic() - began < 180


def test_a_run_across_three_nodes_equals_the_same_run_on_one(cluster, tmp_path):
    """train.sbatch with -N 3: ranks on every node (config.json's hosts say so), the stale-segment
    clean-up ran on each node's own /dev/shm, and float64 dgd's trajectory is the one-node run's."""
    planted = {node: _plant_stale_segment(cluster, node) for node in (1, 2, 3)}
    run = tmp_path / "across"
    proc = _sbatch(cluster, tmp_path, ["-N", "3", "-n", "7", "-o", str(tmp_path / "job.out"),
                                       str(SLURM_DIR / "train.sbatch"), *DGD, "--out", str(run)])
    # with a start that Slurm's pmi2 plugin broke, the log holds that start's clean-up too
    log = "".join(p.read_text() for p in sorted(tmp_path.glob("job.out*")))
    assert proc.returncode == 0, proc.stderr + log[-3000:]
    assert set(_hosts(run)) == set(NODES) and _hosts(run)[0] == "node1"
    assert [r["status"] for r in events_of(run, "summary")] == ["completed"]
    for node, name in planted.items():  # every node with ranks cleaned its own /dev/shm
        assert not _on_node(cluster, node, f"/dev/shm/{name}"), f"node{node} kept {name}"
    assert log.count("stale MPICH shared-memory segment") >= 3
    local = tmp_path / "local"
    assert run_train(7, [*DGD, "--out", str(local)], timeout=180).returncode == 0
    assert np.abs(np.load(run / "params.npy") - np.load(local / "params.npy")).max() < 1e-10


def test_the_clusters_guide_recipe_puts_the_master_on_a_node_of_its_own(cluster, tmp_path):
    """The multi-node command of docs/clusters.md (Across nodes), verbatim (from the project folder; only PGC_OUT
    added)."""
    guide = (ROOT / "docs" / "clusters.md").read_text()
    line = next(line for line in guide.splitlines() if "PGC_MASTER_ALONE=1" in line and line.startswith("sbatch"))
    run = tmp_path / "alone"
    env = {**cluster, "PGC_OUT": str(run)}
    args = shlex.split(line)[1:]
    proc = _sbatch(env, ROOT, ["-o", str(tmp_path / "job.out"), *args])
    log = (tmp_path / "job.out").read_text()
    assert proc.returncode == 0, proc.stderr + log[-3000:]
    hosts = _hosts(run)
    assert hosts[0] == "node1" and "node1" not in hosts[1:] and set(hosts[1:]) == {"node2", "node3"}
    assert "master alone on node1" in log
    assert [r["status"] for r in events_of(run, "summary")] == ["completed"]


def test_mpich_mpiexec_across_nodes_inside_an_allocation(cluster, tmp_path):
    run = tmp_path / "hydra"
    env = {**cluster, "PGC_LAUNCHER": "mpiexec", "PGC_MASTER_ALONE": "1"}
    proc = _sbatch(env, tmp_path, ["-N", "3", "--ntasks-per-node=2", "-o", str(tmp_path / "job.out"),
                                   str(SLURM_DIR / "train.sbatch"), *DGD, "--out", str(run)])
    assert proc.returncode == 0, proc.stderr + (tmp_path / "job.out").read_text()[-3000:]
    assert _hosts(run) == ["node1", "node2", "node2", "node3", "node3"]
    assert len(steps_of(run)) == 20


def test_the_template_puts_each_server_on_a_node_of_its_own(cluster, tmp_path):
    """PGC_MASTER_ALONE=1 with --servers 2: servers on node1 and node2, the workers on node3, and
    float64 dgd's trajectory is the one-server run's."""
    run = tmp_path / "servers"
    env = {**cluster, "PGC_MASTER_ALONE": "1"}
    proc = _sbatch(env, tmp_path, ["-N", "3", "--ntasks-per-node=3", "-o", str(tmp_path / "job.out"),
                                   str(SLURM_DIR / "train.sbatch"), *DGD, "--servers", "2", "--out", str(run)])
    log = "".join(p.read_text() for p in sorted(tmp_path.glob("job.out*")))
    assert proc.returncode == 0, proc.stderr + log[-3000:]
    assert _hosts(run) == ["node1", "node2", "node3", "node3", "node3"]
    assert "2 servers alone, one on each of node1 node2; 3 workers on node3" in log
    local = tmp_path / "local"
    assert run_train(4, [*DGD, "--out", str(local)], timeout=180).returncode == 0
    assert np.abs(np.load(run / "params.npy") - np.load(local / "params.npy")).max() < 1e-10


def test_a_sweep_spreads_its_array_tasks_over_the_nodes(cluster, tmp_path):
    exp = tmp_path / "exp.toml"
    exp.write_text('name = "spread"\nworkers = 3\nschemes = ["dgd", "pgc-cr"]\ns = [1]\nseeds = [0, 1]\n'
                   'target_loss = 1.9\ntimeout = 200\n[train]\nsteps = 10\neval_every = 5\n')
    out = tmp_path / "out"
    began = time.monotonic()
    proc = subprocess.run([str(SLURM_DIR / "submit-sweep.sh"), str(exp), str(out), "--time=4", "--nodes=1"],
                          env={**cluster, "SUBMIT_WAIT": "1"}, cwd=tmp_path, capture_output=True, text=True,
                          timeout=420)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = sorted(p.parent for p in out.glob("*/config.json"))
    assert len(runs) == 4 and (out / "results.md").is_file()
    nodes = {_hosts(run)[0] for run in runs}  # each task on one node; the array over several
    assert len(nodes) >= 2, nodes
    assert time.monotonic() - began < 420


def _until(what: str, check, timeout: float, log: Path):
    """Poll `check()` every second until it is truthy (its value is returned), failing after `timeout` s."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = check()
        if value:
            return value
        time.sleep(1)
    tail = log.read_text()[-3000:] if log.is_file() else "(no job log)"
    pytest.fail(f"no {what} within {timeout:.0f} s; the job's log ends:\n{tail}")


def _running(env: dict, cwd: Path, args: list[str], log: Path, run: Path, steps: int = 30) -> str:
    """Submit a job that the test steers while it runs (no sbatch --wait) and wait until it has
    recorded `steps` steps; returns its id. (A start that Slurm's pmi2 plugin broke, train.sbatch
    makes again itself: START_TIMEOUT leaves room for it.)"""
    submit = subprocess.run(["sbatch", "--parsable", *args], env=env, cwd=cwd, capture_output=True, text=True,
                            timeout=60)
    assert submit.returncode == 0, submit.stderr
    job = submit.stdout.strip().split(";")[0]
    _until(f"{steps} steps", lambda: _step_lines(run) >= steps, START_TIMEOUT, log)
    return job


def _written(run: Path) -> list[dict]:
    """The complete records of metrics.jsonl so far (it is being written: a last line may be cut)."""
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().split("\n")[:-1]] if path.is_file() else []


def _step_lines(run: Path) -> int:
    return sum("step_time" in r for r in _written(run))


def _node_state(env: dict, node: str) -> str:
    """The node's state as sinfo shows it ("idle", "idle*" when it does not answer, "down", ...)."""
    return subprocess.run(["sinfo", "-h", "-n", node, "-o", "%T"], env=env, capture_output=True, text=True,
                          timeout=30).stdout.strip()


def _link(env: dict, node: int, state: str) -> None:
    subprocess.run([str(SLURM_DIR / "multinode-exec.sh"), str(node), "ip", "link", "set", "eth0", state], env=env,
                   check=True, timeout=30)


def _transfer_seconds(env: dict, sender: int, receiver: int, nbytes: int, port: int = 16990) -> float:
    """Seconds from the first byte to the last of nbytes sent over TCP from node `sender` to node `receiver`."""
    receive = (f"import socket, time\ns = socket.create_server(('0.0.0.0', {port}))\nconn, _ = s.accept()\n"
               f"got, first = 0, None\nwhile got < {nbytes}:\n    b = conn.recv(1 << 20)\n    if not b: break\n"
               f"    first = first or time.monotonic()\n    got += len(b)\nprint(time.monotonic() - first, got)")
    send = (f"import socket, time\nfor _ in range(100):\n    try:\n"
            f"        c = socket.create_connection(('node{receiver}', {port}), timeout=10); break\n"
            f"    except OSError: time.sleep(0.1)\nc.sendall(bytes({nbytes})); c.close()")
    exec_node = str(SLURM_DIR / "multinode-exec.sh")
    server = subprocess.Popen([exec_node, str(receiver), sys.executable, "-c", receive], env=env,
                              stdout=subprocess.PIPE, text=True)
    try:
        subprocess.run([exec_node, str(sender), sys.executable, "-c", send], env=env, check=True, timeout=60)
        out, _ = server.communicate(timeout=60)
    finally:
        server.kill()
    seconds, got = out.split()
    assert int(got) == nbytes
    return float(seconds)


def test_a_shaped_link_carries_no_more_than_its_rate_each_way(cluster):
    """multinode-link.sh caps what enters and what leaves a node (4 MB at 40 Mbit/s: 0.8 s), and
    `off` gives the unlimited link back; a typo in the rate or the node is a one-line error."""
    link = str(SLURM_DIR / "multinode-link.sh")
    bad = subprocess.run([link, "1", "40mbits"], env=cluster, capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "is not a rate like 1gbit" in bad.stderr
    absent = subprocess.run([link, "9", "1gbit"], env=cluster, capture_output=True, text=True, timeout=30)
    assert absent.returncode == 2 and "node9 is not up" in absent.stderr
    nbytes = 4_000_000
    subprocess.run([link, "1", "40mbit"], env=cluster, check=True, timeout=30)
    try:
        into, out_of = _transfer_seconds(cluster, 2, 1, nbytes), _transfer_seconds(cluster, 1, 2, nbytes)
    finally:
        subprocess.run([link, "1", "off"], env=cluster, check=True, timeout=30)
    assert 0.6 < into < 10 and 0.6 < out_of < 10, (into, out_of)
    assert _transfer_seconds(cluster, 2, 1, nbytes) < 0.4


def test_the_slow_link_benchmark_runs_every_variant_on_the_same_workers(cluster, tmp_path):
    """benchmarks/slow_link.py as docs/BENCHMARKS.md §16 runs it, shortened and on unshaped links
    (multinode-link.sh has its own test, and a start-up exchange slowed by a shaped link is one
    more chance for Slurm's pmi2 failure, which the benchmark retries): both variants run on the
    same workers (node3), each server alone on its node, and the table has their rows."""
    out = tmp_path / "bench"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "slow_link.py"), "--variants", "1:float32",
                           "2:bfloat16", "--seeds", "0", "--target-loss", "2.0", "--timeout", "240",
                           "--start-timeout", "90", "--out", str(out), "--", "--scheme", "pgc-cr", "-s", "1",
                           "--steps", "10", "--eval-every", "5"],
                          env=cluster, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert [r.split("|")[1:3] for r in rows] == [[" 1 ", " float32 "], [" 2 ", " bfloat16 "]], proc.stdout
    for folder, servers in (("k1-float32-seed0", ["node1"]), ("k2-bfloat16-seed0", ["node1", "node2"])):
        config = json.loads((out / folder / "config.json").read_text())
        assert _hosts(out / folder) == servers + ["node3", "node3"]
        assert config["config"]["wire_dtype"] == folder.split("-")[1]


def test_a_node_that_drops_off_the_network_is_handled_like_hung_workers(cluster, tmp_path):
    """node3 (workers 2 and 3) leaves the network mid-run: gc-cr (s=2) goes on with node2's workers; the
    time-limit signal then ends the job within --grace with a checkpoint and "stopped" in its summary;
    once node3 is back, the requeued job resumes and finishes with every step recorded exactly once."""
    run, log = tmp_path / "run", tmp_path / "job.out"
    env = {**cluster, "PGC_MASTER_ALONE": "1"}
    job = _running(env, tmp_path, ["--time=6", "-N", "3", "--ntasks-per-node=2", "-o", str(log),
                                   str(SLURM_DIR / "train.sbatch"), "--scheme", "gc-cr", "-s", "2", "--steps", "300",
                                   "--compute-time", "0.05", "--checkpoint-every", "20", "--grace", "3",
                                   "--eval-every", "50", "--problem", "logistic", "--out", str(run)], log, run)
    try:
        assert _hosts(run) == ["node1", "node2", "node2", "node3", "node3"]
        _link(env, 3, "down")
        dropped = _step_lines(run)
        _until("30 steps without node3", lambda: _step_lines(run) >= dropped + 30, 120, log)
        signalled = time.monotonic()
        subprocess.run(["scancel", "-b", "--signal=USR1", job], env=env, check=True, timeout=30)
        stopped = _until("a stop", lambda: [r for r in _written(run) if r.get("status") == "stopped by SIGUSR1"],
                         60, log)[0]
        assert time.monotonic() - signalled < 30  # no wait for node3's workers: the abort ends the job
        assert (run / "checkpoints" / checkpoint_name(stopped["steps"])).is_file()
        without = [r for r in steps_of(run) if r["step"] >= dropped + 5]
        assert without and all(not {2, 3} & set(r["used"]) for r in without)  # decoded from node2's workers
    finally:
        # node3 comes back before the job requeues itself, so Slurm's kill of the old start reaches it
        # at once: a kill that node3 missed is resent later and, the requeued job keeping its id, would
        # kill the new start's workers on node3 (seen in CI)
        _link(env, 3, "up")
    _until("the requeue", lambda: "requeueing job" in log.read_text(), 90, log)
    # had Slurm declared node3 dead (a slow machine), it would wait for an admin (or a reboot) to return it
    if "down" in _node_state(env, "node3"):
        subprocess.run(["scontrol", "update", "NodeName=node3", "State=RESUME"], env=env, check=True, timeout=30)
    # Slurm holds a requeued job back for a while; once node3 has cleaned up the old start and answers
    # again ("idle", not "completing" or "idle*"), release it
    _until("the old start cleaned up",
           lambda: slurm_job_state(env, job) == "PENDING" and _node_state(env, "node3") == "idle", 180, log)
    slurm_release_requeued(env, job)
    _until("the requeued job's end", lambda: slurm_job_gone(env, job), 240, log)
    subprocess.run(["scancel", job], env=env, capture_output=True, timeout=30)
    assert [r["status"] for r in events_of(run, "summary")] == ["completed"], log.read_text()[-3000:]
    assert [r["step"] for r in steps_of(run)] == list(range(300))
    config = json.loads((run / "config.json").read_text())
    assert config["resumed_from_step"] == stopped["steps"] and len(config["provenance"]["earlier_starts"]) == 1
    assert _hosts(run) == ["node1", "node2", "node2", "node3", "node3"]
