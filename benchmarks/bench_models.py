"""Real models' training steps with and without jitops.patch, in one run on one GPU.

    python3 benchmarks/bench_models.py                         # every model, every mode
    python3 benchmarks/bench_models.py --models gpt2 --modes eager,patched --profile
    python3 benchmarks/bench_models.py --models gpt2 --modes compile,patched_compile --profile   # compiled steps
    python3 benchmarks/bench_models.py --prewarm-only          # list the models' kernels on meta tensors, prewarm
    python3 benchmarks/bench_models.py --device cpu --tiny     # the same logic on tiny configs, no GPU

Models, built from their configs (random init, no downloads), bf16, AdamW:
    gpt2      HF GPT2LMHeadModel, n_embd 1024, 4 layers, 16 heads, batch 8 x 512 tokens
    llama     HF LlamaForCausalLM, hidden 1024, 4 layers, 16 heads, MLP 2816, vocab 32000, batch 8 x 512
    vit       timm vit_base_patch16_224 (ViT-B/16), batch 32 at 224 (transformers' ViT with --tiny)
    resnet50  timm resnet50, batch 32 at 224, channels_last (transformers' ResNet with --tiny)
Modes: eager (torch), patched (jitops.patch, eager), compile (torch.compile), patched_compile.

Per model and mode: the steady training step (forward, backward, optimizer; median of timed blocks, the modes'
blocks interleaved), the host time of a step (the GPU held busy by a sleep kernel first, so nothing waits on it:
what the CPU spends issuing the step), GPU kernel time per step (torch.profiler), the first step's wall time and
jitops compiles, peak memory, and the loss and gradients of one step against the unpatched model from the same
weights.  Ratios are against torch eager in the same run.  Results: benchmarks/results/models.json.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import jitops  # noqa: E402
from jitops import native  # noqa: E402
from harness import save_record  # noqa: E402

MODES = ("eager", "patched", "compile", "patched_compile")
BASELINE = "torch eager (and torch.compile for patched_compile), same run"


# ---- models -----------------------------------------------------------------------------------------------------
@dataclass
class Model:
    name: str
    build: Callable[[], torch.nn.Module]
    batch: Callable[[str], tuple[Any, ...]]          # device -> inputs
    loss: Callable[[torch.nn.Module, tuple[Any, ...]], torch.Tensor]
    channels_last: bool = False


def _lm_loss(model, batch):
    (ids,) = batch
    return model(input_ids=ids, labels=ids).loss


def _image_loss(model, batch):
    images, labels = batch
    out = model(images)
    logits = out.logits if hasattr(out, "logits") else out
    return F.cross_entropy(logits.float(), labels)


def gpt2(tiny: bool) -> Model:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=256, n_positions=64) if tiny else \
        GPT2Config(n_embd=1024, n_layer=4, n_head=16, n_positions=1024)
    b, t = (2, 16) if tiny else (8, 512)
    return Model("gpt2", lambda: GPT2LMHeadModel(cfg),
                 lambda device: (torch.randint(0, cfg.vocab_size, (b, t), device=device),), _lm_loss)


def llama(tiny: bool) -> Model:
    from transformers import LlamaConfig, LlamaForCausalLM

    if tiny:
        cfg = LlamaConfig(hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=4, vocab_size=256, max_position_embeddings=64)
    else:
        cfg = LlamaConfig(hidden_size=1024, intermediate_size=2816, num_hidden_layers=4, num_attention_heads=16,
                          num_key_value_heads=16, vocab_size=32000, max_position_embeddings=1024)
    b, t = (2, 16) if tiny else (8, 512)
    return Model("llama", lambda: LlamaForCausalLM(cfg),
                 lambda device: (torch.randint(0, cfg.vocab_size, (b, t), device=device),), _lm_loss)


def _timm_available() -> bool:
    try:
        import timm  # noqa: F401
        return True
    except Exception:  # noqa: BLE001 - timm needs a torchvision that matches torch (not on the CPU boxes)
        return False


def vit(tiny: bool) -> Model:
    if not tiny and _timm_available():
        import timm

        build = lambda: timm.create_model("vit_base_patch16_224", num_classes=1000)  # noqa: E731
        size, classes, b = 224, 1000, 32
    else:
        from transformers import ViTConfig, ViTForImageClassification

        cfg = ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                        image_size=32, patch_size=8, num_labels=10) if tiny else ViTConfig(num_labels=1000)
        build = lambda: ViTForImageClassification(cfg)  # noqa: E731
        size, classes, b = (32, 10, 2) if tiny else (224, 1000, 32)
    return Model("vit", build, lambda device: (torch.randn(b, 3, size, size, device=device),
                                               torch.randint(0, classes, (b,), device=device)), _image_loss)


def resnet50(tiny: bool) -> Model:
    if not tiny and _timm_available():
        import timm

        build = lambda: timm.create_model("resnet50", num_classes=1000)  # noqa: E731
        size, classes, b = 224, 1000, 32
    else:
        from transformers import ResNetConfig, ResNetForImageClassification

        cfg = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], num_labels=10) if tiny else \
            ResNetConfig(num_labels=1000)
        build = lambda: ResNetForImageClassification(cfg)  # noqa: E731
        size, classes, b = (32, 10, 2) if tiny else (224, 1000, 32)
    return Model("resnet50", build, lambda device: (torch.randn(b, 3, size, size, device=device),
                                                    torch.randint(0, classes, (b,), device=device)),
                 _image_loss, channels_last=True)


MODELS = {"gpt2": gpt2, "llama": llama, "vit": vit, "resnet50": resnet50}


# ---- running a mode ---------------------------------------------------------------------------------------------
def make(model: Model, base_state: dict, device: str, dtype: torch.dtype, mode: str):
    """A fresh copy of the model in `mode`, from the same weights; (module to call, module holding the
    parameters, patch report or None)."""
    with torch.device(device):
        net = model.build()
    net.load_state_dict(base_state)
    net = net.to(device=device, dtype=dtype)
    if model.channels_last:
        net = net.to(memory_format=torch.channels_last)
    net.train()
    report = jitops.patch(net) if mode.startswith("patched") else None
    runner = torch.compile(net) if mode.endswith("compile") else net
    return runner, net, report


def batch_for(model: Model, device: str, dtype: torch.dtype) -> tuple[Any, ...]:
    torch.manual_seed(1)
    batch = model.batch(device)
    fixed = []
    for t in batch:
        if t.is_floating_point():
            t = t.to(dtype)
            if model.channels_last:
                t = t.contiguous(memory_format=torch.channels_last)
        fixed.append(t)
    return tuple(fixed)


def train_step(model: Model, runner, net, batch, opt) -> torch.Tensor:
    loss = model.loss(runner, batch)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def block_ms(step: Callable[[], Any], device: str, steps: int) -> float:
    """Mean time of `steps` back-to-back steps."""
    sync(device)
    started = time.perf_counter()
    for _ in range(steps):
        step()
    sync(device)
    return (time.perf_counter() - started) / steps * 1e3


def host_ms(step: Callable[[], Any], device: str, reps: int = 5) -> float:
    """CPU milliseconds to issue one step while the GPU is busy with a sleep kernel queued before it, so the
    host never waits on the device: the step's host cost alone.  (On the CPU: the plain step time.)"""
    times = []
    for _ in range(reps):
        sync(device)
        if device == "cuda":
            torch.cuda._sleep(int(2e9))  # ~1 s at the H100's clock: longer than any step's host time
        started = time.perf_counter()
        step()
        times.append((time.perf_counter() - started) * 1e3)
        sync(device)
    return statistics.median(times)


