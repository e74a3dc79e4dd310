"""SageMaker training channels: ``ParallelReader("train")`` inside a SageMaker training container.

```
 <input>/config/inputdataconfig.json   {"train": {"TrainingInputMode": "Pipe", "RecordWrapperType": "RecordIO",
                                                  "S3DistributionType": "FullyReplicated", ...}, ...}
 Pipe mode:  <input>/data/train_0, train_1, ...   one FIFO per epoch, created by SageMaker one after another
             -> PipeChannelSource.streams(e): wait for the job's next FIFO (the one after the last that a
                pass of this process opened: begin_pass), open it (reader process only), one Stream
 File mode:  <input>/data/train/**                the channel's S3 objects, downloaded (or mounted: FastFile)
             -> FileChannelSource: the directory's RecordIO files, recursively, every epoch
```

Where things are: ``<input>`` is ``sm_input_dir``, else ``$SM_INPUT_DIR``, else ``/opt/ml/input``;
``<input>/data`` can be replaced by ``pipe_dir`` and ``<input>/config`` by ``config_dir``.  In File mode the
channel's directory is ``<data>/<channel>``, or ``$SM_CHANNEL_<CHANNEL>`` when that one does not exist.

The multipart convention (``default_join``) follows who framed the records:

- Pipe mode with ``RecordWrapperType: RecordIO``: SageMaker's wrapper framed them -> ``"concat"``.
- Pipe mode with ``RecordWrapperType: None`` (or unset): SageMaker streams the S3 objects back to back, which
  is a valid RecordIO stream only when the objects are ``.rec`` files themselves (SageMaker's documentation:
  "If the input data is already in RecordIO format, you don't need to set this attribute").  Their own
  writer framed them, MXNet's or a fixed-size splitter -> ``"auto"`` (:mod:`parrecio.recordio.joins`).  Raw
  objects cannot be delimited: a ``ContentType`` that says images,
  text or JSON is refused at once, and any stream that does not begin with the RecordIO magic is refused
  when it is opened, both with a :class:`SourceError` that says how to fix the channel.
- File and FastFile mode: the files are the ``.rec`` objects as written -> ``"auto"``.

Without ``inputdataconfig.json`` (a hand-made layout), a ``<data>/<channel>`` directory means File mode and
a ``<data>/<channel>_0`` path means Pipe mode with the RecordIO wrapper.  ``S3DistributionType`` is kept in
``distribution``: with ``ShardedByS3Key`` each host already receives its own share of the data.
"""

from __future__ import annotations

import io
import json
import os
import re
import stat
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ..errors import SourceError
from ..recordio.framing import MAGIC_BYTES
from .base import DEFAULT_FIFO_TIMEOUT, Source, Stream
from .fifo import GONE, MISSING, NO_WRITER, FifoWait, PrefixedRaw as _PrefixedRaw, open_fifo
from .files import FileSource, cwd_shown, list_recordio_files

__all__ = [
    "PipeChannelSource", "FileChannelSource", "channel_source", "looks_like_channel_name",
    "read_input_config", "input_dirs", "DEFAULT_INPUT_DIR", "INPUT_CONFIG_FILE",
]

DEFAULT_INPUT_DIR = "/opt/ml/input"
INPUT_CONFIG_FILE = "inputdataconfig.json"
_CHANNEL_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}\Z")  # SageMaker's ChannelName pattern
_RAW_CONTENT_TYPES = ("image/", "application/x-image", "text/", "application/json", "application/jsonlines")
_EXPLAIN = {  # what SageMaker does, beside what a wait is for
    MISSING: "SageMaker creates it when the epoch starts, once the previous epoch's FIFO was read to its end",
    NO_WRITER: "SageMaker opens it when it starts streaming the epoch",
}
_FIX_WRAPPER = (
    "set RecordWrapperType to RecordIO on the channel (SageMaker Python SDK: "
    "TrainingInput(..., input_mode='Pipe', record_wrapping='RecordIO'); for an augmented manifest also "
    "s3_data_type='AugmentedManifestFile' and attribute_names=[...]), or give the channel .rec files"
)


