"""The parallel pipeline: reader process -> input ring -> decoder processes -> output slots -> consumer.

Modules, in the order data flows through them: :mod:`.shm` (segments), :mod:`.messages` (what crosses
process boundaries), :mod:`.reader_proc` + :mod:`.ring` (the reader process), :mod:`.worker` +
:mod:`.pool` (decoder processes), :mod:`.slots` (output memory lent to the user), :mod:`.run` (one pass:
dispatch, reorder, liveness), :mod:`.batching`, :mod:`.parallel_reader` (the public class).

The exports are lazy (:mod:`parrecio._lazy`): a decoder or reader process imports only its own modules.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .parallel_reader import ParallelReader, State
    from .stats import Stats
    from .tuning import Tuning

__all__ = ["ParallelReader", "Stats", "State", "Tuning"]

__getattr__, __dir__ = lazy_exports(__name__, {"ParallelReader": ".parallel_reader", "State": ".parallel_reader",
                                               "Stats": ".stats", "Tuning": ".tuning"})
