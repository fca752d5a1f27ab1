# %% [markdown]
# # Performance: what the benchmarks measured
#
# The benchmarks in `benchmarks/` run on a GPU, time jitops and a baseline (torch, cuBLAS, cuDNN...) in the
# same run on the same device, and save what they measured as JSON in `benchmarks/results/<name>.json` (the
# latest run of each; docs/benchmarks.md has the same figures in tables). This notebook only reads those
# files, so it runs anywhere; every plot names the device and the date of its data.
#
# - **JIT latency** (`bench_jit_latency.py`): one gelu kernel done four ways (jitops, CuPy, Triton, torch's
#   `load_inline`), each *cold* (first call in a fresh process, empty cache: compile, load, launch), *warm*
#   (first call in a fresh process, kernel on disk) and *hot* (a later call, on a 1-element tensor: the
#   per-call overhead).
# - **Throughput** (every other benchmark): achieved TB/s for memory-bound ops (gelu, layer norm), TFLOP/s
#   for compute-bound ones (GEMM, grouped GEMM, convolution), against the baseline measured in the same run.
#
# To refresh the data, run `bash benchmarks/gpu_session.sh bench` on a GPU machine and copy its JSON files
# into `benchmarks/results/`.

# %%
import json
import os
from pathlib import Path

import matplotlib.pyplot as plt

# Where the benchmarks write: benchmarks/results, or $JITOPS_BENCH_OUT when it is set (as in the harness).
REPO = Path.cwd().parent if Path.cwd().name == "notebooks" else Path.cwd()
RESULTS = Path(os.environ.get("JITOPS_BENCH_OUT") or REPO / "benchmarks" / "results")
EXPECTED = ["jit_latency", "gelu", "layer_norm", "gemm", "grouped_gemm", "conv2d"]

results = {path.stem: json.loads(path.read_text()) for path in sorted(RESULTS.glob("*.json"))}
print(f"{len(results)} result file(s) in {RESULTS}:")
for name, data in results.items():
    device = data.get("device", {})
    print(f"  {name:14s} {device.get('name', '?'):28s} {data.get('date', '?'):22s} {len(data.get('rows', []))} rows"
          f"   ({data.get('command', '?')})")
missing = [name for name in EXPECTED if name not in results]
if missing:
    print("not measured yet (no JSON file): " + ", ".join(missing))
    print("  produce them on a GPU with: " + "; ".join(f"python benchmarks/bench_{n}.py" for n in missing))


def provenance(data):
    """The line every plot carries: which device, which software, when."""
    device = data.get("device", {})
    parts = [device.get("name", "unknown device")]
    if device.get("capability"):
        parts[0] += f" (sm {device['capability']})"
    software = ", ".join(f"{key} {device[key]}" for key in ("torch", "cuda", "driver") if device.get(key))
    if software:
        parts.append(software)
    parts.append(data.get("date", "undated"))
    return " | ".join(parts)


# %% [markdown]
# ## Cold, warm and hot latency
#
# The cold bars are on a log scale: compiling through `load_inline` takes about a minute, NVRTC a fraction of a
# second. Warm is what every process after the first pays once per kernel; hot is what every call pays.

