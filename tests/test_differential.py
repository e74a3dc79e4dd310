"""The differential tier: ParallelReader with workers=1..3 returns exactly what workers=0 returns, and
workers=0 returns what a naive reference returns (``tests/differential_reference.py``).

Each example is a :class:`Config` drawn by hypothesis: the data (record sizes from 0 bytes to more than
half the ring, groups of 1-4, multipart records in both joins with the magic inside payloads, damage),
the source (a file, a folder, a FIFO, a file object, an ``s3://`` prefix on moto), the plan (shuffle
off / buffer / index, shards, equal shards, epochs, a resumed epoch) and the delivery (batches,
``drop_last``, Raw / fixed-shape / tuple / image fields, ring, task and slot sizes).  The data is
generated from the Config alone, so a failure is reproduced by its repr::

    PARRECIO_DIFF_REPRO='Config(...)' .venv/bin/python -m pytest tests/test_differential.py -k repro

Compared (workers=0 vs N, exactly): every pass's samples (values, order, batch lengths, column kinds),
the error that ends a pass (type, ``.index``, ``.offset``, ``.source``), ``stats.samples``,
``skipped``, ``skipped_records``, ``len()`` before and after each pass, ``state_dict()``.  Against the
reference: the same, where the README documents it (the shuffle buffer's order is not: multiset).  On
every run with workers: ``stats.reruns == 0``, ``stats.workers_replaced == 0``, output slots within the
bound of ``resources.py``/README ("two batches per task in flight, plus two"; at least one task's and
three batches'), and nothing left behind
(processes, /dev/shm).

Profiles (``PARRECIO_HYPOTHESIS_PROFILE``, registered in ``conftest.py``):

- unset / ``default``: ``PARRECIO_DIFF_EXAMPLES`` (100) examples in four draws of their own
  (``test_differential``: anything, 55; ``_damage``: damage injected, 20; ``_ring``: > 16 MiB through a
  32/64 MiB ring, 10; ``_s3``: an s3:// prefix of 2-4 objects, 15), ``derandomize=True``: the same
  examples on every run (a CI failure is a regression, not a new draw); about a minute on 2 loaded cores.
- ``long``: random exploration, batches of 50 examples (the four foci in turn) until
  ``PARRECIO_DIFF_BUDGET_S`` seconds (600) or ``PARRECIO_DIFF_MAX_EXAMPLES`` examples are done;
  ``PARRECIO_DIFF_SEED`` fixes the first batch's seed.

``PARRECIO_DIFF_RESYNC_RULE=weak`` judges damage inside streamed groups only by "no mixed groups"
(see ``differential_reference.corruption_outcome``); ``PARRECIO_DIFF_LOG=path`` logs each example's time.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import io
import math
import os
import re
import select
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import numpy as np
import pytest
from hypothesis import HealthCheck, given, note, seed as hyp_seed, settings, strategies as st
from hypothesis.control import currently_in_test_context

from parrecio import CorruptRecordError, DecodeError, ParallelReader, PipelineError, Tuning
from parrecio.decoders.base import is_random
from parrecio.pipeline.shm import leftover
from pipeline_helpers import deadline, our_children

import differential_reference as ref

try:
    import boto3  # noqa: F401
    import moto.server  # noqa: F401
    HAVE_S3 = True
except ImportError:  # pragma: no cover - depends on the environment
    HAVE_S3 = False

PROFILE = os.environ.get("PARRECIO_HYPOTHESIS_PROFILE", "default")
BUDGET_S = float(os.environ.get("PARRECIO_DIFF_BUDGET_S", "600"))
EXAMPLE_TIMEOUT_S = 90  # one example (all its readers); a hang fails it instead of the whole run


@dataclass(frozen=True)
class Config:
    """One example: everything the data and the readers are made from (its repr reproduces it)."""

    seed: int                    # the data
    source: str                  # file | folder | fifo | bytesio | openfile | s3
    files: Tuple[int, ...]       # groups per file
    index: bool                  # an .idx beside every file
    group: int                   # records per group
    fields: Tuple[str, ...]      # per position: raw | digest | pair | crop | flip | letterbox | center; ("none",): fields=None
    container: str               # list | dict | single
    sizes: str                   # tiny | small | mixed | bulk (record sizes, see differential_reference._size)
    big: Tuple[int, ...]         # groups with a record of about half the ring or more
    magic: int                   # percent of records with the magic inside
    join: str                    # mxnet | concat
    part: int                    # concat: part size of multipart records
    ring_mib: int
    chunk_groups: Optional[int]
    slot_samples: Optional[int]
    prefetch: int
    shuffle: bool
    shuffle_buffer: int
    reader_seed: int
    num_shards: int
    shard_index: int
    even_shards: Optional[str]
    epochs: Tuple[int, ...]      # one pass per entry (set_epoch when it is not the next one)
    resume_at: Optional[int]     # first pass: state_dict after item 1 + resume_at % (items - 1), resumed anew
    on_error: str
    damage: Tuple[Tuple[int, str, str], ...]  # (group, first|middle|last, magic|cflag|length|lastpart|truncate)
    batch_size: Optional[int]
    drop_last: bool
    workers: int                 # compared with workers=0
    shuffle_buffer_bytes: int = 1 << 30  # (last: the repros written before it still construct)

    def repro(self) -> str:
        return (f"PARRECIO_DIFF_REPRO={repr(self)!r} .venv/bin/python -m pytest "
                f"tests/test_differential.py -k repro")


# -- strategies ---------------------------------------------------------------------------------
def _pick(draw, options):
    """One of ``options`` ((weight, value) pairs), shrinking towards the first."""
    total = sum(w for w, _ in options if w)
    k = draw(st.integers(0, total - 1))
    for w, v in options:
        if not w:
            continue
        if k < w:
            return v
        k -= w
    raise AssertionError


@st.composite
def configs(draw, focus: Optional[str] = None) -> Config:
    """``focus``: None (anything), ``"damage"`` (damage injected), ``"ring"`` (more than 16 MiB through
    a 32 or 64 MiB ring: its early wrap), ``"s3"`` (an s3:// prefix of 2-4 objects, often a 32/64 MiB
    ring, no damage: damage has its own draw)."""
    data_seed = draw(st.integers(0, 1000))
    bulk = focus == "ring" or (focus is None and _pick(draw, [(9, False), (1, True)]))
    if bulk:
        ring_mib, sizes = _pick(draw, [(1, 32), (1, 64)]), "bulk"
    else:
        # 32/64 MiB rings with little data: a stream of several objects (s3) can still pass the early
        # wrap point at 16 MiB, a ring window per object
        big_ring = 4 if focus == "s3" else 1
        ring_mib = _pick(draw, [(3, 1), (2, 2), (1, 3), (2, 4), (big_ring, 32), (2 * big_ring, 64)])
        sizes = _pick(draw, [(3, "small"), (2, "tiny"), (3, "mixed")])
    source = "s3" if focus == "s3" else _pick(draw, [(6, "file"), (4, "folder"), (2, "fifo"), (2, "bytesio"),
                                                      (1, "openfile"), (3 if HAVE_S3 else 0, "s3")])
    if focus == "s3":  # several objects: each is a stream of its own through the ring
        nfiles = _pick(draw, [(2, 3), (1, 4), (1, 2)])
    else:
        nfiles = draw(st.integers(1, 4)) if source in ("folder", "s3") else 1
    index = source in ("file", "folder", "s3") and _pick(draw, [(1, False), (1, True)])
    group = draw(st.integers(1, 4))
    shuffle = _pick(draw, [(2, False), (1, True)])
    image = not bulk and focus != "damage" and _pick(draw, [(6, False), (1, True)])
    others = [(4, "raw"), (4, "digest"), (2, "pair")]
    if image:
        kind = draw(st.sampled_from(ref.IMAGE_KINDS))
        if group == 1 and shuffle and not index and kind in ("crop", "flip"):
            group = 2  # a shuffle buffer's order is checked as a multiset: a random image needs a tag beside it
        fields = (kind,) + tuple(_pick(draw, others) for _ in range(group - 1))
    else:
        fields = tuple(_pick(draw, others) for _ in range(group))
        if group == 1 and _pick(draw, [(4, False), (1, True)]):
            fields = ("none",)
    if fields == ("none",):
        container = "single"
    elif group == 1:
        container = _pick(draw, [(2, "single"), (1, "list"), (1, "dict")])
    else:
        container = _pick(draw, [(2, "list"), (1, "dict")])
    most = 30 if image else {"tiny": 400, "small": 120, "mixed": 25, "bulk": 160 // group}[sizes]
    if source == "s3" and index and sizes != "bulk":
        most = min(most, 40)  # an index shuffle of S3 is a ranged GET per record (moto: ~2 ms each)
    files = tuple(draw(st.integers(10 if bulk else 1 if focus == "damage" and i == 0 else 0, most))
                  for i in range(nfiles))
    total = sum(files)
    big: Tuple[int, ...] = ()
    if sizes in ("small", "mixed") and not image and total and _pick(draw, [(3, False), (1, True)]):
        big = tuple(sorted(set(draw(st.lists(st.integers(0, total - 1), min_size=1, max_size=2)))))
    magic = _pick(draw, [(2, 0), (2, 10), (1, 60)])
    join = _pick(draw, [(1, "mxnet"), (2 if focus == "s3" else 1, "concat")])  # s3: often SageMaker-wrapped
    part = 0
    if join == "concat":  # tiny parts for small records only: a 200 KiB record in 4-byte parts is 50k frames
        # (and a big record of half a 64 MiB ring, 8 million: one example took 111 s on two loaded cores)
        part = _pick(draw, [(1, 1000), (1, 4), (1, 97), (1, 65536)] if sizes in ("tiny", "small") and not big else
                     [(1, 65536), (1, 4096), (1, 100_003)])
    chunk_groups = _pick(draw, [(3, None), (1, 1), (1, 3), (1, 17), (1, 256)])
    slot_samples = _pick(draw, [(3, None), (1, 1), (1, 5), (1, 64)])
    prefetch = _pick(draw, [(3, 2), (1, 1), (1, 3)])
    shuffle_buffer = _pick(draw, [(1, 16), (1, 1), (1, 3), (1, 128), (1, 4096)]) if shuffle else 1024
    reader_seed = draw(st.integers(0, 3))
    num_shards = _pick(draw, [(3, 1), (1, 2), (1, 3), (1, 4)])
    shard_index = draw(st.integers(0, num_shards - 1))
    even_shards = _pick(draw, [(2, None), (1, "pad"), (1, "drop")])
    once = source in ("bytesio", "openfile")  # an open file object is read once: epoch 0 only
    e0 = 0 if once else draw(st.integers(0, 3))
    more = None if once else _pick(draw, [(1, None), (1, "next"), (1, "set")])
    epochs = (e0,) if more is None else (e0, e0 + 1) if more == "next" else (e0, draw(st.integers(0, 5)))
    on_error = _pick(draw, [(1, "raise"), (1, "skip")])
    damage: Tuple = ()
    if total and not bulk and not image and focus != "s3" and (
            focus == "damage" or _pick(draw, [(2, False), (1, True)])):
        damage = tuple(draw(st.lists(st.tuples(
            st.integers(0, total - 1), st.sampled_from(["first", "middle", "last"]),
            st.sampled_from(["magic", "cflag", "length", "lastpart", "truncate"])), min_size=1, max_size=3)))
    resume_at = None
    if not damage and _pick(draw, [(3, False), (1, True)]):
        resume_at = draw(st.integers(0, 1000))
    batch_size = _pick(draw, [(2, None), (1, 1), (1, 7), (1, 64)])
    drop_last = draw(st.booleans()) if batch_size else False
    workers = draw(st.integers(1, 3))
    # a byte bound that holds fewer groups than shuffle_buffer (the window below stays an upper bound)
    shuffle_buffer_bytes = _pick(draw, [(3, 1 << 30), (1, 1), (1, 5000), (1, 200_000)]) if shuffle else 1 << 30
    return Config(data_seed, source, files, index, group, fields, container, sizes, big, magic, join, part,
                  ring_mib, chunk_groups, slot_samples, prefetch, shuffle, shuffle_buffer, reader_seed,
                  num_shards, shard_index, even_shards, epochs, resume_at, on_error, damage, batch_size,
                  drop_last, workers, shuffle_buffer_bytes)


# -- sources --------------------------------------------------------------------------------------
_MOTO: dict = {}


def _moto_endpoint() -> str:
    if "url" not in _MOTO:
        import logging
        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        server = moto.server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        _MOTO.update(server=server, url=f"http://{host}:{port}")
    return _MOTO["url"]


@pytest.fixture(scope="module", autouse=True)
def _stop_moto():
    yield
    if "server" in _MOTO:
        _MOTO.pop("server").stop()
        _MOTO.clear()


@contextlib.contextmanager
def _aws_env(url: str):
    """The standard AWS configuration pointing at moto, for as long as the example runs (the reader
    takes the consumer's environment when it is made)."""
    saved = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
    for k in saved:
        del os.environ[k]
    os.environ.update(AWS_ENDPOINT_URL=url, AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing",
                      AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=os.devnull,
                      AWS_SHARED_CREDENTIALS_FILE=os.devnull)
    try:
        yield
    finally:
        for k in [k for k in os.environ if k.startswith("AWS_")]:
            del os.environ[k]
        os.environ.update(saved)


class _FifoFeeder(threading.Thread):
    """Writes ``data`` into the FIFO ``path`` once a reader opens it (one pass); stops on request."""

    def __init__(self, path: str, data: bytes) -> None:
        super().__init__(daemon=True)
        self.path, self.data = path, data
        self.stopping = threading.Event()
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        fd = None
        try:
            while fd is None and not self.stopping.is_set():
                try:
                    fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
                except OSError as exc:
                    if exc.errno != errno.ENXIO:  # no reader yet
                        raise
                    time.sleep(0.002)
            view = memoryview(self.data)
            writable = select.poll()  # (not select.select: a long run's descriptors may number over 1024)
            if fd is not None:
                writable.register(fd, select.POLLOUT)
            while fd is not None and view and not self.stopping.is_set():
                try:
                    view = view[os.write(fd, view[:1 << 20]):]
                except BlockingIOError:
                    writable.poll(50)
                except BrokenPipeError:  # the pass ended before the stream did (an error, a break)
                    break
        except BaseException as exc:  # pragma: no cover - reported by the test
            self.error = exc
        finally:
            if fd is not None:
                os.close(fd)


class Materialized:
    """The configuration's source on disk (or moto): a new channel per reader, a feeder per pass."""

    def __init__(self, cfg: Config, ds: ref.Dataset, tmp: str) -> None:
        self.cfg, self.ds = cfg, ds
        self.dir = os.path.join(tmp, "data")
        os.mkdir(self.dir)
        self.paths = []
        for df in ds.files:
            path = os.path.join(self.dir, df.name)
            with open(path, "wb") as f:
                f.write(df.data)
            if df.idx is not None:
                with open(path[:-4] + ".idx", "wb") as f:
                    f.write(df.idx)
            self.paths.append(path)
        self.opened: List[Any] = []
        self.feeder: Optional[_FifoFeeder] = None
        if cfg.source == "fifo":
            os.mkdir(os.path.join(tmp, "fifo"))
            self.fifo = os.path.join(tmp, "fifo", ds.files[0].name)
            os.mkfifo(self.fifo)
        if cfg.source == "s3":
            import boto3 as _boto3
            url = _moto_endpoint()
            client = _boto3.client("s3", endpoint_url=url, region_name="us-east-1",
                                   aws_access_key_id="testing", aws_secret_access_key="testing")
            self.bucket = f"diff-{uuid.uuid4().hex[:12]}"
            client.create_bucket(Bucket=self.bucket)
            for path in self.paths:
                client.upload_file(path, self.bucket, f"data/{os.path.basename(path)}")
                if os.path.exists(path[:-4] + ".idx"):
                    client.upload_file(path[:-4] + ".idx", self.bucket, f"data/{os.path.basename(path)[:-4]}.idx")
            self.env = _aws_env(url)
        else:
            self.env = contextlib.nullcontext()

    def channel(self) -> Any:
        src = self.cfg.source
        if src == "file":
            return self.paths[0]
        if src == "folder":
            return self.dir
        if src == "fifo":
            return self.fifo
        if src == "bytesio":
            return io.BytesIO(self.ds.files[0].data)
        if src == "openfile":
            f = open(self.paths[0], "rb")
            self.opened.append(f)
            return f
        return f"s3://{self.bucket}/data/"

    @contextlib.contextmanager
    def one_pass(self):
        if self.cfg.source != "fifo":
            yield
            return
        feeder = self.feeder = _FifoFeeder(self.fifo, self.ds.files[0].data)
        feeder.start()
        try:
            yield
        finally:
            feeder.stopping.set()
            feeder.join(10)
            assert not feeder.is_alive(), "the FIFO feeder did not stop"
            if feeder.error is not None:
                raise feeder.error

    def close(self) -> None:
        for f in self.opened:
            f.close()
        if self.cfg.source == "s3":  # moto keeps each object (big ones in an open temporary file) until deleted
            import boto3 as _boto3
            client = _boto3.client("s3", endpoint_url=_moto_endpoint(), region_name="us-east-1",
                                   aws_access_key_id="testing", aws_secret_access_key="testing")
            for page in client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
                for obj in page.get("Contents", []):
                    client.delete_object(Bucket=self.bucket, Key=obj["Key"])
            client.delete_bucket(Bucket=self.bucket)


# -- running a reader -------------------------------------------------------------------------------
def reader_kwargs(cfg: Config, workers: int) -> dict:
    if cfg.fields == ("none",):
        fields: Any = None
    else:
        decs = [ref.make_decoder(k) for k in cfg.fields]
        fields = decs[0] if cfg.container == "single" else \
            {f"f{i}": d for i, d in enumerate(decs)} if cfg.container == "dict" else decs
    return dict(fields=fields, workers=workers, batch_size=cfg.batch_size, drop_last=cfg.drop_last,
                shuffle=cfg.shuffle, seed=cfg.reader_seed, on_error=cfg.on_error, num_shards=cfg.num_shards,
                shard_index=cfg.shard_index, even_shards=cfg.even_shards, shuffle_buffer=cfg.shuffle_buffer,
                shuffle_buffer_bytes=cfg.shuffle_buffer_bytes, join=cfg.join, tuning=Tuning(ring_bytes=cfg.ring_mib << 20, chunk_groups=cfg.chunk_groups,
                                             slot_samples=cfg.slot_samples, prefetch=cfg.prefetch))


def _values(cfg: Config, item: Any) -> Tuple:
    """A sample (or a batch's columns) as the tuple of its fields."""
    if cfg.container == "single":
        return (item,)
    if cfg.container == "dict":
        assert isinstance(item, dict) and list(item) == [f"f{i}" for i in range(cfg.group)], type(item)
        return tuple(item.values())
    assert isinstance(item, tuple) and len(item) == cfg.group, type(item)
    return item


def _rows(col: Any) -> Tuple[Any, list]:
    """A batch column's kind (README: one stacked array, a list, a tuple of columns) and its rows."""
    if isinstance(col, np.ndarray):
        return "a", [col[i] for i in range(len(col))]
    if isinstance(col, list):
        return "l", col
    if isinstance(col, tuple):
        kinds, rows = zip(*(_rows(c) for c in col))
        return ("t", kinds), [tuple(r) for r in zip(*rows)]
    raise AssertionError(f"a batch column of type {type(col).__name__}")


def _source_file(source: Any) -> Any:
    m = re.search(r"part-(\d+)\.rec", str(source))
    return int(m.group(1)) if m else str(source)


@dataclass
class PassObs:
    epoch: int
    samples: list            # canonical values, in order
    lengths: list            # items' lengths (1 per sample without batch_size)
    kinds: list              # per batch: its columns' kinds
    error: Optional[tuple]   # (type, index, file, offset)
    resumed_at: Optional[int] = None
    state: Optional[dict] = None


def _iterate(r: ParallelReader, cfg: Config, epoch: int, limit: Optional[int] = None) -> PassObs:
    obs = PassObs(epoch, [], [], [], None)
    it = iter(r)
    try:
        for item in it:
            if cfg.batch_size is None:
                obs.samples.append(ref.canon_sample(_values(cfg, item)))
                obs.lengths.append(1)
            else:
                kinds, cols = zip(*(_rows(c) for c in _values(cfg, item)))
                n = {len(c) for c in cols}
                assert len(n) == 1, f"columns of different lengths {n}"
                obs.kinds.append(kinds)
                obs.lengths.append(n.pop())
                obs.samples += [ref.canon_sample(vals) for vals in zip(*cols)]
            del item
            if limit is not None and len(obs.lengths) == limit:
                obs.state = r.state_dict()
                break
    except (CorruptRecordError, DecodeError) as exc:
        obs.error = (type(exc).__name__, exc.index, _source_file(exc.source), exc.offset)
    except PipelineError as exc:
        if "nothing to pad" not in str(exc):  # a rank that skipped all its samples (padding.py)
            raise
        obs.error = (type(exc).__name__, None, None, None)
    finally:
        it.close()
    return obs


@dataclass
class RunObs:
    passes: list
    len_before: Any
    len_after: list
    stats: dict
    health: list             # per reader object: (reruns, workers_replaced, slots, bound)


def _len(r: ParallelReader) -> Any:
    try:
        return len(r)
    except TypeError:
        return "TypeError"


def _health(r: ParallelReader, cfg: Config) -> tuple:
    st_ = r.stats
    if r.workers == 0 or r._res.slots is None:
        return (st_.reruns, st_.workers_replaced, 0, 0)
    slots = r.telemetry()["queues"]["slots"]
    size = r.config.slot_size
    task = cfg.chunk_groups or 2 * size
    bound = max(math.ceil(r.workers * cfg.prefetch * task / size) + 2,
                math.ceil(task / size) + 3)  # (resources.py: at least one task, unaligned, and two batches)
    return (st_.reruns, st_.workers_replaced, slots, bound)


def _add_stats(total: dict, r: ParallelReader, broken_off: bool = False) -> None:
    # stats.samples of a pass broken off early (the resumed example's first reader) is left out: with
    # workers it counts the samples decoded ahead but never handed out (256 after next() x10 with
    # workers=1, 10 with workers=0); reported, not checked here
    for k in ("skipped", "skipped_records") if broken_off else ("samples", "skipped", "skipped_records"):
        total[k] = total.get(k, 0) + getattr(r.stats, k)


def run_reader(cfg: Config, mat: Materialized, workers: int, resume_items: Optional[int]) -> RunObs:
    kw = reader_kwargs(cfg, workers)
    obs = RunObs([], None, [], {}, [])
    r = ParallelReader(mat.channel(), **kw)
    try:
        obs.len_before = _len(r)
        for i, epoch in enumerate(cfg.epochs):
            if r.epoch != epoch:
                r.set_epoch(epoch)
            assert r.epoch == epoch
            if i == 0 and resume_items is not None:
                with mat.one_pass():
                    first = _iterate(r, cfg, epoch, limit=resume_items)
                assert first.state is not None and first.error is None
                obs.health.append(_health(r, cfg))
                _add_stats(obs.stats, r, broken_off=True)
                r.close()
                r = ParallelReader(mat.channel(), **kw)  # a new reader, resumed
                r.load_state_dict(first.state)
                assert r.epoch == epoch
                with mat.one_pass():
                    rest = _iterate(r, cfg, epoch)
                first.samples += rest.samples
                first.lengths += rest.lengths
                first.kinds += rest.kinds
                first.error, first.resumed_at = rest.error, first.state["position"]
                obs.passes.append(first)
                obs.len_after.append(None)  # a resumed pass does not say the epoch's length
                continue
            with mat.one_pass():
                obs.passes.append(_iterate(r, cfg, epoch))
            obs.len_after.append(_len(r))
        obs.health.append(_health(r, cfg))
        _add_stats(obs.stats, r)
    finally:
        r.close()
    return obs


# -- checks ---------------------------------------------------------------------------------------
class Checker:
    def __init__(self, cfg: Config, ds: ref.Dataset, resume_items: Optional[int]) -> None:
        self.cfg, self.ds, self.resume_items = cfg, ds, resume_items
        self.decoders = [None] if cfg.fields == ("none",) else [ref.make_decoder(k) for k in cfg.fields]
        self.random = [d is not None and is_random(d) for d in self.decoders]
        self.kinds = tuple(ref.column_kind(k) for k in cfg.fields)
        self._cache: dict = {}

    def value(self, g: int, epoch: int, position: int) -> Tuple:
        """The canonical sample of group ``g`` at ``position`` of ``epoch`` (the reference decode)."""
        keyed = any(self.random)
        k = (g, epoch, position) if keyed else (g,)
        if k not in self._cache:
            key = ref.key_of(self.cfg, epoch, position)
            payloads = [rec.payload for rec in self.ds.groups[g]]
            self._cache[k] = ref.canon_sample(ref.decode(self.decoders, payloads, key))
        return self._cache[k]

    def plain(self, sample: Tuple) -> Tuple:
        """The fields of a canonical sample that do not depend on its position (non-random)."""
        return tuple(v for v, r in zip(sample, self.random) if not r)

    def check_pass(self, p: PassObs) -> None:
        cfg = self.cfg
        exp = ref.expected_pass(self.ds, cfg, p.epoch)
        what = f"epoch {p.epoch} ({exp.mode}{': ' + exp.why if exp.why else ''})"
        n = len(p.samples)
        want_n = None
        if exp.mode != "weak":  # how many samples come out: drop_last drops a short tail (not before an error)
            want_lengths = ref.batch_lengths(len(exp.items), cfg.batch_size, cfg.drop_last, exp.error is not None)
            want_n = sum(want_lengths)
            assert n == want_n, f"{what}: {n} samples, the reference says {want_n}"
            assert p.lengths == want_lengths, f"{what}: batch lengths {p.lengths}, the reference says {want_lengths}"
        elif cfg.batch_size is not None:
            assert all(x == cfg.batch_size for x in p.lengths[:-1]), f"{what}: batch lengths {p.lengths}"
        if exp.mode == "exact":
            for i, (pos, g) in enumerate(exp.items[:want_n]):
                assert p.samples[i] == self.value(g, p.epoch, pos), \
                    f"{what}: sample {i} is not group {g} at position {pos}" + self._which(p.samples[i])
        elif exp.mode == "multiset":
            self._check_multiset(p, exp, what, whole=want_n == len(exp.items))
        else:  # weak: whole, original groups only
            allowed = {self.plain(self.value(g, p.epoch, 0)) for g in exp.items}
            for i, s in enumerate(p.samples):
                assert self.plain(s) in allowed, \
                    f"{what}: sample {i} is not one whole undamaged group (mixed records?)" + self._which(s)
        # the error that ends the pass
        if exp.error_maybe:
            assert p.error is None or p.error[0] == "CorruptRecordError", f"{what}: error {p.error}"
        elif exp.error is None:
            assert p.error is None, f"{what}: error {p.error}, the reference expects none"
        else:
            assert p.error is not None, f"{what}: no error, the reference expects {exp.error}"
            for name, got, want in zip(("type", "index", "file", "offset"), p.error, exp.error):
                if want is not None and not (name == "file" and isinstance(got, str)):
                    assert got == want, f"{what}: error {name} {got!r}, the reference expects {want!r}"
        if cfg.batch_size is not None:
            for k in p.kinds:
                assert k == self.kinds, f"{what}: batch columns {k}, the README says {self.kinds}"
        if p.resumed_at is not None:
            want = self.resume_items * (cfg.batch_size or 1)
            assert p.resumed_at == want, f"{what}: state_dict position {p.resumed_at}, want {want}"

    def _check_multiset(self, p: PassObs, exp: ref.Expected, what: str, whole: bool) -> None:
        wanted = [self.plain(self.value(g, p.epoch, 0)) for g in exp.items]
        got = [self.plain(s) for s in p.samples]
        if whole:
            assert Counter(got) == Counter(wanted), f"{what}: not the same groups as the reference"
        else:  # drop_last dropped a tail the reference cannot name
            assert not Counter(got) - Counter(wanted), f"{what}: groups the reference does not have"
        where = {}
        for k, w in enumerate(wanted):
            where.setdefault(w, []).append(k)
        for k, s in enumerate(p.samples):
            candidates = where[self.plain(s)]
            if any(self.random):  # random fields: decoded with the key of output position k
                assert any(s == self.value(exp.items[c], p.epoch, k) for c in candidates), \
                    f"{what}: sample {k}'s random fields differ from the reference's decode at position {k}"
            if len(candidates) == 1 and exp.window is not None:
                assert candidates[0] <= k + exp.window, \
                    f"{what}: output {k} is group #{candidates[0]} of the stream order: it left a shuffle " \
                    f"buffer of {exp.window} before it could have arrived"

    def _which(self, sample: Tuple) -> str:
        """A hint: which original (group, position) records a delivered sample holds (by its tags)."""
        tags = []
        for v in sample:
            if v[0] == "b" and isinstance(v[1], bytes) and v[1][:4] == b"PRDF" and len(v[1]) >= 12:
                tags.append(ref.TAG.unpack(v[1][:12])[1:3])
        return f" (its records' tags (group, position): {tags})" if tags else ""

    def check_run(self, obs: RunObs) -> None:
        cfg = self.cfg
        for p in obs.passes:
            self.check_pass(p)
        total = len(self.ds.groups)
        bs = cfg.batch_size

        def batches(n: int) -> int:
            return n if bs is None else n // bs if cfg.drop_last else -(-n // bs)

        if ref._all_indexed(cfg):  # README: from the .idx files, before any pass
            want = batches(len(ref.plan(total, shuffle=False, seed=0, epoch=0, num_shards=cfg.num_shards,
                                        shard_index=cfg.shard_index, even=cfg.even_shards)))
            assert obs.len_before == want, f"len() before the first pass: {obs.len_before}, want {want}"
        else:
            assert obs.len_before == "TypeError", f"len() before the first pass: {obs.len_before}"
        prev = obs.len_before
        for p, got in zip(obs.passes, obs.len_after):
            if got is None or (p.error is not None and p.error[0] == "PipelineError"):
                continue  # (a rank with nothing to pad with: its pass ran, its length is moot)
            if p.error is None and ref._all_indexed(cfg):
                prev = obs.len_before  # README: the .idx files' count every epoch, skipped samples in it
            elif p.error is None:
                exp = ref.expected_pass(self.ds, cfg, p.epoch)
                if exp.mode != "weak":
                    prev = batches(len(exp.items))
                else:
                    prev = got
            assert got == prev, f"len() after epoch {p.epoch}: {got}, want {prev}"
        exps = [ref.expected_pass(self.ds, cfg, p.epoch) for p in obs.passes]
        for name in ("skipped", "skipped_records"):
            if all(getattr(e, name) is not None for e in exps):
                want = sum(getattr(e, name) for e in exps)
                assert obs.stats[name] == want, f"stats.{name} = {obs.stats[name]}, want {want}"


def resume_items(cfg: Config, ds: ref.Dataset) -> Optional[int]:
    """After how many items of the first pass the state is taken (None: no resume in this example)."""
    if cfg.resume_at is None:
        return None
    exp = ref.expected_pass(ds, cfg, cfg.epochs[0])
    if exp.mode == "weak" or exp.error is not None or exp.padded:
        return None  # (a resumed pass pads with its own first sample: not modelled by the reference)
    items = len(ref.batch_lengths(len(exp.items), cfg.batch_size, cfg.drop_last, False))
    if items < 2:
        return None
    return 1 + cfg.resume_at % (items - 1)


def _no_leaks(before: set) -> None:
    gc.collect()
    mine = f"parrecio-{os.getpid()}-"
    end = time.monotonic() + 5
    while (our_children() or set(leftover(mine)) - before) and time.monotonic() < end:
        time.sleep(0.05)
    assert our_children() == [], "processes of the pipeline left behind"
    assert set(leftover(mine)) - before == set(), "/dev/shm segments left behind"


def check_config(cfg: Config) -> None:
    """One example, end to end (``PARRECIO_DIFF_LOG=path``: one line per example, its time and config)."""
    t0 = time.monotonic()
    try:
        _check_config(cfg)
    finally:
        log = os.environ.get("PARRECIO_DIFF_LOG")
        if log:
            with open(log, "a") as f:
                f.write(f"{time.monotonic() - t0:6.2f}s {cfg!r}\n")


def _check_config(cfg: Config) -> None:
    if currently_in_test_context():  # printed with the falsifying example
        note(f"reproduce: {cfg.repro()}")
    before = set(leftover(f"parrecio-{os.getpid()}-"))
    try:
        ds = ref.build(cfg)
        ref.check_framing(ds, cfg.join)
        k = resume_items(cfg, ds)
        checker = Checker(cfg, ds, k)
        with tempfile.TemporaryDirectory(prefix="parrecio-diff-") as tmp, deadline(EXAMPLE_TIMEOUT_S):
            mat = Materialized(cfg, ds, tmp)
            try:
                with mat.env:
                    inline = run_reader(cfg, mat, 0, k)
                    parallel = run_reader(cfg, mat, cfg.workers, k)
            finally:
                mat.close()
        _no_leaks(before)
        for field_ in ("passes", "len_before", "len_after", "stats"):
            a, b = getattr(inline, field_), getattr(parallel, field_)
            if a != b:
                raise AssertionError(f"workers=0 and workers={cfg.workers} differ in {field_}: "
                                     f"{_diff(a, b)}")
        for reruns, replaced, slots, bound in parallel.health:
            assert reruns == 0 and replaced == 0, f"reruns={reruns} workers_replaced={replaced}"
            assert slots <= bound, f"{slots} output slots, more than the bound {bound}"
        checker.check_run(inline)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{cfg!r}\n{cfg.repro()}") from None


def _diff(a: Any, b: Any) -> str:
    """Where two observations first differ, briefly."""
    if isinstance(a, list) and isinstance(b, list):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"[{i}]: {_diff(x, y)}"
        return f"lengths {len(a)} != {len(b)}"
    if isinstance(a, PassObs) and isinstance(b, PassObs):
        for name in ("epoch", "error", "lengths", "kinds", "resumed_at", "state"):
            if getattr(a, name) != getattr(b, name):
                return f"{name}: {getattr(a, name)!r} != {getattr(b, name)!r}"
        return f"samples {_diff(a.samples, b.samples)}"
    s = f"{a!r} != {b!r}"
    return s if len(s) < 600 else s[:600] + "..."


# -- the tests ------------------------------------------------------------------------------------
_SETTINGS = dict(deadline=None, database=None, print_blob=True,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                        HealthCheck.filter_too_much, HealthCheck.large_base_example])


