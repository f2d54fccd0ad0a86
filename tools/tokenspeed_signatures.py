"""Read tokenspeed's DeepSeek V4 op-boundary signatures with ``ast`` and write them into
spec/tokenspeed-signatures.json, beside the entries already there (the seed's f3e4d1e2 /
6a08766a table, kept as it is).

    python3 tools/tokenspeed_signatures.py --wheel tokenspeed-0.1.1-py3-none-any.whl \
        --git /path/to/tokenspeed/.git --commit f4d8ec6e039c028c7ee71317ccfb84e56ae2b45c [--check]

``--wheel``: a released tokenspeed wheel (from the package index: ``pip download --no-deps
tokenspeed==0.1.1``): the ``__all__`` of its ``deepseek_v4_ops.py`` and the signature of each
name, under ``forms["<version>"]``. ``--kernel-wheel``: a released tokenspeed-kernel wheel
(``pip download --no-deps tokenspeed-kernel==0.1.4``): the cache-side functions of its ``dsv4``,
``dsv4.triton`` and ``dsv41`` modules (``KERNEL_MODULES``), under ``kernel_forms["<version>"]``.
``--git`` / ``--commit``: a clone of lightseekorg/tokenspeed
and a commit of its main branch: that commit's ``deepseek_v4_ops.__all__`` and the signature of
every function ``kvformats.compat.tokenspeed`` exports that the commit has (looked for in the
files of the boundary, in order), under ``forms["<commit[:8]>"]``. Nothing is imported or run:
the files are parsed. ``--check`` writes nothing and exits 1 when the file would change.

Signatures are recorded as the seed's are: each parameter's name, kind (``positional_or_keyword``
or ``keyword_only``) and default (a JSON value, absent when there is none), and the return
annotation as written upstream.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "spec" / "tokenspeed-signatures.json"
OPS = "tokenspeed/runtime/layers/attention/deepseek_v4_ops.py"
# the files of the boundary on tokenspeed's main branch, where a name is looked for in this order
MAIN_FILES = (
    "python/" + OPS,
    "tokenspeed-kernel/python/tokenspeed_kernel/ops/attention/triton/deepseek_v4.py",
    "tokenspeed-kernel/python/tokenspeed_kernel/ops/transform/__init__.py",
    "tokenspeed-kernel/python/tokenspeed_kernel/thirdparty/cuda/deepseek_v4_attention.py",
    "python/tokenspeed/runtime/layers/attention/deepseek_v4_geometry.py",
    "python/tokenspeed/runtime/configs/deepseek_v4_cache_spec.py",
)


def _params(fn: ast.FunctionDef) -> list[dict]:
    a = fn.args
    if a.vararg or a.kwarg or a.posonlyargs:
        raise SystemExit(f"{fn.name}: *args, **kwargs and positional-only parameters are not recorded")
    out = []
    defaults = [None] * (len(a.args) - len(a.defaults)) + list(a.defaults)
    for arg, default in zip(a.args, defaults):
        out.append(_param(arg.arg, "positional_or_keyword", default))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        out.append(_param(arg.arg, "keyword_only", default))
    return out


def _param(name: str, kind: str, default) -> dict:
    p = {"name": name, "kind": kind}
    if default is not None:
        p["default"] = ast.literal_eval(default)
    return p


def _functions(text: str) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}


def _all(text: str) -> list[str]:
    for n in ast.parse(text).body:
        if isinstance(n, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in n.targets):
            return list(ast.literal_eval(n.value))
    raise SystemExit("no __all__")


def _signature(fn: ast.FunctionDef) -> dict:
    return {"params": _params(fn), "returns": ast.unparse(fn.returns) if fn.returns is not None else None}


def release_form(wheel: Path) -> tuple[str, dict]:
    name, version = wheel.name.split("-")[:2]
    with zipfile.ZipFile(wheel) as zf:
        text = zf.read(OPS).decode()
    fns = _functions(text)
    names = _all(text)
    return version, {
        "kind": "release",
        "package": name,
        "version": version,
        "url": f"https://pypi.org/project/{name}/{version}/",
        "filename": wheel.name,
        "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "source": OPS,
        "ops_all": names,
        "functions": {n: _signature(fns[n]) for n in names},
    }


# tokenspeed-kernel's cache-side functions, per module of the wheel: what kvformats.compat.
# tokenspeed_kernel mirrors (the attention kernels, dsv4_prefill / dsv4_decode / selected_attention
# and the like, are out of scope: docs/porting-from-tokenspeed.md)
KERNEL_ATTENTION = "tokenspeed_kernel/ops/attention/"
KERNEL_MODULES = {
    "dsv4": ("dsv4/__init__.py", ("dsv4_indexer_cache_format", "dsv4_swa_cache_insert",
                                  "dsv4_csa_indexer_fp8_cache_insert")),
    "dsv4.triton": ("dsv4/triton.py", None),  # None: its __all__ but the attention kernel below
    "dsv41": ("dsv41/__init__.py", ("cache_pack", "cache_unpack", "cache_scatter", "cache_gather",
                                    "swa_rope_scatter", "compressor_pool", "compressor_tail_scatter",
                                    "index_q_quantize")),
}
KERNEL_OUT_OF_SCOPE = ("triton_dsv4_prefill",)


def kernel_release_form(wheel: Path) -> tuple[str, dict]:
    """The cache-side signatures of a tokenspeed-kernel wheel, per module (``KERNEL_MODULES``)."""
    name, version = wheel.name.split("-")[:2]
    modules = {}
    with zipfile.ZipFile(wheel) as zf:
        for module, (path, names) in KERNEL_MODULES.items():
            text = zf.read(KERNEL_ATTENTION + path).decode()
            fns = _functions(text)
            if names is None:
                names = tuple(n for n in _all(text) if n not in KERNEL_OUT_OF_SCOPE)
            modules[module] = {"source": KERNEL_ATTENTION + path,
                               "functions": {n: _signature(fns[n]) for n in names}}
    return version, {
        "kind": "release",
        "package": name.replace("_", "-"),
        "version": version,
        "url": f"https://pypi.org/project/{name.replace('_', '-')}/{version}/",
        "filename": wheel.name,
        "sha256": hashlib.sha256(wheel.read_bytes()).hexdigest(),
        "out_of_scope": list(KERNEL_OUT_OF_SCOPE),
        "modules": modules,
    }


def _git_show(git: Path, commit: str, path: str) -> str | None:
    out = subprocess.run(["git", f"--git-dir={git}", "show", f"{commit}:{path}"], capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def main_form(git: Path, commit: str, wanted: list[str]) -> tuple[str, dict]:
    files = {path: _functions(text) for path in MAIN_FILES if (text := _git_show(git, commit, path)) is not None}
    ops_text = _git_show(git, commit, MAIN_FILES[0])
    if ops_text is None:
        raise SystemExit(f"{MAIN_FILES[0]} is not at {commit}")
    functions = {}
    for name in wanted:
        for path, fns in files.items():
            if name in fns:
                functions[name] = {"source": path, **_signature(fns[name])}
                break
    return commit[:8], {
        "kind": "commit",
        "commit": commit,
        "ops_all": {"source": MAIN_FILES[0], "names": _all(ops_text)},
        "functions": functions,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wheel", type=Path, action="append", default=[], help="a released tokenspeed wheel")
    p.add_argument("--kernel-wheel", type=Path, action="append", default=[],
                   help="a released tokenspeed-kernel wheel (its cache-side dsv4 / dsv41 functions)")
    p.add_argument("--git", type=Path, help="a clone's git directory of lightseekorg/tokenspeed")
    p.add_argument("--commit", action="append", default=[], help="a full commit id on its main branch")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if the file would change")
    args = p.parse_args(argv)
    raw = SPEC.read_text()
    data = json.loads(raw)
    forms = data.setdefault("forms", {})
    for wheel in args.wheel:
        key, form = release_form(wheel)
        forms[key] = form
    for wheel in args.kernel_wheel:
        key, form = kernel_release_form(wheel)
        data.setdefault("kernel_forms", {})[key] = form
    wanted = sorted({*data["functions"], *(n for f in forms.values() for n in f["functions"])})
    for commit in args.commit:
        if args.git is None:
            raise SystemExit("--commit needs --git")
        key, form = main_form(args.git, commit, wanted)
        forms[key] = form
        data["commits"][key] = commit
    out = json.dumps(data, indent=1, ensure_ascii=False) + "\n"
    if args.check:
        if out != raw:
            print(f"{SPEC.relative_to(ROOT)} is not what the sources give", file=sys.stderr)
            return 1
        return 0
    SPEC.write_text(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