def gpu_ms(step: Callable[[], Any], steps: int = 3) -> float:
    """Sum of device time of every kernel, memcpy and memset per step (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    total_us = sum(e.self_device_time_total for e in prof.key_averages())
    return total_us / steps / 1e3


def compare_with_eager(model: Model, base_state: dict, device: str, dtype: torch.dtype, mode: str,
                       batch) -> dict[str, float]:
    """One forward and backward of the unpatched model and of `mode` from the same weights and inputs."""
    results = []
    for m in ("eager", mode):
        runner, net, _ = make(model, base_state, device, dtype, m)
        torch.manual_seed(2)  # the same dropout masks
        loss = model.loss(runner, batch)
        loss.backward()
        grads = {n: p.grad.detach().float().clone() for n, p in net.named_parameters() if p.grad is not None}
        results.append((loss.detach().float().item(), grads))
        del runner, net
    (loss_ref, g_ref), (loss, g) = results
    # Relative error per parameter, against at least 1e-3 of the largest parameter gradient: some gradients are
    # zero in exact arithmetic (a key projection's bias under softmax) and hold only rounding noise.
    floor = 1e-3 * max((ref.norm().item() for ref in g_ref.values()), default=0.0)
    worst = 0.0
    for name, ref in g_ref.items():
        denom = max(ref.norm().item(), floor)
        if denom > 0 and name in g:
            worst = max(worst, (g[name] - ref).norm().item() / denom)
    return {"loss_ref": loss_ref, "loss": loss, "loss_diff": abs(loss - loss_ref), "grad_rel_err_max": worst,
            "grads_compared": len(g_ref), "grads_missing": len(set(g_ref) - set(g))}


@dataclass
class Run:
    """One mode of one model, built and past its first steps: what the timed blocks call."""
    row: dict[str, Any]
    runner: Any
    net: torch.nn.Module
    opt: torch.optim.Optimizer
    batch: tuple[Any, ...]
    step: Callable[[], Any]
    block_times: list[float]


def start_mode(model: Model, base_state: dict, device: str, dtype: torch.dtype, mode: str, args) -> Run:
    """A fresh copy of the model in `mode`, its first step timed (jitops compiles or loads kernels in it, as
    torch.compile compiles), then warmed up.  Peak memory is what this copy adds at its peak over what was
    allocated before it was built (the other modes' copies stay alive for the interleaved blocks)."""
    batch = batch_for(model, device, dtype)
    jitops.reset_stats()
    torch.manual_seed(3)
    if device == "cuda":
        sync(device)
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    runner, net, report = make(model, base_state, device, dtype, mode)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, foreach=True)
    step = lambda: train_step(model, runner, net, batch, opt)  # noqa: E731
    row: dict[str, Any] = {"model": model.name, "mode": mode}
    if report is not None:
        row["patched_modules"] = len(report.swapped)
        row["fused_pairs"] = len(report.fused)
        row["left_alone"] = [f"{a.kind}: {a.reason}" for a in report.left_alone][:20]
        print(report, flush=True)
    sync(device)
    started = time.perf_counter()
    step()
    sync(device)
    row["first_step_s"] = time.perf_counter() - started
    row["first_step_compiles"] = jitops.stats.compiles
    row["first_step_disk_hits"] = jitops.stats.disk_hits
    for _ in range(args.warmup):
        step()
    if mode.startswith("patched") and device == "cuda" and native.wait() is not None:
        step()  # the Python path offers what it launched before jitops' C++ host path was loaded
    if device == "cuda":
        sync(device)
        row["peak_mem_gb"] = (torch.cuda.max_memory_allocated() - before) / 2**30
    return Run(row, runner, net, opt, batch, step, [])


