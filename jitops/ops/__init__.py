"""jitops' built-in ops, one file each.  Importing this package registers them with torch.library."""
from .add import add
from .gelu import gelu, gelu_backward

__all__ = ["add", "gelu", "gelu_backward"]
