"""The package's structure: no import cycles, a shallow import chain, no import inside a function
to dodge a cycle, modules of a readable size, ``__all__`` in every public module, the public
surface as reviewed (growing it is a decision: add the name to PUBLIC), each public name at one
home, plumbing underscored, and no attribute of a package shadowing one of its modules."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "python" / "torchfeed"
MAX_LINES = 450
MAX_CHAIN = 9  # modules in the longest chain of top-level imports (it was 12)
# Imports inside functions that are there for start-up time, not for a cycle: the command line
# imports torch and its heavy subcommands only when they run.
LAZY_OK = {"torchfeed.cli": {"torchfeed._pipeline_bench", "torchfeed._doctor"}}

# The public surface: each public module's __all__. The top level re-exports the names a
# pipeline uses most (TOP); every other public name lives in exactly one public module.
PUBLIC = {
    "torchfeed.cli": {"main"},
    "torchfeed.collate": {"DefaultCollate", "ImageCollate", "PadCollate"},
    "torchfeed.data": {
        "DistributedSampler",
        "SeedPerSample",
        "SerializedList",
        "ShardedIterableDataset",
        "SkipCorrupt",
        "WorkerSeeder",
        "seed_sample",
        "seed_worker",
    },
    "torchfeed.decode": {
        "DecodeCenterCrop",
        "DecodeRandomCrop",
        "decode_image",
        "decode_window",
        "image_size",
        "read_file",
        "read_image",
    },
    "torchfeed.images": {"RaggedImages"},
    "torchfeed.limits": {
        "DEFAULT_MAX_IMAGE_PIXELS",
        "ImageTooLargeError",
        "check_image_pixels",
        "max_image_pixels",
        "set_max_image_pixels",
    },
    "torchfeed.loaders": {"ResumableLoader", "ZeroCopyLoader", "loader"},
    "torchfeed.memory": {"PinnedRing", "RingTensor", "SharedRing"},
    "torchfeed.ops": {"crop_flip_normalize", "decode_jpeg_window", "pad"},  # the op modules
    "torchfeed.ops.crop_flip_normalize": {"crop_flip_normalize", "resize_center_crop_normalize"},
    "torchfeed.ops.decode_jpeg_window": {"decode_jpeg_window"},
    "torchfeed.ops.pad": {"Padded", "pad", "pad_packed"},
    "torchfeed.prefetch": {"DevicePrefetcher"},
    "torchfeed.ragged": {"RaggedBatch"},
    "torchfeed.reference": {
        "crop_flip_normalize_float64",
        "crop_flip_normalize_torchvision",
        "pad_packed",
        "pad_sequences",
        "pad_window",
        "resample_matrix",
    },
    "torchfeed.sampling": {"resized_crop_box", "sample_flips", "sample_resized_crop_params"},
    "torchfeed.transforms": {
        "FusedSteps",
        "RandomResizedCropFlipNormalize",
        "ResizeCenterCropNormalize",
        "ResizeRandomFlipNormalize",
        "fuse",
    },
}
TOP = {
    "DefaultCollate",
    "DevicePrefetcher",
    "ImageCollate",
    "PadCollate",
    "Padded",
    "PinnedRing",
    "RaggedBatch",
    "RaggedImages",
    "RandomResizedCropFlipNormalize",
    "ResizeCenterCropNormalize",
    "ResizeRandomFlipNormalize",
    "ResumableLoader",
    "ZeroCopyLoader",
    "__version__",
    "build_info",
    "crop_flip_normalize",
    "fuse",
    "loader",
    "pad",
    "pad_packed",
    "resize_center_crop_normalize",
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _targets(node: ast.AST, module: str) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            package = module.rsplit(".", node.level)[0]
            base = f"{package}.{base}" if base else package
        found = [base]
        found += [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in MODULES]
        return found
    return []


@cache
def imports(module: str) -> tuple[set[str], set[str]]:
    """(torchfeed modules imported at module level, those imported inside functions)."""
    tree = ast.parse(MODULES[module].read_text())
    top, inner = set(), set()
    for node in ast.walk(tree):
        for target in _targets(node, module):
            if target in MODULES and target != module:
                (top if node in tree.body or _in_type_checking(tree, node) else inner).add(target)
    # a module-level `if` (e.g. a build-dependent registration) is still module level
    for stmt in tree.body:
        if isinstance(stmt, ast.If | ast.Try):
            for node in ast.walk(stmt):
                top.update(t for t in _targets(node, module) if t in MODULES and t != module)
    inner -= top
    # importing a submodule imports its package first
    for name in list(top):
        parts = name.split(".")
        top.update(
            ".".join(parts[:i]) for i in range(2, len(parts)) if ".".join(parts[:i]) != module
        )
    return top, inner


def _in_type_checking(tree: ast.Module, node: ast.AST) -> bool:
    return False


def test_no_import_cycles():
    state: dict[str, int] = {}
    cycles = []

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for dep in sorted(imports(m)[0]):
            if dep not in MODULES or dep.startswith(m + "."):
                continue
            if state.get(dep) == 1:
                cycles.append([*path, m, dep])
            elif dep not in state:
                visit(dep, [*path, m])
        state[m] = 2

    for m in MODULES:
        if m not in state:
            visit(m, [])
    assert not cycles, cycles


def test_import_chain_is_shallow():
    @cache
    def depth(m: str) -> int:
        deps = [d for d in imports(m)[0] if not d.startswith(m + ".") and d in MODULES]
        return 1 + max((depth(d) for d in deps), default=0)

    deepest = max(MODULES, key=depth)
    assert depth(deepest) <= MAX_CHAIN, (deepest, depth(deepest))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_function_level_import_of_the_package(module):
    inner = imports(module)[1]
    allowed = LAZY_OK.get(module, set())
    unexpected = {m for m in inner if not any(m == a or m.startswith(a + ".") for a in allowed)}
    assert not unexpected, f"{module} imports {unexpected} inside a function"
    if module in LAZY_OK:  # the exemption is used (else it should go)
        assert inner


@pytest.mark.parametrize("module", sorted(MODULES))
def test_module_size(module):
    lines = len(MODULES[module].read_text().splitlines())
    assert lines < MAX_LINES, f"{module}: {lines} lines"


@pytest.mark.parametrize(
    "module", sorted(m for m in MODULES if not any(p.startswith("_") for p in m.split(".")))
)
def test_public_modules_list_their_names(module):
    tree = ast.parse(MODULES[module].read_text())
    names = {
        t.id
        for stmt in tree.body
        if isinstance(stmt, ast.Assign | ast.AnnAssign)
        for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
        if isinstance(t, ast.Name)
    }
    assert "__all__" in names or module.endswith("__main__"), f"{module} has no __all__"


def _public(module: str) -> bool:
    return not any(p.startswith("_") for p in module.split("."))


def test_the_public_surface_is_the_reviewed_one():
    found = {
        m: set(importlib.import_module(m).__all__)
        for m in MODULES
        if _public(m) and m not in ("torchfeed", "torchfeed.__main__")
    }
    assert found == PUBLIC
    assert set(importlib.import_module("torchfeed").__all__) == TOP


def test_each_public_name_has_one_home():
    """An object is exported by one public module (the top level re-exports TOP from theirs),
    and is defined there or in a private module, never in another public one."""
    homes: dict[int, list[str]] = {}
    for module, names in PUBLIC.items():
        if module == "torchfeed.ops":
            continue  # it lists its op modules
        mod = importlib.import_module(module)
        for name in names:
            obj = getattr(mod, name)
            homes.setdefault(id(obj), []).append(f"{module}.{name}")
            defined = getattr(obj, "__module__", None)
            if isinstance(defined, str) and defined != module:
                assert not _public(defined), f"{module}.{name} is defined in {defined}"
    assert not [h for h in homes.values() if len(h) > 1]
    top = importlib.import_module("torchfeed")
    for name in TOP - {"__version__", "build_info"}:
        (home,) = homes[id(getattr(top, name))]  # a re-export of its one home
        assert home.rsplit(".", 1)[1] == name


@pytest.mark.parametrize("module", sorted(m for m in MODULES if _public(m)))
def test_plumbing_is_underscored(module):
    """A public module defines its public names and private (underscored) ones, nothing else."""
    tree = ast.parse(MODULES[module].read_text())
    defined = {
        stmt.name
        for stmt in tree.body
        if isinstance(stmt, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef)
    }
    public = set(importlib.import_module(module).__all__)
    stray = {n for n in defined if not n.startswith("_") and n not in public}
    assert not stray, f"{module} defines {stray}: export them or underscore them"


@pytest.mark.parametrize("package", sorted(m for m in MODULES if MODULES[m].name == "__init__.py"))
def test_no_attribute_of_a_package_shadows_one_of_its_modules(package):
    pkg = importlib.import_module(package)
    for name in MODULES:
        if name.rsplit(".", 1)[0] != package or name == package or name.endswith("__main__"):
            continue
        leaf = name.rsplit(".", 1)[1]
        importlib.import_module(name)
        assert getattr(pkg, leaf) is sys.modules[name], (
            f"{package}.{leaf} is {getattr(pkg, leaf)!r}, not the module {name}"
        )


def test_import_torchfeed_leaves_torchvision_until_an_image_name_is_asked_for():
    """`import torchfeed` (in every spawned worker too) does not import torchvision, which takes
    longer than the rest of torchfeed (torchvision.models imports torch._dynamo); the transforms,
    `torchfeed.decode` and `torchfeed.sampling` import it when first asked for, and a bare
    `import torchfeed` still reaches them."""
    code = """
import sys, torchfeed
assert "torchvision" not in sys.modules, "import torchfeed imported torchvision"
assert {"fuse", "transforms", "decode", "sampling"} <= set(dir(torchfeed))
t = torchfeed.RandomResizedCropFlipNormalize(8, mean=0.5, std=0.5)
assert "torchvision" in sys.modules
assert torchfeed.fuse is sys.modules["torchfeed.transforms"].fuse
assert torchfeed.decode.read_file is sys.modules["torchfeed.decode"].read_file
from torchfeed import *
assert ResizeCenterCropNormalize is torchfeed.transforms.ResizeCenterCropNormalize
try:
    torchfeed.no_such_name
except AttributeError as e:
    assert "no attribute 'no_such_name'" in str(e)
else:
    raise AssertionError("no AttributeError")
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