def looks_like_channel_name(text: str) -> bool:
    """Whether ``text`` can be a SageMaker channel name (``[A-Za-z0-9._-]``, 1 to 64 characters)."""
    return bool(_CHANNEL_NAME.match(text)) and text not in (".", "..")


def input_dirs(sm_input_dir: Optional[str] = None, pipe_dir: Optional[str] = None,
               config_dir: Optional[str] = None) -> tuple:
    """``(data_dir, config_dir)`` by the rules of the module docstring."""
    root = sm_input_dir or os.environ.get("SM_INPUT_DIR") or DEFAULT_INPUT_DIR
    return (os.fspath(pipe_dir) if pipe_dir else os.path.join(root, "data"),
            os.fspath(config_dir) if config_dir else os.path.join(root, "config"))


def read_input_config(config_dir: str) -> Optional[Dict[str, Any]]:
    """The parsed ``inputdataconfig.json`` of ``config_dir``, or ``None`` if there is none."""
    path = os.path.join(config_dir, INPUT_CONFIG_FILE)
    try:
        with open(path, "rb") as f:
            config = json.loads(f.read())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise SourceError(f"cannot read the SageMaker input config {path}: {exc}") from exc
    if not isinstance(config, dict) or not all(isinstance(v, dict) for v in config.values()):
        raise SourceError(f"the SageMaker input config {path} is not an object of channel objects")
    return config


def channel_source(channel: str, *, sm_input_dir: Optional[str] = None, pipe_dir: Optional[str] = None,
                   config_dir: Optional[str] = None, fifo_timeout: float = DEFAULT_FIFO_TIMEOUT) -> Source:
    """The source of SageMaker channel ``channel`` (see the module docstring).  Call in the consumer."""
    data_dir, config_dir = input_dirs(sm_input_dir, pipe_dir, config_dir)
    config_path = os.path.join(config_dir, INPUT_CONFIG_FILE)
    taken_as = f"{channel!r} is not an existing path (cwd {cwd_shown()}), so it was taken as a SageMaker channel"
    config = read_input_config(config_dir)
    channel_dir = os.path.join(data_dir, channel)
    if config is None:
        if os.path.isdir(channel_dir):
            return FileChannelSource(channel, channel_dir, {"TrainingInputMode": "File"})
        if os.path.lexists(os.path.join(data_dir, f"{channel}_0")):
            assumed = {"TrainingInputMode": "Pipe", "RecordWrapperType": "RecordIO"}
            return PipeChannelSource(channel, data_dir, assumed, fifo_timeout=fifo_timeout)
        raise SourceError(
            f"{taken_as}, but there is no SageMaker input config {config_path}, no directory {channel_dir} "
            f"(File mode) and no FIFO {channel_dir}_0 (Pipe mode)"
        )
    if channel not in config:
        known = ", ".join(repr(c) for c in sorted(config)) or "none"
        raise SourceError(f"{taken_as}, but the SageMaker input config {config_path} has no channel "
                          f"{channel!r}; its channels: {known}")
    settings = config[channel]
    mode = settings.get("TrainingInputMode") or ("File" if os.path.isdir(channel_dir) else "Pipe")
    if mode in ("File", "FastFile"):
        return FileChannelSource(channel, _file_mode_dir(channel, channel_dir), settings)
    if mode == "Pipe":
        return PipeChannelSource(channel, data_dir, settings, fifo_timeout=fifo_timeout)
    raise SourceError(f"SageMaker channel {channel!r}: unknown TrainingInputMode {mode!r} in {config_path} "
                      f"(expected File, FastFile or Pipe)")


def _file_mode_dir(channel: str, channel_dir: str) -> str:
    if os.path.isdir(channel_dir):
        return channel_dir
    upper = channel.upper()
    for var in dict.fromkeys([f"SM_CHANNEL_{upper}", "SM_CHANNEL_" + re.sub(r"[^A-Z0-9]", "_", upper)]):
        env_dir = os.environ.get(var)
        if env_dir and os.path.isdir(env_dir):
            return env_dir
    raise SourceError(f"SageMaker channel {channel!r} is in File mode but its directory {channel_dir} does "
                      f"not exist (nor does $SM_CHANNEL_{channel.upper()})")


