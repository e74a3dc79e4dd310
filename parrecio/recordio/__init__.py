"""RecordIO: the framing of MXNet/dmlc-core ``.rec`` files and SageMaker Pipe-mode RecordIO streams.

Layers, bottom up:

- :mod:`.framing` -- the format (magic ``0xCED7230A``, the lrec word, cflags), the one implementation of
  frame validation and part joining (:func:`~.framing.read_record`), the writer's split rule and resync.
- :mod:`.reader` -- :class:`RecordReader`, streaming over files, pipes, sockets, with a zero-copy fast path.
- :mod:`.writer` -- :class:`RecordWriter`, byte-identical to MXNet's ``MXRecordIO``/``MXIndexedRecordIO``.
- :mod:`.index` -- :class:`IndexedRecordReader`, random access through an ``.idx`` file.
- :mod:`.irheader` -- :class:`IRHeader`, :func:`pack`, :func:`unpack` of MXNet image records.
"""

from .framing import DEFAULT_MAX_RECORD_BYTES, MAGIC
from .index import IndexedRecordReader, read_index
from .irheader import IR_SIZE, IRHeader, pack, unpack
from .reader import DEFAULT_CHUNK_SIZE, Record, RecordReader
from .writer import RecordWriter

__all__ = [
    "MAGIC", "DEFAULT_MAX_RECORD_BYTES", "DEFAULT_CHUNK_SIZE",
    "Record", "RecordReader", "RecordWriter", "IndexedRecordReader", "read_index",
    "IRHeader", "IR_SIZE", "pack", "unpack",
]