# The default profile: four draws of their own, so that a failure in one (and its shrinking) never
# starves the others; (focus, examples), PARRECIO_DIFF_EXAMPLES scales them (default 100 in all).
_FOCI = ((None, 0.55), ("damage", 0.2), ("ring", 0.1), ("s3", 0.15))
_EXAMPLES = int(os.environ.get("PARRECIO_DIFF_EXAMPLES", "100"))


def _default_test(focus: Optional[str], share: float):
    @pytest.mark.skipif(PROFILE == "long", reason="the long profile runs test_differential_long")
    @pytest.mark.timeout(1800)  # passing: seconds; failing: hypothesis shrinks for minutes
    @settings(max_examples=max(1, round(_EXAMPLES * share)), derandomize=True, **_SETTINGS)
    @given(cfg=configs(focus=focus))
    def test(cfg):
        check_config(cfg)
    if focus == "s3":
        test = pytest.mark.skipif(not HAVE_S3, reason="boto3 and moto[server] are needed")(test)
    return test


test_differential = _default_test(None, _FOCI[0][1])
test_differential_damage = _default_test("damage", _FOCI[1][1])
test_differential_ring = _default_test("ring", _FOCI[2][1])
test_differential_s3 = _default_test("s3", _FOCI[3][1])


@pytest.mark.skipif(PROFILE != "long", reason="PARRECIO_HYPOTHESIS_PROFILE=long")
@pytest.mark.timeout(BUDGET_S + 900)
def test_differential_long():
    """Random exploration for PARRECIO_DIFF_BUDGET_S seconds, in batches of 50 examples, the foci in
    turn (anything, anything, damage, ring, s3)."""
    stop = time.monotonic() + BUDGET_S
    most = int(os.environ.get("PARRECIO_DIFF_MAX_EXAMPLES", "1000000000"))
    done = rounds = 0
    first_seed = os.environ.get("PARRECIO_DIFF_SEED")
    foci = [None, None, "damage", "ring"] + (["s3"] if HAVE_S3 else [])
    while time.monotonic() < stop and done < most:
        n = min(50, most - done)

        @settings(max_examples=n, derandomize=False, **_SETTINGS)
        @given(cfg=configs(focus=foci[rounds % len(foci)]))
        def batch(cfg):
            if time.monotonic() < stop:
                check_config(cfg)

        if first_seed is not None and done == 0:
            batch = hyp_seed(int(first_seed))(batch)
        batch()
        done += n
        rounds += 1


