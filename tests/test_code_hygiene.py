"""Comments say why, with the number that matters: no clock times, no "run N" diaries, no references to result
files that are not in the tree (result files, docs pages) (git keeps the history; docs/benchmarks.md has the latest figures)."""
from __future__ import annotations

import io
import re
import tokenize
from pathlib import Path

import pytest

import jitops

REPO = Path(jitops.__file__).parent.parent
SOURCES = sorted((REPO / "jitops").rglob("*.py"))

CLOCK = re.compile(r"(?<![\w:.])([01]?\d|2[0-3]):[0-5]\d(?![\w:])")   # 13:13, 9:05 UTC; not a[1:10] or 1:2:3
RUN_N = re.compile(r"\b(?:run|runs) \d+(?:-\d+)?\b|\b(?:first|second|third|last) run\b", re.IGNORECASE)
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")   # a run's date: docs/benchmarks.md holds it with the run
FILE = re.compile(r"(?<![\w/])(?:benchmarks|docs|tools|kernels)/[\w*./-]*[\w*]")  # a path in the repository

# Files that still have them, each named until it is cleaned (remove the entry then: a stale one fails).
EXCEPTIONS: dict[str, str] = {}


def comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring (strings that are a statement of their own)."""
    found, previous = [], None
    for token in tokenize.generate_tokens(io.StringIO(path.read_text()).readline):
        if token.type == tokenize.COMMENT:
            found.append((token.start[0], token.string))
        elif token.type == tokenize.STRING and (previous is None or previous.type in (
                tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT)):
            found.append((token.start[0], token.string))
        if token.type not in (tokenize.COMMENT, tokenize.NL):
            previous = token
    return found


def c_comments(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every // and /* */ comment of a C, C++ or CUDA source."""
    text = path.read_text()
    return [(text.count("\n", 0, match.start()) + 1, match.group(0))
            for match in re.finditer(r"//[^\n]*|/\*.*?\*/", text, re.S)]


def diary_lines(path: Path) -> list[str]:
    bad = []
    for line, text in (comments_and_docstrings(path) if path.suffix == ".py" else c_comments(path)):
        for pattern, what in ((DATE, "run date"), (CLOCK, "clock time"), (RUN_N, "run number")):
            for match in pattern.finditer(text):
                bad.append(f"{path.relative_to(REPO)}:{line}: {what} {match.group(0)!r}")
        for match in FILE.finditer(text):
            pattern = match.group(0)
            if not list(REPO.glob(pattern)):
                bad.append(f"{path.relative_to(REPO)}:{line}: {pattern} is not in the tree")
    return bad


KERNEL_SOURCES = sorted(p for p in (REPO / "kernels").rglob("*") if p.suffix in (".cu", ".cuh", ".cpp", ".h"))


@pytest.mark.parametrize("path", SOURCES + KERNEL_SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_clock_times_or_run_diaries_in_comments(path):
    relative = str(path.relative_to(REPO))
    bad = diary_lines(path)
    if relative in EXCEPTIONS:
        assert bad, f"{relative} is clean now: remove it from EXCEPTIONS"
        return
    assert not bad, ("comments say why with the number that matters; the date and device belong to "
                     "docs/benchmarks.md:\n  " + "\n  ".join(bad))


def test_the_patterns_can_fail(tmp_path):
    # The samples are written from parts ({day}, {hhmm}...) so that this file itself holds no diary line.
    day, hhmm, late, again, nth = "2026-" + "11-22", "13" + ":13", "16" + ":42", "run " + "7", "second " + "run"
    sample = tmp_path / "sample.py"
    stamp = " ".join((day, hhmm))  # a date and a clock time, the pattern the check must catch
    sample.write_text('"""Timed ' + stamp + '."""\n'
                      f"x = a[1:10]  # {nth}: 21.2 us (benchmarks/results/gone_1642.json)\n"
                      f"y = 1  # {late} UTC, {again}\n")
    found = [line.split(": ", 1)[1] for line in diary_lines_at(sample, tmp_path)]
    assert found == [f"run date '{day}'", f"clock time '{hhmm}'", f"run number '{nth}'",
                     "benchmarks/results/gone_1642.json is not in the tree", f"clock time '{late}'",
                     f"run number '{again}'"]
    kernel_clock, kernel_run = "13" + ":57", "run " + "9"
    kernel = tmp_path / "k.cu"
    kernel.write_text("// tile 128 (" + " ".join((day, kernel_clock)) + ")\nint a = b ? 1:2;\n"
                      f"/* {kernel_run}:\n   slower */\n")
    found = [line.split(": ", 1)[1] for line in diary_lines_at(kernel, tmp_path)]
    assert found == [f"run date '{day}'", f"clock time '{kernel_clock}'", f"run number '{kernel_run}'"]


def diary_lines_at(path: Path, root: Path) -> list[str]:
    global REPO
    saved, REPO = REPO, root
    try:
        return diary_lines(path)
    finally:
        REPO = saved
