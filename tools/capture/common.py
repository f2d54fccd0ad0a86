"""Shared parts of the capture scripts (tools/capture/*.py): deterministic edge-case inputs, the
vector JSON (the shape of spec/vectors, read by kvformats.spec.vectors) and the provenance block.

The capture scripts run an engine's own code, imported from a directory outside the tracked tree
(never copied into the repository), and store its inputs and outputs as data under
spec/vectors/captured/<engine>/. No capture script uses kvformats: a captured vector
must not depend on the implementation it is used to check.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import shlex
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OUT_ROOT = ROOT / "spec" / "vectors" / "captured"
SENTINEL = 0xA5  # every cache byte before the engine writes: the bytes it leaves alone keep it

DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32",
               torch.int32: "int32", torch.int64: "int64", torch.uint8: "uint8"}


def spec(t: torch.Tensor) -> dict:
    """``{"dtype", "shape", "hex"}`` of a tensor (little-endian element bytes), as spec/vectors."""
    t = t.detach().cpu().contiguous()
    return {"dtype": DTYPE_NAMES[t.dtype], "shape": list(t.shape),
            "hex": bytes(t.reshape(-1).view(torch.uint8).tolist()).hex()}


def hexbytes(t: torch.Tensor) -> str:
    return bytes(t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).tolist()).hex()


def load_module(name: str, path: Path):
    """Import one engine file by path (no package __init__ runs: those pull in CUDA extensions)."""
    if not path.is_file():
        sys.exit(f"{path} not found: extract the engine's file there first (see the script's docstring)")
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    module_spec.loader.exec_module(module)
    return module


def blob_id(path: Path) -> str:
    """git's blob id of a file: names the exact engine source that ran, whatever its folder."""
    data = path.read_bytes()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def provenance(*, repo: str, commit: str, file: str, function: str, source_path: Path,
               device: str, note: str = "") -> dict:
    """The ``captured`` block of a vector: which upstream code produced the expected bytes
    (``blob``: git's id of the exact file that ran)."""
    url = f"https://github.com/{repo}/blob/{commit}/{file}"
    out = {"repo": repo, "commit": commit, "file": file, "function": function, "url": url,
           "blob": blob_id(source_path), "device": device, "torch": torch.__version__.split("+")[0],
           "command": " ".join(shlex.quote(a) for a in ["python3", *sys_argv_rel()])}
    if note:
        out["note"] = note
    return out


def sys_argv_rel() -> list[str]:
    """sys.argv with the script path relative to the repository root and without --out (no
    machine paths)."""
    script = Path(sys.argv[0]).resolve()
    try:
        first = str(script.relative_to(ROOT))
    except ValueError:
        first = script.name
    rest, skip = [], False
    for a in sys.argv[1:]:  # --out names a folder of the machine that ran it, not how to reproduce it
        if skip or a == "--out" or a.startswith("--out="):
            skip = a == "--out"
            continue
        rest.append(a)
    return [first, *rest]


def render(vec: dict) -> str:
    return json.dumps(vec, indent=2, sort_keys=True) + "\n"


def write(vec: dict, engine: str, out_root: Path = OUT_ROOT) -> Path:
    path = out_root / engine / f"{vec['id']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(vec), encoding="utf-8")
    print(f"wrote {path.relative_to(out_root.parent) if out_root == OUT_ROOT else path}")
    return path