class FileChannelSource(FileSource):
    """A SageMaker channel in File or FastFile mode: its directory's RecordIO files, recursively, every epoch.

    The directory rule is :func:`parrecio.sources.files.list_recordio_files` with ``recursive=True``: the
    ``*.rec`` files anywhere under the directory, in the order of their relative paths (the order in which
    S3 lists the keys that SageMaker mirrored there); if there are none, every regular non-hidden file except
    ``*.idx``/``*.lst``.  Hidden files and directories are skipped.
    """

    def __init__(self, channel: str, directory: str, settings: Dict[str, Any]) -> None:
        files = list_recordio_files(directory, recursive=True)
        if not files:
            raise SourceError(f"SageMaker channel {channel!r} (File mode): directory {directory} has no files "
                              f"(looked for *.rec, then any regular non-hidden file, recursively)")
        super().__init__(files, name=channel, default_join="auto", kind="sagemaker-file")
        self.channel = channel
        self.directory = directory
        self.settings = dict(settings)
        self.distribution = settings.get("S3DistributionType")


# FIFOs of each Pipe-mode channel, (data dir, channel), that passes of this process have opened: the job's
# numbering (PipeChannelSource.begin_pass), shared by every reader of the channel in the process.
_FIFOS_TAKEN: Dict[Tuple[str, str], int] = {}
# FIFOs that passes of this process read now, by channel and by source: a second reader of the channel
# whose pass starts meanwhile takes the next one (it waited on the FIFO the first one's reader process
# held, and timed out once that one was served and removed).
_FIFOS_CLAIMED: Dict[Tuple[str, str], Dict[int, int]] = {}


