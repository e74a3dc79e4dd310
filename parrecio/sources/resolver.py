"""``resolve(channel)``: what the user gives -> the Source that reads it (files, stdin, file objects,
SageMaker channels, ``s3://`` URLs); and, for indexed reading, the reader of a ``(rec, idx)`` pair of a
source (:func:`open_indexed`) and the groups of an epoch's order read through such readers
(:func:`read_groups`).  Kept apart from :mod:`parrecio.sources.base`, which the concrete sources build on,
so that the imports run one way: base <- fds, files, sagemaker, s3 <- resolver."""

from __future__ import annotations

import collections
import os
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from ..errors import CorruptRecordError, SourceError
from . import fds, files, s3, sagemaker
from .base import DEFAULT_FIFO_TIMEOUT, Source

__all__ = ["resolve", "open_indexed", "read_groups"]


def resolve(
    channel: Any,
    *,
    sm_input_dir: Optional[str] = None,
    pipe_dir: Optional[str] = None,
    config_dir: Optional[str] = None,
    fifo_timeout: float = DEFAULT_FIFO_TIMEOUT,
    storage_options: Optional[dict] = None,
) -> Source:
    """Turn the user's ``channel`` into a :class:`Source`.  Call in the consumer process.

    ``channel`` may be:

    - a :class:`Source`: returned as it is;
    - ``"-"``: standard input (file descriptor 0, duplicated now; one epoch only);
    - an open binary file object: read from its current position (one epoch only);
    - a path (``str``, ``bytes`` or ``os.PathLike``) to a file or a FIFO; a directory (its ``*.rec`` files
      in name order; if it has none, every regular non-hidden file except ``*.idx``/``*.lst``; not
      recursive); a glob pattern (``**`` allowed, matches in sorted order, directories expanded as above);
      or a list/tuple of those, concatenated in the given order;
    - a SageMaker channel name (a string that is not an existing path and is made of ``[A-Za-z0-9._-]``):
      see :mod:`parrecio.sources.sagemaker` for ``sm_input_dir``, ``pipe_dir``, ``config_dir`` and
      ``fifo_timeout``;
    - an ``s3://bucket/prefix/`` URL (the objects under it, in key order, by the directory rule),
      ``s3://bucket/key`` (that object), or a list of such URLs: see :mod:`parrecio.sources.s3` (needs
      boto3) for ``storage_options``, the explicit settings of the connection.

    Raises :class:`SourceError` naming what was looked for when nothing matches.
    """
    if isinstance(channel, Source):
        return channel
    if s3.is_s3_url(channel) or (isinstance(channel, (list, tuple)) and channel
                                 and all(s3.is_s3_url(c) for c in channel)):
        urls = [channel] if isinstance(channel, str) else list(channel)
        return s3.S3Source.from_urls(urls, storage_options=storage_options)
    if storage_options is not None:
        raise ValueError("storage_options applies to s3:// channels only; this channel is "
                         f"{channel!r}")
    if isinstance(channel, (list, tuple)) and any(s3.is_s3_url(c) for c in channel):
        raise SourceError(f"a channel list mixes s3:// URLs and other channels ({channel!r}): give only "
                          f"s3:// URLs, or only paths")
    if isinstance(channel, str) and channel == "-":
        return fds.StdinSource()
    if hasattr(channel, "read") and not isinstance(channel, (str, bytes, os.PathLike)):
        return fds.fileobj_source(channel)
    if isinstance(channel, (list, tuple)):
        return files.FileSource.from_patterns(channel)
    if not isinstance(channel, (str, bytes, os.PathLike)):
        raise SourceError(
            f"unsupported channel {channel!r} ({type(channel).__name__}): expected a path, a glob, a list of "
            f"paths, '-', an open binary file object or a SageMaker channel name"
        )
    path = os.fsdecode(channel)
    if (
        isinstance(channel, str)
        and not os.path.lexists(path)
        and sagemaker.looks_like_channel_name(path)
    ):
        return sagemaker.channel_source(
            path, sm_input_dir=sm_input_dir, pipe_dir=pipe_dir, config_dir=config_dir,
            fifo_timeout=fifo_timeout,
        )
    return files.FileSource.from_patterns([path], name=path)


def open_indexed(source: Any, rec: Any, idx: Any, *, join: str, max_record_bytes: int) -> Any:
    """The reader of the records of ``rec`` by the offsets of its index ``idx`` (a pair of the
    pipeline's ``index_paths``): the source's own when it has one (``s3://`` objects: ranged GETs),
    else an :class:`~parrecio.recordio.IndexedRecordReader` of the local file.  Either has ``offsets``,
    ``read_at(offset)`` and ``close()``."""
    opener = getattr(source, "open_indexed", None)
    if opener is not None:
        return opener(rec, idx, join=join, max_record_bytes=max_record_bytes)
    from ..recordio import IndexedRecordReader
    return IndexedRecordReader(rec, idx, join=join, max_record_bytes=max_record_bytes)


def read_groups(readers: Sequence[Any], offsets: Sequence[Sequence[int]], nf: int,
                order: Sequence[Tuple[int, int]]) -> Iterator[Tuple[int, List[int], Any]]:
    """``(stream_id, offsets of the group, payloads)`` for each ``(stream_id, group)`` of ``order``, in
    that order; ``payloads`` is the list of the group's ``nf`` payloads, or the
    :class:`CorruptRecordError` that reading it raised (any other error is raised where its group is).

    Readers of local files are read one group after the other, here.  Readers with a ``read_ahead``
    (``s3://`` objects, whose random reads are bound by latency) get that many groups of the order
    requested ahead on their ``executor``, up to about 64 MiB of spans in flight (always one group);
    what is requested and not yet taken when the generator is closed is cancelled."""
    ahead = max((getattr(r, "read_ahead", 0) for r in readers), default=0)
    if ahead <= 1:
        for stream_id, g in order:
            offs = list(offsets[stream_id][g * nf:(g + 1) * nf])
            yield stream_id, offs, _read_group(readers[stream_id], offs)
        return
    executor = readers[0].executor
    budget = getattr(readers[0], "inflight_bytes", 64 << 20)
    inflight: "collections.deque" = collections.deque()
    nbytes = 0
    todo = iter(order)
    try:
        while True:
            while len(inflight) < ahead and (not inflight or nbytes < budget):
                item = next(todo, None)
                if item is None:
                    break
                stream_id, g = item
                r = readers[stream_id]
                offs = list(offsets[stream_id][g * nf:(g + 1) * nf])
                size = sum(r.span(o) for o in offs)
                inflight.append((stream_id, offs, size, executor.submit(_read_group, r, offs)))
                nbytes += size
            if not inflight:
                return
            stream_id, offs, size, fut = inflight.popleft()
            nbytes -= size
            yield stream_id, offs, fut.result()
    finally:
        for *_, fut in inflight:
            fut.cancel()


def _read_group(reader: Any, offs: List[int]) -> Any:
    try:
        return [reader.read_at(o) for o in offs]
    except CorruptRecordError as exc:
        return exc