def git_commit(git_dir: str | None) -> str | None:
    if not git_dir:
        return None
    return subprocess.run(["git", f"--git-dir={git_dir}", "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


# ----- deterministic inputs ------------------------------------------------------------------------
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def edge_blocks(block: int, fmax: float, floor_amax: float, seed: int) -> list[torch.Tensor]:
    """float32 blocks of ``block`` values covering the cases every scale rule has to get right:
    random at several magnitudes, zeros (with -0.0), tiny and subnormal values, the amax floor,
    values at and above the element maximum ``fmax`` (448 for e4m3, 6 for e2m1), amax exactly on
    a power-of-two boundary ``fmax * 2^k`` and one bf16 step above it, and round-half cases."""
    g = _gen(seed)
    rnd = lambda scale: torch.randn(block, generator=g) * scale  # noqa: E731
    out = [rnd(1.0), rnd(1e-3), rnd(300.0)]
    zeros = torch.zeros(block)
    zeros[1::3] = -0.0
    out.append(zeros)
    neg_zero = torch.full((block,), -0.0)
    out.append(neg_zero)
    tiny = rnd(1e-6)
    tiny[0] = 1e-39  # float32 (and bf16) subnormal
    tiny[1] = -1e-39
    out.append(tiny)
    out.append(torch.linspace(-1.0, 1.0, block) * floor_amax * 0.5)  # amax below the floor
    at = torch.linspace(-1.0, 1.0, block) * floor_amax
    out.append(at)  # amax on the floor
    out.append(torch.linspace(-1.0, 1.0, block) * fmax)  # amax == element max, scale 1
    over = rnd(fmax / 4)
    over[3] = fmax * 1.125  # above the element max (448 -> 504; 6 -> 6.75)
    over[5] = -fmax * 40.0
    out.append(over)
    big = rnd(1e30)
    big[2] = 3.3895313892515355e38  # bf16 max: the largest finite scale exponent
    out.append(big)
    for k in (-3, 5):  # amax exactly fmax * 2^k, then one bf16 step (2^-7 relative) above
        b = rnd(fmax * 2.0**k / 8).clamp(-fmax * 2.0**k, fmax * 2.0**k)
        b[7] = fmax * 2.0**k
        out.append(b.clone())
        b[7] = fmax * 2.0**k * (1 + 2.0**-7)
        out.append(b.clone())
        # one float32 ulp above the boundary: amax / fmax rounds back onto 2^k in float32, not in
        # double (bf16 inputs round it back to the boundary itself)
        b[7] = torch.nextafter(torch.tensor(fmax * 2.0**k), torch.tensor(float("inf")))
        out.append(b)
    return out


def halfway_block(block: int, fmax: float, mids: list[float]) -> torch.Tensor:
    """A block whose scale is 1 (amax == fmax) holding the given element values and their
    negatives: round-half-to-even and tie-direction cases of the element type."""
    vals = [fmax] + [s * m for m in mids for s in (1.0, -1.0)]
    vals = (vals * (block // len(vals) + 1))[:block]
    return torch.tensor(vals, dtype=torch.float32)


# e4m3 midpoints between neighbouring codes (ties): RNE keeps the even code
E4M3_MIDS = [17.0, 19.0, 0.0029296875, 0.0009765625, 1.0625, 1.1875, 232.0, 416.0, 0.0087890625,
             0.015625 + 0.0009765625, 464.0, 449.0]
# e2m1 midpoints and near-midpoints (the threshold and RNE rules differ at 0.75, 1.75, 3.5)
E2M1_MIDS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.1, 0.26, 5.5, 6.0, 7.0]


def rows_from_blocks(blocks: list[torch.Tensor], per_row: int, tail: int = 0, seed: int = 0) -> torch.Tensor:
    """Pack blocks ``per_row`` to a row (cycling), plus ``tail`` random unquantized columns (RoPE)."""
    rows = []
    g = _gen(seed + 1)
    n_rows = -(-len(blocks) // per_row)
    for r in range(n_rows):
        parts = [blocks[(r * per_row + j) % len(blocks)] for j in range(per_row)]
        if tail:
            parts.append(torch.randn(tail, generator=g) * 2.0)
        rows.append(torch.cat(parts))
    return torch.stack(rows)


def shuffled_blocks(blocks: list[torch.Tensor], seed: int) -> list[torch.Tensor]:
    """The same blocks in another order, so each case lands at another block index of a row."""
    perm = torch.randperm(len(blocks), generator=_gen(seed)).tolist()
    return [blocks[i] for i in perm]


def random_cache_bytes(n: int, seed: int, scale_lo: int = 100, scale_hi: int = 140) -> torch.Tensor:
    """Random bytes (every e4m3 / e2m1 code is reachable); callers overwrite the scale bytes."""
    del scale_lo, scale_hi
    return torch.randint(0, 256, (n,), generator=_gen(seed), dtype=torch.int64).to(torch.uint8)


# scale bytes a reader has to handle: 0 (2^-127), 1, small, 127 (1.0), large, 254 (2^127) and 0xFF
# (NaN in float8_e8m0fnu; readers that compute 2^(b-127) get +Inf)
SCALE_BYTES = [0, 1, 20, 100, 120, 127, 130, 200, 254, 255]


def release_provenance(*, release, file: str, function: str, source_path: Path, wheel_path: Path,
                       device: str, note: str = "") -> dict:
    """The ``captured`` block of a vector produced by code from a released wheel (``release``: a
    ``tests.harness.released.Release``): package, version, the wheel file and its sha256, the
    file inside it and its sha256, the function, the PyPI page, the device and the command."""
    import triton

    out = {"package": release.package, "version": release.version, "wheel": release.filename,
           "wheel_sha256": hashlib.sha256(wheel_path.read_bytes()).hexdigest(), "file": file,
           "sha256": hashlib.sha256(source_path.read_bytes()).hexdigest(), "function": function,
           "url": release.url, "device": device, "torch": torch.__version__.split("+")[0],
           "triton": triton.__version__,
           "command": " ".join(shlex.quote(a) for a in ["python3", *sys_argv_rel()])}
    if release.commit:
        out["source"] = f"{release.repo}@{release.commit} (the commit the wheel names)"
    if note:
        out["note"] = note
    return out
