# %% [markdown]
# # Deploying: prewarm the cache, then never compile
#
# In a notebook, compiling on first use is what you want. In a deployment it is not: a serving container that
# compiles for half a minute on its first request, or that has no compiler at all, is a bug. jitops splits the
# two:
#
# 1. **record** the kernels a real run needs: `JITOPS_RECORD=misses.jsonl` appends every cache miss as one
#    JSON line (a *manifest item*: op, dtype, shapes, arguments, arch);
# 2. **prewarm** a cache from the record on a build machine: `python -m cache_tools prewarm --record ...`
#    (no GPU needed for the CUDA kernels: NVRTC compiles for any arch);
# 3. **verify** that the cache covers the manifest: `python -m cache_tools verify --manifest ...` exits
#    non-zero on a miss, so it can gate a CI job or an image build;
# 4. **run offline**: `JITOPS_OFFLINE=1` turns every would-be compile into a `CacheMissError`, and
#    `JITOPS_CACHE_PATH` points at the prewarmed cache as a read-only root.
#
# Each step below runs in its own process, as it would on separate machines. With a GPU the workload runs the
# CUDA kernels; without one it runs jitops' CPU kernels, which take the same path through the cache.

# %%
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

WORK = Path(tempfile.mkdtemp(prefix="jitops-deploy-"))
DEV_CACHE = WORK / "dev-cache"      # the developer's cache: empty, so the recorded run below misses
IMAGE_CACHE = WORK / "image-cache"  # what an image's build stage prewarms and ships
RECORD = WORK / "misses.jsonl"
print("working in", WORK)
print(f"GPU: {torch.cuda.get_device_name()}" if torch.cuda.is_available() else
      "No GPU here: the workload runs jitops' CPU kernels; everything else is the same.")


def sh(command, **env):
    """Run a command line as in a terminal (`python` is this notebook's interpreter) with extra environment
    variables, print its output, and return its exit code."""
    args = shlex.split(command)
    if args[0] == "python":
        args[0] = sys.executable
    result = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env})
    print(result.stdout, end="")
    return result.returncode


# %% [markdown]
# ## The workload
#
# A stand-in for an application: a forward and a backward pass through `jitops.gelu`. It prints the stats
# counters as its last line, so that we can check what each run compiled.

# %%
WORKLOAD = WORK / "workload.py"
WORKLOAD.write_text('''
import json, sys
import torch, jitops

device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = getattr(torch, sys.argv[1]) if len(sys.argv) > 1 else (torch.bfloat16 if device == "cuda" else torch.float32)
x = torch.randn(512, 1024, device=device, dtype=dtype, requires_grad=True)
y = jitops.gelu(x, approximate="tanh")
y.sum().backward()
print(f"ran gelu forward and backward on {device} {dtype}")
print(json.dumps(jitops.stats.as_dict()))
''')


def last_json_line(text):
    return json.loads(text.strip().splitlines()[-1])


# %% [markdown]
# ## 1. Record the misses of a real run
#
# The run compiles what it needs (its cache is empty) and, because `JITOPS_RECORD` is set, appends one line per
# miss. Lines are deduplicated within a process and appended with one `write`, so several processes can share a
# record file.

# %%
assert sh(f"python {WORKLOAD}", JITOPS_CACHE_DIR=str(DEV_CACHE), JITOPS_RECORD=str(RECORD)) == 0
print(f"\n{RECORD.name}:")
print(RECORD.read_text())

# %% [markdown]
# Each line is a manifest item. A manifest is the same items under `"ops"`, with the target archs: the file you
# would commit next to a Dockerfile (or write by hand for the shapes you serve). `prewarm` and `verify` take
# either form (`--manifest` or `--record`).

# %%
items = [json.loads(line) for line in RECORD.read_text().splitlines()]
archs = sorted({arch for item in items for arch in item["archs"]})
ops = [{key: item[key] for key in ("op", "kernel_op", "dtypes", "shapes", "kwargs", "strides") if key in item}
       for item in items]
MANIFEST = WORK / "manifest.json"
body = ",\n".join(f"  {json.dumps(op)}" for op in ops)
MANIFEST.write_text(f'{{"archs": {json.dumps(archs)}, "ops": [\n{body}\n]}}\n')  # one item a line: clear diffs
print(MANIFEST.read_text())

