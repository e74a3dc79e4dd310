"""parrecio: RecordIO streams to ordered, decoded, batched numpy arrays, using every CPU core."""

from .errors import CorruptRecordError, DecodeError, ParrecioError, PipelineError, SourceError

__version__ = "0.1.0"

__all__ = [
    "ParrecioError", "CorruptRecordError", "DecodeError", "SourceError", "PipelineError",
    "__version__",
]
