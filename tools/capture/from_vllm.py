"""Capture vectors from vLLM's Triton DeepSeek V4 fp8_ds_mla writer (needs a GPU).

    python3 tools/capture/from_vllm.py [--src .engines/vllm-0.34.0] [--out DIR] [--interpret]

``--src`` holds vLLM's python tree outside the tracked tree; the script reads one file,
``vllm/models/deepseek_v4/common/ops/cache_utils.py``, and ``vllm/_version.py`` for the commit.
vLLM's git snapshot is too large to fetch here, so the file comes from the release wheel
(``vllm==0.34.0``, built from commit 62d4bc3c7), fetched with pip and unpacked:

    pip download vllm==0.34.0 --no-deps -d /tmp/vllm-wheel
    unzip -q /tmp/vllm-wheel/vllm-0.34.0-*.whl 'vllm/_version.py' 'vllm/models/deepseek_v4/common/ops/*' -d .engines/vllm-0.34.0

Why only this: ``import vllm`` fails without its compiled extensions (the 0.34.0 wheel pins torch
2.14 and ships CUDA builds of them); its V4 CPU path
(vllm/models/deepseek_v4/cpu/) calls compiled C++ ops (``torch.ops._C``); its 584 B writers are
the CUDA fused op and the Triton ``quantize_and_insert_k_cache``. This script loads
cache_utils.py alone, with stub modules for its vLLM imports (imports only: the function captured
uses none of them but stock ``triton``), and runs ``quantize_and_insert_k_cache`` (profile vllm of
fp8_ds_mla) into a sentinel-filled cache of kvformats' page size at shuffled slots with one
skipped. Its reader (``dequantize_and_gather_k_cache``) goes through vLLM's JIT-warmup launcher
classes, which a stub cannot stand in for, so it is not captured.

``--interpret`` runs it on CPU under TRITON_INTERPRET=1 as a dry run of this script only (the
interpreter's float casts are not the GPU's): its output goes to a scratch folder, never committed.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common as c  # noqa: E402
import from_tokenspeed as shared  # noqa: E402  (same inputs, page size and slots as tokenspeed's writer)

REPO = "vllm-project/vllm"
FILE = "vllm/models/deepseek_v4/common/ops/cache_utils.py"


class _JitKernelBase:
    """Stands in for VllmTritonJitKernel (a generic base class): subscriptable, no-arg init."""

    def __class_getitem__(cls, item):
        return cls

    def __init__(self, *args, **kwargs):
        pass


def _stub_imports() -> None:
    """Modules cache_utils.py imports at module level; triton is the real one."""
    import triton
    import triton.language as tl

    def mod(name: str, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m

    unused = lambda *a, **k: None  # noqa: E731  (reached only by code paths this script does not run)
    for pkg in ("vllm", "vllm.model_executor", "vllm.model_executor.layers", "vllm.model_executor.layers.quantization",
                "vllm.model_executor.layers.quantization.utils", "vllm.model_executor.warmup",
                "vllm.transformers_utils", "vllm.utils"):
        mod(pkg)
    mod("vllm.model_executor.layers.quantization.utils.quant_utils", get_fp8_min_max=unused)
    mod("vllm.model_executor.warmup.jit_warmup", WarmupIntRange=unused, kernel_launcher=lambda f: f,
        zip_inputs=unused)
    mod("vllm.model_executor.warmup.jit_warmup_triton_helper", LaunchSpec=object, TritonPointerInputVariant=unused,
        TritonWarmupTensor=unused, VllmTritonJitKernel=_JitKernelBase, triton_scalar_specialization_rep=unused)
    mod("vllm.platforms", current_platform=types.SimpleNamespace(is_fp8_fnuz=lambda: False))
    mod("vllm.transformers_utils.deepseek_v4_utils", get_compress_ratios=unused)
    mod("vllm.triton_utils", tl=tl, triton=triton)
    mod("vllm.utils.import_utils", has_cutedsl=lambda: False)
    mod("vllm.utils.math_utils", next_power_of_2=triton.next_power_of_2)


def version(src: Path) -> tuple[str, str]:
    text = (src / "vllm/_version.py").read_text()
    ver = re.search(r"__version__ = version = '([^']+)'", text).group(1)
    commit = re.search(r"commit_id = '([^']+)'", text).group(1).lstrip("g")
    return ver, commit


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--src", default=os.environ.get("VLLM_SRC", ".engines/vllm-0.34.0"))
    ap.add_argument("--out", default=None, help="vector root (default spec/vectors/captured)")
    ap.add_argument("--interpret", action="store_true", help="dry run on CPU under the Triton interpreter")
    args = ap.parse_args()
    if args.interpret:
        os.environ["TRITON_INTERPRET"] = "1"
    elif not torch.cuda.is_available():
        sys.exit("vLLM's writer is a Triton kernel: run this on a GPU (or --interpret for a dry run)")
    src = Path(args.src)
    ver, commit = version(src)
    _stub_imports()
    cu = c.load_module("vllm_dsv4_cache_utils", src / FILE)
    dev = torch.device("cuda" if torch.cuda.is_available() and not args.interpret else "cpu")
    where = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu, TRITON_INTERPRET=1 (dry run)"
    x = shared.mla_rows()
    n = x.shape[0]
    cache, slots = shared.new_cache("fp8_ds_mla", n, dev), shared.slots_for(n, dev)
    cu.quantize_and_insert_k_cache(x.to(dev), cache, slots, block_size=shared.PAGE)
    vec = shared.encode_vector(
        "vllm_fp8_ds_mla_write_triton", "fp8_ds_mla", {"head_dim": 512, "rope_dim": 64}, x, slots.cpu(),
        cache.cpu(), None, None,
        c.provenance(repo=REPO, commit=commit, file=FILE, function="quantize_and_insert_k_cache (Triton)",
                     source_path=src / FILE, device=where,
                     note=f"file from the vllm=={ver} wheel on PyPI (built from commit {commit})"),
        "vLLM's Triton fp8_ds_mla writer quantize_and_insert_k_cache on edge-case bf16 rows, whole cache")
    vec["params"]["profile"] = "vllm"
    vec["source"] = "captured: vLLM's own code (see captured)"
    out_root = Path(args.out) if args.out else (Path(tempfile.mkdtemp(prefix="vllm-interpret-"))
                                                if args.interpret else c.OUT_ROOT)
    c.write(vec, "vllm", out_root)


if __name__ == "__main__":
    main()
