"""pgc-advise's simulations: every candidate (scheme, s) on a probe run's own problem, with the
delays, compute time and master cost the probe measured, to a target loss or accuracy.

What each simulation takes from the probe (pgc_mpi.runs.probe):

- the problem: the same synthetic problem, or the same torch model, data set, loss, minibatch and
  dtype (built by pgc-sim's ProblemChoice, as pgc-train builds it), and the same recipe (the
  optimizer, its schedule, clipping, ...: the shared CoreConfig fields). A pgc_mpi.fit run's
  Python objects cannot be rebuilt from config.json's labels: they must be given as plug-ins.
- the compute time per gradient: the fastest worker's median; each other worker's excess over it
  (a slower node computes slower, and its extras do not show it) is a `fixed:W:SEC` delay term,
  times the gradients a candidate's worker computes per step (c for gc-* and is-gc-*, else 1);
- the delays beyond the computation (Replay): by default the measured extras themselves, as a
  trace: the first seed replays each worker's extras in the order of the models they were
  measured at, cycled past their end (the trace delay model gives 0 past a trace's last step, so
  the replay is written out to the last simulated step); every further seed replays other
  stretches of the same cluster: blocks of consecutive measured steps drawn at random (replay_positions); or the
  `--delay` spec fitted to them (its draws follow each seed);
- the master's own cost: its measured median times per part (fixed seconds: the simulated n and
  model size are the probe's), unless a cost model file is given, or none.

Every candidate of one seed sees the same problem and the same delays (run_all).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..choices import BUILTIN_DATASETS, MODELS, OPTIMIZERS
from ..config import CORE_FIELDS, SimConfig, check_plugin_names
from ..core.traits import traits
from ..errors import ConfigError
from ..learning.plugins import is_spec
from ..learning.problems import accuracy_key, loss_key
from ..runs.delays import Extra, extras_by_worker, write_trace
from ..runs.probe import Probe
from ..runs.stats import interval
from .cli import ProblemChoice, run_all
from .master_cost import MasterCost, PartCost, save
from .recommend import CandidateResult, candidate_name

if TYPE_CHECKING:
    from .simulator import SimResult

# The probe's options that each candidate sets for itself, or that the advice replaces
CANDIDATE_FIELDS = ("scheme", "stragglers", "c", "replication", "adapt", "delay", "steps", "seed")
BLOCK = 10  # steps per block of the trace's bootstrap (replay_positions)
COMPUTE_NOISE = 1e-4  # seconds per gradient: a worker's compute excess below this is timer noise
DELAY_MODELS = ("trace", "fit")


@dataclass(frozen=True)
class Target:
    """What every candidate runs to: a loss (`loss`: the training loss, the test loss where the
    evaluation has none) or an accuracy (`accuracy`: test, else validation, else training)."""

    kind: str  # "loss" or "accuracy"
    value: float

    def key(self, metrics: dict) -> str | None:
        """The evaluation's key the target is checked against (None: it has none)."""
        if self.kind == "loss":
            return loss_key(metrics) if any(k in metrics for k in ("train_loss", "test_loss")) else None
        return accuracy_key(metrics)

    def met(self, metrics: dict) -> bool:
        key = self.key(metrics)
        if key is None or not math.isfinite(metrics[key]):
            return False
        return metrics[key] <= self.value if self.kind == "loss" else metrics[key] >= self.value

    def sim_fields(self) -> dict[str, float]:
        """The SimConfig fields that stop a run at the target."""
        return {"target_loss" if self.kind == "loss" else "target_accuracy": self.value}

    def describe(self) -> str:
        return f"{self.kind} {'<=' if self.kind == 'loss' else '>='} {self.value:g}"


@dataclass(frozen=True)
class Candidate:
    """A scheme and s to simulate (s None: the scheme does not depend on it), with the options it
    adds to the probe's: `flags` as on the command line, `fields` as SimConfig's."""

    scheme: str
    s: int | None
    flags: tuple[str, ...] = ()
    fields: tuple[tuple[str, Any], ...] = ()

    @property
    def name(self) -> str:
        return candidate_name(self.scheme, self.s, self.flags)


