"""Run tokenspeed's own test of ``deepseek_v4_ops`` against the drop-in ``kvformats.compat.tokenspeed``.

tokenspeed's test file ``test/runtime/test_deepseek_v4_attention_ops.py`` (lightseekorg/tokenspeed,
main at f4d8ec6e) is run unmodified, with ``tokenspeed.runtime.layers.attention.deepseek_v4_ops``
replaced by ``kvformats.compat.tokenspeed`` (a ``sys.modules`` alias installed before the test
module is imported). Everything else the test imports comes from tokenspeed's own files, read at
run time from ``--src`` (default ``.tokenspeed/main``, git-ignored; tokenspeed's code never enters
this repository), except where they cannot load:

* ``tokenspeed_kernel._triton`` re-exports tokenspeed's Triton fork (``tokenspeed_triton``): stock
  Triton is given under its names (a stub module made here; nothing else in it).
* tokenspeed's CUDA extension (``tokenspeed_kernel.thirdparty.cuda.deepseek_v4_attention``) needs
  ``tvm_ffi`` and a built ``.so``: tokenspeed's own ``ops/attention/cuda/deepseek_v4.py`` then takes
  its ``except ImportError`` branch (``has_persistent_topk()`` and the other ``has_*`` say False), so
  the test's own skip paths take over.
* ``tokenspeed.runtime.models.deepseek_v4`` and ``...kv_cache.hybrid_deepseek_v4`` import the whole
  runtime (transformers, distributed, the model layers). When such a module fails to import, the
  names the test takes from it (``_deepseek_v4_sanitize_swa_slot_mapping``,
  ``_mask_invalid_graph_tokens``) are lifted from tokenspeed's own file: the top-level definitions
  they use, found with ``ast``, run as written (nothing is re-implemented here).
* ``ci_system.ci_register`` is tokenspeed's own file (its ``register_cuda_ci`` is a no-op at run
  time); a no-op stub stands in when it is absent.

Get tokenspeed's files (once) from a clone or bare mirror of the public repository:

    python3 tools/tokenspeed_own_tests.py --extract-from <git dir> --src .tokenspeed/main

which is, for each path of ``SOURCES`` below (the repository's paths, kept as they are under
--src),

    git --git-dir=<git dir> show f4d8ec6e:<path> > .tokenspeed/main/<path>

Run (from the project root; on CPU the test's CUDA class is skipped by its own
``@unittest.skipUnless(torch.cuda.is_available())``):

    python3 tools/tokenspeed_own_tests.py [--src .tokenspeed/main] [-k PATTERN]

It prints one row per test (passed / failed / error / skipped / difference, the first line of the
reason), then the counts, and writes the same to ``$OUT/tokenspeed_own_tests.txt`` when ``OUT`` is
set. Exit status 0 only when every failure is one of ``EXPECTED_DIFFERENCES``: a test, the reason,
and a pattern the failure's message must match (another failure of that test still fails).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import re
import subprocess
import symtable
import sys
import time
import types
import unittest
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMIT = "f4d8ec6e"  # lightseekorg/tokenspeed main (f4d8ec6e "perf(gemm): route the unrouted K3 decode projections")
TEST_FILE = "test/runtime/test_deepseek_v4_attention_ops.py"
OPS_MODULE = "tokenspeed.runtime.layers.attention.deepseek_v4_ops"
DROP_IN = "kvformats.compat.tokenspeed"

# The files of the public repository the test needs, at their repository paths. deepseek_v4_ops.py
# is not among them (the drop-in replaces it), nor tokenspeed_kernel/_triton.py (the Triton fork).
SOURCES = (
    TEST_FILE,
    "test/ci_system/ci_register.py",
    "python/tokenspeed/runtime/layers/attention/deepseek_v4_geometry.py",
    "python/tokenspeed/runtime/layers/attention/kernel_page_sizes.py",
    "python/tokenspeed/runtime/layers/attention/kv_cache/hybrid_deepseek_v4.py",
    "python/tokenspeed/runtime/models/deepseek_v4.py",
    "tokenspeed-kernel/python/tokenspeed_kernel/ops/attention/cuda/deepseek_v4.py",
    "tokenspeed-kernel/python/tokenspeed_kernel/ops/attention/triton/deepseek_v4.py",
    "tokenspeed-kernel/python/tokenspeed_kernel/thirdparty/cuda/deepseek_v4_attention.py",
    "tokenspeed-kernel/python/tokenspeed_kernel/ops/transform/__init__.py",
    "tokenspeed-kernel/python/tokenspeed_kernel/ops/transform/triton/__init__.py",
    "tokenspeed-kernel/python/tokenspeed_kernel/ops/transform/faster_hadamard_transform/__init__.py",
    "tokenspeed-kernel/python/tokenspeed_kernel/platform.py",
    "tokenspeed-kernel/python/tokenspeed_kernel/registry.py",
    "tokenspeed-kernel/python/tokenspeed_kernel/selection.py",
    "tokenspeed-kernel/python/tokenspeed_kernel/signature.py",
    "tokenspeed-kernel/python/tokenspeed_kernel/profiling.py",
)
# top-level package -> its folder under --src
PACKAGE_ROOTS = {
    "tokenspeed": "python/tokenspeed",
    "tokenspeed_kernel": "tokenspeed-kernel/python/tokenspeed_kernel",
    "ci_system": "test/ci_system",
}
# modules whose failed import falls back to lifting the names asked of them from tokenspeed's file
LIFTABLE = (
    "tokenspeed.runtime.models.deepseek_v4",
    "tokenspeed.runtime.layers.attention.kv_cache.hybrid_deepseek_v4",
    # its kernel backends register at import and one asks for the GPU platform: without a GPU,
    # tokenspeed_kernel refuses to import it ("requires an NVIDIA CUDA or AMD ROCm GPU")
    "tokenspeed_kernel.ops.transform",
)

_CPU = "docs/porting-from-tokenspeed.md, 'Differences from tokenspeed', row 'CPU tensors'"
_CUDA_ONLY = re.compile(r"ValueError not raised|does not match.*only supports CUDA")
_INDEX = "docs/porting-from-tokenspeed.md, 'Index helpers' table"


@dataclass(frozen=True)
class Difference:
    reason: str
    matches: re.Pattern  # the failure's message must match, else it is a real failure


# Failures that are kvformats' documented contract, not an incompatibility: test name -> Difference.
EXPECTED_DIFFERENCES = {
    name: Difference(f"tokenspeed's {what} refuses CPU tensors (ValueError 'only supports CUDA'); the drop-in "
                     f"runs it on CPU with the torch reference ({_CPU})", _CUDA_ONLY)
    for name, what in (
        ("test_indexer_q_mxfp4_requires_cuda", "deepseek_v4_prepare_indexer_q_mxfp4 (Triton)"),
        ("test_indexer_mxfp4_cache_writer_requires_cuda", "write_deepseek_v4_indexer_mxfp4_cache (Triton)"),
        ("test_compressor_state_writer_requires_cuda", "save_deepseek_v4_compressor_state (Triton)"),
        ("test_compress_cache_insert_requires_cuda", "deepseek_v4_hca_compress_kv_cache_insert (Triton)"),
        ("test_csa_indexer_cache_insert_requires_cuda", "deepseek_v4_csa_indexer_cache_insert (Triton)"),
    )
}
EXPECTED_DIFFERENCES["test_decode_swa_indices_and_lens_masks_invalid_tokens"] = Difference(
    "an invalid token's row: tokenspeed's kernel leaves its prior contents (the test asserts the -123 it "
    "filled stays), the drop-in writes -1 entries and length 0 (" + _INDEX + ", "
    "deepseek_v4_decode_swa_indices_and_lens; 'Sane behaviour where tokenspeed is undefined'); the lengths "
    "and the valid row are asserted equal before that line", re.compile(r"False is not true \(test line 1713\)$"))


# ---------------------------------------------------------------------------------------------
# extraction


def extract(git_dir: str | Path, src: Path, commit: str = COMMIT, paths=SOURCES) -> list[str]:
    """``git show <commit>:<path>`` for each path into ``src/<path>``; returns the paths written."""
    written = []
    for path in paths:
        text = subprocess.run(["git", f"--git-dir={git_dir}", "show", f"{commit}:{path}"], check=True,
                              capture_output=True).stdout
        target = src / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(text)
        written.append(path)
    (src / "EXTRACTED_FROM.txt").write_text(f"lightseekorg/tokenspeed {commit}\n" + "".join(p + "\n" for p in paths))
    return written


# ---------------------------------------------------------------------------------------------
# imports: the alias, tokenspeed's files, stubs, lifted names


def _triton_stub(name: str) -> types.ModuleType:
    """tokenspeed_kernel._triton with stock Triton under the names the fork's module exports."""
    import triton
    import triton.language as tl

    mod = types.ModuleType(name, "stub: stock Triton under tokenspeed_kernel._triton's names (no fork)")
    mod.triton, mod.tl = triton, tl
    optional = {"libdevice": ("triton.language.extra", "libdevice"),
                "TensorDescriptor": ("triton.tools.tensor_descriptor", "TensorDescriptor"),
                "proton": ("triton.profiler", None), "gluon": ("triton.experimental.gluon", None),
                "gl": ("triton.experimental.gluon.language", None), "aggregate": ("triton.language.core", "_aggregate")}
    for attr, (module, member) in optional.items():
        try:
            value = importlib.import_module(module)
            setattr(mod, attr, getattr(value, member) if member else value)
        except Exception:  # noqa: BLE001 - absent in this Triton: left out, as an import of it would fail
            pass
    mod.redirect_triton_to_tokenspeed_triton = lambda: None
    return mod


