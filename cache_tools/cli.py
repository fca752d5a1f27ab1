"""The command line: `python -m cache_tools` / `jitops-cache`.  Parses flags, calls the functions of the other
modules (which tests call directly too) and prints their results as tables or, with --json, as JSON.

Exit codes: 0 done; 1 something failed (a compile, a corrupt entry, a manifest item that would miss, a write);
2 bad input (flags, manifest, archive, an arch no compiler here supports, a cache root that cannot be
written), with nothing in the cache changed; 130 interrupted (SIGINT), 143 terminated (SIGTERM): the
compilers under way are stopped and their build directories removed.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import shlex
import shutil
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import jitops
from jitops import config, runtime
from jitops.backends import processes
from jitops.config import Config
from jitops.errors import ConfigError

from . import archive, entries, explain, info, manifest, prewarm, remote
from .common import (UsageError, WriteError, check_archs_supported, check_writable, compact_shape_class,
                     format_age, format_size, os_error_message, parse_age, parse_archs, parse_size, print_json,
                     print_table)

PROG = "jitops-cache"

MANIFEST_HELP = """\
manifest format (JSON, or YAML with PyYAML):
  {{"archs": ["sm_90a", "cpu"],
   "ops": [{{"op": "layer_norm", "dtypes": ["bf16", "fp32"],
            "shapes": [[[4096, 1024], [1024], [1024]]],
            "kwargs": {{"normalized_shape": [1024], "eps": 1e-05}}}}]}}
  op         a public op ({ops}),
             or namespace::name with --import MODULE.  The item builds every kernel a call
             can use: the no-grad path, the grad path and its backward; "grad": false (or
             true) keeps one path.
  shapes     one entry per example call: the shapes of its tensor arguments in order
             (null for an absent optional tensor, a list of shapes for a list argument)
  kwargs     the other arguments; omitted ones take their defaults
  strides    optional, parallel to shapes, for non-contiguous calls
  kernel_op  exactly one op's call, as JITOPS_RECORD lines give it:
             {{"op": "layer_norm", "kernel_op": "layer_norm_backward", ...}}
