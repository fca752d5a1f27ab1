"""jitops.gelu's tuning: how many 16-byte vectors a thread loads before it computes, the grid, and tanh's form.
The op is declared in jitops/ops/gelu.py; `config.scope(gelu_tuning={...})` overrides these constants.

Tuning (benchmarks/bench_gelu.py --sweep, H100, 2^28 elements: every variant within 5% of the 3.0 TB/s copy
except where noted): 16-byte vectors each thread loads before computing - forward 4 (bf16 erf 358 us where 1 and
2 took 372), backward 2 (bf16 erf 525 us; 4 took 535: 97 registers, 2 blocks an SM; 8 took 671) - the grid cap
in blocks per SM (0: one block per tile; capping at 8 or 16 a SM cost 5-10%), and tanh through the SFU's
tanh.approx for 16-bit types (no measurable gain, so off: the accurate tanhf).
"""
from __future__ import annotations

from typing import NamedTuple

from ..config import config

BLOCK = 256
DEFAULTS = {"unroll_forward": 4, "unroll_backward": 2, "blocks_per_sm": 0, "fast_tanh": 0}


class GeluTuning(NamedTuple):
    unroll_forward: int
    unroll_backward: int
    blocks_per_sm: int
    fast_tanh: bool


def _from(values: dict[str, int]) -> GeluTuning:
    return GeluTuning(values["unroll_forward"], values["unroll_backward"], values["blocks_per_sm"],
                      bool(values["fast_tanh"]))


PLANNED = _from(DEFAULTS)  # the kernels' template defaults (kernels/gelu.cu)


def tuning() -> GeluTuning:
    """The constants as the current config scope sets them (the defaults above unless a scope overrides some)."""
    overrides = config.gelu_tuning
    return _from({**DEFAULTS, **overrides}) if overrides else PLANNED

