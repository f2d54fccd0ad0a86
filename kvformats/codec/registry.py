"""Format registry and backend dispatch.

Formats register their class; each (format, op) registers an implementation per backend. A
family of model operations (DeepSeek V4's) registers under its ``OpFamily`` key, a key space of
its own: no format name equals it, so a format named like a family neither sees nor replaces the
family's ops. ``backend="auto"`` picks the Triton kernel for CUDA tensors when that op has one, and the
reference otherwise. A named backend that cannot run raises BackendUnavailableError; nothing
falls back silently.
"""

from __future__ import annotations

import difflib
import importlib
import re
from typing import Callable, NamedTuple

import attrs

from kvformats.errors import BackendUnavailableError, InputError, LayoutError
from kvformats.runtime import replay

BACKENDS = ("reference", "triton")


class OpFamily(NamedTuple):
    """The registry's key of a family of model operations (``OpFamily("deepseek_v4")``), where a
    codec op has its format's name. It is a tuple, never equal to a name, so the family's ops and
    the formats' ops cannot collide; as a tuple it hashes as fast as a name on the call path."""

    name: str

    def __str__(self) -> str:
        return self.name


_FORMATS: dict[str, type] = {}
_OPS: dict[tuple[str | OpFamily, str], dict[str, Callable]] = {}
_LIBRARY_KERNELS: dict[tuple[str, str], Callable] = {}  # (module, name) -> launcher; see library_kernel
_kernels_loaded = False
# (format, op, backend, device) -> implementation: what resolve() chose, so that an eager
# call does not redo the choice (its checks are a noticeable part of a small call's host time).
# Emptied whenever an implementation or a kernel profile is registered.
_RESOLVED: dict[tuple, Callable] = {}
_KERNEL_FNS: set[Callable] = set()  # implementations registered as "triton"


def is_kernel(fn: Callable) -> bool:
    """Whether ``fn`` is a kernel backend's implementation (it records value errors itself,
    ``kvformats.runtime.deferred``), rather than the reference."""
    return fn in _KERNEL_FNS


# A format's name becomes file names (``kvformats spec --write``: spec/formats/<name>.json, and the
# generated docs pages), so it is held to characters that cannot leave a folder or name another
# place: "../escaped" would write outside it, "a/b" into a subfolder, "A" and "a" collide on
# case-insensitive file systems.
FORMAT_NAME = re.compile(r"[a-z0-9_]+")


def register_format(cls):
    """Class decorator: make a Layout subclass reachable by ``get_format(cls.name)``. LayoutError
    (nothing registered) for a name that is not lower-case letters, digits and underscores."""
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or FORMAT_NAME.fullmatch(name) is None:
        raise LayoutError(f"format name {name!r} of {getattr(cls, '__name__', cls)!r} is not [a-z0-9_]+ "
                          f"(lower-case letters, digits, underscores): the name becomes file names of "
                          f"`kvformats spec --write` and `kvformats docs --write`")
    _FORMATS[name] = cls
    return cls


def unregister_format(name: str) -> None:
    """Undo ``register_format`` and every op registered for ``name`` (a format registered for a
    while, e.g. by a test); LayoutError for a name that is not registered."""
    if name not in _FORMATS:
        raise LayoutError(f"unknown format {name!r}; registered formats: {', '.join(list_formats())}")
    del _FORMATS[name]
    for key in [k for k in _OPS if k[0] == name]:
        del _OPS[key]
    _KERNEL_PROFILES.pop(name, None)
    _RESOLVED.clear()
    replay.clear()


def list_formats() -> list[str]:
    """Sorted names of the registered formats."""
    return sorted(_FORMATS)


