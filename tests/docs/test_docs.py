"""The documentation: the README as a front door, its guides in docs/, and the links between them.

docs/options.md is generated from the parsers (so it cannot drift from --help); every relative link
in README.md and docs/*.md reaches an existing file and, with `#anchor`, a heading of it; the README
stays short, keeps CI's test command on a line of its own, and shows examples/custom_cnn.py as it is.
No MPI, no torch: fast.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path
from urllib.parse import unquote

import pytest

from pgc_mpi.commands.options_doc import REGENERATE, parsers, render

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]

FENCE = re.compile(r"^\s*(```|~~~)")
# [text](target) and ![alt](target); the target ends at whitespace (an optional "title" follows) or ")".
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CODE_SPAN = re.compile(r"(`+).*?\1")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lowercased, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = text.replace("`", "").strip().lower()
    kept = "".join(ch for ch in text if ch in "-_ " or unicodedata.category(ch)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a Markdown file, with GitHub's -1, -2, ... for repeated headings."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path.read_text()):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else f"{base}-{count}")
    return out


def relative_links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link that is not an external or mail address, outside code.

    A link's text may run over lines, its target may not: a `](` that starts no whole link (a target
    broken by a line break, say) is reported as the target "MALFORMED: ..." so that it fails the check.
    """
    links = []
    numbered = prose_lines(path.read_text())
    text = "\n".join(CODE_SPAN.sub(lambda m: "x" * len(m.group(0)), line) for _, line in numbered)
    starts = [0]
    for _, line in numbered:
        starts.append(starts[-1] + len(line) + 1)

    def line_at(offset: int) -> int:
        return numbered[max(k for k, s in enumerate(starts[:-1]) if s <= offset)][0]

    covered = set()
    for match in LINK.finditer(text):
        covered.update(range(match.start(), match.end()))
        target = match.group(1)
        if not re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto:
            links.append((line_at(match.start()), target))
    for match in re.finditer(r"\]\(", text):
        if match.start() not in covered:
            links.append((line_at(match.start()), "MALFORMED: " + text[match.start():match.start() + 60]))
    return sorted(links)


def test_the_options_reference_is_what_the_parsers_say():
    written = (ROOT / "docs" / "options.md").read_text()
    assert written == render(), f"docs/options.md is out of date: regenerate it with `{REGENERATE}`"
    assert REGENERATE in written.splitlines()[2]  # the header says how


def test_every_option_of_both_commands_is_in_the_reference():
    written = (ROOT / "docs" / "options.md").read_text()
    options = [(p.prog, o) for p in parsers() for action in p._actions for o in action.option_strings]
    assert len(options) > 60
    assert [(prog, o) for prog, o in options if f"`{o}`" not in written] == []


def test_the_reference_imports_neither_torch_nor_mpi():
    import subprocess
    import sys

    code = ("import sys; from pgc_mpi.commands.options_doc import render; render(); "
            "print(sorted(m for m in ('torch', 'mpi4py') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_slugs_follow_github():
    assert slug("Training: `pgc-train`") == "training-pgc-train"
    assert slug("Other machines: torch and MPI") == "other-machines-torch-and-mpi"
    assert slug("11. The paper's experiments at this machine's scale (simulated, 5 seeds)") == (
        "11-the-papers-experiments-at-this-machines-scale-simulated-5-seeds")
    assert slug("Outputs (`--out DIR`)") == "outputs---out-dir"
    assert slug("pgc_mpi/: one folder per layer") == "pgc_mpi-one-folder-per-layer"


def test_the_link_check_sees_links_and_skips_code(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\nSee [a](a.md#x), ![f](f.png \"title\") and [web](https://example.org).\n"
                    "`[not](a link)`\n```\n[nor](this.md)\n```\n## Title\n"
                    "[a text\nover lines](b.md) [cut](c.md#x-\ny)\n")
    links = relative_links(page)
    assert [t for _, t in links[:3]] == ["a.md#x", "f.png", "b.md"] and [n for n, _ in links[:3]] == [3, 3, 9]
    assert links[3][0] == 10 and links[3][1].startswith("MALFORMED: ](c.md#x-")
    assert anchors(page) == {"title", "title-1"}


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_relative_link_resolves(page):
    broken = []
    for number, target in relative_links(page):
        if target.startswith("MALFORMED"):
            broken.append(f"{page.relative_to(ROOT)}:{number}: {target}")
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / unquote(file_part)).resolve() if file_part else page
        where = f"{page.relative_to(ROOT)}:{number}: {target}"
        if not dest.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            broken.append(f"{where} (no heading with that anchor)")
        elif anchor and dest.suffix != ".md":
            broken.append(f"{where} (an anchor into a file that is not Markdown)")
    assert broken == []


def test_the_readme_links_to_every_guide():
    linked = {(README.parent / t.partition("#")[0]).resolve() for _, t in relative_links(README)}
    assert [p.name for p in DOCS if p.resolve() not in linked] == []


def test_the_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move the details into a guide in docs/"


def test_the_readme_first_pytest_line_is_the_test_command():
    """CI runs `grep -m1 '^python -m pytest' README.md` (.ci/run): that line must be the whole test command."""
    first = next(line for line in README.read_text().splitlines() if line.startswith("python -m pytest"))
    assert first.startswith("python -m pytest && MPIEXEC_TIMEOUT=600 mpiexec -n 2 python -m pytest --with-mpi -m mpi")
    assert "mpiexec -n 4 python -m pytest --with-mpi -m mpi" in first
    # the multi-rank runs name the files that hold mpi-marked tests (collecting the whole suite on
    # every rank of three runs cost about 20 s): every such file must be named
    marked = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("test_*.py")
                    if re.search(r"^(pytestmark = |@)pytest\.mark\.mpi\b", p.read_text(), re.MULTILINE))
    assert marked and all(first.count(f"-m mpi {name}") == 3 for name in marked), marked
    assert "grep -m1 '^python -m pytest' README.md" in (ROOT / ".ci" / "run").read_text()


def test_the_readme_example_is_examples_custom_cnn():
    text = README.read_text()
    section = text[text.index("### Train your own model"):]
    block = re.search(r"^```python\n(.*?)^```$", section, re.MULTILINE | re.DOTALL)
    assert block, "no python block in the README's Train your own model"
    script = (ROOT / "examples" / "custom_cnn.py").read_text()
    assert block.group(1) == script[script.index("from sklearn.datasets import load_digits"):]
