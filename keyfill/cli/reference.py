"""docs/cli.md's option tables, written from the parser itself so the page cannot drift from
`--help`: each block between `<!-- options: NAME -->` and `<!-- /options -->` is the table of
`keyfill NAME`'s options. `python -m keyfill.cli.reference docs/cli.md` rewrites the blocks;
tests/test_cli.py checks that the page is what this writes."""

from __future__ import annotations

import argparse
import re
import sys

from keyfill.cli import build_parser

TABLE = re.compile(r"(<!-- options: (?P<name>[a-z-]+) -->\n).*?(<!-- /options -->)", re.S)


def subcommands(parser: argparse.ArgumentParser | None = None) -> dict[str, argparse.ArgumentParser]:
    parser = parser or build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def options_table(command: argparse.ArgumentParser) -> str:
    """A markdown table of the command's options, as its --help gives them (with their
    defaults, where a flag has one worth saying)."""
    helper = command._get_formatter()
    rows = ["| option | meaning |", "|---|---|"]
    for action in command._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or "--help" in action.option_strings:
            continue
        takes = f" {helper._format_args(action, action.dest.upper())}" if action.nargs != 0 else ""
        flags = ", ".join(f"`{flag}{takes}`" for flag in action.option_strings)
        meaning = " ".join(helper._expand_help(action).split()) if action.help else ""
        if "(default:" in (action.help or ""):  # it says its own (a default of this machine's cores, say)
            meaning = re.sub(r" \(default: [^()]*\)$", "", meaning)
        meaning = re.sub(r" \(default: (None|False)\)$", "", meaning).replace("|", "\\|")
        rows.append(f"| {flags} | {meaning} |")
    return "\n".join(rows) + "\n"


def rewrite(text: str) -> str:
    """`text` with every options block holding its command's table."""
    commands = subcommands()

    def table(m: re.Match[str]) -> str:
        return m.group(1) + options_table(commands[m.group("name")]) + m.group(3)

    return TABLE.sub(table, text)


def main(argv: list[str] | None = None) -> int:
    (path,) = argv if argv is not None else sys.argv[1:]
    with open(path) as f:
        text = f.read()
    with open(path, "w") as f:
        f.write(rewrite(text))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