# The options that change the answer, each a candidate of its own beside the scheme without it:
# (the trait of the schemes it applies to, its flags, its SimConfig fields). The pipelined
# schemes' two leave the paper's guarantees or follow it: OPTION_MARKS says which in the report.
OPTION_CANDIDATES = (
    ("drops_compute", ("--drop-compute", "auto"), (("drop_compute", "auto"),)),
    ("abandons", ("--abandon-late",), (("abandon_late", True),)),
    ("stale_buffers", ("--max-staleness", "none"), (("max_staleness", "none"),)),
    ("stale_buffers", ("--staleness-correction", "none"), (("staleness_correction", "none"),)),
)
OPTION_MARKS = {("--max-staleness", "none"): "leaves the paper's staleness bound",
                ("--staleness-correction", "none"): "the paper's estimator"}


def option_marks(flags: tuple[str, ...]) -> list[str]:
    """What a candidate's options say about it beyond their names (OPTION_MARKS)."""
    return [mark for option, mark in OPTION_MARKS.items() if any(flags[k:k + 2] == option for k in range(len(flags)))]


def problem_choice(probe: Probe, model: str | None = None, dataset: str | None = None,
                   loss: str | None = None) -> ProblemChoice:
    """The probe's problem, to simulate: its synthetic problem, or its torch model, data and loss
    (`model`, `dataset`, `loss`: plug-ins replacing them, required for a fit run's Python objects)."""
    o = probe.options
    given = [f"--{name}" for name, value in (("model", model), ("dataset", dataset), ("loss", loss)) if value]
    if probe.synthetic:
        if given:
            raise ConfigError(f"{' and '.join(given)}: the probe trained the synthetic {probe.synthetic} problem, "
                              f"which is simulated as it was")
        # a synthetic problem's data are drawn from its seed: every seed simulates the probe's data
        return ProblemChoice(probe.synthetic, o.get("samples"), o.get("dim"), None, None, None, o.get("batch_size"),
                             None, None, None, None, data_seed=int(o.get("seed", 0)))
    if probe.from_fit:
        # a built-in name (or an HDF5 file) is what it says; any other name is a label of a Python object
        rebuildable = {"model": o.get("model") in MODELS, "loss": o.get("loss") is None,
                       "dataset": o.get("dataset") in BUILTIN_DATASETS or str(o.get("dataset")).endswith(".h5")}
        yours = {"model": model, "dataset": dataset, "loss": loss}
        missing = [f"--{name} PATH:NAME (config.json: {o.get(name)})" for name, ok in rebuildable.items()
                   if not ok and yours[name] is None]
        if missing:
            raise ConfigError(f"{probe.path} was trained by pgc_mpi.fit, whose model, data and loss are Python objects "
                              f"that config.json names only by label: give them to pgc-advise as plug-ins, "
                              f"{', '.join(missing)}")
    model, dataset, loss = model or o.get("model"), dataset or o.get("dataset"), loss or o.get("loss")
    check_plugin_names(model, loss)
    return ProblemChoice(None, None, None, model, dataset, loss, o.get("batch_size"), o.get("dtype", "float32"),
                         o.get("eval_train", True), True, 1)