def block_ratios(base: dict[str, Any], row: dict[str, Any]) -> list[float]:
    """base's step time over row's, block by block: the modes run interleaved, so each pair ran side by side."""
    return [b / r for b, r in zip(base["step_ms_blocks"], row["step_ms_blocks"])]


def finish_mode(run: Run, model: Model, base_state: dict, device: str, dtype: torch.dtype, args) -> dict[str, Any]:
    """The steady step (median of its interleaved blocks), host and GPU time, and the check against eager."""
    row, mode = run.row, run.row["mode"]
    row["step_ms"] = statistics.median(run.block_times)
    row["step_ms_blocks"] = run.block_times
    row["host_ms"] = host_ms(run.step, device)
    if device == "cuda":
        row["gpu_ms"] = gpu_ms(run.step)
    if args.profile and mode != "eager":
        print(f"== {row['model']} {mode}: where a step's time goes", flush=True)
        profile_step(run.step, device)
    if args.host_ops and mode == "patched" and device == "cuda":
        row["host_ops"] = host_per_module(model, run.runner, run.batch)
    run.runner = run.net = run.opt = run.step = None  # free this copy before the check builds two more
    if mode != "eager" and not args.no_check:
        row.update(compare_with_eager(model, base_state, device, dtype, mode, run.batch))
    return row


