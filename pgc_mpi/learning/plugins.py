"""User code named on the command line: `PATH:NAME`, where PATH is an importable module
(`mypkg.nets`) or a Python file (`./nets.py`, relative to the current folder) and NAME an
attribute of it (`make_model`, `Net`, `focal_loss`, `nets.make_model` for a nested one).

pgc-train's --model, --loss and --dataset, pgc-sim's and pgc-bench's take such specs. Every rank
imports the file itself (it must be readable on every node), and each failure is one
ConfigError that names the spec and what to change. This module imports neither torch nor
mpi4py; the user's file may.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Any

from ..errors import ConfigError


def is_spec(text: object) -> bool:
    """Whether `text` reads as PATH:NAME (both parts non-empty); a Windows drive letter is no PATH."""
    if not isinstance(text, str) or ":" not in text:
        return False
    path, _, name = text.rpartition(":")
    return bool(path.strip()) and bool(name.strip())


def load_object(spec: str, option: str) -> Any:
    """The object `spec` (PATH:NAME) names; `option` is the flag it came from, for the messages."""
    if not is_spec(spec):
        raise ConfigError(f"{option} {spec!r} is not PATH:NAME (a module like mypkg.nets or a file like ./nets.py, "
                          f"a colon, then the name of an attribute in it)")
    path, _, name = spec.rpartition(":")
    module = _import(path.strip(), option, spec)
    value: Any = module
    for part in name.strip().split("."):
        if not hasattr(value, part):
            found = sorted(n for n in vars(module) if not n.startswith("_"))
            raise ConfigError(f"{option} {spec}: {path} has no attribute {name!r} (it defines: "
                              f"{', '.join(found[:12]) or 'nothing public'}{', ...' if len(found) > 12 else ''})")
        value = getattr(value, part)
    return value


def _import(path: str, option: str, spec: str) -> Any:
    """The module of PATH: a file when it ends in .py or names one, else a module import."""
    file = Path(path)
    if path.endswith(".py") or file.is_file():
        if not file.is_file():
            raise ConfigError(f"{option} {spec}: no such file {path} (relative paths are from the current folder, "
                              f"{Path.cwd()})")
        return _import_file(file.resolve(), option, spec)
    try:
        return importlib.import_module(path)
    except ModuleNotFoundError as exc:
        if exc.name and (path == exc.name or path.startswith(exc.name + ".")):
            raise ConfigError(f"{option} {spec}: no module named {exc.name!r} (give a file path like ./nets.py, "
                              f"or install the package or add its folder to PYTHONPATH)") from None
        raise ConfigError(f"{option} {spec}: importing {path} failed: {_first_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the user's module raises while importing
        raise ConfigError(f"{option} {spec}: importing {path} failed: {_first_line(exc)}") from None


def _import_file(file: Path, option: str, spec: str) -> Any:
    """Import a .py file once per process, under a name of its own (two files called nets.py in
    different folders stay apart); its folder goes on sys.path for its own imports."""
    name = f"pgc_user_{abs(hash(str(file))):x}_{file.stem}"
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, file)
    if loader_spec is None or loader_spec.loader is None:
        raise ConfigError(f"{option} {spec}: {file} cannot be imported as Python")
    module = importlib.util.module_from_spec(loader_spec)
    if str(file.parent) not in sys.path:
        sys.path.insert(0, str(file.parent))
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except Exception as exc:  # noqa: BLE001 - a syntax error or any exception of the user's file
        del sys.modules[name]
        raise ConfigError(f"{option} {spec}: importing {file} failed: {_first_line(exc)}") from None
    return module


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def label_of(obj: Any) -> str:
    """A stable name for a Python object given to pgc_mpi.fit (config.json and the checkpoints'
    identity): module:qualified name of a function or class, of an instance's class otherwise."""
    target = obj if callable(obj) and hasattr(obj, "__qualname__") else type(obj)
    return f"{getattr(target, '__module__', '?')}:{getattr(target, '__qualname__', type(obj).__name__)}"