def get_format(name: str, **params):
    """The layout ``name`` with ``params`` (e.g. ``get_format("fp8_ds_mla", page_size=64)``),
    the same object as calling its class (``kvformats.Fp8DsMla(page_size=64)``).

    Formats and their parameters (defaults; ``profile`` picks the numerics, default first):

    * ``fp8_ds_mla`` (Fp8DsMla): head_dim=512, rope_dim=64, page_size=64,
      profile tokenspeed | vllm | flashmla-ref. DeepSeek V4 attention rows, 584 B.
    * ``fp8_ds_mla_v32`` (Fp8DsMlaV32): head_dim=576, rope_dim=64, page_size=64,
      profile flashmla-ref | vllm. DeepSeek V3.2 attention rows, 656 B.
    * ``fp8_ds_mla_v41`` (Fp8DsMlaV41): head_dim=512, page_size=64, profile tokenspeed |
      flashmla. DeepSeek V4.1 attention records, 528 B, page-planar.
    * ``fp8_ds_mla_v41_interleaved`` (Fp8DsMlaV41Interleaved): head_dim=512, page_size=64,
      profile flashmla | vllm | tokenspeed. The same 528 B records, token-interleaved.
    * ``fp4_ds_mla_v41`` (Fp4DsMlaV41): head_dim=512, page_size=64, profile tokenspeed |
      flashmla. DeepSeek V4.1 fp4 records, 288 B, page-planar.
    * ``fp4_ds_mla_v41_interleaved`` (Fp4DsMlaV41Interleaved): head_dim=512, page_size=64,
      profile flashmla | vllm | tokenspeed. The same 288 B records, token-interleaved.
    * ``fp8_indexer`` (Fp8Indexer): head_dim=128, page_size=64,
      profile tokenspeed | vllm | deepgemm-ref. CSA indexer keys, 132 B.
    * ``mxfp4_indexer`` (Mxfp4Indexer): head_dim=128, page_size=64,
      profile tokenspeed | vllm | deepgemm-ref | ocp. CSA indexer keys, 68 B.
    * ``nvfp4_ds_mla`` (Nvfp4DsMla): head_dim=576, rope_dim=64, page_size=64, profile flashmla.
      DeepSeek V3.2 rows as NVFP4 NoPE + e4m3 RoPE, 352 B (scales stored permuted).
    * ``compressor_state`` (CompressorState): head_dim=512, ratio=4, page_size=4. The
      compressor's float32 kv and score state, no quantization.
    * ``compressor_state_v41`` (CompressorStateV41): head_dim=512, page_size=8. The V4.1
      ratio-2 compressor's ring of float32 [kv | score] rows as computed (no APE), 4096 B.

    ``list_formats()`` gives the registered names (formats added with ``register_format``
    included); ``kvformats show NAME`` prints a layout's regions.

    Raises:
        LayoutError: ``name`` is not registered, a parameter is not one of the format's (the
            message suggests the closest name), or a value is invalid for it (e.g. a
            ``head_dim`` that is not a multiple of the format's block, or an unknown
            ``profile``).
    """
    cls = _FORMATS.get(name)
    if cls is None:
        raise LayoutError(f"unknown format {name!r}; registered formats: {', '.join(list_formats())}")
    valid = [f.name for f in attrs.fields(cls)]
    unknown = [k for k in params if k not in valid]
    if unknown:
        hints = [f"{k!r} (did you mean {close[0]!r}?)" if (close := difflib.get_close_matches(k, valid, n=1))
                 else repr(k) for k in unknown]
        raise LayoutError(f"{name} has no parameter {', '.join(hints)}; its parameters are "
                          f"{', '.join(valid)}")
    return cls(**params)


def has_backend(fmt: str, op: str, backend: str) -> bool:
    """Whether ``backend`` has an implementation of ``fmt.op`` registered: for "triton", what the
    kernel package's table registered (loaded here if it was not yet; empty without Triton).
    The declared capability the tests skip a format's kernel cases by."""
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}")
    if backend == "triton":
        _load_kernels()
    return backend in _OPS.get((fmt, op), {})


def register_op(fmt: str | OpFamily, op: str, backend: str):
    """Decorator: register ``fn(layout, ...)`` as ``backend``'s implementation of ``fmt.op``
    (``fmt`` a format's name, or the OpFamily of model ops: ``register_model_op``)."""
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}")

    def deco(fn):
        _register(fmt, op, backend, fn)
        replay.clear()  # a plan may hold the launches of the implementation this one replaces
        return fn

    return deco


def register_model_op(family: str, op: str, backend: str):
    """Decorator: register ``fn`` as ``backend``'s implementation of the model op ``op`` of
    ``family`` (e.g. "deepseek_v4"), under ``OpFamily(family)``; ``fn`` takes the validated
    arguments the public op passes."""
    return register_op(OpFamily(family), op, backend)