def run_model(model: Model, base_state: dict, device: str, dtype: torch.dtype, modes: list[str],
              args) -> list[dict[str, Any]]:
    """Every mode of one model, their timed blocks interleaved (eager, patched, ..., eager, patched, ...): the
    host-bound steps here drift by up to a third on the H100's host (ViT-B/16 eager: 18.6 to 29.1 ms a step),
    and interleaving puts the same drift into every mode's median."""
    runs = [start_mode(model, base_state, device, dtype, mode, args) for mode in modes]
    for _ in range(args.blocks):
        for run in runs:
            before = native.counters()
            run.block_times.append(block_ms(run.step, device, args.steps))
            after = native.counters()
            # jitops.linear's calls a step that its C++ host path served, and that it handed to Python
            for name in ("native_calls", "native_misses"):
                run.row[f"{name}_per_step"] = run.row.get(f"{name}_per_step", 0) + \
                    (after[name] - before[name]) / (args.steps * args.blocks)
    rows = []
    for run in runs:
        rows.append(finish_mode(run, model, base_state, device, dtype, args))
        print(json.dumps(rows[-1]), flush=True)
    return rows


def profile_step(step: Callable[[], Any], device: str) -> None:
    """Where a step's time goes: cProfile by function, torch.profiler's ops by host time, then its kernels by device
    time (a compiled step next to a patched compiled one: do their GPU times differ, or their host's?)."""
    sync(device)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(3):
        step()
    sync(device)
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(30)
    print(text.getvalue(), flush=True)
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(3):
            step()
        sync(device)
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30), flush=True)
    if device == "cuda":
        print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=30), flush=True)


def host_per_module(model: Model, net, batch) -> list[dict[str, Any]]:
    """Host microseconds of each kind of swapped module's call, jitops against the module's torch forward, on the
    inputs it sees in the model (captured by hooks), forward alone and forward + backward, with the GPU held busy
    so the host never waits (the issue's measure: a call costs at most 1.2x the torch op's host time)."""
    from jitops.patching import _original_class

    captured: dict[tuple, tuple] = {}

    def hook(module, inputs, output):
        key = (type(module).__name__, tuple(tuple(t.shape) for t in inputs if isinstance(t, torch.Tensor)))
        if key not in captured and inputs and isinstance(inputs[0], torch.Tensor):
            captured[key] = (module, inputs[0].detach(), inputs[0].requires_grad)

    handles = [m.register_forward_hook(hook) for m in net.modules() if "_jitops_original" in type(m).__dict__]
    model.loss(net, batch)  # with autograd on: a hook sees which inputs carry a gradient in the step
    for h in handles:
        h.remove()

    def paired_us(ours: Callable[[], Any], theirs: Callable[[], Any], calls: int = 30,
                  rounds: int = 9) -> tuple[float, float]:
        # Host microseconds a call, ours and theirs in alternating order round by round, the least of each: the
        # host's speed drifts over seconds (ViT-B/16's LayerNorm, forward + backward, read x1.22 timed as a block
        # of ours, then one of torch's, and x1.02 in a probe on the same machine), and a side timed in one block
        # takes that drift alone.  A sleep kernel of about 0.1 s keeps the GPU busy past the calls.
        best = [float("inf"), float("inf")]
        for r in range(rounds):
            for side in ((0, 1) if r % 2 == 0 else (1, 0)):
                fn = (ours, theirs)[side]
                torch.cuda.synchronize()
                torch.cuda._sleep(int(2e8))
                started = time.perf_counter()
                for _ in range(calls):
                    fn()
                best[side] = min(best[side], (time.perf_counter() - started) / calls * 1e6)
        torch.cuda.synchronize()
        return best[0], best[1]

    rows = []
    for (kind, shapes), (module, x, x_needs_grad) in captured.items():
        original = _original_class(type(module)).forward
        # As in the model's step: the input carries a gradient where it did there (a stem's images do not), the
        # parameters do, and it keeps its strides (ViT-B/16's head reads x[:, 0], rows 197 * 768 apart: a
        # contiguous copy is a problem the step never offered to the C++ path, and the forward alone, never
        # followed by its backward, would not offer it either).  The forward alone records the graph that the
        # step's backward would run.
        xg = x.detach().requires_grad_(x_needs_grad)
        g = torch.ones_like(module(xg))
        cases = {
            "forward": (lambda: module(xg), lambda: original(module, xg)),
            "forward+backward": (lambda: module(xg).backward(g), lambda: original(module, xg).backward(g)),
        }
        for what, (ours, theirs) in cases.items():
            for fn in (ours, theirs):  # warm both: first calls load kernels and allocate
                for _ in range(3):
                    fn()
            jit_us, torch_us = paired_us(ours, theirs)
            rows.append({"module": kind, "input": shapes, "call": what, "jitops_us": jit_us, "torch_us": torch_us,
                         "ratio": jit_us / torch_us})
            print(f"  host {kind:28s} {str(shapes):28s} {what:17s} jitops {jit_us:7.1f} us  torch {torch_us:7.1f} us"
                  f"  x{jit_us / torch_us:.2f}", flush=True)
        module.zero_grad(set_to_none=True)
    return rows