@pytest.mark.skipif(not os.environ.get("PARRECIO_DIFF_REPRO"), reason="PARRECIO_DIFF_REPRO='Config(...)'")
def test_repro():
    """One configuration, as a failure printed it."""
    cfg = eval(os.environ["PARRECIO_DIFF_REPRO"], {"Config": Config, "__builtins__": {}})
    check_config(cfg)


def test_reference_reads_back_what_it_writes():
    """The reference's footing, without any reader: both joins, the magic at every kind of place,
    every damage kind, groups of 1-4."""
    for join, part in (("mxnet", 0), ("concat", 4), ("concat", 97)):
        for group in (1, 3):
            for damage in ((), ((0, "first", "magic"), (5, "middle", "cflag"), (9, "last", "length")),
                           ((3, "last", "lastpart"), (0, "first", "truncate")),
                           ((4, "first", "magic"), (5, "first", "cflag"), (6, "first", "length"))):
                cfg = Config(7, "file", (12,), True, group, ("raw",) * group, "list", "small", (), 60, join,
                             part, 1, None, None, 2, False, 1024, 0, 1, 0, None, (0,), None, "skip", damage,
                             None, False, 1)
                ds = ref.build(cfg)
                ref.check_framing(ds, join)
                assert len(ds.damage) == len({(d.file, d.group, d.pos) for d in ds.damage})
    assert ref.plan(5, shuffle=False, seed=0, epoch=0, num_shards=3, shard_index=2, even="pad") == [2, 0]
    assert ref.plan(5, shuffle=False, seed=0, epoch=0, num_shards=3, shard_index=2, even="drop") == [2]
    assert ref.emitted_before([0, 2, 4, 6], 5, 2, "drop") == [0, 2]
    assert ref.emitted_before([0, 2, 4, 6], 5, 2, None) == [0, 2, 4]
