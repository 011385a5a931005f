"""The Markdown reference of pgc-train's and pgc-sim's options, built from their argparse parsers.

`python -m pgc_mpi.commands.options_doc > docs/options.md` regenerates docs/options.md; a test checks
that the file equals `render()`, so the reference and `--help` never disagree. One table per argument
group of each parser: the option strings, the argument (its metavar, as the usage line shows it) and
the help text with its default, expanded as `--help` expands it. The output depends on nothing but
the parsers (no terminal width, no wrapping). Only the parsers are imported: no torch, no mpi4py.
"""

from __future__ import annotations

import argparse
import re
import sys

REGENERATE = "python -m pgc_mpi.commands.options_doc > docs/options.md"

# Characters that Markdown would read as formatting in a help text's prose (outside `code spans`).
_MARKDOWN_SPECIAL = re.compile(r"([\\*_<>\[\]|])")


def _escape(text: str) -> str:
    """`text` as one Markdown table cell: prose escaped, code spans kept, `|` escaped everywhere."""
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for k, part in enumerate(parts):
        if k % 2:  # a code span: only the table's cell separator needs escaping
            out.append(part.replace("|", "\\|"))
        else:
            out.append(_MARKDOWN_SPECIAL.sub(r"\\\1", part))
    return "".join(out)


def _one_line(text: str) -> str:
    """Collapse the whitespace of a help text or description (source line breaks, indentation)."""
    return " ".join(text.split())


def _formatter(parser: argparse.ArgumentParser) -> argparse.HelpFormatter:
    """The parser's own help formatter, at a fixed width (only its expansions are used, never its wrapping)."""
    return parser.formatter_class(prog=parser.prog, width=1000)


def _argument(formatter: argparse.HelpFormatter, action: argparse.Action) -> str:
    """The argument an option takes as --help shows it (e.g. `SCHEME`); empty for a flag."""
    if action.nargs == 0:
        return ""
    default_metavar = action.dest.upper()
    return formatter._format_args(action, default_metavar)


def _help(formatter: argparse.HelpFormatter, action: argparse.Action) -> str:
    """The help text with %(default)s and the like expanded as --help expands them."""
    if not action.help:
        return ""
    return _one_line(formatter._expand_help(action))


def _group_table(parser: argparse.ArgumentParser, group: argparse._ArgumentGroup) -> list[str]:
    """The Markdown lines of one argument group: its heading, description and table; none when it is empty."""
    actions = [a for a in group._group_actions if a.help is not argparse.SUPPRESS]
    if not actions:
        return []
    formatter = _formatter(parser)
    lines = [f"### {parser.prog}: {group.title}", ""]
    if group.description:
        lines += [_escape(_one_line(group.description)), ""]
    lines += ["| option | argument | meaning (default) |", "|---|---|---|"]
    for action in actions:
        names = ", ".join(f"`{name}`" for name in action.option_strings) or f"`{action.dest}`"
        argument = _argument(formatter, action)
        shown = f"`{argument}`" if argument else ""
        lines.append(f"| {names} | {shown.replace('|', chr(92) + '|')} | {_escape(_help(formatter, action))} |")
    lines.append("")
    return lines


def render_parser(parser: argparse.ArgumentParser) -> str:
    """One command's section: its name, description and one table per non-empty argument group."""
    lines = [f"## {parser.prog}", ""]
    if parser.description:
        lines += [_escape(_one_line(parser.description)), ""]
    for group in parser._action_groups:
        lines += _group_table(parser, group)
    return "\n".join(lines)


def parsers() -> list[argparse.ArgumentParser]:
    """pgc-train's and pgc-sim's parsers, in that order."""
    from ..config import build_parser as train_parser
    from ..sim.cli import build_parser as sim_parser

    return [train_parser(), sim_parser()]


def render() -> str:
    """The whole reference, docs/options.md's content."""
    head = [
        "# Options of pgc-train and pgc-sim",
        "",
        f"Generated from the commands' parsers by `{REGENERATE}`: do not edit by hand. "
        "A test checks that this file equals what the parsers say, so it is what `--help` prints. "
        "Every option can also be set in a TOML file given with `--config` (pgc-train), keys spelled like the "
        "flags; the main options in context are in [training.md](training.md) and [simulator.md](simulator.md).",
        "",
    ]
    return "\n".join(head) + "\n" + "\n".join(render_parser(p) for p in parsers()).rstrip("\n") + "\n"


def main() -> int:
    """Print the reference (redirect it to docs/options.md)."""
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
