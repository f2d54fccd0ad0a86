"""Every exception the package raises is a class of kvformats/errors.py (a scan of the source),
kvformats.testing's public strategies and tolerance included. The suite's harness (tests/harness/)
is not the package: its checks fail with AssertionError, as tests do."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from kvformats import errors

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("kvformats", "kvformats_kernels")
ERRORS = ROOT / "kvformats" / "errors.py"


def _error_classes() -> set[str]:
    """The classes errors.py defines, including the one its module ``__getattr__`` makes."""
    tree = ast.parse(ERRORS.read_text(encoding="utf-8"))
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}


def _sources():
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _functions_and_raises(tree: ast.AST):
    """(name of the innermost enclosing function or None, raise node) for each raise."""
    def walk(node, function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield from walk(child, child.name)
            else:
                if isinstance(child, ast.Raise):
                    yield function, child
                yield from walk(child, function)
    yield from walk(tree, None)


def _allowed(function: str | None, exc: ast.expr, classes: set[str]) -> bool:
    if isinstance(exc, ast.Name) and exc.id[:1].islower():
        return True  # re-raise of an exception held in a variable (``except ... as err``, a returned error)
    if isinstance(exc, ast.Name) and exc.id == "NotImplementedError":
        return True  # the body of an abstract method (a bare class, no message): a subclass must override
    call = exc.func if isinstance(exc, ast.Call) else exc
    name = call.attr if isinstance(call, ast.Attribute) else call.id if isinstance(call, ast.Name) else None
    if name == "AttributeError" and function == "__getattr__":
        return True  # the module __getattr__ protocol
    return name in classes


def test_every_raise_is_an_errors_class():
    classes = _error_classes()
    bad = []
    for path in _sources():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for function, node in _functions_and_raises(tree):
            if node.exc is not None and not _allowed(function, node.exc, classes):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: raise {ast.unparse(node.exc)[:60]}")
    assert not bad, "raise a class of kvformats/errors.py (add one there if none fits):\n" + "\n".join(bad)


def test_no_exception_class_outside_errors():
    bad = []
    for path in _sources():
        if path == ERRORS:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name.endswith(("Error", "Exception", "Warning")):
                bad.append(f"{path.relative_to(ROOT)}:{node.lineno}: class {node.name}")
    assert not bad, "exception classes belong in kvformats/errors.py:\n" + "\n".join(bad)


def test_old_import_paths_still_work():
    from kvformats import cli
    from kvformats.caches import files as io
    from kvformats.codec import convert

    assert convert.ConversionError is errors.ConversionError
    assert io.CacheFileError is errors.CacheFileError
    assert cli.UsageError is errors.UsageError


def test_errors_stay_builtin_exceptions():
    assert issubclass(errors.UnsupportedError, NotImplementedError)
    assert issubclass(errors.UnsupportedError, RuntimeError)
    assert issubclass(errors.InputTypeError, TypeError) and issubclass(errors.InputTypeError, ValueError)
    assert issubclass(errors.UsageError, errors.KVFormatError)


def test_strategy_argument_error_is_hypothesis_invalid_argument():
    hypothesis_errors = pytest.importorskip("hypothesis.errors")
    from kvformats.errors import StrategyArgumentError

    assert issubclass(StrategyArgumentError, hypothesis_errors.InvalidArgument)
    assert issubclass(StrategyArgumentError, errors.KVFormatError)
    assert StrategyArgumentError.__module__ == "kvformats.errors"
    with pytest.raises(AttributeError):
        errors.NoSuchError  # noqa: B018
