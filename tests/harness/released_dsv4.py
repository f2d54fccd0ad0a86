"""tokenspeed-kernel 0.1.4's DeepSeek V4 Triton module (``tokenspeed_kernel/ops/attention/dsv4/
triton.py``) from its released wheel, fetched at test time (never in the repository), run under
the Triton interpreter with the GPU's conversions, for the ``kvformats.compat.tokenspeed_kernel.dsv4``
drop-in to be compared with it on CPU.

    files = extract(TOKENSPEED_KERNEL_DSV4, tmp)                     # pip download, sha256 checked
    results = run_tokenspeed_dsv4([(name, args, kwargs), ...], tmp, workdir)

Each call runs in one fresh Python process (TRITON_INTERPRET=1 must be set before Triton binds
its library functions), on copies of its arguments, under ``released.gpu_numerics``. The file
imports tokenspeed's Triton fork, kernel registry, platform and the attention kernels of its
``_triton.indexer``: stock Triton, stubs (decorators and metadata only; ``current_platform()``
says Hopper, not Blackwell) and stand-ins that raise if called.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import torch

from tests.harness import released as rel

DSV4_TRITON = "tokenspeed_kernel/ops/attention/dsv4/triton.py"
DSV4_API = "tokenspeed_kernel/ops/attention/dsv4/__init__.py"  # read with ast only (signatures)
TOKENSPEED_KERNEL_DSV4 = replace(rel.TOKENSPEED_KERNEL, files=(DSV4_TRITON, DSV4_API))
_LOADED: dict = {}


class _Hopper:
    """``current_platform()`` of an H100 / H200 (the devices kvformats' GPU runs use)."""

    is_blackwell = False
    is_hopper = True
    is_nvidia = True
    is_amd = False


def load_tokenspeed_dsv4(files_dir: Path, interpret: bool = True):
    """The released ``dsv4/triton.py`` imported from ``files_dir`` (what ``extract`` filled)."""
    key = (str(files_dir), interpret)
    if key not in _LOADED:
        triton, tl, libdevice = rel._triton_modules()
        stubs = {
            "tokenspeed_kernel._triton": dict(triton=triton, tl=tl, libdevice=libdevice),
            "tokenspeed_kernel.ops.attention.dsv4._triton.indexer": {},  # attention kernels: unused
            "tokenspeed_kernel.platform": dict(CapabilityRequirement=rel._Unused, current_platform=_Hopper),
            "tokenspeed_kernel.registry": dict(Priority=rel._Unused(), register_kernel=lambda *a, **k: (lambda f: f)),
            "tokenspeed_kernel.signature": dict(dense_tensor_format=lambda dtype: ("dense", str(dtype)),
                                                format_signature=lambda **kw: tuple(sorted(kw.items()))),
        }
        with rel._stubbed(stubs):
            _LOADED[key] = rel._import_file("_released_tokenspeed_kernel_dsv4_triton",
                                            Path(files_dir) / DSV4_TRITON, interpret)
    return _LOADED[key]


def _copy(a):
    return a.clone() if isinstance(a, torch.Tensor) else a


def call_tokenspeed_dsv4(module, name: str, args: tuple, kwargs: dict, device: str | None = None) -> dict:
    """One call of the released ``name`` on copies of its arguments under ``gpu_numerics``:
    ``{"result", "args", "kwargs"}`` (the returned value; the arguments after the call, holding its
    in-place writes) or ``{"error": (exception type name, message), "args", "kwargs"}``."""
    device = rel.released_device() if device is None else device  # the arguments' device in the call
    args, kwargs = rel.moved(args, device), rel.moved(kwargs, device)  # copies
    try:
        with rel.released_numerics():
            result = getattr(module, name)(*args, **kwargs)
        rel.finished()
    except Exception as err:  # the released code's refusal, recorded as data
        return {"error": (type(err).__name__, str(err)), "args": args, "kwargs": kwargs}
    return {"result": result, "args": args, "kwargs": kwargs}


def run_tokenspeed_dsv4(calls: list[tuple[str, tuple, dict]], files_dir: Path, workdir: Path) -> list[dict]:
    """Each ``(name, args, kwargs)`` run by ``call_tokenspeed_dsv4`` in one fresh Python process
    with TRITON_INTERPRET=1; one dict per call, in order. Arguments that alias each other before
    the call are separate copies in it (say so in a test that relies on aliasing)."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    calls = [(n, tuple(_copy(a) for a in args), {k: _copy(v) for k, v in kwargs.items()})
             for n, args, kwargs in calls]
    torch.save({"calls": calls, "files": str(files_dir)}, workdir / "dsv4_calls.pt")
    root, env = Path(__file__).resolve().parents[2], rel.child_env()
    out = subprocess.run([sys.executable, "-m", "tests.harness.released_dsv4", str(workdir / "dsv4_calls.pt"),
                          str(workdir / "dsv4_results.pt")], cwd=root, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the released dsv4 functions failed:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}")
    return torch.load(workdir / "dsv4_results.pt", weights_only=False, map_location="cpu")


def _main(calls_path: str, out_path: str) -> None:
    spec = torch.load(calls_path, weights_only=False)
    module = load_tokenspeed_dsv4(Path(spec["files"]), rel.released_device() == "cpu")
    torch.save([call_tokenspeed_dsv4(module, n, a, k) for n, a, k in spec["calls"]], out_path)


if __name__ == "__main__":
    _main(*sys.argv[1:])
