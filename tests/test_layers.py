"""The package's layers: imports only point down (or stay within a layer), and no modules import
each other in a cycle. Read from the source with ast: every ``import`` and ``from ... import``,
at module level, inside a function or under ``if TYPE_CHECKING``, counts. The package front
(``kvformats/__init__.py``) is the composition root: the one module that binds the layers'
parts together (``bind_*`` calls), at the top, so no binding runs up a layer.

The registry finds the kernel package by name at run time (``KERNEL_PACKAGE``) and reads its
table: that is the plugin arrangement, data handed down, not an import, so it is not an edge."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kvformats", "kvformats_kernels")

# Bottom first. A module belongs to the layer of the longest prefix that names it (a package and
# everything below it); "kvformats" itself is the package's front (its __init__: the names
# ``import kvformats`` gives) and names no module below it, so a new module at the top of the
# package has no layer until it is given one here.
LAYERS = (
    ("version", ("kvformats.version",)),  # __version__, SPEC_VERSION
    ("errors", ("kvformats.errors",)),
    ("runtime", ("kvformats.runtime",)),  # deferred value checks, launch replay
    ("validation", ("kvformats.validation",)),  # argument checks
    ("numerics", ("kvformats.numerics",)),
    ("declaration", ("kvformats.layout", "kvformats.examples")),  # a format's layout and its fixtures
    ("formats", ("kvformats.formats",)),
    ("model constants", ("kvformats.dsv4_constants", "kvformats.dsv41_constants")),  # what the model ops share with their kernels
    ("kernels", ("kvformats_kernels",)),
    ("codec", ("kvformats.codec",)),  # registry, dispatch, row I/O, paged ops, torch ops
    ("model ops", ("kvformats.deepseek_v4", "kvformats.deepseek_v41")),
    ("layer step", ("kvformats.dsv4_layer",)),  # the model ops' clients: layer-step reference, quality, inputs
    ("compat", ("kvformats.compat",)),  # other libraries' names over the model ops and the codec
    ("spec", ("kvformats.spec",)),  # spec JSON, golden vectors, generated docs
    ("caches", ("kvformats.caches",)),  # cache files, regions, hexdumps, diff, check
    ("report", ("kvformats.report",)),  # the HTML inspector of cache files and notebook displays
    ("transfer", ("kvformats.transfer",)),  # P/D transfer plans, handshake, checksums, engines (lazy)
    ("front", ("kvformats",)),  # the composition root and the names ``import kvformats`` gives
    ("cli", ("kvformats.cli", "kvformats.__main__")),
    ("testing", ("kvformats.testing",)),
)
RANK = {name: i for i, (name, _) in enumerate(LAYERS)}
# What the kernels may import of kvformats: the layers below dispatch only. The registry reads the
# kernels' table, and the model ops dispatch through it, so the kernels import neither.
KERNELS_MAY_IMPORT = ("errors", "runtime", "validation", "numerics", "declaration", "formats", "model constants")
# Old import paths kept for one release; each is the new module under its old name.
COMPAT = ("kvformats.convert", "kvformats.deferred", "kvformats.fsck", "kvformats.io", "kvformats.ops",
          "kvformats.paged", "kvformats.profiles", "kvformats.registry", "kvformats.rope", "kvformats.strategies",
          "kvformats.tolerance", "kvformats.torch_ops", "kvformats.vectors", "kvformats.deepseek_v4.pipeline",
          "kvformats.deepseek_v4.pipeline_config", "kvformats.deepseek_v4.synthetic")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


MODULES = _modules()


def _target(name: str) -> str | None:
    """The module ``name`` imports: itself, or its nearest enclosing package or module."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()

    def visit(node):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    up = package.split(".")[:len(package.split(".")) - child.level + 1]
                    base = ".".join(up + ([child.module] if child.module else []))
                # ``from package import submodule`` imports the submodule; a name, the module
                found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in child.names)
            visit(child)

    visit(tree)
    return {t for name in found if (t := _target(name)) and t != module}


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def _layer(module: str) -> str | None:
    if module in COMPAT:
        return "old path"
    best = None
    for name, prefixes in LAYERS:
        for prefix in prefixes:
            inside = module.startswith(prefix + ".") and prefix != "kvformats"
            if (module == prefix or inside) and (best is None or len(prefix) > len(best[1])):
                best = (name, prefix)
    return best[0] if best else None


def test_every_module_has_a_layer():
    assert [m for m in MODULES if _layer(m) is None] == []
    assert [m for m in COMPAT if m not in MODULES] == [], "a kept old path is missing"


def test_no_import_points_up():
    up = [f"{m} ({_layer(m)}) imports {t} ({_layer(t)})"
          for m, targets in GRAPH.items() if m not in COMPAT for t in sorted(targets)
          if t not in COMPAT and RANK.get(_layer(t), -1) > RANK.get(_layer(m), len(RANK))]
    assert up == []