# %%
def plot_jit_latency(data):
    methods = {row["method"]: row for row in data["rows"]}
    names = list(methods)
    colors = ["tab:blue" if name == "jitops" else "tab:gray" for name in names]
    panels = [("cold_first_ms", "cold: first call, empty cache (ms)", True),
              ("warm_first_ms", "warm: first call, fresh process (ms)", False),
              ("hot_us", "hot: per call, 1-element tensor (us)", False)]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for ax, (key, title, log) in zip(axes, panels):
        values = [methods[name][key] for name in names]
        bars = ax.bar(names, values, color=colors)
        ax.bar_label(bars, labels=[f"{v:,.0f}" if v >= 100 else f"{v:.1f}" for v in values], fontsize=9)
        ax.set_title(title)
        if log:
            ax.set_yscale("log")
        ax.margins(y=0.15)
    torch_hot = methods.get("jitops", {}).get("baseline_hot_us")
    if torch_hot:
        axes[2].axhline(torch_hot, color="tab:red", linestyle="--", label=f"torch gelu ({torch_hot:.1f} us)")
        axes[2].legend(loc="upper left", fontsize=9)
    fig.suptitle(f"JIT latency of one bf16 gelu kernel\n{provenance(data)}", fontsize=11)
    fig.tight_layout()
    plt.show()
    extra = methods.get("jitops", {})
    for key, label in (("warm_second_kernel_ms", "jitops: second kernel loaded in a warm process (ms)"),
                       ("add_hot_us", "jitops.add hot call (us)"), ("torch_add_hot_us", "torch.add hot call (us)"),
                       ("add_grad_hot_us", "jitops.add hot call with requires_grad (us)"),
                       ("torch_add_grad_hot_us", "torch.add hot call with requires_grad (us)")):
        if key in extra:
            print(f"{label:52s} {extra[key]:8.2f}")


if "jit_latency" in results:
    plot_jit_latency(results["jit_latency"])
else:
    print("No benchmarks/results/jit_latency.json: run benchmarks/bench_jit_latency.py on a GPU.")

# %% [markdown]
# ## Throughput against the baselines
#
# One chart per benchmark file and metric: jitops (blue) and the baseline measured in the same run (gray) for
# each op, shape and dtype, with the speedup (baseline time over jitops time) after jitops' rate. For
# memory-bound ops the rate counts bytes read plus bytes written; for compute-bound ones, floating-point
# operations (2·M·N·K for a GEMM).

# %%
def plot_rows(name, data):
    by_metric = {}
    for row in data.get("rows", []):
        if "metric" in row:  # a throughput row (harness.Row); jit_latency's rows are plotted above
            by_metric.setdefault(row["metric"], []).append(row)
    for metric, rows in by_metric.items():
        labels = [f"{r['op']}  {r['shape']}  {r['dtype']}" for r in rows]
        baselines = sorted({r["baseline"] for r in rows})
        fig, ax = plt.subplots(figsize=(11, 0.55 * len(rows) + 1.6))
        positions = range(len(rows))
        ours = ax.barh([p - 0.2 for p in positions], [r["ours_rate"] for r in rows], height=0.4,
                       color="tab:blue", label="jitops")
        theirs = ax.barh([p + 0.2 for p in positions], [r["baseline_rate"] for r in rows], height=0.4,
                         color="tab:gray", label=" / ".join(baselines))
        ax.bar_label(ours, labels=[f"{r['ours_rate']:.2f}  x{r['speedup']:.2f}" for r in rows], fontsize=8,
                     padding=3)
        ax.bar_label(theirs, labels=[f"{r['baseline_rate']:.2f}" for r in rows], fontsize=8, padding=3)
        ax.set_yticks(list(positions), labels)
        ax.invert_yaxis()
        ax.set_xlabel(f"achieved {metric}")
        ax.margins(x=0.15)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
        ax.set_title(f"{name}: {metric}, jitops vs {' / '.join(baselines)}\n{provenance(data)}", fontsize=11)
        fig.tight_layout()
        plt.show()


throughput = {name: data for name, data in results.items() if any("metric" in r for r in data.get("rows", []))}
for name, data in throughput.items():
    plot_rows(name, data)
for name in EXPECTED[1:]:
    if name not in throughput:
        print(f"No throughput rows for {name}: run benchmarks/bench_{name}.py on a GPU.")

# %% [markdown]
# ## Reading the numbers
#
# - Throughput is measured after warm-up (which absorbs the one-time compile), as the median of many
#   CUDA-event timed calls; `benchmarks/harness.py` rotates the inputs of small cases so that they do not run
#   from L2. Compare a memory-bound op's TB/s with the device's copy bandwidth (about 3 TB/s on an H100), not
#   with its peak.
# - A result belongs to its device, software and date: the plots say which. Numbers from another GPU or another
#   driver are not comparable bar for bar.
