"""parrecio: RecordIO streams to ordered, decoded, batched numpy arrays, using every CPU core."""

from .errors import CorruptRecordError, DecodeError, ParrecioError, PipelineError, SourceError
from .pipeline import ParallelReader, Stats, Tuning
from .recordio import IndexedRecordReader, IRHeader, Record, RecordReader, RecordWriter, pack, unpack

__version__ = "0.1.0"

__all__ = [
    "ParrecioError", "CorruptRecordError", "DecodeError", "SourceError", "PipelineError",
    "__version__",
    "ParallelReader", "Stats", "Tuning",
    "Record", "RecordReader", "RecordWriter", "IndexedRecordReader", "IRHeader", "pack", "unpack",
]
