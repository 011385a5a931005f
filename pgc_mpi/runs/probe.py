"""A short probe run read for advice (pgc-advise): its options, what its workers took beyond their
computation, their computation per gradient, and the master's own time per step.

A probe is an ordinary run folder (pgc-train's or pgc_mpi.fit's `--out`, or a pgc-bench sim run)
of a few dozen steps on the cluster to advise on. `read_probe` takes from it:

- the run's options (config.json's `config`), its worker count and which program wrote it
  (`provenance.program`; older folders: guessed from the labels fit gives Python objects);
- the extras of its messages past the warm-up (pgc_mpi.runs.delays: per worker, the tail,
  correlation in time, the persistently slow workers, a fitted `--delay`);
- each worker's median compute time per gradient (a message's compute_time over its gradients),
  and of it the data wait (getting minibatches: a slow data pipeline, told apart from a slow node);
- the master's median time per part (receive per message; decode, update, send per step), as
  benchmarks/master_cost.py measures them, over the steps past the warm-up;
- its last evaluation (what it reached: a target it did not reach is named from it).

A run that cannot be read as a probe is a ProbeError whose message is one line: not a run
folder, a ddp run (no messages), fewer than MIN_STEPS models with messages past the warm-up.
Pure: no MPI, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..core.message import MessageRecord
from ..core.traits import PEER_SCHEMES
from ..errors import ConfigError, RunDataError
from .delays import WARMUP, DelayReport, extras, summarize
from .metrics import MASTER_PARTS, read_json
from .results import load_run

DATA_BOUND = 0.2  # a data wait this share of the compute or more is named as the pipeline's, not the nodes'
MIN_STEPS = 30  # models with messages past the warm-up: fewer say too little about the tail of the delays
FIT_PROGRAM = "pgc_mpi.fit"


class ProbeError(ConfigError):
    """A run folder that cannot be read as a probe (its message is one line)."""


@dataclass(frozen=True)
class Probe:
    """What a probe run measured (see the module's docstring)."""

    path: Path
    options: dict  # config.json's "config": the run's resolved options
    workers: int
    program: str  # pgc-train, pgc_mpi.fit, or "unknown" (no provenance: a pgc-bench sim run, older folders)
    command_line: tuple[str, ...]  # as provenance records it: the program's name, then its arguments
    delays: DelayReport
    steps_measured: int  # models with messages past the warm-up
    compute: dict[int, float]  # each worker's median compute seconds per gradient
    data_wait: dict[int, float] = field(default_factory=dict)  # of it, getting minibatches (empty: not recorded)
    master: dict[str, float] = field(default_factory=dict)  # median seconds per part; empty: the master took none
    median_step_time: float = math.nan
    last_eval: dict = field(default_factory=dict)  # the probe's last evaluation record (empty: none)

    @property
    def scheme(self) -> str:
        return str(self.options["scheme"])

    @property
    def synthetic(self) -> str | None:
        """The synthetic problem's name, or None for a torch model on a data set."""
        return self.options.get("problem")

    @property
    def from_fit(self) -> bool:
        """Whether pgc_mpi.fit wrote the run: its model, data and loss may be Python objects that
        config.json names only by label (module:qualified name), which cannot be rebuilt."""
        if self.program != "unknown":
            return self.program == FIT_PROGRAM
        labels = [self.options.get(k) for k in ("model", "dataset", "loss")]
        # folders written before provenance named the program: fit's labels of arrays and of
        # objects defined in the user's script cannot be pgc-train's PATH:NAME plug-ins
        return self.options.get("dataset") == "arrays" or any(str(v).startswith("__main__:") for v in labels if v)

    def compute_time(self) -> float:
        """The fastest worker's median compute seconds per gradient (the others' excess: `compute_excess`)."""
        return min(self.compute.values())

    def compute_excess(self) -> dict[int, float]:
        """Each worker's median compute per gradient above the fastest's, in seconds."""
        base = self.compute_time()
        return {w: c - base for w, c in self.compute.items()}

    def describe(self) -> str:
        """The measurements in a few lines: the delays' report, compute per gradient, the master's parts."""
        compute = np.array(list(self.compute.values()))
        lines = [f"probe {self.path}: {self.scheme} on {self.workers} workers, {self.steps_measured} steps measured; "
                 f"median step {self.median_step_time:.4g} s",
                 self.delays.describe(),
                 f"compute per gradient: median per worker {compute.min():.4g}..{compute.max():.4g} s"]
        if self.data_wait:
            lines.append(self.describe_data_wait())
        if self.master:
            per = {"receive": "message"}
            lines.append("master: " + ", ".join(f"{part} {1e3 * sec:.3g} ms per {per.get(part, 'step')}"
                                                for part, sec in self.master.items()))
        return "\n".join(lines)


    def data_wait_share(self) -> float:
        """The share of the workers' compute spent getting minibatches (medians per gradient; nan: not recorded)."""
        if not self.data_wait:
            return math.nan
        return sum(self.data_wait.values()) / max(sum(self.compute[w] for w in self.data_wait), 1e-12)

    def describe_data_wait(self) -> str:
        """The data wait in words, and what it is when it weighs: a slow data pipeline, which every
        scheme pays alike in its compute (the simulation keeps it there), not slow nodes."""
        waits = np.array(list(self.data_wait.values()))
        share = self.data_wait_share()
        line = (f"of it, getting minibatches (data wait): median per worker {waits.min():.4g}..{waits.max():.4g} s "
                f"({100 * share:.0f}% of the compute)")
        if share >= DATA_BOUND:
            loaders = self.options.get("loader_workers", 0)  # runs from before the option read their own
            line += (": the workers are slowed by their data pipeline, not by slow nodes; every scheme pays it per "
                     "gradient computed. "
                     + ("Loader processes (--loader-workers 2) would read it ahead" if loaders in (0, "0") else
                        "A Dataset whose reads take longer than a step needs more --loader-workers"))
        return line


def read_probe(path: Path, warmup: int = WARMUP) -> Probe:
    """The probe run in folder `path`, its first `warmup` steps left out (ProbeError: see the module)."""
    path = Path(path)
    for name in ("config.json", "metrics.jsonl"):
        if not (path / name).is_file():
            raise ProbeError(f"{path}: not a run folder (no {name}); give the --out folder of a pgc-train or "
                             f"pgc_mpi.fit run")
    try:
        recorded = read_json(path / "config.json")
        options = recorded["config"]
        config, steps, evals, _ = load_run(path)
    except RunDataError as exc:
        raise ProbeError(str(exc)) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ProbeError(f"{path}: config.json or metrics.jsonl is not a run's ({exc})") from None
    if options.get("scheme") in PEER_SCHEMES:
        raise ProbeError(f"{path} is a {options['scheme']} run: it records no messages to measure delays from; "
                         f"probe with --scheme dgd, which waits for every worker as {options['scheme']} does")
    if not steps:
        raise ProbeError(f"{path}: no step records (the run ended before its first step)")
    found = extras(steps, warmup)
    measured = len({e.step for e in found})
    if measured < MIN_STEPS:
        raise ProbeError(f"{path}: too short to advise from: {measured} steps with messages past the first "
                         f"{warmup}; needs at least {MIN_STEPS} steps past the first {warmup} (probe with --steps "
                         f"{MIN_STEPS + warmup + 5} or more)")
    first = int(steps[0]["step"]) + warmup
    compute = _per_gradient(steps, first)
    if not compute:
        raise ProbeError(f"{path}: no message past the first {warmup} steps says how long its gradients took")
    provenance = recorded.get("provenance") or {}
    return Probe(path=path, options=options, workers=int(recorded["workers"]),
                 program=str(provenance.get("program", "unknown")),
                 command_line=tuple(map(str, provenance.get("command_line", ()))),
                 delays=summarize(found, warmup, first, where=str(path)), steps_measured=measured,
                 compute=compute, data_wait=_per_gradient(steps, first, "data_wait"),
                 master=_master_parts(steps, first),
                 median_step_time=float(np.median([r["step_time"] for r in steps if r["step"] >= first])),
                 last_eval=evals[-1] if evals else {})


def _per_gradient(steps: list[dict], first: int, what: str = "compute_time") -> dict[int, float]:
    """Each worker's median seconds of `what` (a MessageRecord time: compute_time, data_wait) per
    gradient over its messages at models from `first` on (messages without it are left out)."""
    per: dict[int, list[float]] = {}
    for record in steps:
        for m in map(MessageRecord._make, record.get("messages", [])):
            usable = m.verdict != "rejected" and m.step >= first and m.gradients
            value = getattr(m, what)
            if usable and math.isfinite(value if value is not None else math.nan):
                per.setdefault(int(m.worker), []).append(value / m.gradients)
    return {w: float(np.median(v)) for w, v in sorted(per.items())}


def _master_parts(steps: list[dict], first: int) -> dict[str, float]:
    """The master's median seconds per part (receive: per message) over the steps from `first` on;
    empty when it took no time (a simulated run without a cost model)."""
    used = [r for r in steps if r["step"] >= first and r.get("messages")]
    if not used or not all(f"{part}_time" in used[0] for part in MASTER_PARTS):
        return {}
    parts = {"receive": float(np.median([r["receive_time"] / len(r["messages"]) for r in used]))}
    parts.update({part: float(np.median([r[f"{part}_time"] for r in used])) for part in MASTER_PARTS[1:]})
    return parts if any(v > 0 for v in parts.values()) else {}

