"""Sources: files, directories, globs, FIFOs, stdin, file objects and SageMaker channels as RecordIO streams.

:func:`resolve` turns the ``channel`` a user gives into a :class:`Source`; the reader process calls
:meth:`Source.streams` once per epoch and reads each :class:`Stream` to its end.  The SageMaker helpers
(:func:`iter_manifest_records`, :func:`write_sagemaker_recordio`, :func:`serve_pipe_channel`) also serve
local Pipe-mode emulation (``parrecio pipe-serve``) and packing.
"""

from .base import DEFAULT_FIFO_TIMEOUT, Source, Stream
from .emulate import EpochRecords, serve_pipe_channel, write_channel_config
from .fds import FdCarrier, FdSource, PumpSource, StdinSource, fileobj_source
from .files import FileSource, expand_patterns, list_recordio_files
from .manifest import iter_manifest_records, line_records, parse_attribute_names, read_manifest_lines
from .sagemaker import FileChannelSource, PipeChannelSource, channel_source, read_input_config
from .wrapper import encode_sagemaker_record, write_sagemaker_recordio
from .resolver import resolve

__all__ = [
    "resolve", "Source", "Stream", "DEFAULT_FIFO_TIMEOUT",
    "FileSource", "FdSource", "StdinSource", "PumpSource", "FdCarrier", "fileobj_source",
    "FileChannelSource", "PipeChannelSource", "channel_source", "read_input_config",
    "expand_patterns", "list_recordio_files",
    "iter_manifest_records", "line_records", "read_manifest_lines", "parse_attribute_names",
    "encode_sagemaker_record", "write_sagemaker_recordio",
    "serve_pipe_channel", "write_channel_config", "EpochRecords",
]