class PipeChannelSource(Source):
    """A SageMaker channel in Pipe mode: a pass reads the job's next FIFO ``<data>/<channel>_<n>``
    (:meth:`begin_pass`; ``n`` is epoch ``e`` without it, as ``parrecio bench`` and a source used alone read it).

    :meth:`streams` opens it (in the reader process only) with :func:`parrecio.sources.fifo.open_fifo`,
    waiting up to ``fifo_timeout`` seconds in all for it to appear, for a writer, and for another process
    that has it open for reading to let go (two readers would split its bytes); each wait is said in a
    WARNING after 2 s and every 60 s after that.  At ``fifo_timeout`` it raises a :class:`SourceError`
    naming the reason; once a writer is there, a stalled stream is not an error.  It yields the FIFO as the
    epoch's one stream.
    """

    kind = "sagemaker-pipe"

    def __init__(self, channel: str, data_dir: str, settings: Dict[str, Any], *,
                 fifo_timeout: float = DEFAULT_FIFO_TIMEOUT) -> None:
        self.name = channel
        self.channel = channel
        self.data_dir = data_dir
        self.settings = dict(settings)
        self._fifo_of: Dict[int, int] = {}  # epoch -> the FIFO number its pass reads (begin_pass)
        self.fifo_timeout = float(fifo_timeout)
        self.distribution = settings.get("S3DistributionType")
        wrapper = settings.get("RecordWrapperType") or "None"  # SageMaker's default is None
        self.wrapped = str(wrapper).lower() == "recordio"
        self.default_join = "concat" if self.wrapped else "auto"
        if not self.wrapped:
            content_type = str(settings.get("ContentType") or "").lower()
            if content_type.startswith(_RAW_CONTENT_TYPES):
                raise SourceError(
                    f"SageMaker channel {channel!r} is in Pipe mode with RecordWrapperType {wrapper} and "
                    f"ContentType {settings.get('ContentType')!r}: SageMaker streams the S3 objects back to "
                    f"back without RecordIO framing, so their records cannot be delimited; {_FIX_WRAPPER}"
                )

    def begin_pass(self, epoch: int) -> None:
        """A pass of epoch ``epoch`` starts (in the consumer): it reads the next FIFO of this job.

        SageMaker numbers a job's FIFOs from 0 and serves them in turn, whatever epoch the script counts:
        a job resumed from a checkpoint at epoch 2 (a new job) is served ``train_0`` first.  So a pass
        reads the FIFO after the last one that a pass of this process (any reader of the channel) opened;
        the epoch number orders the samples (shuffle, shards, sample keys), not which FIFO."""
        claimed = _FIFOS_CLAIMED.setdefault(self._key, {})
        claimed.pop(id(self), None)  # (this source's earlier pass, if it never ended: one at a time)
        index = _FIFOS_TAKEN.get(self._key, 0)
        # A pass of ours ended at once may have opened its FIFO before it could say so: then that one is
        # gone (served) and a later one is there.
        later = self._fifos_after(index)
        if later and not os.path.exists(self._path(index)):
            index = later[0]
        while index in claimed.values():
            index += 1
        claimed[id(self)] = index
        self._fifo_of = {epoch: index}

    def end_pass(self, epoch: int, opened: bool) -> None:
        """The pass of epoch ``epoch`` ended; ``opened``: whether it opened its FIFO (one that did not --
        it timed out waiting, or was ended first -- leaves it to the next pass)."""
        _FIFOS_CLAIMED.get(self._key, {}).pop(id(self), None)
        if opened:
            index = self.fifo_index(epoch)
            _FIFOS_TAKEN[self._key] = max(_FIFOS_TAKEN.get(self._key, 0), index + 1)

    def release(self) -> None:
        _FIFOS_CLAIMED.get(self._key, {}).pop(id(self), None)
        super().release()

    @property
    def _key(self) -> Tuple[str, str]:
        return (os.path.abspath(self.data_dir), self.channel)

    def fifo_index(self, epoch: int) -> int:
        """The number of the FIFO that epoch ``epoch`` is read from (see :meth:`begin_pass`)."""
        return self._fifo_of.get(epoch, epoch)

    def fifo_path(self, epoch: int) -> str:
        return self._path(self.fifo_index(epoch))

    def _path(self, index: int) -> str:
        return os.path.join(self.data_dir, f"{self.channel}_{index}")

    def streams(self, epoch: int) -> Iterator[Stream]:
        self.check_epoch(epoch)
        path = self.fifo_path(epoch)
        wait = FifoWait(f"epoch {epoch} of SageMaker channel {self.channel!r} (Pipe mode)", self.fifo_timeout,
                        timeout_error=lambda *why: self._timeout_error(epoch, path, *why),
                        explain=_EXPLAIN, hint=lambda: self._later_fifo_hint(epoch))
        file = open_fifo(path, wait, appear=True)  # never blocks in open(); says what it waits for
        name = f"{self.channel}_{self.fifo_index(epoch)} (FIFO {path})"
        if not self.wrapped:
            file = _expect_recordio(file, name, self.channel)
        yield Stream(name, file)

    def _timeout_error(self, epoch: int, path: str, kind: str, who: str, hint: str) -> SourceError:
        """The SourceError of epoch ``epoch``'s FIFO not ready within ``fifo_timeout``, by reason."""
        head = f"SageMaker channel {self.channel!r} (Pipe mode): the FIFO of epoch {epoch}, {path},"
        split = ("two readers of one FIFO split its bytes between them, each getting part of the records "
                 "without an error. Read a channel in one process only (give other processes channels of "
                 "their own)")
        if kind == MISSING:
            return SourceError(self._missing_message(epoch, path) + (f"; {hint}" if hint else ""))
        if kind == GONE:
            return SourceError(f"{head} was read by another process ({who}): it had it open for reading until "
                               f"it was removed, and no FIFO of that name appeared again within "
                               f"{self.fifo_timeout:g} s (fifo_timeout). This process did not open it: {split}")
        if kind == NO_WRITER:
            return SourceError(f"{head} exists but no writer opened it within {self.fifo_timeout:g} s "
                               f"(SageMaker opens it when it streams the epoch; raise fifo_timeout= if it is "
                               f"just slow)")
        return SourceError(f"{head} was held open for reading by another process ({who}) for "
                           f"{self.fifo_timeout:g} s (fifo_timeout), so it was not opened: {split}, or end the "
                           f"other process first")

    def _missing_message(self, epoch: int, path: str) -> str:
        return (f"SageMaker channel {self.channel!r} (Pipe mode): the FIFO of epoch {epoch}, {path}, did not "
                f"appear within {self.fifo_timeout:g} s (SageMaker numbers a job's FIFOs from 0 and creates "
                f"<channel>_<n> after <channel>_<n-1> was read to its end; raise fifo_timeout= if it is "
                f"just slow)")

    def _fifos_after(self, index: int) -> List[int]:
        """The numbers above ``index`` of the channel's FIFOs there now, in order."""
        pattern = re.compile(re.escape(self.channel) + r"_(\d+)\Z")
        try:
            return sorted(int(m.group(1)) for m in map(pattern.match, os.listdir(self.data_dir))
                          if m and int(m.group(1)) > index)
        except OSError:
            return []

    def _later_fifo_hint(self, epoch: int) -> str:
        """A sentence when a later epoch's FIFO is there: this epoch was served already, to someone else."""
        later = self._fifos_after(self.fifo_index(epoch))
        if not later:
            return ""
        return (f"{self._path(later[0])} exists, so epoch {epoch} was probably served already, to another "
                f"process (each epoch's FIFO is served once)")

    def wait_for_fifo(self, epoch: int, on_wait: Optional[Callable[[str, float], None]] = None) -> str:
        """Wait up to ``fifo_timeout`` seconds for epoch ``epoch``'s FIFO to appear; return its path.

        Opens nothing, so it may be called in the consumer too (``parrecio bench`` does, to say what it is
        waiting for).  ``on_wait(path, waited_seconds)`` is called after each check that finds the FIFO
        missing (checks are at most 0.1 s apart).  Raises :class:`SourceError` when the time is up, or when the path
        is a directory.
        """
        path = self.fifo_path(epoch)
        start = time.monotonic()
        deadline = start + self.fifo_timeout
        delay = 0.002
        while True:
            try:
                mode = os.stat(path).st_mode
            except FileNotFoundError:
                mode = None
            if mode is not None:
                if stat.S_ISDIR(mode):
                    raise SourceError(f"SageMaker channel {self.channel!r}: {path} is a directory, not a FIFO")
                return path
            now = time.monotonic()
            if now >= deadline:
                raise SourceError(self._missing_message(epoch, path))
            if on_wait is not None:
                on_wait(path, now - start)
            time.sleep(min(delay, max(0.0, deadline - now)))
            delay = min(delay * 2, 0.1)


