"""The parallel pipeline: reader process -> input ring -> decoder processes -> output slots -> consumer.

Modules, in the order data flows through them: :mod:`.shm` (segments), :mod:`.messages` (what crosses
process boundaries), :mod:`.reader_proc` + :mod:`.ring` (the reader process), :mod:`.worker` +
:mod:`.pool` (decoder processes), :mod:`.slots` (output memory lent to the user), :mod:`.run` (one pass:
dispatch, reorder, liveness), :mod:`.batching`, :mod:`.parallel_reader` (the public class).
"""

from .parallel_reader import ParallelReader, State
from .stats import Stats
from .tuning import Tuning

__all__ = ["ParallelReader", "Stats", "State", "Tuning"]
