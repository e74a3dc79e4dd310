"""Lazy package exports (PEP 562): ``package.Name`` imports its submodule on first use.

Why: a decoder process (started by the forkserver) imports ``parrecio.pipeline.worker``; with eager
``__init__`` imports that pulled in the whole library (the consumer's pipeline, sources, S3, ...), about
half of the forkserver's start-up and so of the time to the first batch.  Names stay importable as
before (``from parrecio import ParallelReader``); type checkers see them through ``TYPE_CHECKING``
imports in each ``__init__``.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, Tuple


def lazy_exports(package: str, table: Dict[str, str]) -> Tuple[Callable[[str], Any], Callable[[], List[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` whose public ``name`` lives in the submodule
    ``table[name]`` (relative to the package, e.g. ``".pipeline"``).

    An export must not share its name with a submodule: importing that submodule binds the module to
    the package attribute first, and ``__getattr__`` is never asked (keep such names eager)."""
    def __getattr__(name: str) -> Any:
        sub = table.get(name)
        if sub is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(sub, package), name)
        setattr(importlib.import_module(package), name, value)  # later lookups skip __getattr__
        return value

    def __dir__() -> List[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(table))

    return __getattr__, __dir__
