"""What holds the GEMMs of issue 4 back: the SM clock and board power while each side runs, and the memory bound
of the mixture-of-experts grouped GEMM measured directly.

    python benchmarks/probe_gemm_power.py [--seconds 2.0]      # on the GPU

For each case, ours and the baseline each run back to back for a few seconds while `nvidia-smi -lms 50` samples
the SM clock, the power draw and whether the software power cap is holding the clock down.  From the clock the
probe derives the tensor cores' peak at that clock (H100: 4096 dense bf16 FLOP per SM per cycle, 132 SMs: 989.4
TFLOP/s at 1830 MHz) and the share of it each side reaches.  If both sides sit at the power limit with the clock
pulled down, a kernel that idles the tensor cores less mostly buys a lower clock, not more FLOP/s.

The memory rows time one read of every byte the mixture-of-experts product must read (x and the 64 experts'
weights, 305 MB) with a plain read kernel, and a device copy, so the product's time can be set against the
fastest any kernel could stream its inputs.
"""
from __future__ import annotations

import argparse
import importlib
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

import jitops  # noqa: E402
from harness import save_record, time_cuda  # noqa: E402

FLOP_PER_SM_CYCLE = 4096  # dense bf16/fp16 wgmma on sm_90: 989.4 TFLOP/s = 132 SMs x 4096 x 1.83 GHz
FIELDS = ["timestamp", "clocks.sm", "power.draw", "power.limit", "temperature.gpu",
          "clocks_event_reasons.sw_power_cap", "clocks_event_reasons.hw_slowdown",
          "clocks_event_reasons.sw_thermal_slowdown"]


class Sampler:
    """nvidia-smi in the background, one line every 50 ms, each with its own timestamp."""

    def __init__(self) -> None:
        self.path = Path(tempfile.mkstemp(suffix=".csv")[1])
        self.proc = subprocess.Popen(
            ["nvidia-smi", f"--query-gpu={','.join(FIELDS)}", "--format=csv,noheader,nounits", "-lms", "50"],
            stdout=self.path.open("w"), stderr=subprocess.STDOUT)
        time.sleep(0.5)

    def stop(self) -> list[dict]:
        self.proc.terminate()
        self.proc.wait()
        rows = []
        for line in self.path.read_text().splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != len(FIELDS):
                continue
            try:
                stamp = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                rows.append({"t": stamp, "clock_mhz": float(parts[1]), "power_w": float(parts[2]),
                             "limit_w": float(parts[3]), "temp_c": float(parts[4]),
                             "power_cap": parts[5] == "Active", "hw_slowdown": parts[6] == "Active",
                             "thermal": parts[7] == "Active"})
            except ValueError:
                continue
        return rows


def run_for(fn, seconds: float) -> tuple[float, float, float]:
    """Call fn back to back for about `seconds`; (ms per call from events around the whole loop, start, end)."""
    ms = time_cuda(fn, warmup=5, reps=5, min_ms=20.0)
    calls = max(10, int(seconds * 1e3 / ms))
    start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    started = time.time()
    start_event.record()
    for _ in range(calls):
        fn()
    end_event.record()
    torch.cuda.synchronize()
    return start_event.elapsed_time(end_event) / calls, started, time.time()


def window(samples: list[dict], start: float, end: float) -> dict:
    """Clock and power over the second half of a window (the first half lets clock and power settle)."""
    inside = [s for s in samples if (start + end) / 2 <= s["t"] <= end]
    if not inside:
        return {}
    return {"clock_mhz": statistics.median(s["clock_mhz"] for s in inside),
            "power_w": statistics.median(s["power_w"] for s in inside),
            "limit_w": inside[0]["limit_w"], "temp_c": max(s["temp_c"] for s in inside),
            "power_capped": sum(s["power_cap"] for s in inside) / len(inside),
            "hw_slowdown": sum(s["hw_slowdown"] for s in inside) / len(inside), "samples": len(inside)}


