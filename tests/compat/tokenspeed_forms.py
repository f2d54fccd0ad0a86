"""The ways a caller can call a function of a given signature, and where each argument lands in
another function's signature: how the compat tests check that ``kvformats.compat.tokenspeed``
takes every call form of each tokenspeed version (spec/tokenspeed-signatures.json).

    for args, kwargs in call_forms(params):          # params: the JSON table's entries
        where = landed(inspect.signature(dropin), params, args, kwargs)   # upstream name -> ours

A call form passes each parameter it passes as a distinct marker object, so ``landed`` can say
which of the drop-in's parameters received it (or raise TypeError where the drop-in cannot bind
the call at all).
"""

from __future__ import annotations

import inspect

KINDS = {"positional_or_keyword": inspect.Parameter.POSITIONAL_OR_KEYWORD,
         "keyword_only": inspect.Parameter.KEYWORD_ONLY}

# Where a drop-in's parameter list is the union of two tokenspeed versions', the upstream
# parameter a call passes at a position another version gives another name lands in the
# drop-in's parameter of that position; the drop-in tells the forms apart by the value
# (docs/porting-from-tokenspeed.md, "Call forms"). (function, upstream name) -> drop-in names.
ALIASES = {
    **{(fn, "compress_ratio"): {"kv_write_mask"} for fn in ("deepseek_v4_csa_compress_kv_cache_insert",
                                                            "deepseek_v4_hca_compress_kv_cache_insert")},
    **{(fn, "block_table_base_offsets"): {"compress_ratio"} for fn in ("deepseek_v4_csa_compress_kv_cache_insert",
                                                                        "deepseek_v4_hca_compress_kv_cache_insert")},
    ("gather_paged_indexer_fp8_cache", "block_table"): {"page_table"},  # 6a08766a's name, by position
}


class Marker:
    def __init__(self, name: str):
        self.name = name

    def __repr__(self) -> str:
        return f"<{self.name}>"


def params_of(fn) -> list[dict]:
    """A live function's parameters in the JSON table's shape (to check tokenspeed's own
    functions, where they can be imported)."""
    out = []
    for p in inspect.signature(fn).parameters.values():
        kind = {v: k for k, v in KINDS.items()}[p.kind]
        entry = {"name": p.name, "kind": kind}
        if p.default is not inspect.Parameter.empty:
            entry["default"] = p.default
        out.append(entry)
    return out


def call_forms(params: list[dict]) -> list[tuple[tuple, dict]]:
    """Every positional prefix of the positional-or-keyword parameters, the rest by keyword, with
    and without the optional ones; keyword-only parameters by keyword (the optional ones passed
    and not passed)."""
    pos = [p for p in params if p["kind"] == "positional_or_keyword"]
    kwonly = [p for p in params if p["kind"] == "keyword_only"]
    forms = []
    for optional in (True, False):
        chosen = [p for p in pos if optional or "default" not in p]
        kw = {p["name"]: Marker(p["name"]) for p in kwonly if optional or "default" not in p}
        for k in range(len(chosen) + 1):
            args = tuple(Marker(p["name"]) for p in chosen[:k])
            kwargs = {p["name"]: Marker(p["name"]) for p in chosen[k:]}
            forms.append((args, {**kwargs, **kw}))
    return forms


def landed(sig: inspect.Signature, args: tuple, kwargs: dict) -> dict[str, str]:
    """Upstream parameter name -> the drop-in parameter that receives its marker (TypeError when
    ``sig`` does not bind the call)."""
    bound = sig.bind(*args, **kwargs)
    return {value.name: name for name, value in bound.arguments.items() if isinstance(value, Marker)}


def check_forms(fn_name: str, sig: inspect.Signature, params: list[dict]) -> None:
    """Each call form of ``params`` binds on ``sig``, every passed argument landing in the
    parameter of its name or in a documented alias (``ALIASES``)."""
    for args, kwargs in call_forms(params):
        try:
            where = landed(sig, args, kwargs)
        except TypeError as err:
            raise AssertionError(f"{fn_name}{sig} refuses the call form {args} {kwargs}: {err}") from None
        passed = [a.name for a in args] + list(kwargs)
        assert sorted(where) == sorted(passed), (fn_name, args, kwargs, where)
        for upstream, ours in where.items():
            assert ours == upstream or ours in ALIASES.get((fn_name, upstream), ()), \
                f"{fn_name}: {upstream!r} passed as in {args} {kwargs} lands in {ours!r}"