def resolve_model_op(family: str, op: str, backend: str, device) -> Callable:
    """The implementation of the model op ``op`` of ``family`` that ``backend`` selects for
    tensors on ``device`` (``resolve`` under the family's key)."""
    return resolve(OpFamily(family), op, backend, device)


def model_ops(family: str) -> list[str]:
    """Sorted names of the ops registered for ``family``."""
    return sorted(op for key, op in _OPS if key == OpFamily(family))


def _register(fmt: str | OpFamily, op: str, backend: str, fn: Callable) -> None:
    _OPS.setdefault((fmt, op), {})[backend] = fn
    if backend == "triton":
        _KERNEL_FNS.add(fn)
    _RESOLVED.clear()


# Kernel packages are plugins: found on the first CUDA call, each hands over a table of its
# launchers and imports nothing of this layer back, so kernels and dispatch form no cycle. They
# are the only way the library reaches kernels. A package is a module with ``kernel_table()``
# (and optionally ``kernel_profiles()``), named by an entry point of the group KERNEL_GROUP in
# its distribution's metadata, or passed to ``register_kernel_package``; this repository's
# ``kvformats_kernels`` is one (declared in pyproject.toml, and loaded first by name too, so a
# source checkout without installed metadata still has it). The table's keys, by their first item:
#   (format, op)                  a format's codec or paged op
#   (MODEL_OP, family, op)        a model op, registered under OpFamily(family)
#   (LIBRARY, module, name)       a launcher a library module calls itself (library_kernel)
KERNEL_GROUP = "kvformats.kernels"
KERNEL_PACKAGE = "kvformats_kernels"
MODEL_OP = "model op"
LIBRARY = "library"
_KERNEL_OWNERS: dict[tuple, str] = {}  # table key -> the package that registered it


def kernel_packages() -> list[str]:
    """The kernel packages' module names in load order: ``kvformats_kernels``, then every entry
    point of the group ``kvformats.kernels`` (sorted by name; each module once)."""
    from importlib.metadata import entry_points

    names = [KERNEL_PACKAGE]
    for ep in sorted(entry_points(group=KERNEL_GROUP), key=lambda e: e.name):
        if ep.value not in names:
            names.append(ep.value)
    return names


def _load_kernels() -> None:
    """Import the kernel packages once and register their tables as the "triton" backend (an
    empty table when Triton does not import)."""
    global _kernels_loaded
    if not _kernels_loaded:
        _kernels_loaded = True
        for name in kernel_packages():
            register_kernel_package(name)


def register_kernel_package(package) -> None:
    """Register a kernel package (a module, or its importable name) as the "triton" backend of the
    keys its ``kernel_table()`` names, and the profiles of its ``kernel_profiles()``. A package
    that cannot be imported or has no table, a key this version does not read, or a key another
    package registered already is a BackendUnavailableError naming both, raised before anything
    of the package is registered. No plan can exist before kernels load (only their launches are
    recorded), so loading them keeps the replay counts."""
    name = package if isinstance(package, str) else getattr(package, "__name__", repr(package))
    try:
        module = importlib.import_module(package) if isinstance(package, str) else package
        table = dict(module.kernel_table())
        profiles = dict(module.kernel_profiles()) if hasattr(module, "kernel_profiles") else {}
    except Exception as err:  # an installation problem: named, with its cause
        raise BackendUnavailableError(f"kernel package {name!r} could not be loaded: {type(err).__name__}: {err}") \
            from err
    for key in table:
        if not isinstance(key, tuple) or not (len(key) == 2 or (len(key) == 3 and key[0] in (MODEL_OP, LIBRARY))):
            raise BackendUnavailableError(f"kernel package {name!r}'s kernel table has a key this version of "
                                          f"kvformats does not read: {key!r}")
        owner = _KERNEL_OWNERS.get(key)
        if owner is not None and owner != name:
            raise BackendUnavailableError(f"kernel package {name!r} registers {key!r}, which kernel package "
                                          f"{owner!r} registered already")
    for key, fn in table.items():
        _KERNEL_OWNERS[key] = name
        if len(key) == 2:
            _register(key[0], key[1], "triton", fn)
        elif key[0] == MODEL_OP:
            _register(OpFamily(key[1]), key[2], "triton", fn)
        else:
            _LIBRARY_KERNELS[key[1:]] = fn
    for fmt, names in profiles.items():
        _KERNEL_PROFILES[fmt] = tuple(names)
    _RESOLVED.clear()