def read_kernel():
    """A plain streaming read: 16-byte loads, four in flight a thread, an XOR the compiler cannot drop."""
    import cupy
    source = r"""
    extern "C" __global__ void read_all(const uint4* __restrict__ p, unsigned long long n, unsigned* out) {
      unsigned acc = 0;
      unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
      unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
      for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride),
              d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
      }
      for (; i < n; i += stride) { uint4 a = __ldcs(p + i); acc ^= a.x ^ a.y ^ a.z ^ a.w; }
      if (acc == 0x9e3779b9u) out[0] = acc;
    }"""
    kernel = cupy.RawKernel(source, "read_all")
    out = cupy.zeros(1, dtype=cupy.uint32)

    def read(buffer: torch.Tensor, blocks: int) -> None:
        n = buffer.numel() * buffer.element_size() // 16
        ptr = cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(buffer.data_ptr(), n * 16, buffer), 0)
        with cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream):
            kernel((blocks,), (256,), (ptr, cupy.uint64(n), out))
    return read


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    gg = importlib.import_module("bench_grouped_gemm")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    cases = []
    for m, n, k in ((4096, 4096, 4096), (8192, 8192, 8192), (4000, 4000, 4000), (128, 8192, 8192),
                    (8192, 8192, 1024)):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        cases.append((f"gemm {m}x{n}x{k} bf16", 2 * m * n * k, [
            ("jitops.gemm", lambda a=a, b=b: jitops.gemm(a, b)),
            ("torch.matmul", lambda a=a, b=b: torch.matmul(a, b))]))
    x, w, offsets, sizes = gg.moe_inputs()
    moe_flops = 2 * sum(sizes) * gg.MOE["K"] * gg.MOE["N"]
    cases.append(("grouped moe 64 x [32-256] x 2048 x 1024 bf16", moe_flops, [
        ("jitops.grouped_gemm", lambda: jitops.grouped_gemm(x, w, offsets=offsets)),
        ("torch._grouped_mm", lambda: torch._grouped_mm(x, w, offs=offsets))]))
    for _, _, sides in cases:  # JIT loads and cuBLAS heuristics before any clock is sampled
        for _, fn in sides:
            fn()
    torch.cuda.synchronize()

    sampler = Sampler()
    rows = []
    for name, flops, sides in cases:
        for side, fn in sides + sides[::-1]:  # ours, torch, torch, ours: drift hits both alike
            ms, start, end = run_for(fn, args.seconds)
            rows.append({"case": name, "side": side, "ms": ms, "tflops": flops / (ms * 1e-3) / 1e12,
                         "_window": (start, end)})
    # The mixture of experts' memory bound: one read of x and w, and a copy of the same bytes.
    read = read_kernel()
    inputs = torch.cat([x.reshape(-1), w.reshape(-1)])
    copy_dst = torch.empty_like(inputs)
    best_blocks, best_ms = None, float("inf")
    for blocks in (sms * 2, sms * 4, sms * 8, sms * 16, sms * 32):
        ms = time_cuda(lambda: read(inputs, blocks), warmup=3, reps=30)
        best_blocks, best_ms = (blocks, ms) if ms < best_ms else (best_blocks, best_ms)
    nbytes = inputs.numel() * 2
    for side, fn, moved in (("read x and w once (plain read kernel)", lambda: read(inputs, best_blocks), nbytes),
                            ("copy x and w (read + write)", lambda: copy_dst.copy_(inputs), 2 * nbytes)):
        ms, start, end = run_for(fn, args.seconds / 2)
        rows.append({"case": "memory bound of the moe product", "side": side, "ms": ms,
                     "tb_s": moved / (ms * 1e-3) / 1e12, "_window": (start, end)})
    samples = sampler.stop()

    print(f"{'case':46s} {'side':38s} {'us':>8s} {'TFLOP/s':>8s} {'MHz':>6s} {'W':>6s} {'capped':>6s} "
          f"{'% of peak at clock':>18s}")
    for row in rows:
        start, end = row.pop("_window")
        row.update(window(samples, start, end))
        peak = sms * FLOP_PER_SM_CYCLE * row.get("clock_mhz", float("nan")) * 1e6 / 1e12
        row["peak_at_clock_tflops"] = peak
        rate = f"{row['tflops']:8.1f}" if "tflops" in row else f"{row['tb_s']:6.2f}TB/s"
        share = f"{100 * row['tflops'] / peak:17.1f}%" if "tflops" in row else ""
        print(f"{row['case']:46s} {row['side']:38s} {row['ms'] * 1e3:8.1f} {rate} {row.get('clock_mhz', 0):6.0f} "
              f"{row.get('power_w', 0):6.0f} {row.get('power_capped', 0):6.2f} {share}", flush=True)
    print(f"read kernel: {best_blocks} blocks of 256 threads")
    path, _ = save_record("gemm_power", {"seconds_per_side": args.seconds, "read_blocks": best_blocks,
                                         "nvidia_smi_samples": len(samples), "samples": rows})
    print("wrote", path)


if __name__ == "__main__":
    main()
