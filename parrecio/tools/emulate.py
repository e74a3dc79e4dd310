"""Local emulation of a SageMaker Pipe-mode channel: test a training script without SageMaker.

```
 serve_pipe_channel(root, "train", ["train.manifest"], epochs=3, ...)
   1. root/config/inputdataconfig.json   {"train": {"TrainingInputMode": "Pipe", "RecordWrapperType": "RecordIO"}}
      root/config/resourceconfig.json    (one host, unless one is there already)
   2. for epoch e = 0, 1, ...:  mkfifo root/data/train_<e>
                                open it for writing      (blocks until the script opens it)
                                write the epoch's records in SageMaker wrapper framing
                                close, remove the FIFO   (the script sees the end of the epoch)
```

The records of an epoch come from the sources in order: a ``.rec`` file gives its records (read with
:class:`~parrecio.recordio.RecordReader`, ``join="auto"``, and re-framed by SageMaker's wrapper), an
augmented manifest (``*.manifest``/``*.jsonl``) gives ``len(attribute_names)`` records per line (see
:mod:`parrecio.tools.manifest`).  With ``shuffle`` the *items* (a manifest line with its records, or one
``.rec`` record) are permuted with ``random.Random(seed + epoch)``, like SageMaker's ``ShuffleConfig``
reshuffles every Pipe-mode epoch; ``.rec`` records are then read by offset, so nothing is held in memory
but the offsets.  ``split_bytes`` splits larger records into concat parts (cflags 1/2/3).

A reader that closes its end early ends that epoch (as in SageMaker); the next epoch is served next.  The
FIFO being served is removed however the function ends (an exception, ``KeyboardInterrupt``); the config
stays, so a script started later still finds the channel (and waits for its FIFO).
"""

from __future__ import annotations

import fcntl
import json
import os
import random
import stat
import threading
from typing import Any, Callable, Generator, Iterator, List, Optional, Sequence, Tuple

from ..errors import SourceError
from ..recordio import RecordReader
from ..recordio.framing import MAGIC_BYTES, check_join
from ..recordio.index import indexed_count
from ..recordio.wrapper import telling_split
from ..sources.files import expand_patterns
from ..sources.sagemaker import INPUT_CONFIG_FILE, looks_like_channel_name
from .epoch_writer import EpochWriter
from .inspect import head_of, not_recordio, records_after_damage
from .manifest import check_manifest, is_manifest_path, iter_manifest_records, line_records, read_manifest_lines

__all__ = ["serve_pipe_channel", "write_channel_config", "EpochRecords"]


