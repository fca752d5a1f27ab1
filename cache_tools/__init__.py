"""cache_tools: the jitops cache CLI (python -m cache_tools)."""
