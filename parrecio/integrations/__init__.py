"""Adapters from :class:`~parrecio.ParallelReader` to training frameworks.

Import the one you need; none of them is imported by ``import parrecio`` and none imports its framework
before you use it::

    from parrecio.integrations.torch import ParallelIterableDataset, to_torch   # PyTorch
    from parrecio.integrations.tf import dataset                                # tf.data
    from parrecio.integrations.keras import generator, steps_per_epoch          # Keras fit()
    from parrecio.integrations.dlpack import map_arrays                         # JAX, CuPy, ... via DLPack
    from parrecio.integrations.ray import read_recordio                         # Ray Data (a Datasource)

``parrecio.integrations.torch`` etc. also work as attributes after ``import parrecio.integrations``
(loaded on first access); ``parrecio.integrations.ray`` is imported by its full name (it decodes in Ray's
read tasks, not through a ParallelReader: ``pip install 'parrecio[ray]'``).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["torch", "tf", "keras", "dlpack"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted(list(globals()) + __all__)