def _bindings(path: Path) -> list[str]:
    """The ``bind_*(...)`` calls a module makes: a lower layer handed a part of a higher one."""
    calls = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", "")
            if name.startswith("bind_"):
                calls.append(f"{name} (line {node.lineno})")
    return calls


def test_only_the_composition_root_binds():
    assert _bindings(MODULES["kvformats"]), "the package front binds the codec and the record property"
    bound = {m: calls for m, path in MODULES.items() if m != "kvformats" and (calls := _bindings(path))}
    assert bound == {}


def test_type_checking_imports_count(tmp_path):
    """An import only type checkers run is still an arrow between layers."""
    path = tmp_path / "probe.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kvformats.codec import slot_ops\n",
                    encoding="utf-8")
    assert _imports("kvformats.layout", path) == {"kvformats.codec.slot_ops"}


def test_nothing_imports_an_old_path():
    used = [f"{m} imports {t}" for m, targets in GRAPH.items() for t in sorted(targets) if t in COMPAT and m != t]
    assert used == []


def test_the_library_reaches_the_kernels_only_through_the_registry():
    """No module of kvformats imports kvformats_kernels (nor names it for importlib); the registry
    finds the package by its KERNEL_PACKAGE name and reads its kernel table."""
    def library(m):
        return m == "kvformats" or m.startswith("kvformats.")

    def kernels(m):
        return m == "kvformats_kernels" or m.startswith("kvformats_kernels.")

    imports = [f"{m} imports {t}" for m, targets in GRAPH.items() if library(m) for t in sorted(targets) if kernels(t)]
    assert imports == []
    named = [m for m, path in MODULES.items() if library(m) and m != "kvformats.codec.registry"
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Constant) and isinstance(node.value, str) and kernels(node.value)
             and node.value.replace(".", "").replace("_", "").isalnum()]
    assert named == []


def test_kernels_import_only_what_lies_below_dispatch():
    bad = [f"{m} imports {t} ({_layer(t)})" for m, targets in GRAPH.items() if _layer(m) == "kernels"
           for t in sorted(targets) if _layer(t) != "kernels" and _layer(t) not in KERNELS_MAY_IMPORT]
    assert bad == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            connect(v)
    return out


def test_no_import_cycles():
    assert _cycles(GRAPH) == []


@pytest.mark.parametrize("module", COMPAT)
def test_an_old_path_is_the_new_module(module):
    import importlib
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        old = importlib.import_module(module)
    new = old.__name__
    assert new != module and importlib.import_module(new) is old


def test_every_old_path_is_in_the_changelog_with_its_new_one():
    """CHANGELOG.md says when each path kept for one release goes, and where to import from."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    for old in COMPAT:
        new = importlib.import_module(old).__name__  # each old path is the new module
        assert f"| `{old}` | `{new}` |" in text, old


def test_the_declaration_does_not_depend_on_the_replay_engine():
    assert "kvformats.runtime.replay" not in _imports("kvformats.layout", MODULES["kvformats.layout"])


def test_the_codec_binding_is_checked_and_an_unbound_layout_says_so(monkeypatch):
    import torch

    import kvformats as kvf
    from kvformats import layout
    from kvformats.errors import BackendUnavailableError, InputTypeError

    from kvformats.codec import paged_ops, slot_ops

    with pytest.raises(InputTypeError, match="encode, decode, gather"):
        layout.bind_codec(object(), paged_ops)
    with pytest.raises(InputTypeError, match="dequantize_gather, gather_paged, decode_topk"):
        layout.bind_codec(slot_ops, slot_ops)
    assert layout.slot_ops is slot_ops and layout.paged_ops is paged_ops  # a refused binding changes nothing
    monkeypatch.setattr(layout, "slot_ops", layout._Unbound())
    with pytest.raises(BackendUnavailableError, match="import kvformats"):
        kvf.Fp8Indexer().decode(torch.zeros(1, 8448, dtype=torch.uint8), torch.zeros(1, dtype=torch.long))


def test_a_layout_op_calls_the_codec_op_its_protocol_names():
    """``Layout.encode`` calls ``slot_ops.encode``; ``slot_ops`` is typed by the ``SlotOps``
    protocol, which names exactly the ops the layout calls (a type checker checks the calls
    against it, with no import of the codec layer), and at run time the package front has bound
    the codec's modules to those names."""
    from kvformats import layout
    from kvformats.codec import paged_ops, slot_ops

    tree = ast.parse(MODULES["kvformats.layout"].read_text(encoding="utf-8"))
    calls = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "Layout":
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef):
                    calls[fn.name] = {(c.func.value.id, c.func.attr) for c in ast.walk(fn) if isinstance(c, ast.Call)
                                      and isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name)}
    for module, names, protocol in (("slot_ops", layout.SLOT_OPS, layout.SlotOps),
                                    ("paged_ops", layout.PAGED_OPS, layout.PagedOps)):
        assert set(protocol.__annotations__) == set(names)
        for name in names:
            assert (module, name) in calls[name], name
    assert layout.slot_ops is slot_ops and layout.paged_ops is paged_ops
