"""Released engine writers, run on CPU: their wheels fetched from the package index at test time
(tokenspeed-kernel 0.1.4, vllm 0.33.0, sglang 0.5.23),
the few Python files needed extracted to a scratch folder (never into the repository), imported
with stub modules for their imports, and their Triton kernels run under the Triton interpreter
with the GPU's float conversions (``gpu_numerics``).

    wheel = fetch(TOKENSPEED_KERNEL)             # pip download --no-deps, cached, sha256 checked
    extract(TOKENSPEED_KERNEL, dest / "tk")      # only TOKENSPEED_KERNEL.files, RECORD hashes checked
    jobs = make_jobs(["tokenspeed-swa"])         # rows of every input kind, slots, sentinel caches
    caches = run_writers(jobs, {"tokenspeed-kernel": dest / "tk"}, workdir)  # a TRITON_INTERPRET=1 child

In a process that set TRITON_INTERPRET=1 before importing Triton (the capture scripts do),
``run_writer(name, x, slots, cache, page_size, folder)`` runs one writer in place.
``run_tokenspeed_dsv41([(name, args), ...], dest / "tk", workdir)`` calls tokenspeed's dsv41 cache
codecs themselves (``cache_pack`` / ``cache_unpack`` / ``cache_scatter`` / ``cache_gather``) so, with
their results, in-place writes and refusals (``extract(TOKENSPEED_KERNEL_DSV41, ...)`` also brings
the public ``dsv41/__init__.py`` for its signatures).

Wheels are cached in ``$KVFORMATS_TEST_CACHE/wheels`` (default ``~/.cache/kvformats-tests``), so a
machine downloads each once (vllm 0.33.0's wheel is 336 MB); ``IndexUnreachable`` is raised only
when pip fails *and* the package index does not answer (tests skip on it and on nothing else).

Why the interpreter needs help (measured with triton 3.9.0, tests/interop/test_released_writers.py
``test_interpreter_casts_depart_from_the_gpu``): the interpreter converts float32 -> float8e4nv
with ties away from zero, without saturation (500.0 -> 0x78, 464.0 -> 0x7F = NaN) and without the
carry into the next binade (-0.0309 -> 0x88 instead of 0x90); float32 -> bfloat16 truncates;
bfloat16 -> float32 flushes subnormals; float8e4nv 0x7F / 0xFF read as +-480, not NaN; and it
refuses inline PTX. On an sm_89+ GPU, Triton lowers these casts to ``cvt.rn.satfinite.e4m3x2.f32``
(round to nearest even, finite values saturated to +-448), ``cvt.rn.bf16.f32`` and exact widenings.
``gpu_numerics`` replaces those conversions with exactly that, reads a 0/1 integer load/store mask
(the interpreter leaves ``block_bool & scalar_bool`` as int32, then refuses it) as a boolean, and
gives one inline-PTX sequence,
vLLM's ``cvt.rn.satfinite.e2m1x2.f32``, the instruction's documented semantics (PTX ISA, cvt:
round to nearest, ties to even; saturating to +-6; the sign of a value that rounds to zero kept);
any other inline assembly still raises. Everything else runs as the interpreter runs it: float32
arithmetic in numpy (IEEE, correctly rounded, as the GPU's ``div.rn`` / ``mul.rn``), ``tl.log2`` /
``tl.exp2`` as numpy's (the GPU uses its ``lg2.approx`` / ``ex2.approx``: see spec/engines.md
"V4.1 writers" for why the writers' bytes do not depend on that on bf16 input).

No kvformats import here: what these writers produce must not depend on the library it checks.
"""

from __future__ import annotations

import base64
import contextlib
import csv
import fcntl
import hashlib
import importlib.util
import io
import os
import subprocess
import sys
import types
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch


@dataclass(frozen=True)
class Release:
    """One released wheel: its name and version on the package index, the exact file (its sha256
    pins the bytes; a PyPI file never changes once uploaded) and the members the harness reads."""

    package: str
    version: str
    filename: str
    sha256: str
    files: tuple[str, ...]
    repo: str = ""
    commit: str = ""  # the commit the wheel says it was built from, where it says so

    @property
    def url(self) -> str:
        return f"https://pypi.org/project/{self.package}/{self.version}/"


TOKENSPEED_KERNEL = Release(
    package="tokenspeed-kernel", version="0.1.4",
    filename="tokenspeed_kernel-0.1.4-cp311-cp311-manylinux_2_28_x86_64.whl",
    sha256="958ed94e8ec272ba198277bda56b0b4fa10b03626a80bb7d2a5a50440cd0b38b",
    files=("tokenspeed_kernel/ops/attention/dsv41/triton.py",),
    repo="lightseekorg/tokenspeed")
VLLM = Release(
    package="vllm", version="0.33.0", filename="vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl",
    sha256="4b6bdec4ab269990bf70d45a3c1e94c3760a27064513760193b26d6f0da883aa",
    files=("vllm/_version.py",
           "vllm/models/deepseek_v41/common/ops/cache_utils.py",
           "vllm/models/deepseek_v41/common/ops/fused_compress_quant_cache.py",
           "vllm/models/deepseek_v4/common/ops/fused_indexer_q.py"),
    repo="vllm-project/vllm", commit="4ba787ec9")
SGLANG = Release(
    package="sglang", version="0.5.23", filename="sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl",
    sha256="00b3cd5b265ac76c64185fbb6b95424f324ddd9f428d0306b77bc9db9d859937",
    files=("sglang/test/kernels/deepseek_v4/dsv41_kv_quant_reference.py",
           "sglang/kernels/ops/quantization/fp4_fake_quant.py"),
    repo="sgl-project/sglang")
RELEASES = {r.package: r for r in (TOKENSPEED_KERNEL, VLLM, SGLANG)}

TOKENSPEED_FILE = TOKENSPEED_KERNEL.files[0]
VLLM_CACHE_UTILS = VLLM.files[1]
VLLM_FUSED = VLLM.files[2]
VLLM_INDEXER_Q = VLLM.files[3]
SGLANG_REFERENCE = SGLANG.files[0]
# tokenspeed-kernel's public dsv41 module (``cache_pack`` ... with their docstrings and ``__all__``),
# extracted beside triton.py for the drop-in's signature checks (tests/compat/test_tokenspeed_kernel_dsv41.py)
TOKENSPEED_DSV41_API = "tokenspeed_kernel/ops/attention/dsv41/__init__.py"
TOKENSPEED_KERNEL_DSV41 = replace(TOKENSPEED_KERNEL, files=(TOKENSPEED_FILE, TOKENSPEED_DSV41_API))


