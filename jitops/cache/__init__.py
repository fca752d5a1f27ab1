"""The on-disk kernel cache and the remote tier (the memory cache is a dict in the runtime and in each op).
`remote` imports the redis client only when a remote is configured."""
from . import remote
from .disk import CacheEntry, CacheRoot, CorruptEntry, DiskCache

__all__ = ["CacheEntry", "CacheRoot", "CorruptEntry", "DiskCache", "remote"]
