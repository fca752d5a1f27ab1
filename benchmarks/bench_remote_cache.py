"""The remote tier (JITOPS_REMOTE_CACHE on Redis), measured against the local disk in the same run.

Every figure is the first call of one kernel in a fresh Python process (torch and jitops imported, then CUDA
initialised on a GPU and the input made, before the clock starts), the median of --reps processes:
  disk             the entry on the local disk, no remote configured (the baseline)
  disk+remote      the same with a remote configured (a disk hit must not touch it)
  remote           an empty local disk and the entry on a Redis on loopback (fetch, verify, store, load); the
                   redis client's import (started in a thread by `import jitops`) may still be running
  next process     the process after a remote hit on the same node: the disk again
  remote, client imported   the same as remote once that import has finished: the tier's own cost
  miss, no remote / down / silent   JITOPS_OFFLINE=1 and an empty disk: the time until CacheMissError, which
                   is the lookup path a compile waits for, with no remote, with Redis down (a closed port) and with
                   a Redis that never answers (every request times out)
  compile, no remote / down         a whole cold first call, compile included (one process each)
then 8 processes on 2 simulated nodes (two disk caches, one Redis) racing on the cold key, after a barrier.

The kernel: with a GPU, jitops.gemm bf16 2048^3 on sm_90a (a CUTLASS 3 kernel built by nvcc); without one,
jitops.gelu's CPU kernel (load_inline).  The server: --redis-server PATH, $JITOPS_REDIS_SERVER, or redis-server
on PATH; with $JITOPS_REDIS_LIBS it runs with that LD_LIBRARY_PATH (a Debian package unpacked by hand).

    python benchmarks/bench_remote_cache.py [--reps 7] [--redis-server /opt/redis/usr/bin/redis-server]

Writes benchmarks/results/remote_cache.json.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests"))

CHILD = r"""
import json, logging, os, sys, time
from pathlib import Path
import torch
import jitops  # at the top, as a program imports its libraries; CUDA starts after (a model's .cuda())
gpu = torch.cuda.is_available()
if gpu:
    torch.cuda.init()

warnings = []
class Count(logging.Handler):
    def emit(self, record):
        if record.levelno >= logging.WARNING:
            warnings.append(record.getMessage())
logging.getLogger("jitops").addHandler(Count())

if os.environ.get("RACE_DIR"):  # start together, after the imports
    ready = Path(os.environ["RACE_DIR"])
    (ready / f"ready.{os.getpid()}").touch()
    while len(list(ready.glob("ready.*"))) < int(os.environ["RACERS"]):
        time.sleep(0.01)
torch.manual_seed(0)
if gpu:
    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    call = lambda: jitops.gemm(a, b)
    reference = lambda: (a.float() @ b.float())
    torch.cuda.synchronize()
else:
    x = torch.randn(1 << 16, dtype=torch.float32)
    call = lambda: jitops.gelu(x, "tanh")
    reference = lambda: torch.nn.functional.gelu(x, approximate="tanh")
if os.environ.get("BENCH_CLIENT_IMPORTED"):  # the redis client's import (a thread) has finished
    import threading
    for thread in threading.enumerate():
        if thread.name == "jitops-redis-import":
            thread.join()
result = {}
started = time.perf_counter()
try:
    y = call()
    if gpu:
        torch.cuda.synchronize()
    result["first_ms"] = (time.perf_counter() - started) * 1e3
    expected = reference()
    result["ok"] = bool(((y.float() - expected).abs().max() / expected.abs().max()).item() < 1e-2)
except jitops.CacheMissError:
    result["first_ms"] = (time.perf_counter() - started) * 1e3
    result["ok"] = True
    result["miss"] = True
