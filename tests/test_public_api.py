"""Every module declares __all__, and every name in it exists."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import rolloutpool

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(rolloutpool.__path__, prefix="rolloutpool.")
    if not m.name.endswith("__main__")
)


@pytest.mark.parametrize("name", MODULES)
def test_all_is_declared_and_exported(name: str) -> None:
    module = importlib.import_module(name)
    declared = getattr(module, "__all__", None)
    assert declared is not None, f"{name} has no __all__"
    missing = [n for n in declared if not hasattr(module, n)]
    assert missing == []
    assert len(declared) == len(set(declared))


def test_operator_is_not_a_package() -> None:
    import operator  # noqa: PLC0415

    assert hasattr(operator, "itemgetter"), "a local operator/ package shadows the stdlib"
