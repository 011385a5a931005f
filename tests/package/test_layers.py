"""The house's rules, read from the code: each folder of pgc_mpi is one layer, a layer imports only
the layers below it (the job, pgc-train and pgc_mpi.fit, is above the runtime, its step loop and
wire: the runtime never imports the job), only the runtime and the job import mpi4py, the core
imports no torch or h5py, and no modules import each other in a circle (lazy imports inside
functions count; imports only for type checkers, under `if TYPE_CHECKING:`, do not count for the
layers but do for circles: a circle through them is still two modules that each need the other).
docs/layout.md states the same rules for readers."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "pgc_mpi"
BELOW = ["base", "core", "learning", "config", "runs"]
ALLOWED = {  # layer -> the pgc_mpi layers it may import
    "base": set(),
    "core": {"base"},
    "learning": {"base", "core"},
    "config": {"base", "core", "learning"},
    "runs": {"base", "core", "learning", "config"},
    "sim": set(BELOW),
    "runtime": set(BELOW),
    "job": {*BELOW, "runtime"},
    "commands": {*BELOW, "sim"},
    "api": {*BELOW, "sim", "runtime", "job", "commands"},  # pgc_mpi/__init__.py and __main__.py, lazily
}
FORBIDDEN = {  # layer -> third-party packages it must not import, anywhere in its code
    "core": {"torch", "mpi4py", "h5py"},
    "learning": {"mpi4py"},
    "config": {"torch", "mpi4py"},
    "runs": {"mpi4py"},
    "sim": {"mpi4py"},
    "commands": {"mpi4py"},
    "base": {"torch", "mpi4py", "h5py"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in ("__main__",):
        return "api"
    if len(parts) == 2 and parts[1] in ("errors", "choices"):
        return "base"
    return parts[1]


MODULES = {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports_of(module: str, type_checking: bool = False) -> tuple[set[str], set[str]]:
    """(pgc_mpi modules, third-party top-level packages) that `module` imports anywhere in its code;
    with `type_checking`, its imports for type checkers only too."""
    path = MODULES[module]
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    ours, theirs = set(), set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Import, ast.ImportFrom)) or (
                not type_checking and _type_checking_only(node, parents)):
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                (ours if alias.name.startswith("pgc_mpi") else theirs).add(alias.name.split(".")[0]
                                                                            if not alias.name.startswith("pgc_mpi")
                                                                            else alias.name)
            continue
        if node.level:
            base = package.split(".")
            base = base[:len(base) - node.level + 1]
            target = ".".join([*base, node.module] if node.module else base)
        else:
            target = node.module or ""
        if not target.startswith("pgc_mpi"):
            theirs.add(target.split(".")[0])
            continue
        for alias in node.names:  # `from pkg import module` imports that module
            sub = f"{target}.{alias.name}"
            ours.add(sub if sub in MODULES else target)
    return {m for m in ours if m in MODULES and m != module}, theirs


GRAPH = {module: imports_of(module)[0] for module in MODULES}
GRAPH_WITH_TYPES = {module: imports_of(module, type_checking=True)[0] for module in MODULES}


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_module_imports_only_the_layers_below_it(module):
    layer = layer_of(module)
    assert layer in ALLOWED, f"{module}: {layer} is no layer of docs/layout.md"
    wrong = sorted(m for m in GRAPH[module] if layer_of(m) != layer and layer_of(m) not in ALLOWED[layer])
    assert not wrong, f"{module} ({layer}) imports {wrong}: {layer} may import only {sorted(ALLOWED[layer])}"
    third = sorted(imports_of(module)[1] & FORBIDDEN.get(layer, set()))
    assert not third, f"{module} ({layer}) imports {third}"


def test_no_modules_import_each_other_in_a_circle():
    """Imports for type checkers included."""
    index, low, stack, on_stack, circles = {}, {}, [], set(), []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH_WITH_TYPES[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in sorted(GRAPH_WITH_TYPES):
        if v not in index:
            visit(v)
    assert not circles, f"import circles: {circles}"


def test_no_module_is_much_longer_than_450_lines():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 475}
    assert not long, f"split these modules: {long}"


def test_no_function_is_longer_than_60_lines():
    """A function that does one thing reads on one screen (its docstring counted)."""
    long = {f"{m}.{f.name}": f.end_lineno - f.lineno + 1 for m, p in MODULES.items()
            for f in ast.walk(ast.parse(p.read_text())) if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))
            and f.end_lineno - f.lineno + 1 > 60}
    assert not long, f"split these functions: {long}"


def test_the_rules_hold_at_run_time_too():
    """Importing the configuration, pgc-sim's and pgc-bench's commands loads neither torch nor mpi4py."""
    code = ("import sys, pgc_mpi.config, pgc_mpi.sim.cli, pgc_mpi.commands.bench, pgc_mpi.core.schemes; "
            "print(sorted({'torch', 'mpi4py', 'h5py'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