class IndexUnreachable(RuntimeError):
    """pip could not download a wheel and the package index did not answer either."""


def cache_root() -> Path:
    return Path(os.environ.get("KVFORMATS_TEST_CACHE", Path.home() / ".cache" / "kvformats-tests"))


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _index_url() -> str:
    url = os.environ.get("PIP_INDEX_URL")
    if not url:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                             capture_output=True, text=True)
        url = out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "https://pypi.org/simple"
    return url.rstrip("/")


def index_reachable(package: str, timeout: float = 20.0) -> bool:
    """Whether the package index answers at all (any HTTP status counts as an answer)."""
    url = f"{_index_url()}/{package}/"
    if url.startswith("file:"):
        return Path(url.removeprefix("file://")).exists()
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method="GET"), timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError, ValueError):
        return False


def fetch(release: Release) -> Path:
    """The release's wheel in the cache folder, downloaded by ``pip download --no-deps`` when it is
    not there yet (one download per machine; a file lock serializes parallel test workers). The
    wheel's sha256 must be ``release.sha256``."""
    folder = cache_root() / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / release.filename
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (path.is_file() and sha256_file(path) == release.sha256):
            # the wheel's platform tags only decide which file pip picks; the harness reads its
            # Python files, so any machine asks for the same file
            platform = release.filename.rsplit("-", 1)[1].removesuffix(".whl")
            cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--platform", platform, "--python-version", "3.11", "--implementation", "cp",
                   "-d", str(folder), f"{release.package}=={release.version}"]
            out = subprocess.run(cmd, capture_output=True, text=True)
            if out.returncode != 0 or not path.is_file():
                if not index_reachable(release.package):
                    raise IndexUnreachable(f"pip download {release.package}=={release.version} failed and the "
                                           f"package index ({_index_url()}) does not answer")
                raise RuntimeError(f"pip download {release.package}=={release.version} failed although the "
                                   f"index answers:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}")
        got = sha256_file(path)
        if got != release.sha256:
            raise RuntimeError(f"{path} has sha256 {got}, not {release.sha256} ({release.package} "
                               f"{release.version} as released)")
    return path


def _record_hashes(zf: zipfile.ZipFile) -> dict[str, str]:
    record = next(n for n in zf.namelist() if n.endswith(".dist-info/RECORD"))
    out = {}
    for row in csv.reader(io.StringIO(zf.read(record).decode())):
        if len(row) >= 2 and row[1].startswith("sha256="):
            digest = base64.urlsafe_b64decode(row[1].removeprefix("sha256=") + "==")
            out[row[0]] = digest.hex()
    return out


def extract(release: Release, dest: Path) -> dict[str, Path]:
    """Only ``release.files`` out of the wheel, into ``dest``; each file's sha256 is checked
    against the wheel's RECORD. Returns member name -> extracted path."""
    wheel = fetch(release)
    out = {}
    with zipfile.ZipFile(wheel) as zf:
        hashes = _record_hashes(zf)
        for member in release.files:
            data = zf.read(member)
            if hashlib.sha256(data).hexdigest() != hashes[member]:
                raise RuntimeError(f"{member} in {wheel.name} does not match the wheel's RECORD")
            target = Path(dest) / member
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            out[member] = target
    return out


def wheel_commit(version_file: Path) -> str:
    """The commit a vLLM wheel says it was built from (``vllm/_version.py``)."""
    for line in version_file.read_text().splitlines():
        if line.startswith("__commit_id__"):
            return line.split("'")[1].lstrip("g")
    return ""


# ----- import stubs ----------------------------------------------------------------------------
class _Unused:
    """Stands in for a name a released file imports but no code path run here uses: a class (it
    may be subclassed and subscripted, ``VllmJitKernel["Key"]``), callable with anything."""

    def __class_getitem__(cls, item):
        return cls

    def __init__(self, *args, **kwargs):
        pass

    def __call__(self, *args, **kwargs):
        return _Unused()

    def __getattr__(self, name):
        return _Unused()


def _stub_module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__dict__.update(attrs)
    mod.__path__ = []  # a package, so that submodules resolve
    def __getattr__(attr):  # PEP 562: any other name imported from it
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unused

    mod.__getattr__ = __getattr__
    return mod


@contextlib.contextmanager
def _stubbed(modules: dict[str, dict]):
    """``sys.modules`` holding stub modules (name -> attributes) while a file is imported; the
    names are removed afterwards (the loaded module keeps what it bound)."""
    added = []
    for name, attrs in modules.items():
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            prefix = ".".join(parts[:i])
            if prefix not in sys.modules:
                sys.modules[prefix] = _stub_module(prefix)
                added.append(prefix)
        sys.modules[name].__dict__.update(attrs)
    try:
        yield
    finally:
        for name in added:
            sys.modules.pop(name, None)


def _import_file(name: str, path: Path, interpret: bool = True) -> types.ModuleType:
    """Import one file by path, its Triton kernels bound to the interpreter (TRITON_INTERPRET=1
    while it is decorated; Triton's own library functions must have been bound so too, see
    ``run_writers``) or, with ``interpret=False``, compiled for the GPU."""
    saved = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1" if interpret else "0"
    try:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
        return module
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


def _triton_modules() -> tuple:
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice

    return triton, tl, libdevice


def _same_device_cpu_allowed(x, tensors):
    """tokenspeed's ``_same_device`` without its CUDA requirement (the interpreter runs CPU
    tensors): every tensor on x's device."""
    if any(t.device != x.device for t in tensors if t is not None):
        raise ValueError("all tensors must share a device")