def first_step(model: Model, base_state: dict, device: str, dtype: torch.dtype, mode: str) -> dict[str, Any]:
    """Wall time of a fresh model's first training step (kernels compiled or loaded inside it), and of the
    second; in background mode also how long until every kernel is ready (jitops.wait())."""
    batch = batch_for(model, device, dtype)
    started = time.perf_counter()
    runner, net, _ = make(model, base_state, device, dtype, mode)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-4, foreach=True)
    built = time.perf_counter()
    train_step(model, runner, net, batch, opt)
    sync(device)
    first = time.perf_counter()
    train_step(model, runner, net, batch, opt)
    sync(device)
    second = time.perf_counter()
    jitops.wait()
    ready = time.perf_counter()
    return {"model": model.name, "mode": mode, "compile_mode": jitops.config.compile_mode,
            "build_s": built - started, "first_step_s": first - built, "second_step_s": second - first,
            "all_kernels_ready_s": ready - built, "compiles": jitops.stats.compiles,
            "compile_seconds": jitops.stats.compile_seconds, "fallbacks": jitops.stats.fallbacks}


def cold_first_step(name: str, mode: str, compile_mode: str, args) -> dict[str, Any]:
    """first_step in a fresh process on an empty cache (no read-only roots either)."""
    with tempfile.TemporaryDirectory(prefix="jitops-cold-") as cache:
        env = dict(os.environ, JITOPS_CACHE_DIR=cache, JITOPS_COMPILE=compile_mode)
        env.pop("JITOPS_CACHE_PATH", None)
        started = time.perf_counter()
        done = subprocess.run([sys.executable, __file__, "--first-step-only", "--models", name, "--modes", mode,
                               "--device", args.device] + (["--tiny"] if args.tiny else []),
                              env=env, capture_output=True, text=True)
        wall = time.perf_counter() - started
    if done.returncode:
        return {"model": name, "mode": mode, "compile_mode": compile_mode, "error": done.stderr[-2000:]}
    row = json.loads(done.stdout.strip().splitlines()[-1])
    row["process_s"] = wall
    return row


# ---- prewarming the models' kernels from meta tensors -----------------------------------------------------------
def record_manifest(names: list[str], tiny: bool, dtype: torch.dtype, arch: str) -> dict[str, Any]:
    """Every kernel call the patched models make in a training step, from a forward and backward on meta
    tensors (no GPU, nothing compiled): a prewarm manifest."""
    items: list[dict[str, Any]] = []
    for name in names:
        model = MODELS[name](tiny)
        with torch.device("meta"):
            net = model.build().to(dtype)
        if model.channels_last:
            net = net.to(memory_format=torch.channels_last)
        jitops.patch(net)
        batch = tuple(t.to("meta") for t in batch_for(model, "cpu", dtype))
        with jitops.record_calls() as calls:
            model.loss(net, batch).backward()
        items += calls.items
    return {"archs": [arch], "ops": items}


def prewarm(names: list[str], tiny: bool, dtype: torch.dtype, arch: str, jobs: int) -> float:
    manifest = record_manifest(names, tiny, dtype, arch)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(manifest, f)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cache_tools", "prewarm", "--manifest", f.name, "--jobs", str(jobs)],
                   check=True)
    os.unlink(f.name)
    return time.perf_counter() - started


