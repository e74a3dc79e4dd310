"""Sources: files, directories, globs, FIFOs, stdin, file objects, SageMaker channels and ``s3://`` URLs as
RecordIO streams.

:func:`resolve` turns the ``channel`` a user gives into a :class:`Source`; the reader process calls
:meth:`Source.streams` once per epoch and reads each :class:`Stream` to its end.  The SageMaker helpers
themselves -- the manifest reader, the RecordIO-wrapper writer, the Pipe-mode emulator -- are tools, in
:mod:`parrecio.tools` and :mod:`parrecio.recordio.wrapper`.

The exports are lazy (:mod:`parrecio._lazy`): the reader process imports only the source it reads.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .base import DEFAULT_FIFO_TIMEOUT, Source, Stream
    from .fds import FdCarrier, FdSource, PumpSource, StdinSource, fileobj_source
    from .files import FileSource, expand_patterns, list_recordio_files
    from .sagemaker import FileChannelSource, PipeChannelSource, channel_source, read_input_config
    from .resolver import open_indexed, read_groups, resolve
    from .s3 import S3Index, S3Source

__all__ = [
    "resolve", "open_indexed", "read_groups", "Source", "Stream", "DEFAULT_FIFO_TIMEOUT", "S3Source", "S3Index",
    "FileSource", "FdSource", "StdinSource", "PumpSource", "FdCarrier", "fileobj_source",
    "FileChannelSource", "PipeChannelSource", "channel_source", "read_input_config",
    "expand_patterns", "list_recordio_files",
]

__getattr__, __dir__ = lazy_exports(__name__, {
    **dict.fromkeys(["DEFAULT_FIFO_TIMEOUT", "Source", "Stream"], ".base"),
    **dict.fromkeys(["FdCarrier", "FdSource", "PumpSource", "StdinSource", "fileobj_source"], ".fds"),
    **dict.fromkeys(["FileSource", "expand_patterns", "list_recordio_files"], ".files"),
    **dict.fromkeys(["FileChannelSource", "PipeChannelSource", "channel_source", "read_input_config"], ".sagemaker"),
    **dict.fromkeys(["open_indexed", "read_groups", "resolve"], ".resolver"),
    **dict.fromkeys(["S3Index", "S3Source"], ".s3"),
})
