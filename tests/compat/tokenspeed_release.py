"""tokenspeed 0.1.1's ``deepseek_v4_ops.py`` from its released wheel, fetched at test time (never in
the repository), for its pure-torch functions to be compared with the drop-ins on CPU.

    ops = load_release_ops(tmp_path, hadamard=my_hadamard)
    ops.deepseek_v4_prepare_indexer_q(...)               # tokenspeed's own code

The wheel comes through tests.harness.released (``pip download --no-deps``, cached, sha256
checked; the three files read are checked against the wheel's RECORD). The file imports its CUDA
and Triton kernels from tokenspeed-kernel: they are stand-ins that raise if called (the functions
compared here do not call them), except ``hadamard_transform``, which the caller supplies. Its
geometry helpers are the wheel's own files.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
import types
from pathlib import Path

from tests.harness.released import Release, extract

OPS = "tokenspeed/runtime/layers/attention/deepseek_v4_ops.py"
GEOMETRY = "tokenspeed/runtime/layers/attention/deepseek_v4_geometry.py"
PAGE_SIZES = "tokenspeed/runtime/layers/attention/kernel_page_sizes.py"
TOKENSPEED = Release(
    package="tokenspeed", version="0.1.1", filename="tokenspeed-0.1.1-py3-none-any.whl",
    sha256="c20d4e87830c821f0b36f665baff999c4d08603b38becc6be33dc2636b97fb19",
    files=(OPS, GEOMETRY, PAGE_SIZES), repo="lightseekorg/tokenspeed")
KERNELS = {
    "tokenspeed_kernel.ops.attention.dsv4": ("dsv4_csa_indexer_fp8_cache_insert", "dsv4_swa_cache_insert"),
    "tokenspeed_kernel.ops.attention.dsv4.triton": (
        "dsv4_fused_csa_indexer_mxfp4_cache_insert", "dsv4_fused_indexer_q_rope_hadamard_mxfp4",
        "dsv4_fused_sparse_compress_cache_insert", "dsv4_save_compressor_state"),
}


def _kernel(name: str):
    def unavailable(*args, **kwargs):
        raise RuntimeError(f"{name} is tokenspeed-kernel's CUDA / Triton kernel, not loaded here")

    return unavailable


@contextlib.contextmanager
def _modules(modules: dict[str, types.ModuleType]):
    """``sys.modules`` holding ``modules`` (and empty parent packages) while a file is imported;
    what was there before is put back afterwards (the loaded module keeps what it bound)."""
    saved = {}
    for name in modules:
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix not in saved:
                saved[prefix] = sys.modules.get(prefix)
            if prefix == name:
                sys.modules[name] = modules[name]
            elif prefix not in modules and prefix not in sys.modules:
                pkg = types.ModuleType(prefix)
                pkg.__path__ = []
                sys.modules[prefix] = pkg
    try:
        yield
    finally:
        for name, mod in saved.items():
            if mod is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = mod


def _load(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def load_release_ops(dest: Path, hadamard) -> types.ModuleType:
    """tokenspeed 0.1.1's ``deepseek_v4_ops`` module, imported from the wheel's file under another
    name; ``hadamard(x, scale=...)`` stands for tokenspeed-kernel's ``hadamard_transform``."""
    files = extract(TOKENSPEED, Path(dest))
    stubs = {}
    for module, names in KERNELS.items():
        mod = types.ModuleType(module)
        mod.__path__ = []
        for n in names:
            setattr(mod, n, _kernel(n))
        stubs[module] = mod
    transform = types.ModuleType("tokenspeed_kernel.ops.transform")
    transform.hadamard_transform = hadamard
    stubs["tokenspeed_kernel.ops.transform"] = transform
    page_sizes = types.ModuleType("tokenspeed.runtime.layers.attention.kernel_page_sizes")
    stubs["tokenspeed.runtime.layers.attention.kernel_page_sizes"] = page_sizes
    geometry = types.ModuleType("tokenspeed.runtime.layers.attention.deepseek_v4_geometry")
    stubs["tokenspeed.runtime.layers.attention.deepseek_v4_geometry"] = geometry
    with _modules(stubs):
        # the wheel's own geometry files, bound into the stand-in modules' places
        page_sizes.__dict__.update(_load("_tokenspeed_0_1_1_page_sizes", files[PAGE_SIZES]).__dict__)
        geometry.__dict__.update(_load("_tokenspeed_0_1_1_geometry", files[GEOMETRY]).__dict__)
        return _load("_tokenspeed_0_1_1_deepseek_v4_ops", files[OPS])