def base_options(probe: Probe, steps: int, eval_every: int, compute_time: float, master_cost: str | None,
                 target: Target, optimizer: str | None = None, scheduler: str | None = None) -> dict[str, Any]:
    """The SimConfig fields every candidate shares: the probe's recipe and settings, the simulated
    steps, evaluation cadence, compute time, master cost and target. The probe's optimizer and
    scheduler factories are simulated as pgc-train ran them (PATH:NAME); a fit probe's were Python
    objects, which config.json names only by label: `optimizer` and `scheduler` (PATH:NAME) give them."""
    o = dict(probe.options)
    for name, yours in (("optimizer", optimizer), ("scheduler", scheduler)):
        recorded = o.get(name)
        if yours is not None:
            o[name] = yours
        elif recorded is not None and recorded not in OPTIMIZERS and (probe.from_fit or not is_spec(recorded)):
            raise ConfigError(f"the probe's {name} {recorded} was a Python object given to pgc_mpi.fit, which "
                              f"config.json names only by label: give it to pgc-advise as --{name} PATH:NAME")
    shared = {name: o[name] for name in CORE_FIELDS if name in o and name not in CANDIDATE_FIELDS}
    return {**shared, "seed": int(o.get("seed", 0)), "workers": probe.workers, "steps": steps,
            "eval_every": eval_every, "compute_time": compute_time, "master_cost": master_cost,
            "probe_every": int(o.get("eval_every", SimConfig.probe_every)), **target.sim_fields()}


def plan(schemes: Iterable[str], s_values: Iterable[int], base: dict[str, Any],
         options: bool = True) -> tuple[dict[Candidate, SimConfig], list[str]]:
    """Every valid candidate's configuration ({candidate: SimConfig}) and a line per one left out
    (an s the scheme cannot take on this many workers, an option the probe's settings exclude).
    With `options`, each scheme also runs with each option of OPTION_CANDIDATES it takes that the
    probe did not use."""
    planned: dict[Candidate, SimConfig] = {}
    skipped: list[str] = []
    s_values = list(s_values)
    for scheme in schemes:
        variants = [Candidate(scheme, None)]
        if options:
            variants += [Candidate(scheme, None, flags, fields) for trait, flags, fields in OPTION_CANDIDATES
                         if getattr(traits(scheme), trait) and not all(base.get(k) == v for k, v in fields)]
        for variant in variants:
            for s in s_values if traits(scheme).depends_on_s else [None]:
                candidate = dataclasses.replace(variant, s=s)
                try:
                    planned[candidate] = SimConfig(**{**base, **dict(candidate.fields), "scheme": scheme,
                                                      "stragglers": 0 if s is None else s, "delay": "none"})
                except ConfigError as exc:
                    skipped.append(f"{candidate.name}: {exc}")
    return planned, skipped


@dataclass(frozen=True)
class Replay:
    """The delays the simulations replay: a base `--delay` per seed (index 0, 1, ...) and each
    worker's compute excess per gradient, added per candidate as fixed terms."""

    used: str  # "trace" or "fit"
    specs: tuple[str, ...]
    excess: dict[int, float]
    note: str

    def spec(self, seed_index: int, cfg: SimConfig) -> str:
        """The full `--delay` of one candidate's configuration on one seed."""
        per_job = len(cfg.make_scheme(cfg.workers).fresh_slots(0, 0))  # gradients a job computes
        groups: dict[str, list[int]] = {}
        for w, sec in sorted(self.excess.items()):
            if sec >= COMPUTE_NOISE:
                groups.setdefault(f"{sec * per_job:.4g}", []).append(w)
        terms = [f"fixed:{','.join(map(str, ws))}:{sec}" for sec, ws in groups.items()]
        return "+".join([self.specs[seed_index], *terms])


def replay(probe: Probe, used: str, steps: int, seeds: int, folder: Path) -> Replay:
    """The Replay of the probe's extras (`used`: trace or fit; traces written into `folder`)."""
    if used not in DELAY_MODELS:
        raise ConfigError(f"--delay-model {used!r} is not one of: {', '.join(DELAY_MODELS)}")
    excess = probe.compute_excess()
    if used == "fit":
        return Replay("fit", (probe.delays.fit.spec,) * seeds, excess,
                      f"the fitted --delay {probe.delays.fit.spec}, drawn afresh for each seed")
    series = {w: np.asarray(x) for w, x in extras_by_worker(probe.delays.extras).items()}
    shortest = min(len(x) for x in series.values())
    specs = []
    for k in range(seeds):
        at = replay_positions(steps, shortest, k, int(probe.options.get("seed", 0)))
        rows = [Extra(w, t, float(x[at[t] % len(x)]), math.nan) for w, x in series.items() for t in range(steps)]
        path = Path(folder) / f"trace-seed{k}.csv"
        write_trace(rows, path)
        specs.append(f"trace:{path}")
    return Replay("trace", tuple(specs), excess,
                  f"the measured extras as traces (trace-seed*.csv): the first seed replays each worker's "
                  f"{shortest} or more measured extras in order, cycled ({steps} simulated steps), the others "
                  f"blocks of {min(BLOCK, shortest)} consecutive ones drawn at random, every worker the same")


