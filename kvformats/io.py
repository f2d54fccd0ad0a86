"""Cache files: save and load caches (one or many layers, any format) as safetensors.

The file's metadata records, per tensor, the format name, its parameters, the page stride and
a fingerprint of the format's spec JSON; loading rebuilds the layout and refuses a file whose
fingerprint differs from this library's definition of that format. A file written here is
plain safetensors: other tools read the raw pages.
"""

from __future__ import annotations

import json
import os
from typing import Mapping

import attrs
import torch

from kvformats.errors import KVFormatError
from kvformats.layout import Layout
from kvformats.registry import get_format

META_KEY = "kvformats"


class CacheFileError(KVFormatError, ValueError):
    """A cache file is missing, truncated, corrupt, foreign, or disagrees with its format."""


@attrs.frozen
class CacheEntry:
    """One cache read from a file: its layout and the cache tensor (page stride restored)."""

    name: str
    layout: Layout
    cache: torch.Tensor


def _safetensors():
    try:
        import safetensors
        import safetensors.torch  # noqa: F401
    except ImportError:  # pragma: no cover - depends on the environment
        raise CacheFileError("cache files need the safetensors package: pip install safetensors") from None
    return safetensors


def save_caches(path: str | os.PathLike, caches: Mapping[str, tuple[Layout, torch.Tensor]]) -> None:
    """Write ``{name: (layout, cache)}`` to ``path`` (safetensors). Pages are stored contiguously;
    the page stride, format, parameters and spec fingerprint go into the metadata."""
    from kvformats import SPEC_VERSION, __version__
    from kvformats.checks import check_cache
    from kvformats.spec import fingerprint

    tensors, entries = {}, {}
    for name, (layout, cache) in caches.items():
        check_cache(layout, cache)
        tensors[name] = cache.detach().to("cpu").contiguous()
        entries[name] = {"format": layout.name, "params": layout.params, "fingerprint": fingerprint(layout),
                         "page_stride": cache.stride(0), "shape": list(cache.shape)}
    meta = {"library_version": __version__, "spec_version": SPEC_VERSION, "tensors": entries}
    _safetensors().torch.save_file(tensors, os.fspath(path), metadata={META_KEY: json.dumps(meta, sort_keys=True)})


def save_cache(path: str | os.PathLike, layout: Layout, cache: torch.Tensor, name: str = "cache") -> None:
    """Write one cache (see ``save_caches``)."""
    save_caches(path, {name: (layout, cache)})


def read_metadata(path: str | os.PathLike) -> dict:
    """The kvformats metadata of a cache file; CacheFileError if it is not one."""
    st = _safetensors()
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CacheFileError(f"no such cache file: {path}")
    try:
        with st.safe_open(path, framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as err:  # safetensors raises its own error types for truncated/corrupt headers
        raise CacheFileError(f"{path} is not a readable safetensors file ({type(err).__name__}: {err})") from None
    if META_KEY not in meta:
        raise CacheFileError(f"{path} is a safetensors file but not a kvformats cache file "
                             f"(no {META_KEY!r} metadata); write it with kvformats.io.save_caches")
    try:
        parsed = json.loads(meta[META_KEY])
        parsed["tensors"].items()
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise CacheFileError(f"{path}: corrupt kvformats metadata ({err})") from None
    return parsed


def _layout_of(path: str, name: str, entry: dict) -> Layout:
    from kvformats.spec import fingerprint

    try:
        layout = get_format(entry["format"], **entry["params"])
    except (KVFormatError, KeyError, TypeError) as err:
        raise CacheFileError(f"{path}: tensor {name!r} declares a format this kvformats cannot build ({err})") from None
    if entry.get("fingerprint") != fingerprint(layout):
        raise CacheFileError(f"{path}: tensor {name!r} was written with a different definition of {layout.name} "
                             f"(fingerprint {entry.get('fingerprint')!r}, this kvformats has {fingerprint(layout)!r}); "
                             f"read it with the kvformats version that wrote it")
    return layout


def _restride(cache: torch.Tensor, page_stride: int, device) -> torch.Tensor:
    """A copy of ``cache`` whose page stride is ``page_stride`` (as it was when saved)."""
    page = cache[0].numel() if cache.shape[0] else 0
    if cache.shape[0] <= 1 or page_stride == page:
        return cache.to(device)
    arena = torch.zeros((cache.shape[0] - 1) * page_stride + page, dtype=cache.dtype, device=device)
    view = arena.as_strided(cache.shape, (page_stride, *cache[0].stride()))
    view.copy_(cache)
    return view


def load_caches(path: str | os.PathLike, *, device=None, expect: Layout | None = None) -> dict[str, CacheEntry]:
    """Read every cache in ``path`` -> ``{name: CacheEntry}``. ``expect``: refuse any tensor whose
    recorded format differs from this layout. Raises CacheFileError on any problem."""
    from kvformats.checks import check_cache

    path = os.fspath(path)
    meta = read_metadata(path)
    st = _safetensors()
    out = {}
    try:
        with st.safe_open(path, framework="pt") as f:
            keys = set(f.keys())
            for name, entry in sorted(meta["tensors"].items()):
                layout = _layout_of(path, name, entry)
                if expect is not None and layout != expect:
                    raise CacheFileError(f"{path}: tensor {name!r} holds {layout.name}{layout.params}, "
                                         f"expected {expect.name}{expect.params}")
                if name not in keys:
                    raise CacheFileError(f"{path}: metadata names tensor {name!r} but the file has no such tensor")
                cache = f.get_tensor(name)
                try:
                    check_cache(layout, cache)
                except KVFormatError as err:
                    raise CacheFileError(f"{path}: tensor {name!r} does not fit {layout.name}: {err}") from None
                out[name] = CacheEntry(name, layout, _restride(cache, int(entry["page_stride"]), device))
    except CacheFileError:
        raise
    except Exception as err:  # truncated data sections surface here
        raise CacheFileError(f"{path}: cannot read tensor data ({type(err).__name__}: {err})") from None
    return out


def load_cache(path: str | os.PathLike, name: str | None = None, **kwargs) -> CacheEntry:
    """Read one cache; ``name`` may be omitted when the file holds exactly one."""
    caches = load_caches(path, **kwargs)
    if name is None:
        if len(caches) != 1:
            raise CacheFileError(f"{path} holds {len(caches)} caches ({', '.join(caches)}); name one")
        return next(iter(caches.values()))
    if name not in caches:
        raise CacheFileError(f"{path} has no cache {name!r}; it holds: {', '.join(caches)}")
    return caches[name]