def library_kernel(module: str, name: str) -> Callable | None:
    """The kernel package's launcher ``name`` for the library module ``module`` (one that serves
    no format and no model op, e.g. ("transfer", "page_checksums")), importing the package on
    first use; None where it has none (Triton does not import). The caller picks the device."""
    _load_kernels()
    return _LIBRARY_KERNELS.get((module, name))


# Ops whose bytes depend on the numerics profile. Reads (decode, gather, the paged ops) multiply
# each element by its stored scale whatever rule chose it, and every backend reads scale byte
# 0xFF as the profile's ue8m0_ff says, so any backend serves any profile.
PROFILE_DEPENDENT_OPS = ("encode",)
_KERNEL_PROFILES: dict[str, tuple[str, ...]] = {}  # format -> profiles its Triton encode honours


def register_kernel_profiles(fmt: str, profiles) -> None:
    """Declare the numerics profiles the Triton ``encode`` of ``fmt`` implements (the kernel
    package calls this when it registers; formats it does not name get their default only)."""
    _KERNEL_PROFILES[fmt] = tuple(profiles)
    _RESOLVED.clear()
    replay.clear()


def resolve_for(layout, op: str, backend: str, device) -> Callable:
    """``resolve`` for a layout object. A Triton ``encode`` serves only the profiles its kernel
    package declared (``register_kernel_profiles``); for another profile ``encode`` resolves to
    the reference under ``backend="auto"`` and raises BackendUnavailableError under "triton"."""
    if op not in PROFILE_DEPENDENT_OPS or getattr(layout, "default_profile", True):
        return resolve(layout.name, op, backend, device)
    if device.type == "cuda":
        _load_kernels()
    if layout.profile in _KERNEL_PROFILES.get(layout.name, ()):
        return resolve(layout.name, op, backend, device)
    if backend == "triton":
        raise BackendUnavailableError(
            f"the Triton kernels do not implement the numerics profile {layout.profile!r} of {layout.name} "
            f"in this version (they do: {', '.join(_KERNEL_PROFILES.get(layout.name, ())) or 'the default'}); "
            f"pass backend='reference' (or 'auto', which uses the reference for it)")
    return resolve(layout.name, op, "reference" if backend == "auto" else backend, device)


def resolve(fmt: str | OpFamily, op: str, backend: str, device) -> Callable:
    """The implementation of ``fmt.op`` that ``backend`` selects for tensors on ``device``
    (``fmt`` a format's name, or a model-op family's OpFamily)."""
    key = (fmt, op, backend, device)  # the device itself: hashing it is cheap, reading .type is not
    fn = _RESOLVED.get(key)
    if fn is None:  # errors are raised each time, never stored
        fn = _RESOLVED[key] = _resolve(fmt, op, backend, device)
    return fn


def _resolve(fmt: str | OpFamily, op: str, backend: str, device) -> Callable:
    if backend not in ("auto", *BACKENDS):
        raise InputError(f"backend must be 'auto', 'reference' or 'triton', got {backend!r}")
    impls = _OPS.get((fmt, op), {})
    if backend == "reference":
        return impls["reference"]
    if device.type == "cuda":
        _load_kernels()
        impls = _OPS.get((fmt, op), {})
    if backend == "auto":
        return impls.get("triton", impls["reference"]) if device.type == "cuda" else impls["reference"]
    if device.type != "cuda":
        raise BackendUnavailableError(f"the triton backend runs on CUDA tensors, got tensors on {device}; "
                                      f"move them to a GPU or pass backend='reference'")
    if "triton" not in impls:
        raise BackendUnavailableError(f"no Triton kernel for {fmt}.{op} in this version of kvformats "
                                      f"(or Triton is not installed: pip install 'kvformats[triton]'); "
                                      f"pass backend='reference'")
    return impls["triton"]