def _ci_register_stub(name: str) -> types.ModuleType:
    mod = types.ModuleType(name, "stub: tokenspeed's CI registration markers as no-ops")
    for marker in ("register_cuda_ci", "register_amd_ci", "register_cpu_ci", "register_npu_ci"):
        setattr(mod, marker, lambda *args, **kwargs: None)
    return mod


STUBS = {"tokenspeed_kernel._triton": _triton_stub}
STUBS_IF_ABSENT = {"ci_system.ci_register": _ci_register_stub}


def _bound_names(node: ast.stmt) -> list[tuple[str, ast.alias | None]]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [(node.name, None)]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [((a.asname or a.name).split(".")[0], a) for a in node.names if a.name != "*"]
    if isinstance(node, ast.Assign):
        return [(n.id, None) for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [(node.target.id, None)]
    return []


def _used_names(node: ast.stmt, future_annotations: bool) -> set[str]:
    skip: set[int] = set()
    if future_annotations:  # annotations are strings then: not evaluated, not needed
        for sub in ast.walk(node):
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = sub.args
                for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
                    if a is not None and a.annotation is not None:
                        skip.update(id(n) for n in ast.walk(a.annotation))
                if sub.returns is not None:
                    skip.update(id(n) for n in ast.walk(sub.returns))
            elif isinstance(sub, ast.AnnAssign):
                skip.update(id(n) for n in ast.walk(sub.annotation))
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and id(n) not in skip}