class EpochRecords:
    """The record sequence of each epoch of a set of sources (``.rec`` files and augmented manifests).

    Built once (it checks the sources, and with ``shuffle`` indexes the items); :meth:`records` then yields
    the payloads of epoch ``e``.
    """

    def __init__(self, sources: Sequence[str], *, attribute_names: Optional[Sequence[str]] = None,
                 shuffle: bool = False, seed: int = 0, join: str = "auto") -> None:
        self.join = check_join(join)  # how a .rec source's multipart records are read (RecordReader's join)
        self.paths = expand_patterns(sources)
        self.attribute_names = list(attribute_names or [])
        manifests = [p for p in self.paths if is_manifest_path(p)]
        if manifests and not self.attribute_names:
            raise SourceError(f"augmented manifest {manifests[0]} needs attribute names (AttributeNames), "
                              f"e.g. source-ref,bounding-box")
        self.shuffle = shuffle
        self.seed = int(seed)
        self._items: Optional[List[Tuple]] = self._index() if shuffle else None

    def check(self) -> None:
        """SourceError now for what would fail in an epoch: a manifest line that does not parse or names a
        file that cannot be read, a ``.rec`` source that does not start with an intact RecordIO record (the
        reader would wait for its stream, then see it cut short, the cause only on this side's stderr): no
        RecordIO at all, or a damaged start that records follow (its records are framed again, and the
        damage would end the epoch)."""
        for path in self.paths:
            if is_manifest_path(path):
                check_manifest(path, self.attribute_names)
                continue
            head = head_of(path, 4)
            if head is None:
                raise SourceError(f"{path}: cannot read it (no such file, or not a regular file)")
            if head and not head.startswith(MAGIC_BYTES):
                size = os.path.getsize(path)
                found = records_after_damage(path, size)
                if found is None:
                    raise not_recordio(path, head_of(path) or head, size)
                raise SourceError(f"{path}: the file's start is damaged, but RecordIO records follow (a frame head "
                                  f"at byte offset {found}); pipe-serve serves whole records: 'parrecio inspect' "
                                  f"lists the damaged regions")

    def count(self) -> Optional[int]:
        """Records per epoch, where that is cheap to know: ``None`` for a ``.rec`` file without an index.

        Shuffled sources were indexed already; a manifest line is ``len(attribute_names)`` records; a
        ``.rec`` file's records are the lines of its ``.idx`` sidecar (as ``im2rec`` writes it).
        """
        if self._items is not None:
            return sum(len(self.attribute_names) if item[0] == "line" else 1 for item in self._items)
        total = 0
        for path in self.paths:
            if is_manifest_path(path):
                with open(path, "rb") as f:
                    total += len(self.attribute_names) * sum(1 for line in f if line.strip())
                continue
            count = indexed_count(path)
            if count is None:
                return None
            total += count
        return total

    def records(self, epoch: int) -> Iterator[bytes]:
        """The payloads of epoch ``epoch``, in order."""
        if self._items is None:
            for path in self.paths:
                if is_manifest_path(path):
                    yield from iter_manifest_records(path, self.attribute_names)
                else:
                    with RecordReader(path, join=self.join) as reader:
                        for record in reader:
                            yield record.payload
            return
        order = list(range(len(self._items)))
        random.Random(self.seed + epoch).shuffle(order)
        files = {}
        try:
            for i in order:
                item = self._items[i]
                if item[0] == "line":
                    _, path, line = item
                    yield from line_records(line, self.attribute_names, path)
                else:
                    _, path, offset, span, join = item
                    if path not in files:
                        files[path] = open(path, "rb")
                    yield _record_at(files[path], path, offset, span, join)
        finally:
            for f in files.values():
                f.close()

    def _index(self) -> List[Tuple]:
        items: List[Tuple] = []
        for path in self.paths:
            if is_manifest_path(path):
                items.extend(("line", path, line) for line in read_manifest_lines(path))
                continue
            offsets = []
            with RecordReader(path, join=self.join) as reader:
                for offset, _ in reader.iter_views():
                    offsets.append(offset)
                # A record read alone cannot tell "auto" the file's convention: the whole file did (a file
                # without multipart records reads alike either way).
                join = self.join if self.join != "auto" else reader.guess.join or "concat"
            size = os.path.getsize(path)
            ends = offsets[1:] + [size]
            items.extend(("rec", path, a, b - a, join) for a, b in zip(offsets, ends))
        return items


def _record_at(f, path: str, offset: int, span: int, join: str) -> bytes:
    f.seek(offset)
    reader = RecordReader(f, join=join, chunk_size=max(span, 8), source_name=path)
    for record in reader:
        return record.payload
    raise SourceError(f"{path}: no record at byte offset {offset} (was the file changed while serving?)")


