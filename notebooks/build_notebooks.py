"""Build notebooks/*.ipynb from their sources, notebooks/src/*.py, with no outputs.

    python notebooks/build_notebooks.py           # rewrite every .ipynb from its source
    python notebooks/build_notebooks.py --check   # exit 1 if an .ipynb differs from its source (tests/ run this)

The sources are the reviewable truth: plain Python in jupytext's "percent" format, where `# %%` starts a code
cell and `# %% [markdown]` a markdown cell whose lines are `# `-prefixed.  Edit them (or pair them with the
notebooks through jupytext), then rebuild.  The .ipynb files are committed without outputs, with fixed cell ids
and metadata, so that building twice gives the same bytes and git diffs stay readable.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent
SOURCES = HERE / "src"
_CELL = re.compile(r"^# %%(?P<kind> \[markdown\])?[^\n]*$", re.M)

METADATA = {
    "kernelspec": {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"},
    "language_info": {"name": "python"},
}


def _markdown(lines: list[str]) -> str:
    out = []
    for line in lines:
        if line == "#":
            out.append("")
        elif line.startswith("# "):
            out.append(line[2:])
        else:
            raise ValueError(f"markdown line does not start with '# ': {line!r}")
    return "\n".join(out)


def parse(text: str) -> list[tuple[str, str]]:
    """(kind, source) per cell, kind "code" or "markdown"; blank lines around a cell are dropped."""
    matches = list(_CELL.finditer(text))
    if not matches or text[:matches[0].start()].strip():
        raise ValueError("a notebook source must start with a '# %%' cell marker")
    cells = []
    for i, match in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = text[match.end():end].strip("\n")
        if match.group("kind"):
            cells.append(("markdown", _markdown(body.splitlines())))
        else:
            cells.append(("code", body))
    return cells


def build(source: Path) -> str:
    """The .ipynb text for one source file."""
    notebook = nbformat.v4.new_notebook(metadata=METADATA)
    for index, (kind, text) in enumerate(parse(source.read_text())):
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        cell = make(text)
        cell["id"] = f"{source.stem.split('_', 1)[0]}-{index:02d}"  # fixed ids: no churn in git
        notebook.cells.append(cell)
    nbformat.validate(notebook)
    return nbformat.writes(notebook) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    args = parser.parse_args(argv)
    stale = []
    for source in sorted(SOURCES.glob("[0-9][0-9]_*.py")):
        target = HERE / f"{source.stem}.ipynb"
        text = build(source)
        if args.check:
            if not target.exists() or target.read_text() != text:
                stale.append(target.name)
        elif not target.exists() or target.read_text() != text:
            target.write_text(text)
            print(f"wrote {target.relative_to(HERE.parent)}")
    if stale:
        print(f"out of date with notebooks/src: {', '.join(stale)}; run python notebooks/build_notebooks.py",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
