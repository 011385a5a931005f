"""`pgc-export RUN [--checkpoint STEP|best|last] --out model.pt`: a run's trained model as a torch
state_dict file, which `module.load_state_dict(torch.load("model.pt"))` loads into a module of the
model's class (a built-in model: pgc_mpi.build_model).

The state_dict is rebuilt from one checkpoint of the run (pgc_mpi.runs.checkpoint.read_state_dict):
the parameters from its flat vector, the buffers (batch-norm running statistics...) as the run's
evaluation computed them at those parameters. RUN is a run folder (its checkpoints are in
RUN/checkpoints) or a checkpoint file (.h5). Bad input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ..errors import PgcError
from ..runs.run_folder import checkpoint_name, checkpoint_step, holds_run, list_checkpoints

PROG = "pgc-export"


class ExportError(PgcError):
    """Input pgc-export cannot export from (its message is the one line it prints)."""


def parser() -> argparse.ArgumentParser:
    """pgc-export's command line."""
    p = argparse.ArgumentParser(prog=PROG, description="Write a run's trained model as a torch state_dict file.")
    p.add_argument("run", type=Path, metavar="RUN", help="a run folder (pgc-train's --out), or a checkpoint file (.h5)")
    p.add_argument("--checkpoint", default="last", metavar="STEP|best|last",
                   help="which of the run's checkpoints: `last`, the newest step checkpoint; `best`, "
                        "RUN/checkpoints/best.h5; a step number, that step's checkpoint; or a .h5 file (last)")
    p.add_argument("--out", type=Path, required=True, help="the file to write the state_dict to (torch.save)")
    return p


def _steps(found: list[Path]) -> str:
    return ", ".join(str(checkpoint_step(p)) for p in found)


def choose_checkpoint(run: Path, which: str = "last") -> Path:
    """The checkpoint file `which` ('last', 'best', a step number or a .h5 path) of run folder
    `run`, or `run` itself when it is a checkpoint file; ExportError naming what is missing."""
    if run.is_file():
        if which != "last":
            raise ExportError(f"{run} is a checkpoint file: --checkpoint {which} picks among a run folder's "
                              f"checkpoints; give the run folder instead")
        return run
    if which.endswith(".h5"):
        for candidate in (Path(which), run / "checkpoints" / which):
            if candidate.is_file():
                return candidate
        raise ExportError(f"--checkpoint {which}: no such checkpoint file (nor in {run / 'checkpoints'})")
    if not run.is_dir():
        raise ExportError(f"{run}: no such run folder or checkpoint file")
    if not holds_run(run):
        raise ExportError(f"{run} is not a run folder (no config.json, metrics.jsonl or checkpoints/ in it)")
    directory = run / "checkpoints"
    found = list_checkpoints(directory)
    if which == "best":
        best = directory / "best.h5"
        if not best.is_file():
            raise ExportError(f"{run} has no best checkpoint ({best} does not exist); export --checkpoint last "
                              f"or a step instead")
        return best
    if not found:
        raise ExportError(f"{run} holds no checkpoint ({directory} has none: the run wrote none; train with "
                          f"--checkpoint-every, or let it end)")
    if which == "last":
        return found[-1]
    try:
        step = int(which)
    except ValueError:
        raise ExportError(f"--checkpoint {which!r}: give a step number, best, last or a .h5 file") from None
    path = directory / checkpoint_name(step) if step >= 0 else None
    if path is None or not path.is_file():
        raise ExportError(f"{run} has no checkpoint of step {which}; its checkpoints are of steps {_steps(found)}")
    return path


def export(checkpoint: Path, out: Path) -> dict:
    """Write the state_dict of `checkpoint` to `out` (torch.save; written to a temporary name in
    the same folder and renamed) and return it. ExportError for an --out whose folder does not
    exist; CheckpointError for a checkpoint that holds no model state or is damaged."""
    import torch

    from ..runs.checkpoint import read_state_dict

    folder = out.parent if str(out.parent) else Path(".")
    if not folder.is_dir():
        raise ExportError(f"--out {out}: the folder {folder} does not exist; create it first")
    if out.is_dir():
        raise ExportError(f"--out {out} is a folder; give a file name, such as {out / 'model.pt'}")
    state = read_state_dict(checkpoint)
    temporary = folder / f".{out.name}.tmp-{os.getpid()}"
    try:
        torch.save(state, temporary)
        os.replace(temporary, out)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise ExportError(f"--out {out}: cannot write it ({exc.strerror or exc})") from None
    return state


def main(argv: list[str] | None = None) -> int:
    """Entry point of `pgc-export`: 0 once the file is written, 2 (one line on stderr) on bad input."""
    args = parser().parse_args(argv)
    try:
        checkpoint = choose_checkpoint(args.run, args.checkpoint)
        state = export(checkpoint, args.out)
    except PgcError as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(f"wrote {args.out}: the model's state_dict ({len(state)} tensors) from {checkpoint}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