def _scope_globals(table) -> set[str]:
    names = {s.get_name() for s in table.get_symbols() if s.is_global()}
    for child in table.get_children():
        names |= _scope_globals(child)
    return names


def _definition_names(node) -> set[str]:
    parts = list(node.decorator_list)
    if isinstance(node, ast.ClassDef):
        parts += [*node.bases, *(k.value for k in node.keywords)]
    else:
        parts += [d for d in (*node.args.defaults, *node.args.kw_defaults) if d is not None]
    return {n.id for p in parts for n in ast.walk(p) if isinstance(n, ast.Name)}


def lift(path: Path, module: types.ModuleType, names) -> list[str]:
    """Run the top-level statements of ``path`` that define ``names`` (and what they use, transitively)
    in ``module``'s namespace, in file order; imports reduced to the names used. Returns what ran."""
    source = path.read_text()
    tree = ast.parse(source, str(path))
    future = any(isinstance(n, ast.ImportFrom) and n.module == "__future__" for n in tree.body)
    where: dict[str, tuple[int, ast.alias | None]] = {}
    for index, node in enumerate(tree.body):
        for name, alias in _bound_names(node):
            where[name] = (index, alias)  # the last binding wins, as when the file runs
    scopes = {(t.get_name(), t.get_lineno()): t for t in symtable.symtable(source, str(path), "exec").get_children()}
    wanted: dict[int, set] = {}
    todo, seen = list(names), set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name not in where:
            if name in names:
                raise ImportError(f"cannot lift {name!r} from {path}: not a top-level name there")
            continue  # a builtin (or a global the file never binds: NameError when used, as there)
        index, alias = where[name]
        wanted.setdefault(index, set())
        node = tree.body[index]
        if alias is not None:
            wanted[index].add(id(alias))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            # the globals it reads: its scope's and nested scopes' global names (symtable), outside
            # annotations (ast; not evaluated under `from __future__ import annotations`), plus its
            # decorators' and defaults' names, read at definition
            table = scopes[(node.name, node.lineno)]
            todo.extend((_scope_globals(table) & _used_names(node, future)) | _definition_names(node))
        else:
            todo.extend(_used_names(node, future))
    body = []
    for index in sorted(wanted):
        node = tree.body[index]
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            node = type(node)(**{**{f: getattr(node, f) for f in node._fields},
                                 "names": [a for a in node.names if id(a) in wanted[index]]})
            ast.copy_location(node, tree.body[index])
        body.append(node)
    flags = __import__("__future__").annotations.compiler_flag if future else 0
    code = compile(ast.Module(body=body, type_ignores=[]), str(path), "exec", flags=flags, dont_inherit=True)
    exec(code, vars(module))  # noqa: S102 - tokenspeed's own statements, as its file has them
    return sorted(n for n in seen if n in where)