def load_tokenspeed_dsv41(files: dict[str, Path], interpret: bool = True) -> types.ModuleType:
    """tokenspeed-kernel 0.1.4's ``tokenspeed_kernel/ops/attention/dsv41/triton.py`` with stock
    Triton for its ``tokenspeed_kernel._triton`` (the wheel depends on tokenspeed-triton, a fork
    of Triton 3.8), stubs for the registry, platform and signature helpers (decorator and
    metadata only), and ``_same_device`` accepting CPU tensors."""
    triton, tl, libdevice = _triton_modules()
    if interpret:
        # the backend-neutral libdevice is placeholders under the interpreter (each returns None);
        # its exp is the interpreter's tl.exp (numpy's float32 exp), as compressor_pool calls it
        libdevice = types.SimpleNamespace(exp=lambda x: tl.exp(x))

    def register_kernel(*args, **kwargs):
        return lambda fn: fn

    def unused_jit(*args, **kwargs):
        raise NotImplementedError("stub: not used by the writers run here")

    stubs = {
        "tokenspeed_kernel._triton": dict(triton=triton, tl=tl, libdevice=libdevice),
        "tokenspeed_kernel.ops.attention.mla._triton.page_table": dict(resolve_group_slot=unused_jit),
        "tokenspeed_kernel.ops.layernorm.triton": dict(reference_rmsnorm_row=unused_jit),
        "tokenspeed_kernel.platform": dict(CapabilityRequirement=_Unused),
        "tokenspeed_kernel.registry": dict(Priority=_Unused(), register_kernel=register_kernel),
        "tokenspeed_kernel.signature": dict(dense_tensor_format=lambda dtype: ("dense", str(dtype)),
                                            format_signature=lambda **kw: tuple(sorted(kw.items()))),
    }
    with _stubbed(stubs):
        mod = _import_file("_released_tokenspeed_kernel_dsv41_triton", files[TOKENSPEED_FILE], interpret)
    mod._same_device = _same_device_cpu_allowed
    return mod


def load_vllm_v41(files: dict[str, Path], interpret: bool = True) -> tuple[types.ModuleType, types.ModuleType]:
    """vLLM 0.33.0's V4.1 cache writers: (``cache_utils``, ``fused_compress_quant_cache``), with
    the real ``fused_indexer_q.py`` (for ``_fp32x2_to_fp4x2``), stock Triton for
    ``vllm.triton_utils`` and stubs for vLLM's platform, warm-up and config helpers (imports only;
    ``current_platform`` says: not ROCm, not CUDA, not FNUZ, so no launch_pdl argument)."""
    triton, tl, _ = _triton_modules()
    platform = types.SimpleNamespace(is_rocm=lambda: False, is_cuda=lambda: False, is_fp8_fnuz=lambda: False)
    stubs = {
        "vllm.triton_utils": dict(tl=tl, triton=triton),
        "vllm.platforms": dict(current_platform=platform),
        "vllm.utils.math_utils": dict(cdiv=lambda a, b: -(-a // b), next_power_of_2=triton.next_power_of_2),
        "vllm.utils.import_utils": dict(has_cutedsl=lambda: False),
        "vllm.model_executor.warmup.jit_warmup": dict(kernel_launcher=lambda fn: fn),
        "vllm.model_executor.warmup.jit_warmup_triton_helper": {},
        "vllm.model_executor.layers.quantization.utils.quant_utils": {},
        "vllm.transformers_utils.deepseek_v4_utils": {},
        "vllm.models.deepseek_v4.common.ops": {},  # the package of the real fused_indexer_q.py
    }
    with _stubbed(stubs):
        fiq = _import_file("vllm.models.deepseek_v4.common.ops.fused_indexer_q", files[VLLM_INDEXER_Q], interpret)
        try:
            cache_utils = _import_file("_released_vllm_v41_cache_utils", files[VLLM_CACHE_UTILS], interpret)
            fused = _import_file("_released_vllm_v41_fused_compress_quant_cache", files[VLLM_FUSED], interpret)
        finally:
            sys.modules.pop("vllm.models.deepseek_v4.common.ops.fused_indexer_q", None)
    assert fused._fp32x2_to_fp4x2 is fiq._fp32x2_to_fp4x2
    return cache_utils, fused


def load_sglang_v41_reference(files: dict[str, Path]) -> types.ModuleType:
    """SGLang 0.5.23's pure-torch reference of its V4.1 cache quantizers
    (``sglang/test/kernels/deepseek_v4/dsv41_kv_quant_reference.py``, which sgl_kernel's
    ``deepseek_v4/kv_layout.cuh`` names as the reference of its CUDA ``store_row_fp8`` /
    ``store_row_fp4``), with the real ``fp4_fake_quant.py`` it imports (torch only)."""
    name = "sglang.kernels.ops.quantization.fp4_fake_quant"
    with _stubbed({"sglang.kernels.ops.quantization": {}}):
        _import_file(name, files[SGLANG.files[1]])
        try:
            return _import_file("_released_sglang_dsv41_kv_quant_reference", files[SGLANG_REFERENCE])
        finally:
            sys.modules.pop(name, None)


# ----- the GPU's conversions under the interpreter ---------------------------------------------
E2M1X2_ASM = """
        {
            .reg .b8 tmp;
            cvt.rn.satfinite.e2m1x2.f32 tmp, $1, $2;
            cvt.u32.u8 $0, tmp;
        }
        """
_E2M1_GRID = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def e2m1_rn_satfinite(x: np.ndarray) -> np.ndarray:
    """PTX ``cvt.rn.satfinite`` to e2m1 of float32 ``x`` -> 4-bit codes (uint32): nearest e2m1
    value, ties to the even code, magnitudes above 6 saturated to 6, the sign bit copied from x
    (-0.0 and negatives that round to zero give 0x8). Finite input only (raises otherwise)."""
    x = np.asarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise ValueError("e2m1 emulation: non-finite input (the harness feeds finite rows only)")
    a = np.minimum(np.abs(x).astype(np.float64), 6.0)
    lo = np.searchsorted(_E2M1_GRID, a, side="right") - 1
    hi = np.minimum(lo + 1, 7)
    d_lo, d_hi = a - _E2M1_GRID[lo], _E2M1_GRID[hi] - a  # exact in float64
    code = np.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo).astype(np.uint32)
    return code | (np.signbit(x).astype(np.uint32) << 3)


def _to_torch(data: np.ndarray, tl_dtype) -> torch.Tensor:
    import triton.language as tl

    t = torch.from_numpy(np.ascontiguousarray(data))
    if tl_dtype == tl.bfloat16:
        return t.view(torch.int16).view(torch.bfloat16).float()  # exact widening, subnormals kept
    if tl_dtype == tl.float8e4nv:
        return t.view(torch.float8_e4m3fn).float()  # exact; 0x7F / 0xFF are NaN
    return t.float()


def _from_float32(t: torch.Tensor, tl_dtype) -> np.ndarray | None:
    import triton.language as tl

    if tl_dtype == tl.float32:
        return t.numpy()
    if tl_dtype == tl.bfloat16:  # cvt.rn.bf16.f32: round to nearest even
        return t.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    if tl_dtype == tl.float8e4nv:  # cvt.rn.satfinite.e4m3x2.f32: RNE, finite values clamped to +-448
        out = t.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8)
        return out.masked_fill(t.isnan(), 0x7F).numpy()
    return None


