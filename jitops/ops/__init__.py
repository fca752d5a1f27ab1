"""jitops' built-in ops, one file each.  Importing this package registers them with torch.library.

Each op module also defines PREWARM: manifest items (the format of cache_tools manifests and JITOPS_RECORD
lines) naming its common shape classes; `python -m jitops` and `cache_tools prewarm --all-builtin` use them.
"""
from . import add as _add_module
from . import gelu as _gelu_module
from . import grouped_gemm as _grouped_gemm_module
from .add import add
from .gelu import gelu, gelu_backward
from .grouped_gemm import grouped_gemm

PREWARM: list[dict] = [*_add_module.PREWARM, *_gelu_module.PREWARM, *_grouped_gemm_module.PREWARM]

__all__ = ["add", "gelu", "gelu_backward", "grouped_gemm", "PREWARM"]
