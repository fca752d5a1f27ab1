"""jitops' built-in ops, one file each.  Importing this package registers them with torch.library.

Each op module also defines PREWARM: manifest items (the format of cache_tools manifests and JITOPS_RECORD
lines) naming its common shape classes; `python -m jitops` and `cache_tools prewarm --all-builtin` use them.
"""
from . import add as _add_module
from . import conv2d as _conv2d_module
from . import gelu as _gelu_module
from . import gemm as _gemm_module
from . import grouped_gemm as _grouped_gemm_module
from . import layer_norm as _layer_norm_module
from .add import add
from .conv2d import conv2d, conv2d_input_grad, conv2d_weight_grad
from .gelu import gelu, gelu_backward
from .gemm import gemm
from .grouped_gemm import grouped_gemm
from .layer_norm import layer_norm, layer_norm_backward, layer_norm_forward, layer_norm_inference
from .linear import linear

PREWARM: list[dict] = [*_add_module.PREWARM, *_gelu_module.PREWARM, *_layer_norm_module.PREWARM,
                       *_conv2d_module.PREWARM, *_grouped_gemm_module.PREWARM, *_gemm_module.PREWARM]

__all__ = ["add", "conv2d", "conv2d_input_grad", "conv2d_weight_grad", "gelu", "gelu_backward", "gemm",
           "grouped_gemm", "layer_norm", "linear", "layer_norm_forward", "layer_norm_backward", "layer_norm_inference",
           "PREWARM"]
