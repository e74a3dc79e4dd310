"""parrecio: RecordIO streams to ordered, decoded, batched numpy arrays, using every CPU core."""

from typing import TYPE_CHECKING

from ._lazy import lazy_exports
from .errors import CorruptRecordError, DecodeError, ParrecioError, PipelineError, SourceError

if TYPE_CHECKING:
    from .pipeline import ParallelReader, Stats, Tuning
    from .recordio import IndexedRecordReader, IRHeader, Record, RecordReader, RecordWriter, pack, unpack

__version__ = "0.1.0"

__all__ = [
    "ParrecioError", "CorruptRecordError", "DecodeError", "SourceError", "PipelineError",
    "__version__",
    "ParallelReader", "Stats", "Tuning",
    "Record", "RecordReader", "RecordWriter", "IndexedRecordReader", "IRHeader", "pack", "unpack",
]

# Imported on first use, so that a decoder process imports only what it runs (see parrecio._lazy).
__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(["ParallelReader", "Stats", "Tuning"], ".pipeline"),
    **dict.fromkeys(["Record", "RecordReader", "RecordWriter", "IndexedRecordReader", "IRHeader", "pack",
                     "unpack"], ".recordio"),
})