# ---- main -------------------------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="tiny configs (a CPU smoke run)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--profile", action="store_true",
                        help="cProfile and torch.profiler (host ops, kernels) of each mode's step but eager's")
    parser.add_argument("--host-ops", action="store_true",
                        help="host time per swapped module's call, jitops against its torch forward")
    parser.add_argument("--no-check", action="store_true", help="skip the loss/gradient comparison")
    parser.add_argument("--cold", action="store_true",
                        help="also time each model's first patched step on an empty cache (blocking and background "
                             "mode), each in a fresh process")
    parser.add_argument("--first-step-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--prewarm", action="store_true", help="prewarm the models' kernels first")
    parser.add_argument("--prewarm-only", action="store_true")
    parser.add_argument("--arch", default="sm_90a")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    names = [n for n in args.models.split(",") if n]
    modes = [m for m in args.modes.split(",") if m]
    for n in names:
        if n not in MODELS:
            parser.error(f"unknown model {n!r}; choose among {', '.join(MODELS)}")
    for m in modes:
        if m not in MODES:
            parser.error(f"unknown mode {m!r}; choose among {', '.join(MODES)}")
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    notes: dict[str, Any] = {"dtype": str(dtype), "tiny": args.tiny}
    if args.prewarm or args.prewarm_only:
        notes["prewarm_s"] = prewarm(names, args.tiny, torch.bfloat16, args.arch, args.jobs)
        print(f"prewarm: {notes['prewarm_s']:.1f} s", flush=True)
        if args.prewarm_only:
            return 0
    if args.first_step_only:  # a child of --cold: one first step, on whatever cache the environment names
        model = MODELS[names[0]](args.tiny)
        torch.manual_seed(0)
        base_state = {k: v.clone() for k, v in model.build().state_dict().items()}
        print(json.dumps(first_step(model, base_state, args.device, dtype, modes[0])), flush=True)
        return 0
    rows = []
    cold_rows = []
    if args.cold:
        for name in names:
            for mode, compile_mode in (("eager", "blocking"), ("patched", "blocking"), ("patched", "background")):
                cold_rows.append(cold_first_step(name, mode, compile_mode, args))
                print(json.dumps(cold_rows[-1]), flush=True)
        notes["cold_first_steps"] = cold_rows
    full = set(names) == set(MODELS) and set(modes) == set(MODES)
    for done, name in enumerate(names, 1):
        model = MODELS[name](args.tiny)
        torch.manual_seed(0)
        base_state = {k: v.clone() for k, v in model.build().state_dict().items()}
        model_rows = run_model(model, base_state, args.device, dtype, modes, args)
        eager = next((r for r in model_rows if r["mode"] == "eager"), None)
        compiled = next((r for r in model_rows if r["mode"] == "compile"), None)
        for r in model_rows:
            r["speedup_vs_eager"] = eager["step_ms"] / r["step_ms"] if eager else None
            if eager and r is not eager:
                r["speedup_vs_eager_blocks"] = block_ratios(eager, r)
            if r["mode"] == "patched_compile" and compiled:
                r["speedup_vs_compile"] = compiled["step_ms"] / r["step_ms"]
                r["speedup_vs_compile_blocks"] = block_ratios(compiled, r)
        rows += model_rows
        if not args.tiny and done < len(names):
            # A run cut off by a time limit still leaves every finished model's four modes, each measured in
            # this one run.
            save_record("models", baseline=BASELINE, rows=rows, summary=notes, variant="partial")
    print(f"\n{'model':10s} {'mode':16s} {'step ms':>9s} {'x eager':>8s} {'host ms':>8s} {'gpu ms':>8s} "
          f"{'first s':>8s} {'compiles':>8s} {'peak GB':>8s} {'loss diff':>10s} {'grad err':>9s}")
    for r in rows:
        print(f"{r['model']:10s} {r['mode']:16s} {r['step_ms']:9.2f} "
              f"{(r['speedup_vs_eager'] or float('nan')):8.3f} {r['host_ms']:8.2f} "
              f"{r.get('gpu_ms', float('nan')):8.2f} "
              f"{r['first_step_s']:8.2f} {r['first_step_compiles']:8d} {r.get('peak_mem_gb', float('nan')):8.2f} "
              f"{r.get('loss_diff', float('nan')):10.2e} {r.get('grad_rel_err_max', float('nan')):9.2e}")
    for r in rows:  # a median can hide blocks on the wrong side of 1
        base = {"patched": "eager", "patched_compile": "compile"}.get(r["mode"])
        ratios = r.get(f"speedup_vs_{base}_blocks")
        if ratios:
            print(f"{r['model']:10s} {r['mode']:16s} against {base}, block by block: "
                  f"x{min(ratios):.3f} to x{max(ratios):.3f}")
    if not args.tiny:
        save_record("models", baseline=BASELINE, rows=rows, summary=notes, variant=None if full else "partial")
    return 0


if __name__ == "__main__":
    sys.exit(main())
