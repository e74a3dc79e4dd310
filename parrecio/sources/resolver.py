"""``resolve(channel)``: what the user gives -> the Source that reads it (files, stdin, file objects,
SageMaker channels).  Kept apart from :mod:`parrecio.sources.base`, which the concrete sources build on, so
that the imports run one way: base <- fds, files, sagemaker <- resolver."""

from __future__ import annotations

import os
from typing import Any, Optional

from ..errors import SourceError
from . import fds, files, sagemaker
from .base import DEFAULT_FIFO_TIMEOUT, Source

__all__ = ["resolve"]


def resolve(
    channel: Any,
    *,
    sm_input_dir: Optional[str] = None,
    pipe_dir: Optional[str] = None,
    config_dir: Optional[str] = None,
    fifo_timeout: float = DEFAULT_FIFO_TIMEOUT,
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
      ``fifo_timeout``.

    Raises :class:`SourceError` naming what was looked for when nothing matches.
    """
    if isinstance(channel, Source):
        return channel
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
