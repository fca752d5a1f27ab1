"""The shape of jitops' import graph, read from the sources (nothing is imported to build it).

- No circle: every module of jitops/ can be understood from the modules it imports, and importing one never
  needs a half-initialised other.  Imports inside functions count (a lazy import that closes a circle is still
  a circle); imports under `if TYPE_CHECKING:` do not.
- An op module (jitops/ops/<op>.py, and its <op>_plan.py, <op>_run.py and <op>_costs.py, the plan's fitted tables)
  imports only the declaration API (jitops.op), the pure helpers (shapes, specs), launch, config and errors, and
  its own plan, run and costs modules.
  Never the runtime, the cache, the backends or another op, except the exceptions listed below with a reason;
  an op built on another uses only that op's public names.  The host sides of an op's kernels (KERNEL_HOST_SIDES:
  jitops.cutlass_host, jitops.light_gemm for gemm) may be imported by that op and import only launch's layer.
- Public names do not shadow their modules: jitops.ops.<op> is the module, the functions are jitops.<name>.
"""
from __future__ import annotations

import ast
import importlib
import types
from pathlib import Path

import pytest

import jitops

ROOT = Path(jitops.__file__).parent
OPS = ROOT / "ops"

# What an op module may import besides its own plan and run modules.
OP_MAY_IMPORT = {"jitops.op", "jitops.shapes", "jitops.specs", "jitops.launch", "jitops.config", "jitops.errors"}

# Modules that hold the Python host half of one op's kernels (argument packing, TMA descriptors, the launch), with
# the op they belong to and why they are not in its <op>_run.py.  That op's modules may import them (its plan
# stays pure); they sit at launch's layer and import only HOST_SIDE_MAY_IMPORT and each other.
KERNEL_HOST_SIDES = {
    "jitops.cutlass_host": (("gemm",), "the CUTLASS 3 sm_90a kernel's host side, checked byte for byte against "
                                    "CUTLASS's host code by tests/test_cutlass_host.py; shared with light_gemm"),
    "jitops.light_gemm": (("gemm",), "the light sm_90a kernel's spec and host side (JITOPS_GEMM_SM90_KERNEL=light), "
                                  "tested on its own by tests/test_light_gemm.py"),
    "jitops.light_conv": (("conv2d",), "the light sm_90a conv kernels' specs and host side "
                                     "(JITOPS_CONV2D_SM90_KERNEL=light), tested on their own by "
                                     "tests/test_light_conv.py"),
    "jitops.light_grouped": (("grouped_gemm",), "the light sm_90a kernel's grouped forms: specs and host side "
                                             "(JITOPS_GROUPED_GEMM_SM90_KERNEL=light), tested on their own by "
                                             "tests/test_light_grouped.py"),
    "jitops.native": (("linear", "gemm", "gelu", "layer_norm", "conv2d"),
                      "the C++ host path (kernels/host/host_path.cpp): linear, layer_norm and conv2d call it first, "
                      "gemm's, gelu's, layer_norm's and conv2d's launches offer it their kernels; jitops/__init__ "
                      "hands it the runtime that builds it"),
}
HOST_SIDE_MAY_IMPORT = {"jitops.launch", "jitops.specs", "jitops.shapes", "jitops.errors", "jitops.config"}

# Ops built on other ops, each with the reason (remove an entry when its imports go): the modules of the first
# may import the public names of the second's modules.
OP_IMPORT_EXCEPTIONS = {
    ("gemm", "gelu"): "the GELU activation: gemm's training path and backward call jitops.gelu and gelu_backward",
    ("linear", "gemm"): "linear is gemm's kernels with weight^T read in place: gemm's shape classes (gemm_plan), "
                        "kernels and launches (gemm_run), and jitops.gemm in its backward",
    ("linear", "gelu"): "the activation's training path and backward (as in gemm)",
    ("conv2d", "linear"): "a conv over non-overlapping patches (stride = filter, ViT's patch embedding) is one "
                          "jitops.linear call on the patch matrix (conv2d_run.run_patchify)",
}

# Top-level public names that are objects named like their module, on purpose (the module is reached with
# `from jitops.<module> import ...`, which goes through sys.modules).
SHADOWING_EXCEPTIONS = {
    "op": "jitops.op(...) declares an op (the documented API); the module holds Op, Impl and the registry",
    "config": "jitops.config is the one Config object (config.offline, config.scope()); its module declares it",
    "runtime": "jitops.runtime is the process's Runtime (cache_tools calls runtime.prewarm, key_for); likewise",
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The jitops modules `path` imports: `from .x import y` is x, or x.y when that is a module."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "jitops":
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "jitops":
                for alias in node.names:
                    sub = f"{target}.{alias.name}"
                    found.add(sub if sub in modules else target)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    found.discard(name)
    return {m for m in found if m in modules}


def graph() -> dict[str, set[str]]:
    paths = sorted(ROOT.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imports_of(p, modules) for p in paths}


def find_circle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state:
                found = walk(nxt)
                if found:
                    return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state:
            found = walk(start)
            if found:
                return found
    return None


def test_the_import_graph_of_jitops_has_no_circle():
    circle = find_circle(graph())
    assert circle is None, "import circle: " + " -> ".join(circle)


def test_the_circle_finder_can_fail():
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) is None


