"""jitops' built-in ops, one module each (jitops.ops.gelu is the module; the public functions are jitops.gelu,
jitops.conv2d, ...).  Importing this package registers them with torch.library.

An op module declares its op(s) and reads top to bottom; a larger op keeps its plan (tile and bucket tables,
cost models and their fitted constants) in <op>_plan.py and its launch code in <op>_run.py.

Each op module also defines PREWARM: manifest items (the format of cache_tools manifests and JITOPS_RECORD
lines) naming its common shape classes; `python -m jitops` and `cache_tools prewarm --all-builtin` use them.
"""
from . import add, conv2d, gelu, gemm, grouped_gemm, layer_norm, linear

PREWARM: list[dict] = [*add.PREWARM, *gelu.PREWARM, *layer_norm.PREWARM, *conv2d.PREWARM, *grouped_gemm.PREWARM,
                       *gemm.PREWARM]

__all__ = ["add", "conv2d", "gelu", "gemm", "grouped_gemm", "layer_norm", "linear", "PREWARM"]
