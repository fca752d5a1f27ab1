"""cache_tools: prewarm, inspect, verify, prune, ship and explain the jitops kernel cache.

    python -m cache_tools prewarm --manifest kernels.json --arch sm_90a,cpu --cache-dir /opt/jitops-cache
    jitops-cache list | verify | prune | export | import | explain | info | push | pull   (--help on each)

A thin command line (cli.py) over functions that take plain arguments and return reports, for tests and
notebooks: manifest.plan(), prewarm.prewarm(), entries.list_entries() / verify() / prune(),
archive.export() / import_archive(), explain.explain(), info.info(), remote.push() / pull() / pull_all().  They act on the cache roots of the
current jitops.config; wrap them in `jitops.config.scope(cache_dir=...)` to point them elsewhere.  Built only
on jitops' public functions.
"""
from __future__ import annotations

from .common import UsageError

__all__ = ["UsageError", "main"]


def main(argv=None) -> int:
    """The command line (what `python -m cache_tools` and `jitops-cache` run)."""
    from .cli import main as cli_main

    return cli_main(argv)