def replay_positions(steps: int, length: int, index: int, seed: int) -> np.ndarray:
    """Which measured extra (its position in a worker's series) each simulated step replays, for
    the `index`-th seed: 0, the series in order, cycled; others, a circular block bootstrap,
    blocks of BLOCK consecutive positions (fewer for a shorter series) starting at random among
    the first `length` (the shortest series; the same blocks for every worker: delays that hit
    several workers at once stay together, and so do a worker's runs of slow steps)."""
    if index == 0:
        return np.arange(steps) % length
    block = min(BLOCK, length)
    rng = np.random.default_rng([seed, index, 0xAD5])
    starts = rng.integers(0, length, size=-(-steps // block))
    return (starts[:, None] + np.arange(block)[None, :]).reshape(-1)[:steps]


def master_cost(probe: Probe, folder: Path) -> str | None:
    """The probe's measured master times as a cost model file in `folder` (None: it took none)."""
    if not probe.master:
        return None
    cost = MasterCost(**{part: PartCost(fixed=sec) for part, sec in probe.master.items()},
                      measured={"from": str(probe.path), "workers": probe.workers,
                                "note": "medians of the probe's step records; fixed seconds: the same n and model"})
    path = Path(folder) / "master-cost.json"
    save(cost, path)
    return str(path)


def simulate_all(planned: dict[Candidate, SimConfig], problem: ProblemChoice, seeds: int, delays: Replay,
                 target: Target) -> list[CandidateResult]:
    """Every candidate on every seed (the probe's seed, then the next ones), summarized."""
    runs = simulate_seeds(planned, problem, 0, seeds, delays)
    return [summarize(c, runs[c], target) for c in planned]


def simulate_seeds(planned: dict[Candidate, SimConfig], problem: ProblemChoice, start: int, stop: int,
                   delays: Replay) -> dict[Candidate, list[SimResult]]:
    """Every candidate on the seeds of index `start` to `stop` - 1 (index 0: the probe's seed;
    `delays` must hold a spec for each): {candidate: [result per seed]}. pgc-advise calls it again
    with later seeds for the candidates more seeds could move."""
    configs = {c.name: cfg for c, cfg in planned.items()}
    first = next(iter(configs.values())).seed
    results = run_all(configs, problem, first + start, stop - start,
                      per_seed=lambda name, cfg: dataclasses.replace(cfg, delay=delays.spec(cfg.seed - first, cfg)))
    return {c: results[c.name] for c in planned}


def summarize(candidate: Candidate, runs: list[SimResult], target: Target) -> CandidateResult:
    """One candidate's runs (one per seed) as a CandidateResult."""
    hits = [next((e for e in res.evals if target.met(e)), None) for res in runs]
    reached = [h for h in hits if h is not None]

    def final(kind: str) -> float:
        values = [res.final(key) for res in runs if res.evals
                  and (key := Target(kind, 0.0).key(res.evals[-1])) is not None]
        return float(np.mean(values)) if values else math.nan

    return CandidateResult(candidate.scheme, candidate.s, len(runs), len(reached), flags=candidate.flags,
                           times=tuple(math.inf if h is None else float(h["wall_time"]) for h in hits),
                           time=interval([h["wall_time"] for h in reached]),
                           steps=interval([h["step"] + 1 for h in reached]),
                           step_time=interval([res.median_step_time() for res in runs]),
                           final_loss=final("loss"), final_accuracy=final("accuracy"))