A JITOPS_RECORD file (--record) holds one item per line, with "archs"."""


def manifest_help() -> str:
    return MANIFEST_HELP.format(ops=", ".join(jitops.public_names()))


def prog() -> str:
    """How this command was started, for remedy lines the user can paste: `jitops-cache` when that is on PATH,
    the path typed otherwise (.venv/bin/jitops-cache without the venv activated), `python -m cache_tools`."""
    argv0 = sys.argv[0] if sys.argv else ""
    name = os.path.basename(argv0)
    if name == "__main__.py" and os.path.basename(os.path.dirname(argv0)) == "cache_tools":
        return "python -m cache_tools"
    if name == PROG and argv0 != PROG:
        on_path = shutil.which(PROG)
        if not on_path or os.path.realpath(on_path) != os.path.realpath(argv0):
            return argv0
    return PROG


def again(args: argparse.Namespace, command: str, *extra: str, archs: Sequence[str] = (),
          imports: bool = True) -> str:
    """A remedy command line that repeats the flags in use (--cache-dir, --arch, --import: `imports` is false
    for a command that takes none)."""
    parts = [prog(), command, *extra]
    if getattr(args, "cache_dir", None) is not None:
        parts += ["--cache-dir", shlex.quote(str(args.cache_dir))]
    for arch in archs:
        parts += ["--arch", arch]
    for module in (getattr(args, "imports", None) or ()) if imports else ():
        parts += ["--import", shlex.quote(module)]
    return " ".join(parts)


# ---- flags -------------------------------------------------------------------------------------------------------
def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _shared(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """The flags every subcommand takes, named the same everywhere.  They may come before or after the
    subcommand; after wins."""
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument("--cache-dir", metavar="DIR", type=Path, default=default,
                        help="the writable cache root (default: JITOPS_CACHE_DIR or the runtime's: "
                             "~/.cache/jitops); read-only JITOPS_CACHE_PATH roots are read too")
    parser.add_argument("--arch", action="append", metavar="ARCH", default=default,
                        help="sm_80, sm_90a, ... or cpu; repeatable or comma-separated.  prewarm/verify/explain: "
                             "build or look up for these (overrides the manifest's archs); list/prune/export/info: "
                             "only these archs' entries (sm_90a selects sm_90 and sm_90a entries)")
    parser.add_argument("--jobs", type=_jobs, metavar="N", default=default,
                        help="parallel compiles or checksum threads (default: JITOPS_JOBS or the number of cores)")
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS if suppress else False,
                        help="print the result as JSON on stdout")


def _imports(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--import", dest="imports", action="append", metavar="MODULE", default=[],
                        help="import this Python module first, so the ops it declares with jitops.op can be named "
                             "(e.g. mylib::scaled_add); repeatable")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog(), description="Prewarm, inspect, verify, prune, ship and explain the jitops kernel cache.\n"
        "`COMMAND --help` describes a command; the manifest format is below.",
        epilog=manifest_help(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s (jitops {jitops.__version__}, torch {_torch_version()})")
    _shared(parser, suppress=False)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def command(name: str, help: str, epilog: str | None = None) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help, epilog=epilog,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        _shared(sub, suppress=True)
        return sub

    p = command("prewarm", "compile the kernels a manifest, a JITOPS_RECORD file or the built-in ops need "
                           "(no GPU needed for NVRTC kernels)", manifest_help())
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--manifest", metavar="FILE", help="a manifest (JSON, or YAML with PyYAML)")
    source.add_argument("--record", metavar="FILE", help="a JITOPS_RECORD file: replays every recorded miss")
    source.add_argument("--all-builtin", action="store_true", help="every built-in op's common shape classes")
    p.add_argument("--skip-unbuildable", action="store_true",
                   help="report kernels this machine cannot build, but do not fail for them")
    p.add_argument("--no-progress", action="store_true", help="no progress display on stderr")
    p.add_argument("--list", action="store_true",
                   help="compile nothing: list every kernel the source covers (public op, the op that asks for it, "
                        "arch, shape class) and whether it is cached already")
    p.add_argument("--verbose", action="store_true",
                   help="list every call that was skipped (an op without an implementation on an arch, a dtype "
                        "the arch does not support) and, with --skip-unbuildable, every kernel this machine "
                        "cannot build, not only their count")
    _imports(p)

    p = command("list", "a table of the cached entries")
    p.add_argument("--op", action="append", metavar="NAME", help="only this op's entries (repeatable)")

    p = command("verify", "check every entry's checksums; with --manifest, check that nothing it names would miss",
                manifest_help())
    p.add_argument("--fix", action="store_true", help="remove corrupt entries from the writable root")
    p.add_argument("--manifest", metavar="FILE", help="exit 1 if a call of this manifest would miss the cache")
    p.add_argument("--record", metavar="FILE", help="the same for a JITOPS_RECORD file")
    _imports(p)

    p = command("prune", "remove entries, least recently used first (by the runtime's last-use stamp)")
    p.add_argument("--max-size", metavar="SIZE", help="keep at most this much: 500M, 2G, 1.5GiB, 800MB")
    p.add_argument("--older-than", metavar="AGE", help="remove entries unused for this long: 30d, 12h, 90m")
    p.add_argument("--dry-run", action="store_true", help="say what would go; remove nothing")

    p = command("export", "write the verified entries into one archive file (tar; .tar.gz; .tar.zst with zstandard)")
    p.add_argument("output", metavar="FILE", help="the archive to write, e.g. kernels.tar.zst")
    p.add_argument("--zstd", action="store_true", help="zstd-compress whatever the file name says")
    p.add_argument("--level", type=int, default=10, help="zstd level (default 10)")

    p = command("import", "check an archive completely, then add its entries to the writable root")
    p.add_argument("archive", metavar="FILE", help="an archive written by `export`")

    p = command("explain", "show the key of every kernel an op call needs and why it would miss")
    p.add_argument("op", nargs="?", help="the op, e.g. gelu (or give --item)")
    p.add_argument("--dtype", help="the call's dtype, e.g. bf16")
    p.add_argument("--shape", action="append", metavar="SHAPE",
                   help="one per tensor argument, in order: 4096x8192, 4096,8192, [] for a scalar, none for an "
                        "absent optional tensor, or JSON ([[2,3],[4,5]] for a tensor list)")
    p.add_argument("--stride", action="append", metavar="STRIDE",
                   help="strides of a non-contiguous tensor argument, one per --shape (or none)")
    p.add_argument("--kwarg", action="append", metavar="NAME=VALUE", help="another argument, e.g. approximate=tanh")
    p.add_argument("--item", metavar="JSON", help="the call as a manifest item: a JITOPS_RECORD line or the item "
                                                  "a CacheMissError prints")
    _imports(p)

    p = command("push", "upload the verified entries of the local cache roots to the remote tier (JITOPS_REMOTE_CACHE)")
    _remote_flag(p)
    p.add_argument("--force", action="store_true", help="upload entries the remote already has too")

    p = command("pull", "fill the writable cache root from the remote tier: what a manifest needs, or everything")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--manifest", metavar="FILE", help="the kernels this manifest's calls need")
    source.add_argument("--record", metavar="FILE", help="the kernels a JITOPS_RECORD file's calls need")
    source.add_argument("--all", action="store_true", help="every entry the remote holds (filtered by --arch)")
    p.add_argument("--any-toolchain", action="store_true",
                   help="accept any toolchain's build of a kernel, as read-only roots do (for an image layer used "
                        "on other machines); by default a kernel is pulled as a call here would look it up")
    _remote_flag(p)
    _imports(p)

    p = command("info", "cache roots, sizes and counts, the remote tier, compiler versions and settings")
    _remote_flag(p)
    return parser


def _remote_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--remote", metavar="URL",
                        help="the remote tier, redis://host:port/db (default: JITOPS_REMOTE_CACHE)")


def _torch_version() -> str:
    import torch

    return torch.__version__


# ---- entry point -------------------------------------------------------------------------------------------------
class Terminated(KeyboardInterrupt):
    """SIGTERM (a supervisor, `docker stop`): unwinds like Ctrl-C, so compilers stop and build dirs go."""


def _terminate(signum: int, frame: Any) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)  # exits 2 with argparse's message on bad flags
    handler = None
    try:
        handler = signal.signal(signal.SIGTERM, _terminate)
    except ValueError:  # not the main thread (an embedding application): its own handlers stay
        pass
    try:
        archs = parse_archs(args.arch)
        if args.cache_dir is not None and args.cache_dir.exists() and not args.cache_dir.is_dir():
            raise UsageError(f"--cache-dir {args.cache_dir} is a file; give a directory (it is created if absent)")
        for module in getattr(args, "imports", ()):
            _import(module)
        scope = {"cache_dir": args.cache_dir} if args.cache_dir is not None else {}
        if getattr(args, "remote", None):
            scope["remote_cache"] = Config.remote_cache.parse("--remote", args.remote)
        with config.scope(**scope):
            return COMMANDS[args.command](args, archs)
    except (UsageError, ConfigError) as exc:
        print(f"{prog()} {args.command}: error: {str(exc).removeprefix('jitops: ')}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a read-only or missing directory: which path, and what to do
        print(f"{prog()} {args.command}: error: {os_error_message(exc)}", file=sys.stderr)
        return 1
    except WriteError as exc:  # the same for a file the user named (an export's archive)
        print(f"{prog()} {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as exc:
        stopped = processes.stop_all()
        what = "terminated" if isinstance(exc, Terminated) else "interrupted"
        print(f"{prog()}: {what}" + (f"; stopped {stopped} compiler process group(s)" if stopped else "") +
              "; what was already built stays cached", file=sys.stderr)
        return 143 if isinstance(exc, Terminated) else 130
    finally:
        if handler is not None:
            signal.signal(signal.SIGTERM, handler)


def _import(module: str) -> None:
    try:
        importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - ImportError, or the module's own error: bad input either way
        raise UsageError(f"--import {module}: {type(exc).__name__}: {exc} (is it on PYTHONPATH?)") from None


def _writable() -> None:
    """Bad input (exit 2, nothing changed) rather than a failed write half-way: no writable root, or one on a
    read-only filesystem or without write permission."""
    if runtime.disk_cache().writable is None:
        raise UsageError("no writable cache root: give --cache-dir DIR (JITOPS_CACHE_DIR is set but empty)")
    check_writable(runtime.disk_cache().writable.path)


def _effective_archs(calls: list[manifest.Call], archs: list[str]) -> list[str]:
    return archs or sorted({a for call in calls for a in call.archs})


def _calls(args: argparse.Namespace) -> list[manifest.Call]:
    if getattr(args, "manifest", None):
        return manifest.load_manifest(args.manifest)
    if getattr(args, "record", None):
        return manifest.load_record(args.record)
    return manifest.builtin_calls()


# ---- prewarm -----------------------------------------------------------------------------------------------------
def cmd_prewarm(args: argparse.Namespace, archs: list[str]) -> int:
    calls = _calls(args)
    if args.all_builtin and not archs:
        raise UsageError("--all-builtin needs --arch: e.g. --arch sm_80,sm_90a,cpu")
    if not args.list:
        check_archs_supported(_effective_archs(calls, archs))
    plan = manifest.plan(calls, archs, strict=not args.all_builtin)
    if args.list:
        return _list_plan(args, plan)
    _writable()
    report = prewarm.prewarm(plan, args.jobs, progress=not args.no_progress)
    ok = not report.count("failed") and (args.skip_unbuildable or not report.count("unbuildable"))
    if args.json:
        print_json(dict(report.as_dict(), ok=ok, cache_dir=str(runtime.disk_cache().writable.path),
                        no_kernel=plan.no_kernel))
        return 0 if ok else 1
    rows = [[r["arch"], r["compiled"], r["cached"], r["failed"], r["unbuildable"], r["skipped"], f"{r['seconds']:.1f}"]
            for r in report.by_arch()]
    print(f"prewarm into {runtime.disk_cache().writable.path}")
    print_table(rows, ["arch", "compiled", "already cached", "failed", "cannot build here", "skipped", "seconds"],
                right=range(1, 7))
    print(f"wall time {report.wall_seconds:.1f} s with {report.jobs} jobs (seconds: build time of each kernel, "
          "added up)")
    # With --skip-unbuildable, kernels this machine cannot build are expected (make run without nvcc): one line.
    expected = args.skip_unbuildable and not args.verbose
    for result in report.results:
        if result.outcome == "failed":
            print(f"\nFAILED {result.job.label} [{result.job.arch}] (op {_op_text(result.job)}, "
                  f"{result.job.call.where}):")
            print(_head(result.error or "", 30))
        elif result.outcome == "unbuildable" and not expected:
            print(f"cannot build here: {result.job.label} [{result.job.arch}] (op {_op_text(result.job)}): "
                  f"{result.error}")
    if expected and report.count("unbuildable"):
        print(unbuildable_summary([r for r in report.results if r.outcome == "unbuildable"]))
    _print_skipped(report.skipped, args.verbose)
    if plan.no_kernel:
        print(plan.no_kernel_summary())
    if not ok:
        print(f"\n{prog()} prewarm: {report.count('failed')} failed, {report.count('unbuildable')} cannot be built "
              "here" + ("" if args.skip_unbuildable or not report.count("unbuildable")
                        else " (--skip-unbuildable accepts those)"), file=sys.stderr)
    return 0 if ok else 1


def _list_plan(args: argparse.Namespace, plan: manifest.Plan) -> int:
    """prewarm --list: what the source covers, kernel by kernel, without building or writing anything (archs this
    machine cannot build for are listed too: the list is about the source, not this machine's compilers)."""
    looked = [entries.lookup(job) for job in plan.jobs]
    cached = [hit for _, hit in looked]
    if args.json:
        # entry: the cache entry's directory name, this toolchain's build (one build can serve several shape
        # classes: it is listed once, under the first)
        print_json({"kernels": [{"op": job.op, "kernel_op": job.kernel_op, "kernel": job.label, "arch": job.arch,
                                 "shape_class": job.shape_class, "entry": key.dirname(), "cached": hit,
                                 "call": job.call.describe()}
                                for job, (key, hit) in zip(plan.jobs, looked)],
                    "skipped": plan.skipped, "no_kernel": plan.no_kernel})
        return 0
    rows = [[job.op, job.kernel_op, job.arch, job.shape_class, "yes" if hit else "no"]
            for job, hit in zip(plan.jobs, cached)]
    print_table(rows, ["op", "asked by", "arch", "shape class", "cached"])
    archs = sorted({job.arch for job in plan.jobs})
    print(f"{len(plan.jobs)} kernels on {', '.join(archs) or 'no arch'}, {sum(cached)} of them cached; "
          "nothing was built")
    _print_skipped(plan.skipped, args.verbose)
    if plan.no_kernel:
        print(plan.no_kernel_summary())
    return 0


def _op_text(job: manifest.Job) -> str:
    return job.op if job.kernel_op == job.op else f"{job.op}, through {job.kernel_op}"


def unbuildable_summary(results: list[prewarm.Result]) -> str:
    """'4 kernels cannot be built here (skipped): no nvcc ... (4); --verbose lists them'."""
    reasons: dict[str, int] = {}
    for result in results:
        reasons[result.error or "?"] = reasons.get(result.error or "?", 0) + 1
    parts = [f"{reason} ({n})" if len(reasons) > 1 else reason for reason, n in reasons.items()]
    return (f"{len(results)} kernel{'s' if len(results) != 1 else ''} cannot be built here (skipped): "
            f"{'; '.join(parts)}; --verbose lists them")


def skip_summary(skipped: list[dict[str, str]]) -> str:
    """'30 combinations skipped: dtype not supported on the target (24), no cpu implementation (6)'."""
    kinds: dict[str, int] = {}
    for item in skipped:
        reason = item["reason"]
        if item.get("kind") == "no implementation":
            kind = f"no {'cpu' if item['arch'] == 'cpu' else 'GPU'} implementation"
        elif " has dtype " in reason and "supported there" in reason:
            kind = "dtype not supported on the target"
        else:
            kind = "the op does not take the call there"
        kinds[kind] = kinds.get(kind, 0) + 1
    parts = [f"{kind} ({n})" if len(kinds) > 1 else kind for kind, n in sorted(kinds.items(), key=lambda k: -k[1])]
    return f"{len(skipped)} combination{'s' if len(skipped) != 1 else ''} skipped: {', '.join(parts)}"


def _print_skipped(skipped: list[dict[str, str]], verbose: bool) -> None:
    """Expected skips (--all-builtin's GPU shapes on the CPU) are one line; --verbose lists them."""
    if not skipped:
        return
    if not verbose:
        print(skip_summary(skipped) + "; --verbose lists them")
        return
    print(skip_summary(skipped) + ":")
    for item in skipped:
        print(f"  skipped {item['call']} on {item['arch']}: {item['reason']}")


def _head(text: str, lines: int) -> str:
    split = text.splitlines()
    shown = "\n".join("  " + line for line in split[:lines])
    return shown + (f"\n  ... ({len(split) - lines} more lines; --json has the whole message)"
                    if len(split) > lines else "")


# ---- list, verify, prune -------------------------------------------------------------------------------------------
def cmd_list(args: argparse.Namespace, archs: list[str]) -> int:
    result = entries.list_entries(archs, args.op or ())
    if args.json:
        print_json(result)
        return 0
    rows = result["entries"]
    several = len(result["roots"]) > 1
    print("cache roots: " + ", ".join(f"{r['path']} ({'writable' if r['writable'] else 'read-only'})"
                                      for r in result["roots"]))
    table = [[_op_cell(r), r["kernel"], r["arch"], r["dtype"], compact_shape_class(r["shape_class"]),
              format_size(r["size"]),
              "-" if r["compile_seconds"] is None else f"{r['compile_seconds']:.2f}", format_age(r["last_used"])]
             + ([("rw" if r["writable"] else "ro")] if several else []) for r in rows]
    header = ["op", "kernel", "arch", "dtype", "shape class", "size", "compile s", "last used"]
    print_table(table, header + (["root"] if several else []), right=(5, 6))
    print(f"{len(rows)} entries, {format_size(sum(r['size'] for r in rows))}")
    if result["unreadable"]:
        print(f"{len(result['unreadable'])} unreadable entries (run `{again(args, 'verify')}`):")
        for bad in result["unreadable"]:
            print(f"  {bad['path']}: {bad['reason']}")
    return 0


def _op_cell(row: dict[str, Any]) -> str:
    """The public op, and the internal op that asked when it is another: 'layer_norm (layer_norm_backward)'."""
    if not row["op"]:
        return "-"
    return row["op"] if row["kernel_op"] in (None, row["op"]) else f"{row['op']} ({row['kernel_op']})"


def cmd_verify(args: argparse.Namespace, archs: list[str]) -> int:
    coverage = None
    if args.manifest or args.record:
        calls = _calls(args)
        check_archs_supported(_effective_archs(calls, archs))
        coverage = manifest.plan(calls, archs)  # bad input stops here, before anything is removed
    if args.fix:
        _writable()
    report = entries.verify(archs, args.jobs, args.fix, coverage)
    if args.json:
        print_json(dict(report.as_dict(), no_kernel=coverage.no_kernel if coverage is not None else []))
        return 0 if report.ok else 1
    where = ", ".join(r["path"] for r in entries.roots())
    print(f"checked {report.checked} entries in {where}: {len(report.corrupt)} corrupt")
    for item in report.corrupt:
        state = "removed" if item.get("removed") else \
            "kept: read-only root" if args.fix and not item["writable"] else \
            f"run `{again(args, 'verify', '--fix', archs=archs)}`"
        print(f"  CORRUPT {item['path']}: {item['reason']} [{state}]")
    if coverage is not None:
        source = args.manifest or args.record
        total = report.covered + len(report.missing)
        print(f"coverage of {source}: {report.covered} of {total} kernels cached"
              + (", missing:" if report.missing else ""))
        for miss in report.missing:
            via = "" if miss["kernel_op"] == miss["op"] else f", through {miss['kernel_op']}"
            print(f"  MISSING {miss['label']} [{miss['arch']}] (op {miss['op']}{via}, {miss['where']})")
        if coverage.no_kernel:
            print(coverage.no_kernel_summary())
        if report.missing:
            flag = "--manifest" if args.manifest else "--record"
            print(f"prewarm them: {again(args, 'prewarm', flag, shlex.quote(str(source)), archs=archs)}")
    return 0 if report.ok else 1


def cmd_prune(args: argparse.Namespace, archs: list[str]) -> int:
    if args.max_size is None and args.older_than is None:
        raise UsageError("say what to prune: --max-size SIZE (e.g. 2G) and/or --older-than AGE (e.g. 30d)")
    max_size = parse_size(args.max_size) if args.max_size is not None else None
    older_than = parse_age(args.older_than) if args.older_than is not None else None
    _writable()
    report = entries.prune(max_size, older_than, archs, args.dry_run)
    if args.json:
        print_json(report.as_dict())
        return 0
    verb = "would remove" if args.dry_run else "removed"
    for item in report.removed:
        what = f"{item.get('label') or item['kernel']} [{item.get('arch') or 'quarantined'}]"
        print(f"{verb} {what}, {format_size(item['size'])}, last used {format_age(item.get('last_used'))}")
    print(f"{verb} {len(report.removed)} entries ({format_size(report.freed)}); kept {report.kept} "
          f"({format_size(report.kept_size)}) in {runtime.disk_cache().writable.path}")
    if report.stale:
        print(f"removed {len(report.stale)} stale temporary directories and unheld lock files")
    return 0


# ---- export, import ----------------------------------------------------------------------------------------------
def cmd_export(args: argparse.Namespace, archs: list[str]) -> int:
    report = archive.export(args.output, archs, args.zstd, args.jobs, args.level)
    if not report.entries:
        where = ", ".join(r["path"] for r in entries.roots())
        print(f"{prog()} export: warning: no entries to export from {where}"
              + (f" for {','.join(archs)}" if archs else "") + f"; {report.path} holds only its index.  "
              f"Prewarm first ({prog()} prewarm --help), or point --cache-dir at the cache to ship.",
              file=sys.stderr)
    if args.json:
        print_json(report.as_dict())
        return 0
    for bad in report.skipped_corrupt:
        print(f"left out corrupt entry {bad['path']}: {bad['reason']}", file=sys.stderr)
    print(f"wrote {report.path}: {len(report.entries)} entries, {format_size(report.size)} "
          f"({'uncompressed' if report.compression == 'none' else report.compression})")
    return 0


def cmd_import(args: argparse.Namespace, archs: list[str]) -> int:
    _writable()
    report = archive.import_archive(args.archive, args.jobs)
    if args.json:
        print_json(report.as_dict())
        return 0 if report.ok else 1
    root = runtime.disk_cache().writable.path
    print(f"imported {len(report.imported)} entries into {root}; {len(report.present)} were already there")
    for item in report.failed:
        print(f"  FAILED {item['label']} [{item['arch']}]: {item['reason']}")
    return 0 if report.ok else 1


# ---- explain, info -----------------------------------------------------------------------------------------------
def _explain_calls(args: argparse.Namespace) -> list[manifest.Call]:
    if args.item:
        if args.op or args.dtype or args.shape or args.kwarg or args.stride:
            raise UsageError("give either --item or OP with --dtype/--shape/--kwarg, not both")
        try:
            item = json.loads(args.item)
        except json.JSONDecodeError as exc:
            raise UsageError(f"--item is not JSON ({exc.msg}): paste a JITOPS_RECORD line or the item a "
                             "CacheMissError printed") from None
        return manifest.parse_item(item, (), "--item")
    if not args.op:
        raise UsageError("name the op (e.g. `explain gelu --dtype bf16 --shape 4096x8192 --arch sm_90a`) or "
                         "give --item JSON")
    if not args.dtype or not args.shape:
        raise UsageError(f"describe the call: --dtype (e.g. bf16) and one --shape per tensor argument of "
                         f"{args.op} (e.g. --shape 4096x8192)")
    item: dict[str, Any] = {"op": args.op, "dtypes": [args.dtype], "shapes": [[_dims(s, "--shape") for s in args.shape]],
                            "kwargs": dict(_kwarg(k) for k in args.kwarg or ())}
    if args.stride:
        item["strides"] = [[_dims(s, "--stride") for s in args.stride]]
    return manifest.parse_item(item, (), "the call")


def _dims(text: str, flag: str) -> Any:
    text = text.strip()
    if text.lower() in ("none", "null"):
        return None
    if text.startswith("["):
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            raise UsageError(f"{flag} {text!r} is not valid JSON") from None
    try:
        return [int(d) for d in text.replace("x", ",").replace("X", ",").split(",") if d.strip()]
    except ValueError:
        raise UsageError(f"{flag} {text!r}: use sizes like 4096x8192 or 4096,8192") from None


def _kwarg(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise UsageError(f"--kwarg {text!r}: use NAME=VALUE, e.g. approximate=tanh")
    try:
        return name.strip(), json.loads(value)
    except json.JSONDecodeError:
        return name.strip(), value  # a bare string: approximate=tanh


def cmd_explain(args: argparse.Namespace, archs: list[str]) -> int:
    calls = _explain_calls(args)
    check_archs_supported(_effective_archs(calls, archs))
    reports = explain.explain(calls, archs, fix_command=again(args, "verify", "--fix"))
    if args.json:
        print_json(reports)
        return 0
    for report in reports:
        call = report["call"]
        via = f" ({call['kernel_op']})" if call.get("kernel_op") not in (None, call["op"]) else ""
        print(f"{call['op']}{via} {call['dtypes'][0]} shapes {json.dumps(call['shapes'][0])}"
              + "".join(f" {k}={v}" for k, v in call["kwargs"].items()) + f" on {report['arch']}")
        for reason in report["skipped"]:
            print(f"  not built there: {reason}")
        if report["no_kernel"]:
            print("  no compiled kernel needed there: torch's code runs this call")
        shown = None
        for kernel in report["kernels"]:
            if (kernel["kernel_op"], kernel["shape_class"]) != shown:  # one header per op call
                shown = (kernel["kernel_op"], kernel["shape_class"])
                print(f"  {kernel['kernel_op']}: shape class: {kernel['shape_class']}")
            _print_kernel(kernel)
        print()
    return 0


def _print_kernel(kernel: dict[str, Any]) -> None:
    print(f"  kernel {kernel['name']}: {kernel['label']}")
    print(f"    key {kernel['entry_name']} ({kernel['backend']}, {kernel['arch']}, {kernel['dtype']})")
    for half in ("request", "toolchain"):
        for name, value in kernel["key"][half].items():
            if name == "sources" and isinstance(value, dict):
                value = ", ".join(f"{path} {digest[:12]}" for path, digest in value.items())
            elif not isinstance(value, str):
                value = json.dumps(value)
            print(f"      {half}.{name}: {value}")
    print(f"    {kernel['status'].upper()}: {kernel['verdict']}")
    if kernel["entry"]:
        print(f"      {kernel['entry']}")
    for problem in kernel.get("corrupt", ()):
        print(f"    corrupt entry with this key: {problem}")
    nearest = kernel.get("nearest")
    if nearest:
        print(f"    nearest cached entry: {nearest['path']}")
        for line in nearest["differences"] + nearest["toolchain_differences"]:
            print(f"      differs: {line}")
    if kernel.get("note"):
        print(f"    {kernel['note']}")


def cmd_info(args: argparse.Namespace, archs: list[str]) -> int:
    result = info.info(archs)
    if args.json:
        print_json(result)
        return 0
    print(f"jitops {result['jitops']}, torch {result['torch']} (CUDA {result['torch_cuda'] or 'none'}), "
          f"Python {result['python']}, {result['machine']}, GPU: {result['gpu'] or 'none'}")
    print("\ncache roots (searched in this order):")
    rows = []
    for root in result["roots"]:
        arch_counts = ", ".join(f"{a} {c['entries']}" for a, c in sorted(root["by_arch"].items()))
        rows.append([root["path"], "writable" if root["writable"] else "read-only",
                     root["entries"] if root["exists"] else "(absent)", format_size(root["size_on_disk"]),
                     root["unreadable"], root.get("quarantined", "-"), arch_counts or "-"])
    print_table(rows, ["path", "kind", "entries", "on disk", "unreadable", "quarantined", "by arch"],
                right=(2, 3, 4, 5))
    if result.get("remote"):
        _print_remote(result["remote"])
    print("\ncompilers:")
    for name, value in result["compilers"].items():
        print(f"  {name:<13} {value}")
    print("\nsettings:")
    width = max((len(setting["variable"]) for setting in result["settings"]), default=0)
    for setting in result["settings"]:
        print(f"  {setting['variable']:<{width}}  {setting['value']}")
    return 0


def _print_remote(state: dict[str, Any]) -> None:
    settings = state["settings"]
    print(f"\nremote tier {state['url']}: " + ("reachable" if state["reachable"] else f"UNREACHABLE: {state['error']}"))
    if state["reachable"]:
        server = state["server"]
        limit = format_size(server["maxmemory"]) if server.get("maxmemory") else "no limit"
        print(f"  redis {server['version']}, ping {state['ping_ms']:.2f} ms, "
              f"memory {format_size(server['used_memory'])} of {limit} ({server['maxmemory_policy']}), "
              f"{server['evicted_keys']} keys evicted, {server['locks_held']} compiles under the fleet lock now")
        arch_counts = ", ".join(f"{a} {c['entries']}" for a, c in sorted(state["by_arch"].items())) or "-"
        print(f"  {state['entries']} entries, {format_size(state['size'])} (by arch: {arch_counts}); "
              f"{state['expired_or_evicted']} indexed entries expired or evicted")
    ttl = f"{settings['ttl_seconds'] / 86400:g} d" if settings["ttl_seconds"] else "none"
    print(f"  TTL {ttl}, entry limit {format_size(settings['max_entry_size'])}, lock {settings['lock_seconds']:g} s, "
          f"timeout {settings['timeout_seconds'] * 1e3:g} ms, back-off {settings['backoff_seconds']:g} s, "
          f"entries {'signed (JITOPS_REMOTE_CACHE_KEY)' if settings['signed'] else 'not signed'}")


# ---- push, pull --------------------------------------------------------------------------------------------------
def cmd_push(args: argparse.Namespace, archs: list[str]) -> int:
    report = remote.push(archs, args.force)
    if args.json:
        print_json(report.as_dict())
        return 0 if report.ok else 1
    for bad in report.skipped_corrupt:
        print(f"left out corrupt entry {bad['path']}: {bad['reason']}", file=sys.stderr)
    for item in report.refused:
        print(f"NOT PUSHED {item['label']} [{item['arch']}], {format_size(item['size'])}: {item['reason']}")
    print(f"pushed {len(report.pushed)} entries ({format_size(sum(i['size'] for i in report.pushed))}) to "
          f"{report.remote}; {len(report.present)} were already there")
    return 0 if report.ok else 1


def cmd_pull(args: argparse.Namespace, archs: list[str]) -> int:
    if args.all:
        report = remote.pull_all(archs)
    else:
        calls = _calls(args)
        check_archs_supported(_effective_archs(calls, archs))
        plan = manifest.plan(calls, archs)  # bad input stops here, before anything is fetched
        _writable()
        report = remote.pull(plan, args.any_toolchain)
    if args.json:
        print_json(report.as_dict())
        return 0 if report.ok else 1
    root = runtime.disk_cache().writable.path
    print(f"pulled {len(report.pulled)} entries ({format_size(sum(i['size'] for i in report.pulled))}) from "
          f"{report.remote} into {root}; {len(report.present)} were already cached")
    for miss in report.missing:
        where = f" (op {miss['op']}, {miss['where']})" if "where" in miss else ""
        print(f"  MISSING {miss['label']} [{miss['arch']}]{where}")
    if report.rejected:
        print(f"  {report.rejected} remote entries were rejected (checksum, signature or key); see the warnings")
    if report.missing and not args.all:
        flag = "--manifest" if args.manifest else "--record"
        push = again(args, "push", imports=False) + (f" --remote {shlex.quote(args.remote)}" if args.remote else "")
        print(f"build them: {again(args, 'prewarm', flag, shlex.quote(str(args.manifest or args.record)), archs=archs)}"
              f", then `{push}`")
    return 0 if report.ok else 1


COMMANDS: dict[str, Callable[[argparse.Namespace, list[str]], int]] = {
    "prewarm": cmd_prewarm, "list": cmd_list, "verify": cmd_verify, "prune": cmd_prune, "export": cmd_export,
    "import": cmd_import, "explain": cmd_explain, "info": cmd_info, "push": cmd_push, "pull": cmd_pull,
}