# %% [markdown]
# ## 2. Verify before prewarming: a miss, and a non-zero exit
#
# The image's cache is still empty, so `verify` reports the missing kernels and fails. In a build pipeline this
# is the step that stops an image that would compile (or fail) at run time.

# %%
IMAGE_CACHE.mkdir()
code = sh(f"python -m cache_tools verify --manifest {MANIFEST} --cache-dir {IMAGE_CACHE}")
print("exit code:", code)
assert code != 0

# %% [markdown]
# ## 3. Prewarm from the record
#
# On a build machine (here: this one), `prewarm --record` compiles every recorded kernel for its recorded arch
# into the image's cache, in parallel (`--jobs`). CUDA kernels compile without a GPU, so the build stage of an
# image needs none.

# %%
assert sh(f"python -m cache_tools prewarm --record {RECORD} --cache-dir {IMAGE_CACHE}") == 0

# %% [markdown]
# ## 4. Verify the coverage
#
# Now every kernel the manifest needs is in the cache, with its checksum intact: exit code 0. `list` shows
# what the image will ship.

# %%
code = sh(f"python -m cache_tools verify --manifest {MANIFEST} --cache-dir {IMAGE_CACHE}")
print("exit code:", code)
assert code == 0
assert sh(f"python -m cache_tools list --cache-dir {IMAGE_CACHE}") == 0

# %% [markdown]
# ## 5. Run offline from the prewarmed cache
#
# The deployment sets `JITOPS_OFFLINE=1` and points `JITOPS_CACHE_PATH` at the shipped cache. A read-only root is
# searched first and never written to, so the image's cache can live on a read-only layer. The writable
# `JITOPS_CACHE_DIR` is a new, empty directory here, to show that nothing comes from anywhere else.
#
# The run loads every kernel from disk and compiles nothing.

# %%
OFFLINE = {"JITOPS_OFFLINE": "1", "JITOPS_CACHE_PATH": str(IMAGE_CACHE),
           "JITOPS_CACHE_DIR": str(WORK / "empty-writable-cache")}
result = subprocess.run([sys.executable, str(WORKLOAD)], capture_output=True, text=True,
                        env={**os.environ, **OFFLINE})
print(result.stdout + result.stderr, end="")
stats = last_json_line(result.stdout)
assert result.returncode == 0 and stats["compiles"] == 0 and stats["disk_hits"] >= 1

# %% [markdown]
# ## 6. What an offline miss looks like
#
# The same workload in float64 needs a kernel nobody prewarmed. Offline, that is an error, raised before
# anything compiles. The message names the op, the kernel, the arch, the shape class and the roots it searched,
# and gives the manifest item to prewarm.

# %%
result = subprocess.run([sys.executable, str(WORKLOAD), "float64"], capture_output=True, text=True,
                        env={**os.environ, **OFFLINE})
print("exit code:", result.returncode)
print(result.stderr[result.stderr.index("jitops.errors.CacheMissError"):])
assert result.returncode != 0

# %% [markdown]
# ## In a Dockerfile
#
# ```dockerfile
# # build stage: any machine, no GPU needed for the CUDA kernels
# COPY misses.jsonl manifest.json /build/
# RUN python -m cache_tools prewarm --record /build/misses.jsonl --cache-dir /opt/jitops-cache \
#  && python -m cache_tools verify --manifest /build/manifest.json --cache-dir /opt/jitops-cache
#
# # runtime stage
# COPY --from=build /opt/jitops-cache /opt/jitops-cache
# ENV JITOPS_CACHE_PATH=/opt/jitops-cache JITOPS_OFFLINE=1
# ```
#
# A complete, tested multi-stage Dockerfile (a build stage that prewarms, a compiler-free runtime stage) is in
# [examples/deploy/](../examples/deploy/). Record the misses from a staging run with `JITOPS_RECORD`, or write
# the manifest by hand for the shapes you serve; `python -m cache_tools prewarm --all-builtin --arch sm_90a`
# prewarms jitops' built-in ops' common shape classes. Ops declared in your own code (like the one in
# `02_custom_op.ipynb`) are named `namespace::name`; give `prewarm` and `verify` `--import MODULE`, the module
# that declares them. The manifest format and every subcommand: [docs/cache_tools.md](../docs/cache_tools.md).
#
# The last cell removes this notebook's working directory.

# %%
shutil.rmtree(WORK, ignore_errors=True)