result.update(jitops.stats.as_dict(), warnings=len(warnings), warning_text=warnings[:3])
print(json.dumps(result))
"""

IMPORT_REDIS = r"""
import json, time, torch, jitops
started = time.perf_counter()
import redis
print(json.dumps({"import_ms": (time.perf_counter() - started) * 1e3}))
"""


def child_env(cache: Path, remote: str | None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JITOPS_REMOTE", "JITOPS_OFFLINE"))}
    env.update(JITOPS_CACHE_DIR=str(cache), PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    env.pop("JITOPS_CACHE_PATH", None)
    if remote:
        env["JITOPS_REMOTE_CACHE"] = remote
    env.update(extra)
    return env


def run_child(env: dict[str, str], code: str = CHILD, timeout: float = 900) -> dict:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout)
    if out.returncode != 0:
        raise SystemExit(f"child failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]  # nothing listens once it is closed: connections are refused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=7, help="fresh processes per timed case (median)")
    parser.add_argument("--redis-server", default=None,
                        help="the redis-server binary (default: $JITOPS_REDIS_SERVER or redis-server on PATH)")
    parser.add_argument("--work-dir", default=None, help="where the caches and the server live (default: a temp dir)")
    parser.add_argument("--prebuilt", metavar="DIR", default=None,
                        help="a cache root that holds the kernel already (cache_tools prewarm on a GPU-less machine): "
                             "the two compile cases are skipped, and the race is the run's only compile")
    args = parser.parse_args()

    import torch
    from harness import save_record
    from redis_server import RedisServer, find_binary

    binary = args.redis_server or find_binary()
    if binary is None:
        raise SystemExit("no redis-server: give --redis-server PATH or set JITOPS_REDIS_SERVER (see "
                         "docs/cache_tools.md, Fleets, for carrying one)")
    gpu = torch.cuda.is_available()
    kernel = ("jitops.gemm bf16 2048^3, sm_90a (CUTLASS 3, nvcc)" if gpu
              else "jitops.gelu fp32 CPU kernel (load_inline)")
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="jitops-bench-remote-"))
    work.mkdir(parents=True, exist_ok=True)
    server = RedisServer(work / "redis", binary=binary).start()
    client = server.client()
    rows: list[dict] = []
    fresh_dirs = iter(range(10**6))

    def fresh() -> Path:
        return work / f"cache-{next(fresh_dirs)}"

    def case(name: str, runs: list[dict], note: str = "", **expect: int) -> dict:
        """One row; `expect` names counters each process must show (a case that measured something else fails
        the run: a --prebuilt entry of another toolchain would make 'disk' a compile)."""
        for run in runs:
            wrong = {k: run[k] for k, v in expect.items() if run[k] != v}
            if wrong or not run["ok"]:
                raise SystemExit(f"case {name!r}: expected {expect} and a correct result, a process had {wrong}, "
                                 f"ok={run['ok']}; warnings: {run['warning_text']}")
        times = [r["first_ms"] for r in runs]
        row = {"case": name, "first_call_ms": statistics.median(times), "min_ms": min(times),
               "max_ms": max(times), "processes": len(runs), "ok": all(r["ok"] for r in runs),
               "warnings_per_process": max(r["warnings"] for r in runs),
               "remote_ms": statistics.median(r["remote_seconds"] * 1e3 for r in runs),
               "compiles": sum(r["compiles"] for r in runs), "disk_hits": sum(r["disk_hits"] for r in runs),
               "remote_hits": sum(r["remote_hits"] for r in runs), "note": note}
        rows.append(row)
        print(f"  {name:24s} {row['first_call_ms']:10.1f} ms  (min {row['min_ms']:.1f}, max {row['max_ms']:.1f}; "
              f"remote {row['remote_ms']:.1f} ms; compiles {row['compiles']}, disk hits {row['disk_hits']}, "
              f"remote hits {row['remote_hits']}, warnings {row['warnings_per_process']})", flush=True)
        return row

    try:
        print(f"kernel: {kernel}; redis-server {binary} on port {server.port}; {args.reps} processes per case",
              flush=True)
        warm = fresh()
        if args.prebuilt:
            shutil.copytree(args.prebuilt, warm)
            cold_none = None
        else:
            cold_none = case("compile, no remote", [run_child(child_env(warm, None))])
        # The remote gets the entry the way a fleet's build box gives it: `cache_tools push`.
        push = subprocess.run([sys.executable, "-m", "cache_tools", "push", "--cache-dir", str(warm),
                               "--remote", server.url], capture_output=True, text=True, env=child_env(warm, None))
        assert push.returncode == 0, push.stderr
        disk = case("disk", [run_child(child_env(warm, None)) for _ in range(args.reps)], disk_hits=1, compiles=0)
        case("disk+remote", [run_child(child_env(warm, server.url)) for _ in range(args.reps)], disk_hits=1,
             compiles=0, remote_seconds=0)
        remote_runs, next_runs = [], []
        for _ in range(args.reps):
            node = fresh()
            remote_runs.append(run_child(child_env(node, server.url)))
            next_runs.append(run_child(child_env(node, server.url)))
        remote = case("remote", remote_runs, remote_hits=1, compiles=0, disk_hits=0)
        case("next process (disk)", next_runs, disk_hits=1, remote_hits=0, compiles=0)
        # The same with the client's import done before the clock: what the tier itself costs, for a program that
        # does anything (CUDA init, loading a model) between importing jitops and its first call.
        imported_runs = [run_child(child_env(fresh(), server.url, BENCH_CLIENT_IMPORTED="1"))
                         for _ in range(args.reps)]
        imported = case("remote, client imported", imported_runs, remote_hits=1, compiles=0, disk_hits=0)
        imports = [run_child(child_env(fresh(), None), IMPORT_REDIS)["import_ms"] for _ in range(args.reps)]
        import_ms = statistics.median(imports)
        print(f"  import redis after torch+jitops: {import_ms:.1f} ms (started in a thread when jitops is imported "
              "with JITOPS_REMOTE_CACHE set)", flush=True)

        down = f"redis://127.0.0.1:{closed_port()}/0"
        with socket.socket() as silent:  # accepts connections (the kernel's backlog), never answers
            silent.bind(("127.0.0.1", 0))
            silent.listen(64)
            never = f"redis://127.0.0.1:{silent.getsockname()[1]}/0"
            miss_none = case("miss, no remote", [run_child(child_env(fresh(), None, JITOPS_OFFLINE="1"))
                                                 for _ in range(args.reps)], compiles=0, warnings=0)
            miss_down = case("miss, Redis down", [run_child(child_env(fresh(), down, JITOPS_OFFLINE="1"))
                                                  for _ in range(args.reps)], compiles=0, remote_errors=1)
            miss_silent = case("miss, Redis silent", [run_child(child_env(fresh(), never, JITOPS_OFFLINE="1"))
                                                      for _ in range(args.reps)], compiles=0, remote_errors=1)
        # One warning; errors may be two (the lookup, and the publish when the compile outlasts the back-off).
        cold_down = None if args.prebuilt else case("compile, Redis down", [run_child(child_env(fresh(), down))],
                                                    compiles=1, warnings=1)

        client.flushall()
        race = work / "race"
        race.mkdir()
        nodes = [fresh(), fresh()]
        started = time.perf_counter()
        racers = [subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True, env=child_env(nodes[i % 2], server.url, RACE_DIR=str(race),
                                                            RACERS="8"))
                  for i in range(8)]
        results = []
        for racer in racers:
            out, err = racer.communicate(timeout=900)
            if racer.returncode != 0:
                raise SystemExit(f"racer failed:\n{err[-4000:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
        race_row = case("race: 8 processes, 2 nodes", results,
                        note=f"wall {time.perf_counter() - started:.1f} s including imports")
    finally:
        server.stop()

    remote_vs_disk = remote["first_call_ms"] - disk["first_call_ms"]
    imported_vs_disk = imported["first_call_ms"] - disk["first_call_ms"]
    down_added = max(miss_down["first_call_ms"] - miss_none["first_call_ms"], 0)
    silent_added = max(miss_silent["first_call_ms"] - miss_none["first_call_ms"], 0)
    one_warning = miss_down["warnings_per_process"] == 1 and miss_silent["warnings_per_process"] == 1

    def verdict(met: bool) -> str:
        return "met" if met else "NOT met"

    goals = {
        "remote hit within 20 ms of a disk hit":
            f"{remote_vs_disk:+.1f} ms right after import ({verdict(remote_vs_disk <= 20)}), "
            f"{imported_vs_disk:+.1f} ms with the client imported ({verdict(imported_vs_disk <= 20)})",
        "8 racers on 2 nodes: exactly 1 compile, all correct":
            f"{race_row['compiles']} compile(s), all correct: {race_row['ok']}: "
            f"{verdict(race_row['compiles'] == 1 and race_row['ok'])}",
        "Redis down: <= 100 ms added per process, one warning":
            f"refused +{down_added:.1f} ms, silent +{silent_added:.1f} ms, warnings "
            f"{miss_down['warnings_per_process']}/{miss_silent['warnings_per_process']} per process: "
            f"{verdict(max(down_added, silent_added) <= 100 and one_warning)}",
    }
    notes = {"kernel": kernel, "reps": args.reps, "redis_server": binary,
             "import_redis_ms": round(import_ms, 1), "remote_minus_disk_ms": round(remote_vs_disk, 2),
             "remote_client_imported_minus_disk_ms": round(imported_vs_disk, 2),
             "remote_over_disk": round(remote["first_call_ms"] / disk["first_call_ms"], 2),
             "down_added_ms": round(down_added, 2), "silent_added_ms": round(silent_added, 2),
             "compile_down_minus_none_ms": (round(cold_down["first_call_ms"] - cold_none["first_call_ms"], 1)
                                            if cold_down and cold_none else None),
             "goals": goals, "cases": rows}
    # Latencies, not throughput against a baseline: the cases go in the notes (as jit_latency's do), so the
    # throughput charts of notebooks/04_performance leave them out.
    path, record = save_record("remote_cache", baseline="a local disk hit (and no remote, for Redis down)",
                               rows=notes.pop("cases"), summary=notes)
    print(f"\n## remote_cache - {record['device'].get('name')} - {record['date']}\n`{record['command']}`\n")
    print(f"kernel: {kernel}; medians of {args.reps} fresh processes (one for the compiles)\n")
    print("| case | first call (ms) | vs | remote tier (ms) | compiles | disk hits | remote hits | warnings/process |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        base = {"miss": miss_none, "comp": cold_none, "race": row}.get(row["case"][:4], disk)
        versus = "-" if row is base else (f"{row['first_call_ms'] - base['first_call_ms']:+.1f} ms "
                                          f"(x{row['first_call_ms'] / base['first_call_ms']:.2f})")
        print(f"| {row['case']} | {row['first_call_ms']:.1f} | {versus} | {row['remote_ms']:.1f} | "
              f"{row['compiles']} | {row['disk_hits']} | {row['remote_hits']} | {row['warnings_per_process']} |")
    print("\n'vs': against disk for hits, 'miss, no remote' for misses, 'compile, no remote' for compiles (one "
          "process each: the compile's own variation is far larger than the remote's cost, which is the 'remote "
          "tier' column).  'remote tier': jitops.stats.remote_seconds, the process's wall time in the tier.")
    print(f"import redis after torch+jitops in a fresh process: {import_ms:.1f} ms (overlapped by a thread)")
    for goal, verdict in goals.items():
        print(f"- {goal}: {verdict}")
    print(f"\nJSON: {path}")
    if not args.work_dir:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
