"""--servers K under mpiexec (bounded by the helpers): every coded scheme's K-server run is the
simulator's replay of rank 0's arrivals, K = 1 and 3 give one trajectory with 1/K of the bytes
into each server, and a signal stops all the servers at one step, checkpointed whole: another K
resumes it into the uninterrupted run's trajectory. pbs on K servers is the one-server pbs rule
replayed on rank 0's arrival order (its diagnostics too), and is stopped, checkpointed with its
whole table and resumed on another K the same way."""

from __future__ import annotations

import signal
import time

import numpy as np
import pytest

from pgc_mpi.core.schemes import make_scheme
from pgc_mpi.learning.problems import Quadratic
from pgc_mpi.runs.checkpoint import load as load_checkpoint
from pgc_mpi.sim.replaying import replay

from helpers import events_of, run_train, start_train, steps_of

WORKERS = 4
# worker 3 always 0.4 s late, far longer than a step: every server decodes every step from the
# same three workers, so the servers' arrival sets agree and rank 0's records describe them all
PROBLEM = ["--problem", "quadratic", "--dim", "301", "--samples", "120", "--batch-size", "5", "--seed", "2",
           "--dtype", "float64", "--lr", "0.3", "-s", "1", "--delay", "fixed:3:0.4", "--record-params"]


