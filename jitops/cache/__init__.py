"""The on-disk kernel cache (the memory cache is a dict in the runtime and in each op)."""
from .disk import CacheEntry, CacheRoot, CorruptEntry, DiskCache

__all__ = ["CacheEntry", "CacheRoot", "CorruptEntry", "DiskCache"]