_FLOATS = ("fp32", "bf16", "fp8e4nv")


def _gpu_convert(src, dst_type):
    """The GPU's conversion between float32, bfloat16 and float8e4nv (TensorHandle), or None for
    any other pair (the interpreter's own conversion then applies)."""
    from triton.runtime.interpreter import TensorHandle

    s, d = src.dtype.scalar, dst_type.scalar
    if s.name not in _FLOATS or d.name not in _FLOATS or s == d:
        return None
    data = _from_float32(_to_torch(src.data, s), d)
    return TensorHandle(data.reshape(src.data.shape), d)


def tl_int1():
    import triton.language as tl

    return tl.int1


class _AsmCall:
    def __init__(self, handle):
        self._handle = handle

    def get_result(self, i):
        assert i == 0
        return self._handle


@contextlib.contextmanager
def gpu_numerics():
    """The Triton interpreter converting floats as the GPU does (see the module docstring) and
    running vLLM's e2m1x2 inline PTX; restored on exit."""
    from triton.runtime import interpreter as ti

    builder = ti.InterpreterBuilder
    saved = builder.cast_impl, builder.create_fp_to_fp, builder.create_inline_asm
    saved_load, saved_store = builder.create_masked_load, builder.create_masked_store

    def _bool_mask(mask):  # a 0/1 integer mask, as `block_bool & scalar_bool` leaves it, read as i1
        if mask is None or mask.data.dtype == np.bool_:
            return mask
        return ti.TensorHandle(mask.data != 0, tl_int1())

    # the trailing policy arguments differ between Triton releases (3.6 has an eviction policy too)
    def create_masked_load(self, ptrs, mask, *policies):
        return saved_load(self, ptrs, _bool_mask(mask), *policies)

    def create_masked_store(self, ptrs, value, mask, *policies):
        return saved_store(self, ptrs, value, _bool_mask(mask), *policies)

    def cast_impl(self, src, dst_type):
        out = _gpu_convert(src, dst_type)
        return saved[0](self, src, dst_type) if out is None else out

    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        out = _gpu_convert(src, dst_type) if rounding_mode in (None, ti._ir.ROUNDING_MODE.RTNE) else None
        return saved[1](self, src, dst_type, rounding_mode) if out is None else out

    def create_inline_asm(self, asm, constraints, values, type, is_pure, pack):
        if " ".join(asm.split()) == " ".join(E2M1X2_ASM.split()) and constraints == "=r,f,f" and pack == 1:
            hi, lo = values  # $1 is the high nibble, $2 the low one
            data = (e2m1_rn_satfinite(hi.data) << 4) | e2m1_rn_satfinite(lo.data)
            return _AsmCall(ti.TensorHandle(data.astype(np.uint32), type[0].scalar if hasattr(type[0], "scalar")
                                            else type[0]))
        return saved[2](self, asm, constraints, values, type, is_pure, pack)

    builder.cast_impl, builder.create_fp_to_fp, builder.create_inline_asm = (cast_impl, create_fp_to_fp,
                                                                             create_inline_asm)
    builder.create_masked_load, builder.create_masked_store = create_masked_load, create_masked_store
    try:
        yield
    finally:
        builder.cast_impl, builder.create_fp_to_fp, builder.create_inline_asm = saved
        builder.create_masked_load, builder.create_masked_store = saved_load, saved_store


# ----- inputs ----------------------------------------------------------------------------------
KINDS = ("normal", "small", "zeros", "tiny", "mixed", "ties")
E4M3_MAX, E2M1_MAX = 448.0, 6.0