def _op_modules() -> list[Path]:
    return sorted(p for p in OPS.glob("*.py") if p.name != "__init__.py")


def _owner(path: Path) -> str:
    """The op a module belongs to: conv2d for conv2d.py, conv2d_plan.py, conv2d_run.py and conv2d_costs.py."""
    stem = path.stem
    for suffix in ("_plan", "_run", "_costs"):
        if stem.endswith(suffix) and (OPS / f"{stem.removesuffix(suffix)}.py").exists():
            return stem.removesuffix(suffix)
    return stem


def _owner_of_module(name: str) -> str | None:
    """The op an op module belongs to (jitops.ops.gemm_run: gemm), None for the rest of jitops."""
    prefix = "jitops.ops."
    if not name.startswith(prefix) or name == "jitops.ops":
        return None
    return _owner(OPS / f"{name.removeprefix(prefix)}.py")


def test_op_modules_import_only_the_op_api_and_their_own_plan_and_run():
    edges = graph()
    wrong, used = [], set()
    for path in _op_modules():
        name, owner = module_name(path), _owner(path)
        own = {f"jitops.ops.{owner}_plan", f"jitops.ops.{owner}_run", f"jitops.ops.{owner}_costs"}
        for target in sorted(edges[name]):
            if target in OP_MAY_IMPORT or target in own:
                continue
            if owner in KERNEL_HOST_SIDES.get(target, ((),))[0]:
                used.add(target)
                continue
            if (owner, _owner_of_module(target)) in OP_IMPORT_EXCEPTIONS:
                used.add((owner, _owner_of_module(target)))
                continue
            wrong.append(f"{name} imports {target}")
    assert not wrong, ("op modules may import only " + ", ".join(sorted(OP_MAY_IMPORT)) + " and their own "
                       "<op>_plan / <op>_run / <op>_costs; move shared code there, or list the exception with its "
                       "reason:\n  " + "\n  ".join(wrong))
    stale = sorted(set(OP_IMPORT_EXCEPTIONS) - used) + sorted(set(KERNEL_HOST_SIDES) - used)
    assert not stale, f"these listed exceptions no longer happen; remove them: {stale}"


def test_kernel_host_sides_sit_at_the_launch_layer():
    edges = graph()
    for name in KERNEL_HOST_SIDES:
        allowed = HOST_SIDE_MAY_IMPORT | set(KERNEL_HOST_SIDES)
        assert edges[name] <= allowed, (name, edges[name] - allowed)


def private_imports(path: Path) -> list[tuple[str, str]]:
    """(module, name) of every `from <jitops module> import _name` in path."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - (node.level - 1)] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
            found += [(target, alias.name) for alias in node.names
                      if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_op_modules_use_only_public_names_of_other_ops():
    """An op built on another (linear on gemm) uses what that op publishes, not its private helpers."""
    wrong = []
    for path in _op_modules():
        owner = _owner(path)
        for target, name in private_imports(path):
            other = _owner_of_module(target)
            if other is not None and other != owner:
                wrong.append(f"{module_name(path)} imports {target}.{name}")
    assert not wrong, "make these public (no leading underscore) where they are defined:\n  " + "\n  ".join(wrong)


def test_plan_modules_are_pure():
    """A plan decides from sizes and the config: no launches, no torch.library, no runtime."""
    edges = graph()
    for path in OPS.glob("*_plan.py"):
        allowed = {"jitops.shapes", "jitops.config", "jitops.errors", f"jitops.ops.{_owner(path)}_costs"}
        assert edges[module_name(path)] <= allowed, (path.name, edges[module_name(path)] - allowed)


def test_no_op_module_is_over_500_lines():
    lengths = {p.name: len(p.read_text().splitlines()) for p in _op_modules()}
    long = {name: n for name, n in lengths.items() if n > 500}
    assert not long, f"split the plan (tables, cost models) or the launch code out of: {long}"


@pytest.mark.parametrize("path", _op_modules(), ids=lambda p: p.stem)
def test_jitops_ops_names_are_their_modules(path):
    module = importlib.import_module(f"jitops.ops.{path.stem}")
    assert getattr(jitops.ops, path.stem) is module


def test_public_functions_live_on_jitops_and_do_not_shadow_modules():
    for name in jitops.__all__:
        value = getattr(jitops, name)
        if (ROOT / f"{name}.py").exists() or (ROOT / name / "__init__.py").exists():
            if not isinstance(value, types.ModuleType):
                assert name in SHADOWING_EXCEPTIONS, f"jitops.{name} is {value!r}, shadowing jitops/{name}.py"
    for name in ("gemm", "conv2d", "grouped_gemm", "layer_norm", "gelu", "add", "linear"):
        assert callable(getattr(jitops, name)) and not isinstance(getattr(jitops, name), types.ModuleType)