class _Lifted(types.ModuleType):
    """A module of tokenspeed whose import failed: names asked of it are lifted from its file."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            done = lift(Path(self.__file__), self, [name])
        except ImportError as exc:
            raise AttributeError(f"{self.__name__}.{name}: {exc}") from exc
        self.__lifted__.update(done)
        return vars(self)[name]


class _Loader(importlib.abc.Loader):
    def __init__(self, finder, kind, payload=None):
        self.finder, self.kind, self.payload = finder, kind, payload

    def create_module(self, spec):
        if self.kind == "stub":
            return self.payload(spec.name)
        return None

    def exec_module(self, module):
        name = module.__name__
        if self.kind == "stub":
            self.finder.provenance[name] = f"{module.__doc__ or 'stub'}"
            return
        if self.kind == "package":
            self.finder.provenance.setdefault(name, "empty package (its __init__ is not run)")
            return
        path = self.payload
        try:
            exec(compile(path.read_bytes(), str(path), "exec", dont_inherit=True), vars(module))  # noqa: S102
        except (ImportError, RuntimeError) as exc:
            if name not in LIFTABLE:
                raise
            lifted = _Lifted(name)
            lifted.__file__, lifted.__lifted__ = str(path), set()
            if hasattr(module, "__path__"):
                lifted.__path__ = module.__path__
            lifted.__package__ = name.rpartition(".")[0]
            lifted.__spec__, lifted.__loader__ = module.__spec__, self
            sys.modules[name] = lifted  # the import system returns what sys.modules holds after exec
            self.finder.provenance[name] = (f"{self._rel(path)}: lifted names (its import failed: "
                                            f"{type(exc).__name__}: {exc})")
            self.finder.lifted[name] = lifted
            return
        self.finder.provenance[name] = self._rel(path)

    def _rel(self, path: Path) -> str:
        try:
            return f"tokenspeed {path.relative_to(self.finder.src)}"
        except ValueError:
            return str(path)


class TokenspeedFinder(importlib.abc.MetaPathFinder):
    """Resolves tokenspeed's import names: the alias, stubs, then tokenspeed's files under ``src``."""

    def __init__(self, src: Path, aliases: dict[str, str] | None = None):
        self.src = Path(src).resolve()
        self.aliases = {OPS_MODULE: DROP_IN} if aliases is None else dict(aliases)
        self.provenance: dict[str, str] = {}
        self.lifted: dict[str, _Lifted] = {}

    def owns(self, fullname: str) -> bool:
        return fullname.split(".")[0] in PACKAGE_ROOTS

    def _spec(self, fullname, loader, origin=None, package=False):
        spec = importlib.machinery.ModuleSpec(fullname, loader, origin=origin, is_package=package)
        if package:
            spec.submodule_search_locations = []
        if origin:
            spec.has_location = True
        return spec

    def find_spec(self, fullname, path=None, target=None):
        if not self.owns(fullname):
            return None
        if fullname in STUBS:
            return self._spec(fullname, _Loader(self, "stub", STUBS[fullname]))
        top, _, rest = fullname.partition(".")
        base = self.src / PACKAGE_ROOTS[top] / Path(*rest.split(".")) if rest else self.src / PACKAGE_ROOTS[top]
        init = base / "__init__.py"
        if init.is_file():  # a package whose __init__ was extracted (it has content the test uses)
            spec = self._spec(fullname, _Loader(self, "file", init), str(init), package=True)
            spec.submodule_search_locations = [str(base)]
            return spec
        if base.with_suffix(".py").is_file():
            file = base.with_suffix(".py")
            return self._spec(fullname, _Loader(self, "file", file), str(file))
        if fullname in STUBS_IF_ABSENT:
            return self._spec(fullname, _Loader(self, "stub", STUBS_IF_ABSENT[fullname]))
        if any(a.startswith(fullname + ".") for a in (*self.aliases, *STUBS, *STUBS_IF_ABSENT)) or base.is_dir():
            spec = self._spec(fullname, _Loader(self, "package"), package=True)
            spec.submodule_search_locations = [str(base)] if base.is_dir() else []
            return spec
        return None  # not extracted: ModuleNotFoundError, as without the package


@contextlib.contextmanager
def installed(src: Path, aliases: dict[str, str] | None = None):
    """Install the finder (first on ``sys.meta_path``) and the alias for the duration; afterwards the
    modules it loaded are removed and those of the same packages loaded before are put back."""
    finder = TokenspeedFinder(src, aliases)
    saved = {k: v for k, v in sys.modules.items() if finder.owns(k)}
    for key in saved:
        del sys.modules[key]
    sys.meta_path.insert(0, finder)
    try:
        for name, target in finder.aliases.items():  # in place before anything imports the test module
            module = importlib.import_module(target)
            parent, _, leaf = name.rpartition(".")
            if parent:
                importlib.import_module(parent)
            sys.modules[name] = module
            if parent:
                setattr(sys.modules[parent], leaf, module)
            finder.provenance[name] = f"sys.modules alias of {target}"
        yield finder
    finally:
        sys.meta_path.remove(finder)
        for key in [k for k in sys.modules if finder.owns(k)]:
            del sys.modules[key]
        sys.modules.update(saved)


# ---------------------------------------------------------------------------------------------
# running


@dataclass
class Outcome:
    test: str  # Class.method
    status: str  # passed | failed | error | skipped | difference
    reason: str = ""
    note: str = ""


class _Result(unittest.TestResult):
    """One Outcome per test; a failing subtest makes its test fail (the worst outcome is kept)."""

    def __init__(self):
        super().__init__()
        self.outcomes: dict[str, Outcome] = {}

    @staticmethod
    def _name(test):
        return f"{type(test).__name__}.{getattr(test, '_testMethodName', str(test))}"

    def _first_line(self, err, test):
        exc_type, exc, tb = err
        text = f"{exc_type.__name__}: {exc}".strip()
        lines = [ln for ln in text.splitlines() if ln.strip()]
        line = None  # the test file's line that raised (the last frame of it in the traceback)
        file = getattr(sys.modules.get(type(test).__module__), "__file__", None)
        while tb is not None:
            if file and tb.tb_frame.f_code.co_filename == file:
                line = tb.tb_lineno
            tb = tb.tb_next
        return (lines[0] if lines else exc_type.__name__) + (f" (test line {line})" if line else "")

    def _set(self, test, status, reason=""):
        name = self._name(test)
        previous = self.outcomes.get(name)
        rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
        if previous is None or rank[status] > rank[previous.status]:
            self.outcomes[name] = Outcome(name, status, reason)

    def addSuccess(self, test):
        super().addSuccess(test)
        self._set(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._set(test, "failed", self._first_line(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        if isinstance(test, unittest.case._SubTest):  # noqa: SLF001
            test = test.test_case
        if not hasattr(test, "_testMethodName"):  # a class or module fixture
            self.outcomes[str(test)] = Outcome(str(test), "error", self._first_line(err, test))
            return
        self._set(test, "error", self._first_line(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        if not hasattr(test, "_testMethodName"):
            return
        self._set(test, "skipped", reason)

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            status = "failed" if issubclass(err[0], test.failureException) else "error"
            self._set(test, status, f"{subtest._subDescription()} {self._first_line(err, test)}")  # noqa: SLF001


def _suite_tests(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from _suite_tests(item)
        else:
            yield item


def run_test_file(test_file: Path, src: Path, pattern: str | None = None,
                  differences: dict[str, Difference] | None = None, aliases: dict[str, str] | None = None):
    """Import ``test_file`` with the alias and tokenspeed's files in place and run its unittest cases.
    Returns (outcomes in file order, provenance of the modules it imported)."""
    differences = EXPECTED_DIFFERENCES if differences is None else differences
    test_file = Path(test_file).resolve()
    with installed(src, aliases) as finder:
        name = f"_tokenspeed_own_{test_file.stem}"
        spec = importlib.util.spec_from_file_location(name, test_file)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        path_before = list(sys.path)
        try:
            try:
                spec.loader.exec_module(module)
            except Exception as exc:  # noqa: BLE001 - reported as the file's error
                return [Outcome(test_file.name, "error", f"import: {type(exc).__name__}: {exc}")], finder.provenance
            suite = unittest.defaultTestLoader.loadTestsFromModule(module)
            if pattern:
                suite = unittest.TestSuite(t for t in _suite_tests(suite) if re.search(pattern, t.id()))
            order = [f"{type(t).__name__}.{t._testMethodName}" for t in _suite_tests(suite)]  # noqa: SLF001
            result = _Result()
            suite.run(result)
        finally:
            sys.modules.pop(name, None)
            sys.path[:] = path_before  # the test file puts its parent folder first on sys.path
        provenance = dict(finder.provenance)
        for mod_name, lifted in finder.lifted.items():
            provenance[mod_name] += f"; lifted: {', '.join(sorted(lifted.__lifted__)) or 'nothing'}"
    outcomes = [result.outcomes[t] for t in order if t in result.outcomes]
    outcomes += [o for k, o in result.outcomes.items() if k not in order]  # fixture errors
    for outcome in outcomes:
        diff = differences.get(outcome.test.rpartition(".")[2])
        if diff is None:
            continue
        if outcome.status in ("failed", "error") and diff.matches.search(outcome.reason):
            outcome.status, outcome.note = "difference", diff.reason
        elif outcome.status == "passed":
            outcome.note = "declared difference not seen: the entry may be stale"
    return outcomes, provenance


STATUSES = ("passed", "difference", "skipped", "failed", "error")


def report(outcomes, provenance, header: str) -> tuple[str, int]:
    counts = {s: sum(o.status == s for o in outcomes) for s in STATUSES}
    width = max([len(o.test) for o in outcomes] + [4])
    lines = [header, "", f"{'test':<{width}}  {'result':<10}  reason", f"{'-' * width}  {'-' * 10}  ------"]
    for o in outcomes:
        reason = o.reason if o.status != "passed" else ""
        lines.append(f"{o.test:<{width}}  {o.status:<10}  {reason}".rstrip())
        if o.note:
            lines.append(f"{'':<{width}}  {'':<10}  -> {o.note}")
    lines += ["", "counts: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES) + f" ({len(outcomes)} tests)",
              "('difference' = a failure declared in EXPECTED_DIFFERENCES with its reason; exit 0 only when "
              "nothing else failed)", "", "where the test's imports came from:"]
    lines += [f"  {name}: {where}" for name, where in sorted(provenance.items())]
    bad = counts["failed"] + counts["error"]
    lines += ["", "RESULT: " + ("ok" if not bad else f"{bad} failed or errored")]
    return "\n".join(lines) + "\n", (0 if not bad else 1)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--src", default=".tokenspeed/main",
                        help="folder of tokenspeed's files at their repository paths (default .tokenspeed/main)")
    parser.add_argument("--extract-from", metavar="GIT_DIR",
                        help="extract SOURCES at --commit from this git dir (a clone's .git, a bare mirror) into --src")
    parser.add_argument("--commit", default=COMMIT, help=f"tokenspeed commit to extract (default {COMMIT})")
    parser.add_argument("--test-file", default=TEST_FILE, help=f"test file under --src (default {TEST_FILE})")
    parser.add_argument("-k", "--pattern", help="run only tests whose id matches this regular expression")
    parser.add_argument("--list-sources", action="store_true", help="print the repository paths extracted and exit")
    args = parser.parse_args(argv)
    if args.list_sources:
        print("\n".join(SOURCES))
        return 0
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    src = Path(args.src)
    if not src.is_absolute():
        src = (Path.cwd() / src) if (Path.cwd() / src).exists() or args.extract_from else ROOT / src
    if args.extract_from:
        written = extract(args.extract_from, src, args.commit)
        print(f"extracted {len(written)} files of {args.commit} into {src}")
    test_file = src / args.test_file
    if not test_file.is_file():
        print(f"tokenspeed's test file is not at {test_file}: extract it first "
              f"(--extract-from <git dir of lightseekorg/tokenspeed>; see this file's docstring)", file=sys.stderr)
        return 2
    import torch

    started = time.perf_counter()
    outcomes, provenance = run_test_file(test_file, src, args.pattern)
    device = f"CUDA ({torch.cuda.get_device_name()})" if torch.cuda.is_available() else "CPU (no CUDA)"
    stamp = src / "EXTRACTED_FROM.txt"
    commit = stamp.read_text().split()[1] if stamp.is_file() else "commit unknown"
    header = (f"tokenspeed's own {args.test_file} ({commit}) against {DROP_IN}\n"
              f"{device}, torch {torch.__version__}, {time.perf_counter() - started:.1f} s")
    text, status = report(outcomes, provenance, header)
    sys.stdout.write(text)
    if os.environ.get("OUT"):
        out = Path(os.environ["OUT"])
        out.mkdir(parents=True, exist_ok=True)
        (out / "tokenspeed_own_tests.txt").write_text(text)
    return status


if __name__ == "__main__":
    sys.exit(main())