def _e4m3_values() -> torch.Tensor:
    v = torch.arange(128, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    return v[~v.isnan()].unique()  # 0 .. 448, ascending


def _tie_rows(dim: int, g: torch.Generator) -> list[torch.Tensor]:
    """Rows whose elements land exactly on rounding midpoints once scaled (every value is a bf16):

    * e4m3 ties: per 32-block, amax = 448 * 2^k (so a power-of-two scale is 2^k under every
      rule) and the other elements are midpoints between neighbouring e4m3 values times 2^k;
    * e2m1 ties: per 16-block, amax = 6 s for an e4m3 value s (the NVFP4-style scale is s; a
      power-of-two s is also the MXFP4 scale), the other elements s * {0.25, 0.75, 1.25, 1.75,
      2.5, 3.5, 5} with both signs;
    * e4m3 scale ties: per 16-block, amax / 6 on a midpoint between e4m3 values.
    """
    vals = _e4m3_values()
    mids = (vals[1:] + vals[:-1]) / 2
    rows = []
    # e4m3 ties
    ks = torch.arange(-12, 6)
    row, i = [], 0
    while sum(len(b) for b in row) < 2 * dim:
        k = float(ks[len(row) % len(ks)])
        take = mids[torch.randperm(len(mids), generator=g)[:31]]
        sign = torch.where(torch.rand(31, generator=g) < 0.5, -1.0, 1.0)
        row.append(torch.cat([torch.tensor([E4M3_MAX]), sign * take]) * 2.0**k)
        i += 1
    flat = torch.cat(row)
    rows += [flat[:dim], flat[dim:2 * dim]]
    # e2m1 ties, at power-of-two and other e4m3 scales
    e2m1_mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    scales = [2.0**k for k in range(-9, 7)] + [1.125 * 2.0**k for k in (-6, 0, 3)] + \
             [1.75 * 2.0**k for k in (-8, -1, 5)] + [1.375, 0.3125, 40.0, 448.0 / 8]
    blocks = []
    for j in range(4 * dim // 16):
        s = scales[j % len(scales)]
        b = torch.cat([torch.tensor([E2M1_MAX]), e2m1_mids, -e2m1_mids, torch.tensor([-E2M1_MAX])])[:16] * s
        blocks.append(b[torch.randperm(16, generator=g)])
    flat = torch.cat(blocks)
    rows += [flat[i * dim:(i + 1) * dim] for i in range(4)]
    # e4m3 scale ties: amax / 6 between two e4m3 values
    smids = mids[(mids > 2.0**-9) & (mids < E4M3_MAX)]
    blocks = []
    for j in range(dim // 16):
        m = float(smids[(j * 7) % len(smids)])
        b = torch.randn(16, generator=g).clamp(-3, 3) * m
        b[j % 16] = E2M1_MAX * m * (1.0 if j % 2 else -1.0)
        blocks.append(b)
    rows.append(torch.cat(blocks))
    return [r.to(torch.bfloat16) for r in rows]


def input_rows(kind: str, n: int, dim: int = 512, seed: int = 0) -> torch.Tensor:
    """``n`` bf16 rows ``[n, dim]`` of one input kind (finite values only):

    ``normal`` N(0, 1); ``small`` N(0, 0.02); ``zeros`` rows of +0, -0 and mixed signed zeros;
    ``tiny`` |x| < 1e-6 (bf16 subnormals included) and blocks whose amax sits below 1e-4, below
    6 * 2^-9 (the e4m3-scale floor) and below 448e-4 (where a floor on amax and a floor on the
    scale part); ``mixed`` every 16 values span 1e-4 .. 1e2 (each 32-tile too); ``ties`` exact
    rounding midpoints after scaling (``_tie_rows``).
    """
    g = torch.Generator().manual_seed(seed * 1000 + KINDS.index(kind))
    if kind == "normal":
        x = torch.randn(n, dim, generator=g)
    elif kind == "small":
        x = torch.randn(n, dim, generator=g) * 0.02
    elif kind == "zeros":
        x = torch.zeros(n, dim)
        x[1::3] = -0.0
        x[2::3] = torch.where(torch.rand(dim, generator=g) < 0.5, -0.0, 0.0)
    elif kind == "tiny":
        mags = torch.empty(n, dim // 16)
        choices = torch.tensor([9e-7, 3e-7, 5e-5, 9.9e-5, 0.0115, 0.0117, 0.02, 0.0447, 0.04])
        mags[:] = choices[torch.randint(len(choices), (n, dim // 16), generator=g)]
        x = (torch.rand(n, dim // 16, 16, generator=g) * 2 - 1) * mags.unsqueeze(-1)
        x[..., 0] = mags * torch.where(torch.rand(n, dim // 16, generator=g) < 0.5, -1.0, 1.0)
        x = x.reshape(n, dim)
        x[0, :8] = torch.tensor([1e-39, -1e-39, 5e-40, -9e-41, 2e-38, -1e-38, 1e-37, 0.0])  # bf16 subnormals
        x[0, 8:16] = 0.0
    elif kind == "mixed":
        e = torch.rand(n, dim, generator=g) * 6 - 4  # 10^-4 .. 10^2
        x = torch.pow(10.0, e) * torch.where(torch.rand(n, dim, generator=g) < 0.5, -1.0, 1.0)
        blocks = x.view(n, dim // 16, 16)
        blocks[..., 3] = 1e-4 * blocks[..., 3].sign()
        blocks[..., 11] = 1e2 * blocks[..., 11].sign()
    elif kind == "ties":
        rows = _tie_rows(dim, g)
        x = torch.stack([rows[i % len(rows)] for i in range(n)]).float()
    else:
        raise ValueError(f"unknown input kind {kind!r}; kinds: {KINDS}")
    return x.to(torch.bfloat16)


def identity_rope(x: torch.Tensor, start: int = 0) -> torch.Tensor:
    """What vLLM's rope-insert kernels quantize when their cos/sin table holds cos = 1, sin = 0:
    they rotate every GPT-J pair ``(e, o)`` of the row (the NoPE pairs load cos = 1, sin = 0 as
    their masked default, the 32 RoPE pairs read the table) as ``(e * 1 - o * 0, o * 1 + e * 0)``
    in float32. That is x bit for bit except signed zeros: the even element of a pair (-0, o)
    with o < 0 or o = -0 becomes +0 (-0 - (-0) = +0), the odd element of a pair (e, -0) with
    e > 0 or e = +0 becomes +0 (-0 + (+0) = +0); every other value, subnormals included, is
    unchanged (x * 1 exact, x - (+-0) = x for x != 0). ``start``: rotate the pairs from that
    dim on only (tokenspeed's ``swa_rope_scatter`` rotates dims 448.. and passes the rest as is)."""
    out = x.float().clone()
    even, odd = out[:, start::2].clone(), out[:, start + 1::2].clone()
    one, zero = torch.tensor(1.0), torch.tensor(0.0)
    out[:, start::2] = even * one - odd * zero
    out[:, start + 1::2] = odd * one + even * zero
    return out.to(torch.bfloat16)


# ----- running the writers ---------------------------------------------------------------------
@dataclass(frozen=True)
class Writer:
    """One released writer: the wheel and file it comes from, the function called (and the
    kernel it launches), the record it writes and the width of its input rows."""

    name: str
    release: Release
    file: str
    function: str
    row_bytes: int
    dim: int = 512
    identity_rope: bool = False  # a rope-insert kernel run with cos = 1, sin = 0
    whole_pages: bool = False  # writes whole pages from rows in slot order (slots must be 0..N-1)
    rope_start: int = 0  # the first dim its RoPE rotates (identity_rope)
    null_page0: bool = False  # never writes page 0 (tokenspeed's null page)

    def quantized_rows(self, x: torch.Tensor) -> torch.Tensor:
        """The rows the writer quantizes for input rows x (its cos 1 / sin 0 rotation applied)."""
        return identity_rope(x, self.rope_start) if self.identity_rope else x

    def written_slots(self, slots: torch.Tensor, page_size: int) -> torch.Tensor:
        """The slots it writes: -1 where it skips one (page 0 for a null-page writer)."""
        return torch.where(slots < page_size, -1, slots) if self.null_page0 else slots


WRITERS = {w.name: w for w in (
    Writer("tokenspeed-swa", TOKENSPEED_KERNEL, TOKENSPEED_FILE,
           "cache_scatter(rows, cache, slots, 'swa') -> _pack_kernel (FORMAT 'swa')", 528),
    Writer("tokenspeed-global", TOKENSPEED_KERNEL, TOKENSPEED_FILE,
           "cache_scatter(rows, cache, slots, 'global') -> _pack_kernel (FORMAT 'global')", 288),
    Writer("tokenspeed-swa-rope", TOKENSPEED_KERNEL, TOKENSPEED_FILE,
           "triton_dsv41_swa_rope_scatter(values, positions, cos_sin, cache, slots, 'swa', None) -> "
           "_swa_rope_insert (cos 1, sin 0)", 528, identity_rope=True, rope_start=448, null_page0=True),
    Writer("tokenspeed-index", TOKENSPEED_KERNEL, TOKENSPEED_FILE,
           "cache_scatter(rows, cache, slots, 'index') -> _pack_kernel (FORMAT 'index')", 68, dim=128),
    Writer("vllm-mxfp8", VLLM, VLLM_CACHE_UTILS,
           "quantize_and_insert_k_cache(..., bytes_per_token=528) -> _quantize_and_insert_k_mxfp8_kernel", 528),
    Writer("vllm-rope-mxfp8", VLLM, VLLM_FUSED,
           "rope_quant_insert(..., compress_ratio=1) -> _rope_quant_insert_mxfp8_kernel (cos 1, sin 0)", 528,
           identity_rope=True),
    Writer("vllm-rope-nvfp4", VLLM, VLLM_FUSED,
           "rope_quant_insert(..., compress_ratio=1) -> _rope_quant_insert_nvfp4_kernel (cos 1, sin 0)", 288,
           identity_rope=True),
    Writer("sglang-ref-v41", SGLANG, SGLANG_REFERENCE,
           "quantize_k_cache_v41(k [pages, page_size, 512]) (torch reference of store_row_fp8)", 528,
           whole_pages=True),
    Writer("sglang-ref-v41-fp4", SGLANG, SGLANG_REFERENCE,
           "quantize_k_cache_v41_fp4(k [pages, page_size, 512]) (torch reference of store_row_fp4)", 288,
           whole_pages=True),
)}

_LOADED: dict[tuple[str, str], object] = {}


def _modules(release: Release, files_dir: Path, interpret: bool = True):
    key = (release.package, str(files_dir), interpret)
    if key not in _LOADED:
        files = {m: Path(files_dir) / m for m in release.files}
        if release is SGLANG:
            _LOADED[key] = load_sglang_v41_reference(files)
        else:
            load = load_tokenspeed_dsv41 if release is TOKENSPEED_KERNEL else load_vllm_v41
            _LOADED[key] = load(files, interpret)
    return _LOADED[key]


def first_differences(got: torch.Tensor, want: torch.Tensor, bits, k: int = 4) -> str:
    """How many elements of ``got`` and ``want`` (same shape) differ in ``bits(t)``, and the first
    ``k`` of them as index: got / want (values and bits): what a GPU run's log must show, since
    its tensors are gone afterwards."""
    g, w = bits(got), bits(want)
    where = (g != w).nonzero()
    shown = []
    for idx in where[:k].tolist():
        i = tuple(idx)
        shown.append(f"{list(i)}: {got[i].item()!r}/{want[i].item()!r} ({int(g[i])}/{int(w[i])})")
    return f"{where.shape[0]} elements differ; first: " + ", ".join(shown)


def released_device() -> str:
    """Where the released Triton kernels run: ``"cpu"`` (the interpreter with ``gpu_numerics``; the
    default, and CI's) or ``"cuda"`` (compiled, on a GPU machine: ``KVFORMATS_RELEASED_DEVICE=cuda``,
    as ``tools/gpu_session.sh compat`` sets). The CUDA run is the released code itself, so it also
    checks the interpreter's GPU-faithful casts, which depend on the installed Triton."""
    device = os.environ.get("KVFORMATS_RELEASED_DEVICE", "cpu")
    if device not in ("cpu", "cuda"):
        raise ValueError(f"KVFORMATS_RELEASED_DEVICE must be cpu or cuda, not {device!r}")
    return device


def child_env(interpret: bool | None = None) -> dict:
    """The environment of a child process running released code: the repository on its path and
    TRITON_INTERPRET set before Triton's import (its library functions bind to the interpreter then)."""
    root = Path(__file__).resolve().parents[2]
    if interpret is None:
        interpret = released_device() == "cpu"
    return dict(os.environ, TRITON_INTERPRET="1" if interpret else "0", PYTHONPATH=os.pathsep.join(
        [str(root)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))


def moved(obj, device: str):
    """``obj`` with every tensor in it (also in tuples, lists and dicts) copied to ``device`` with
    its strides (``Tensor.to`` makes a non-dense tensor dense)."""
    if isinstance(obj, torch.Tensor):
        return torch.empty_strided(obj.shape, obj.stride(), dtype=obj.dtype, device=device).copy_(obj)
    if isinstance(obj, (tuple, list)):
        return type(obj)(moved(o, device) for o in obj)
    if isinstance(obj, dict):
        return {k: moved(v, device) for k, v in obj.items()}
    return obj


def released_numerics():
    """``gpu_numerics`` under the interpreter; nothing to change when the kernels are compiled."""
    return gpu_numerics() if released_device() == "cpu" else contextlib.nullcontext()


def finished() -> None:
    """Wait for a compiled kernel, so an error it raises belongs to its call."""
    if released_device() == "cuda":
        torch.cuda.synchronize()


def _interpreting() -> bool:
    import triton

    return bool(triton.knobs.runtime.interpret)


def run_writer(name: str, x: torch.Tensor, slots: torch.Tensor, cache: torch.Tensor, page_size: int,
               files_dir: Path) -> None:
    """Run released writer ``name`` on rows ``x`` (bf16 ``[N, dim]``) at ``slots`` (int64, -1
    skips) into ``cache`` (uint8 ``[pages, page_size * row_bytes]``, changed in place), on CPU
    under the interpreter with ``gpu_numerics``. Needs TRITON_INTERPRET=1 set before Triton was
    first imported (``run_writers`` starts such a process). With CUDA tensors (and no
    interpreter) the same call runs the kernels compiled, for a cross-check on a GPU."""
    w = WRITERS[name]
    if w.whole_pages:  # torch code: no Triton
        if not torch.equal(slots.cpu(), torch.arange(cache.shape[0] * page_size)):
            raise ValueError(f"{name} writes whole pages: slots must be 0 .. pages * page_size - 1")
        ref = _modules(w.release, files_dir)
        fn = ref.quantize_k_cache_v41 if w.row_bytes == 528 else ref.quantize_k_cache_v41_fp4
        cache.copy_(fn(x.view(cache.shape[0], page_size, x.shape[1]), page_bytes=page_size * w.row_bytes))
        return
    interpret = x.device.type == "cpu"
    if interpret and not _interpreting():
        raise RuntimeError("run_writer needs TRITON_INTERPRET=1 from before Triton's import; use run_writers")
    pages = cache.shape[0]
    paged = cache.view(pages, page_size, w.row_bytes)
    with gpu_numerics() if interpret else contextlib.nullcontext():
        if name == "tokenspeed-swa-rope":
            ts = _modules(w.release, files_dir, interpret)
            n = x.shape[0]
            cos_sin = torch.cat([torch.ones(n, 32), torch.zeros(n, 32)], dim=1).to(x.device)  # cos | sin
            ts.triton_dsv41_swa_rope_scatter(x, torch.arange(n, device=x.device), cos_sin, paged, slots, "swa", None)
        elif w.release is TOKENSPEED_KERNEL:
            ts = _modules(w.release, files_dir, interpret)
            ts.cache_scatter(x, paged, slots, name.split("-", 1)[1])
        else:
            cache_utils, fused = _modules(w.release, files_dir, interpret)
            if name == "vllm-mxfp8":
                cache_utils.quantize_and_insert_k_cache(x, cache, slots, block_size=page_size, bytes_per_token=528)
            else:
                n = x.shape[0]
                cos_sin = torch.cat([torch.ones(n, 32), torch.zeros(n, 32)], dim=1).to(x.device)  # cos | sin
                fused.rope_quant_insert(x, torch.arange(n, device=x.device), cos_sin, paged, slots, 1)


SENTINEL = 0xA5  # every cache byte before a writer runs: the bytes it leaves alone keep it


def make_jobs(writers=None, kinds=KINDS, n: int = 8, page_size: int = 64, pages: int = 2, seed: int = 0) -> list[dict]:
    """One job per (writer, input kind): ``n`` rows of the kind (``input_rows``, ``dim`` wide), slots
    drawn without repeats from ``pages`` pages with every third one -1 (skipped), and a
    sentinel-filled cache ``[pages, page_size * row_bytes]``; a whole-pages writer gets a row for
    every slot, in order."""
    jobs, default_pages = [], pages
    for name in writers or WRITERS:
        w, pages = WRITERS[name], default_pages
        for kind in kinds:
            g = torch.Generator().manual_seed(seed * 7919 + KINDS.index(kind))
            pages = max(pages, 3) if w.null_page0 else pages  # most slots outside the null page
            slots = torch.randperm(pages * page_size, generator=g)[:n].to(torch.int64)
            slots[2::3] = -1
            rows = n
            if w.whole_pages:  # every slot of the pages, in order
                slots, rows = torch.arange(pages * page_size), pages * page_size
            cache = torch.full((pages, page_size * w.row_bytes), SENTINEL, dtype=torch.uint8)
            jobs.append(dict(writer=name, kind=kind, x=input_rows(kind, rows, w.dim, seed), slots=slots, cache=cache,
                             page_size=page_size))
    return jobs


def run_writers(jobs: list[dict], files_dirs: dict[str, Path], workdir: Path) -> list[torch.Tensor]:
    """Each job ``{"writer", "x", "slots", "cache", "page_size"}`` run by ``run_writer`` in a fresh
    Python process with TRITON_INTERPRET=1 (Triton binds its own library functions to the
    interpreter at import, so the process running them must start so); returns the caches.
    ``files_dirs``: package -> the folder ``extract`` filled."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    torch.save({"jobs": jobs, "files": {k: str(v) for k, v in files_dirs.items()}}, workdir / "jobs.pt")
    root, env = Path(__file__).resolve().parents[2], child_env()
    out = subprocess.run([sys.executable, "-m", "tests.harness.released", str(workdir / "jobs.pt"),
                          str(workdir / "caches.pt")], cwd=root, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the released writers failed:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}")
    return torch.load(workdir / "caches.pt", map_location="cpu")  # CUDA results come back; views stay views


def run_probe(workdir: Path) -> dict:
    """``probe_casts`` in a fresh process with TRITON_INTERPRET=1."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    root, env = Path(__file__).resolve().parents[2], child_env(interpret=True)
    out = subprocess.run([sys.executable, "-m", "tests.harness.released", "--probe", str(workdir / "probe.pt")],
                         cwd=root, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the cast probe failed:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}")
    return torch.load(workdir / "probe.pt")


def probe_casts() -> dict:
    """The interpreter's float conversions, stock and under ``gpu_numerics``, on float32 values
    that exercise every rounding case (every e4m3 value, every midpoint between neighbours, both
    signs, values above 448, random values from 2^-12 to 2^8; every bf16 bit pattern): a dict of
    name -> (stock, gpu_numerics, reference) tensors, the reference being torch's conversions
    with the GPU instruction's rules (RNE, saturating to +-448; RNE; exact widenings)."""
    import triton
    import triton.language as tl

    @triton.jit
    def convert(X, E4, BF, W, E4F, N, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < N
        x = tl.load(X + i, m)
        tl.store(E4 + i, x.to(tl.float8e4nv).to(tl.uint8, bitcast=True), m)
        tl.store(BF + i, x.to(tl.bfloat16), m)
        h = (x.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)
        tl.store(W + i, h.to(tl.float32), m)  # bf16 -> fp32 of x's high half
        b = (x.to(tl.int32, bitcast=True) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True)
        tl.store(E4F + i, b.to(tl.float32), m)  # e4m3 -> fp32 of x's low byte

    vals = _e4m3_values()
    mids = (vals[1:] + vals[:-1]) / 2
    g = torch.Generator().manual_seed(0)
    rnd = torch.randn(20000, generator=g) * torch.exp2(torch.randint(-12, 9, (20000,), generator=g).float())
    every_bf16 = (torch.arange(65536, dtype=torch.int32) << 16).view(torch.float32)
    x = torch.cat([vals, -vals, mids, -mids, torch.tensor([449.0, 464.0, 480.0, 500.0, 1e4, -1e4]), rnd,
                   every_bf16[torch.isfinite(every_bf16)]])
    out = {}
    for tag, ctx in (("stock", contextlib.nullcontext()), ("gpu", gpu_numerics())):
        e4, bf = torch.empty(x.shape, dtype=torch.uint8), torch.empty(x.shape, dtype=torch.bfloat16)
        w, e4f = torch.empty(x.shape), torch.empty(x.shape)
        with ctx:
            convert[(triton.cdiv(x.numel(), 4096),)](x, e4, bf, w, e4f, x.numel(), BLOCK=4096)
        out[tag] = dict(e4m3=e4, bf16=bf.view(torch.int16), widen_bf16=w.view(torch.int32), widen_e4m3=e4f)
    bits = x.view(torch.int32)
    out["reference"] = dict(
        e4m3=x.clamp(-448.0, 448.0).to(torch.float8_e4m3fn).view(torch.uint8),
        bf16=x.to(torch.bfloat16).view(torch.int16),
        widen_bf16=(bits & ~0xFFFF).view(torch.float32).view(torch.int32),  # the high half, exactly
        widen_e4m3=(bits & 0xFF).to(torch.uint8).view(torch.float8_e4m3fn).float())
    out["x"] = x
    return out


# ----- tokenspeed-kernel's dsv41 cache codecs, called as its users call them ---------------------
DSV41_CODECS = ("cache_pack", "cache_unpack", "cache_scatter", "cache_gather")
# every dsv41 function a test may call: the public name -> (the Triton solution's name in
# triton.py, the index of its ``out`` argument or None); the public wrapper of swa_rope_scatter
# returns its ``out`` argument, the solution returns None
DSV41_CALLS = {
    "cache_pack": ("cache_pack", 2), "cache_unpack": ("cache_unpack", 2),
    "cache_scatter": ("cache_scatter", None), "cache_gather": ("cache_gather", 3),
    "swa_rope_scatter": ("triton_dsv41_swa_rope_scatter", 6), "compressor_pool": ("compressor_pool", 6),
    "compressor_tail_scatter": ("compressor_tail_scatter", None), "index_q_quantize": ("index_q_quantize", 2),
}


def call_tokenspeed_dsv41(module, name: str, args: tuple) -> dict:
    """One call of tokenspeed-kernel 0.1.4's registered Triton solution ``name`` (one of
    ``DSV41_CALLS``, what ``tokenspeed_kernel.ops.attention.dsv41.<name>`` selects on a GPU) on
    copies of ``args``, under ``gpu_numerics``: ``{"result", "args"}`` (the returned value, the
    arguments after the call: its in-place writes) and ``"out_returned"`` (the result is the
    ``out`` argument passed), or ``{"error": (exception type name, message)}``; nothing of a
    refused call's arguments is changed (``"args"`` holds them as they are after it)."""
    if name not in DSV41_CALLS:
        raise ValueError(f"not a dsv41 function the harness calls: {name!r}")
    solution, out_index = DSV41_CALLS[name]
    args = moved(args, "cuda" if released_device() == "cuda" else "cpu")  # copies
    out = None if out_index is None else args[out_index]
    try:
        with released_numerics():
            result = getattr(module, solution)(*args)
        finished()
        if name == "swa_rope_scatter":
            result = out
    except Exception as err:  # the released code's refusal, recorded as data
        return {"error": (type(err).__name__, str(err)), "args": args}
    return {"result": result, "args": args, "out_returned": out is not None and result is out}


def run_tokenspeed_dsv41(calls: list[tuple[str, tuple]], files_dir: Path, workdir: Path) -> list[dict]:
    """Each ``(name, args)`` of ``calls`` run by ``call_tokenspeed_dsv41`` in one fresh Python process
    with TRITON_INTERPRET=1 (tokenspeed's ``_same_device`` accepting CPU tensors, its kernels
    under the interpreter with the GPU's conversions); returns one dict per call, in order.
    ``files_dir``: the folder ``extract(TOKENSPEED_KERNEL, ...)`` (or ``TOKENSPEED_KERNEL_DSV41``) filled."""
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    calls = [(name, tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args))  # own storages
             for name, args in calls]
    torch.save({"calls": calls, "files": str(files_dir)}, workdir / "dsv41_calls.pt")
    root, env = Path(__file__).resolve().parents[2], child_env()
    out = subprocess.run([sys.executable, "-m", "tests.harness.released", "--dsv41", str(workdir / "dsv41_calls.pt"),
                          str(workdir / "dsv41_results.pt")], cwd=root, env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the released dsv41 codecs failed:\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}")
    return torch.load(workdir / "dsv41_results.pt", map_location="cpu")



def run_dsv41_plan(tmp_path_factory, plan: list, label: str) -> tuple[dict, Path]:
    """A test module's released-code fixture: the wheel's dsv41 files extracted (the test skips,
    saying why, only when the package index cannot be reached) and every ``(key, (name, args))``
    of ``plan`` run by ``run_tokenspeed_dsv41``; returns ({key: (call, record)}, the files' root)."""
    import pytest

    root = tmp_path_factory.mktemp(f"tokenspeed-kernel-{label}")
    try:
        extract(TOKENSPEED_KERNEL_DSV41, root)
    except IndexUnreachable as err:  # the only reason to skip
        pytest.skip(f"tokenspeed-kernel 0.1.4 not fetched: {err}")
    results = run_tokenspeed_dsv41([call for _, call in plan], root, tmp_path_factory.mktemp(f"{label}-run"))
    return {key: (call, res) for (key, call), res in zip(plan, results)}, root


def strided_copy(a):
    """A copy of an argument, a tensor with its strides (``clone`` makes a non-dense one dense)."""
    if not isinstance(a, torch.Tensor):
        return a
    return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype).copy_(a)


def _run_dsv41(calls_path: str, out_path: str) -> None:
    spec = torch.load(calls_path)
    module = _modules(TOKENSPEED_KERNEL, Path(spec["files"]), released_device() == "cpu")
    torch.save([call_tokenspeed_dsv41(module, name, args) for name, args in spec["calls"]], out_path)


def _main(jobs_path: str, out_path: str, *rest: str) -> None:
    if jobs_path == "--probe":
        torch.save(probe_casts(), out_path)
        return
    if jobs_path == "--dsv41":
        _run_dsv41(out_path, *rest)
        return
    spec = torch.load(jobs_path)
    files = {k: Path(v) for k, v in spec["files"].items()}
    caches = []
    for job in spec["jobs"]:
        w, device = WRITERS[job["writer"]], released_device()
        x, slots, cache = moved((job["x"], job["slots"], job["cache"]), device)
        run_writer(job["writer"], x, slots, cache, job["page_size"], files[w.release.package])
        finished()
        caches.append(cache)
    torch.save(caches, out_path)


if __name__ == "__main__":
    _main(*sys.argv[1:4])