def _expect_recordio(file, name: str, channel: str):
    """``file`` unchanged in content, after checking that it starts with the RecordIO magic (or is empty).

    The 4 bytes are read from the unbuffered file below ``file`` (a buffered read could take more, and bytes
    held in a Python buffer are invisible to ``select()``); the result is a ``BufferedReader`` over a
    :class:`_PrefixedRaw` that hands them back first, has the FIFO's ``fileno()`` and tells with ``pending()``
    how many of them are still to come (data that ``select()`` cannot see).
    """
    raw = file.detach() if isinstance(file, io.BufferedIOBase) else file  # nothing was buffered yet
    head = b""
    try:
        while len(head) < len(MAGIC_BYTES):
            got = raw.read(len(MAGIC_BYTES) - len(head))
            if not got:
                break
            head += got
    except BaseException:
        raw.close()
        raise
    if head == MAGIC_BYTES or not head:
        return io.BufferedReader(_PrefixedRaw(head, raw))
    raw.close()
    raise SourceError(
        f"{name}: the stream does not start with the RecordIO magic (first bytes {head.hex()}). SageMaker "
        f"channel {channel!r} is in Pipe mode without RecordWrapperType RecordIO, so SageMaker streams the S3 "
        f"objects back to back and they must be RecordIO (.rec) files themselves; for raw objects (images, "
        f"an augmented manifest's attributes) the records cannot be delimited: {_FIX_WRAPPER}"
    )