def _run(servers: int, scheme: str, out, steps: int = 6, extra: tuple[str, ...] = ()) -> np.ndarray:
    proc = run_train(WORKERS + servers, ["--scheme", scheme, "--servers", str(servers), "--steps", str(steps),
                                         *PROBLEM, *extra, "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return np.load(out / "params.npy")


def _is_the_replay(scheme: str, out, got: np.ndarray) -> bool:
    """Whether the parameters after every step are the simulator's replay (one server, whole
    vector) of rank 0's arrivals."""
    expected = replay(make_scheme(scheme, WORKERS, 1, seed=2), Quadratic(WORKERS, samples=120, dim=301, batch_size=5,
                                                                          seed=2), steps_of(out), lr=0.3)
    return got.shape == (len(expected), 301) and np.abs(got - np.stack(expected)).max() < 1e-10


# is-gc-* decode as gc-* do (with c = 2): their collectors are the ones tested here
@pytest.mark.parametrize("scheme", ["is-sgd", "gc-fr", "gc-cr", "pgc-fr", "pgc-cr"])
def test_a_coded_scheme_on_three_servers_is_the_replay_of_its_arrivals(tmp_path, scheme):
    """Each server decodes its shard by the scheme's rule: put together, they are the replay."""
    got = _run(3, scheme, tmp_path / "run")
    assert len(got) == 7 and _is_the_replay(scheme, tmp_path / "run", got)
    assert all(3 not in r["used"] for r in steps_of(tmp_path / "run"))  # the late worker was never waited for


def test_one_and_three_servers_give_one_trajectory_and_split_the_bytes(tmp_path):
    runs = {k: _run(k, "dgd", tmp_path / f"k{k}", extra=("--delay", "none")) for k in (1, 3)}
    assert np.abs(runs[3] - runs[1]).max() < 1e-10
    one = events_of(tmp_path / "k1", "summary")[0]
    assert "servers" not in one
    servers = events_of(tmp_path / "k3", "summary")[0]["servers"]
    assert [s["server"] for s in servers] == [0, 1, 2] and all(s["steps"] == 6 for s in servers)
    # each server receives its shard of every message: a third of the payload, with the whole header
    # (72 bytes here: 880 bytes a message against 2,480 at K = 1)
    assert max(s["bytes_received"] for s in servers) < 0.36 * steps_of(tmp_path / "k1")[-1]["bytes_received"]


def _stopped_by_sigterm(ranks: int, args: list[str], out, after: int) -> int:
    """Start a run, send it SIGTERM once it has recorded `after` steps (or after 60 s), check it
    stopped as asked (exit status 3), and return the steps its summary says it made."""
    job = start_train(ranks, args, out)
    until = time.monotonic() + 60
    while time.monotonic() < until and len(steps_of(out)) < after:
        time.sleep(0.2)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=60)
    assert job.returncode == 3, err[-3000:]
    return events_of(out, "summary")[-1]["steps"]


def test_a_signal_stops_every_server_at_the_same_step(tmp_path):
    """SIGTERM mid-run: rank 0 abandons the step in progress and checkpoints the whole vector,
    which another number of servers resumes into the one trajectory of an uninterrupted run."""
    args = ["--scheme", "dgd", "--servers", "2", *PROBLEM, "--delay", "fixed:0:0.02", "--optimizer", "momentum"]
    out = tmp_path / "run"
    stopped = _stopped_by_sigterm(WORKERS + 2, [*args, "--steps", "100000"], out, after=10)
    assert stopped >= 10 and (out / "checkpoints" / f"ckpt-{stopped:08d}.h5").exists()
    steps = stopped + 3
    proc = run_train(WORKERS + 3, [*args, "--servers", "3", "--steps", str(steps), "--resume", "latest",
                                   "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    whole = _run(1, "dgd", tmp_path / "whole", steps=steps, extra=("--delay", "fixed:0:0.02", "--optimizer",
                                                                   "momentum"))
    assert np.abs(np.load(out / "params.npy")[-1] - whole[-1]).max() < 1e-10


@pytest.mark.parametrize("on_stale,counter", [("reject", "stale_rejected"), ("refresh", "refreshed")])
def test_the_staleness_rules_act_alike_on_every_server(tmp_path, on_stale, counter):
    """A random worker 1 s late each step misses steps and comes back with old buffers: every server
    judges them from the same header, so the rule acts on each alike, the run is still the replay
    and no step uses a buffer older than the window."""
    out = tmp_path / "run"
    got = _run(2, "pgc-fr", out, steps=20, extra=("--delay", "random:1:1.0", "--on-stale", on_stale, "--grace", "5"))
    assert _is_the_replay("pgc-fr", out, got)
    assert sum(r[counter] for r in steps_of(out)) > 0 and all(r["max_staleness"] <= 1 for r in steps_of(out))
    if on_stale == "reject":
        servers = events_of(out, "summary")[0]["servers"]
        assert servers[0]["rejected_stale"] == servers[1]["rejected_stale"] > 0


def test_faulty_messages_are_rejected_by_every_server(tmp_path):
    """Worker 2's messages carry NaN from step 3 on: each server rejects its shard of them, and the
    run goes on, the replay of rank 0's arrivals, from the other workers."""
    out = tmp_path / "run"
    got = _run(2, "gc-cr", out, extra=("--fault", "nan:2@3"))
    assert _is_the_replay("gc-cr", out, got)
    assert events_of(out, "summary")[0]["rejected_messages"] > 0
    assert all(2 not in r["used"] for r in steps_of(out)[3:])


def test_a_missed_deadline_with_fail_ends_every_server(tmp_path):
    """dgd with a hung worker and --on-deadline fail: the servers miss the deadline, the job ends
    non-zero at once (not at the mpiexec timeout), and the folder says why."""
    out = tmp_path / "run"
    began = time.monotonic()
    proc = run_train(WORKERS + 2, ["--scheme", "dgd", "--servers", "2", "--steps", "20", "--delay", "hang:1@3",
                                   "--deadline", "1", "--on-deadline", "fail", "--grace", "2", "--out", str(out)])
    assert proc.returncode != 0 and time.monotonic() - began < 60
    assert "could not decode by the deadline" in proc.stderr
    summaries = events_of(out, "summary")
    assert summaries and all(s["status"] == "failed" and "deadline" in s["reason"] for s in summaries)
    assert len(steps_of(out)) == 3

# pbs: random delays, so that the arrival order, and with it the table and the steps, differ
# from run to run; window 3, probes every 3 steps
PBS = ["--scheme", "pbs", "--replication", "2", "--c", "3", "--delay", "exp:0.01", "--eval-every", "3"]


def _pbs_replay(records: list[dict], start=None, lr: float = 0.3) -> np.ndarray:
    """The one-server pbs master's parameters on these arrivals, in this order (sim.replaying.replay; it
    follows --adapt's changes of the learning rate in the records)."""
    return np.stack(replay(make_scheme("pbs", WORKERS, 1, c=3, replication=2), _quadratic(), records, lr=lr,
                           start=start))


def _quadratic() -> Quadratic:
    return Quadratic(WORKERS, samples=120, dim=301, batch_size=5, seed=2)


# K = 3 with --adapt and a learning rate large enough for the first probe's bound to halve it
@pytest.mark.parametrize("servers,lr,adapt", [(1, 0.3, ()), (3, 1.2, ("--adapt",))])
def test_pbs_on_k_servers_is_the_one_server_rule_on_rank_0_s_arrival_order(tmp_path, servers, lr, adapt):
    """Every server repeats rank 0's arrivals in its order: the parameters after every step are
    one pbs master's on that order, and the diagnostics summed over the shards are the whole
    vector's (||g_hat||^2, the displacement, and at a probe L_hat and the stale cosine); --adapt's
    learning rate, decided on rank 0, is every shard's."""
    got = _run(servers, "pbs", tmp_path / "run", steps=12, extra=(*PBS, "--lr", str(lr), *adapt))
    records = steps_of(tmp_path / "run")
    assert sum(len(r["messages"]) for r in records) > len(records)  # the order mattered
    assert np.abs(got - _pbs_replay(records, lr=lr)).max() < 1e-10
    assert all("lr" in r for r in records)  # the rate each step used
    assert any(r["lr"] != lr for r in records) == bool(adapt)  # --adapt changed it
    problem = _quadratic()
    for r in records:
        t = r["step"]
        lr = r.get("lr", lr)
        versions = [t - age for age in r["ages"] if age >= 0]
        assert r["grad_norm_sq"] == pytest.approx(np.sum(((got[t] - got[t + 1]) / lr) ** 2), rel=1e-8)
        assert r["displaced_entries"] == len(versions)
        assert r["displacement"] == pytest.approx(np.mean([np.sum((got[t] - got[v]) ** 2) for v in versions]),
                                                  rel=1e-8, abs=1e-300)
        if (t + 1) % 3 == 0 and min(versions) < t:  # (a probe of two equal models measures nothing: nan)
            now, old = problem.probe_grad(got[t]), problem.probe_grad(got[min(versions)])
            moved = np.linalg.norm(got[t] - got[min(versions)])
            assert r["smoothness"] == pytest.approx(np.linalg.norm(now - old) / moved, rel=1e-8)
            assert r["stale_cosine"] == pytest.approx(now @ old / np.linalg.norm(now) / np.linalg.norm(old), rel=1e-8)
    if servers > 1:
        assert [s["steps"] for s in events_of(tmp_path / "run", "summary")[0]["servers"]] == [12] * servers


def test_pbs_servers_refuse_what_rank_0_refuses(tmp_path):
    """Worker 2's gradients turn NaN and worker 0's messages half their size (in every server's
    part): rank 0 refuses them before its table and the follower drops its copies, so the run is
    still the one-server rule on rank 0's order (the partitions keep another holder each)."""
    got = _run(2, "pbs", tmp_path / "run", steps=12, extra=(*PBS, "--fault", "nan:2@3+badsize:0@5"))
    records = steps_of(tmp_path / "run")
    refused = {m[0] for r in records for m in r["messages"] if m[5] == "rejected"}
    assert refused == {0, 2} and np.abs(got - _pbs_replay(records)).max() < 1e-10


def test_a_signal_checkpoints_pbs_servers_with_the_whole_table_and_another_k_resumes_it(tmp_path):
    """SIGTERM during a pbs step on 2 servers: the checkpoint holds the whole table, every column
    of it as the arrivals taken so far left it (those of the abandoned step too); 3 servers resume
    it into the one-server rule on their arrivals."""
    args = [*PROBLEM, *PBS]
    out = tmp_path / "run"
    stopped = _stopped_by_sigterm(WORKERS + 2, ["--servers", "2", *args, "--steps", "100000"], out, after=8)
    records = steps_of(out)[:stopped]
    first = np.load(out / "params.npy")
    assert stopped >= 8 and np.abs(first - _pbs_replay(records)).max() < 1e-10
    ckpt = load_checkpoint(out / "checkpoints" / f"ckpt-{stopped:08d}.h5", {})
    assert ckpt.table_grads.shape == (WORKERS, 301) and np.array_equal(ckpt.params, first[-1])
    # each entry is some holder's minibatch gradient at its version's model, whole (both servers' columns)
    scheme, problem = make_scheme("pbs", WORKERS, 1, c=3, replication=2), _quadratic()
    sent = {i: sum(m[0] == i for r in records for m in r["messages"]) for i in range(WORKERS)}
    for part, version in enumerate(ckpt.table_versions):
        candidates = [problem.loss_and_grad(first[version], part, scheme.draw_index(count, slot))[1]
                      for i in range(WORKERS) for slot in range(2) if scheme.placement[i][slot] == part
                      for count in range(slot, sent[i] + 4, 2)]
        assert min(np.abs(ckpt.table_grads[part] - g).max() for g in candidates) < 1e-12, part
    proc = run_train(WORKERS + 3, [*args, "--servers", "3", "--steps", str(stopped + 6), "--resume", "latest",
                                   "--out", str(out)])
    assert proc.returncode == 0, proc.stderr[-3000:]
    resumed = np.load(out / "params.npy")
    assert len(resumed) == 7 and np.abs(resumed - _pbs_replay(steps_of(out)[stopped:], start=ckpt)).max() < 1e-10