def write_channel_config(root: str, channel: str, *, settings: Optional[dict] = None) -> str:
    """Add ``channel`` (Pipe mode, RecordIO wrapper) to ``root/config/inputdataconfig.json``; return its path.

    Other channels already in the file are kept (several ``pipe-serve`` may share a root; a lock file
    serializes their updates).  ``resourceconfig.json`` (one host, ``algo-1``) is written if absent.
    """
    config_dir = os.path.join(root, "config")
    os.makedirs(config_dir, exist_ok=True)
    os.makedirs(os.path.join(root, "data"), exist_ok=True)
    path = os.path.join(config_dir, INPUT_CONFIG_FILE)
    entry = {
        "TrainingInputMode": "Pipe", "RecordWrapperType": "RecordIO",
        "S3DistributionType": "FullyReplicated", "ContentType": "application/x-recordio",
    }
    entry.update(settings or {})
    with open(os.path.join(config_dir, ".parrecio.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        config = {}
        if os.path.exists(path):
            with open(path, "rb") as f:
                try:
                    config = json.loads(f.read())
                except ValueError:
                    config = {}
        config[channel] = entry
        _write_json_atomically(path, config)
        resource = os.path.join(config_dir, "resourceconfig.json")
        if not os.path.exists(resource):
            _write_json_atomically(resource, {"current_host": "algo-1", "hosts": ["algo-1"],
                                              "network_interface_name": "eth0"})
    return path


def _write_json_atomically(path: str, obj) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


def serve_pipe_channel(root: str, channel: str, sources: Sequence[str], *, epochs: int = 1,
                       attribute_names: Optional[Sequence[str]] = None, shuffle: bool = False, seed: int = 0,
                       split_bytes: Optional[int] = None, log: Optional[Callable[[str], None]] = None,
                       stop: Optional[threading.Event] = None,
                       progress: Optional[Callable[[int, Optional[int]], Any]] = None,
                       join: str = "auto") -> None:
    """Serve ``epochs`` epochs of ``sources`` as the Pipe-mode channel ``channel`` under ``root``.

    Blocks until every epoch was written (each waits for a reader).  See the module docstring.  ``join``:
    how the ``.rec`` sources' multipart records are read (:class:`~parrecio.recordio.RecordReader`'s
    ``join``; ``"auto"`` decides per file).  ``stop``,
    when set between epochs, ends the serving early; ``log`` receives progress lines.  ``progress(epoch,
    total)``, when given, makes a progress bar (a context manager with ``update(n)``, as tqdm's) once a
    reader has opened the epoch's FIFO; ``total`` is :meth:`EpochRecords.count`.
    """
    if not looks_like_channel_name(channel):
        raise SourceError(f"bad channel name {channel!r}: SageMaker channel names are [A-Za-z0-9._-]{{1,64}}")
    if epochs < 1:
        raise SourceError(f"epochs must be >= 1, not {epochs}")
    if split_bytes is not None and split_bytes < 1:
        raise SourceError(f"split_bytes must be >= 1, not {split_bytes}")
    plan = EpochRecords(sources, attribute_names=attribute_names, shuffle=shuffle, seed=seed, join=join)
    plan.check()
    total = plan.count() if progress is not None else None
    log = log or (lambda message: None)
    write_channel_config(root, channel)
    with _serving(root, channel):
        for epoch in range(epochs):
            if stop is not None and stop.is_set():
                return
            fifo = os.path.join(root, "data", f"{channel}_{epoch}")
            _make_fifo(fifo)
            try:
                log(f"epoch {epoch}: waiting for a reader on {fifo}")
                bar = None if progress is None else (lambda epoch=epoch: progress(epoch, total))
                nbytes = _serve_epoch(fifo, plan.records(epoch), telling_split(split_bytes), bar)
                log(f"epoch {epoch}: " + (f"wrote {nbytes} bytes" if nbytes >= 0 else "the reader closed early"))
            finally:
                _remove(fifo)


def _serving(root: str, channel: str) -> Any:
    """A lock on ``channel`` under ``root`` for as long as it is served (the system drops it with the
    process): a second server of the channel would remove the first one's FIFO as a stale one, and the
    first waited for a reader for ever."""
    lock = open(os.path.join(root, "config", f".parrecio-{channel}.lock"), "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise SourceError(f"channel {channel!r} under {root} is served already (another pipe-serve): "
                          f"serve each channel once") from None
    return lock  # (its with-block closes it: the lock goes)


def _make_fifo(path: str) -> None:
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None:
        if not stat.S_ISFIFO(mode):
            raise SourceError(f"{path} exists and is not a FIFO: refusing to replace it")
        os.unlink(path)  # a stale FIFO of an interrupted run
    os.mkfifo(path)


def _serve_epoch(fifo: str, records: Generator[bytes, None, None], split_bytes: Optional[int],
                 bar: Optional[Callable[[], Any]] = None) -> int:
    """Write one epoch into ``fifo``; return the bytes written, or -1 if the reader closed early."""
    fd = os.open(fifo, os.O_WRONLY | getattr(os, "O_CLOEXEC", 0))  # blocks until a reader opens the FIFO
    out = EpochWriter(fd)  # (buffered: 1 MiB)
    try:
        if bar is None:
            return out.write_records(records, split_bytes)
        with bar() as shown:
            return out.write_records(_counted(records, shown), split_bytes)
    except BrokenPipeError:
        return -1
    except BaseException:
        # Interrupted (Ctrl-C, SIGTERM): end the epoch inside a frame, so that the reader sees it cut
        # short (a truncated record) instead of an epoch that looks whole (parrecio.tools.epoch_writer).
        try:
            out.cut_short()
        except OSError:
            pass
        raise
    finally:
        records.close()  # a generator: closes the files it holds open
        os.close(fd)


def _counted(records: Iterator[bytes], shown: Any) -> Iterator[bytes]:
    for record in records:
        yield record
        shown.update(1)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
