"""The naive reference of the differential tier (``tests/test_differential.py``), written plainly.

What a pass of ``ParallelReader`` must deliver, from nothing but the documented rules:

- **Data**: :func:`build` writes the RecordIO bytes itself (``[magic][lrec][payload][zero pad]``, both
  multipart conventions: ``mxnet`` splits where the magic lies at an aligned offset and drops those 4
  bytes, ``concat`` cuts fixed-size parts), the ``.idx`` lines (``key\\toffset``) and the damage.  Every
  payload starts with a tag ``b"PRDF" + u32 group + u16 position + u16 file`` (cut short for records of
  fewer than 12 bytes), so a mispaired or reordered record is visible byte for byte.
- **Framing**: a plain :class:`parrecio.recordio.RecordReader` per file, checked against what was written
  (:func:`records_of`).
- **Groups**: ``len(fields)`` consecutive records of one file (README "ParallelReader": ``fields``).
- **Plan** (README "Distributed training", ``parrecio/pipeline/plan.py`` docstring): the groups of all
  files in source order; ``shuffle`` with an ``.idx`` beside every file: ``default_rng([seed, epoch])
  .permutation(total)``; ``even_shards="pad"`` repeats the order's start cyclically, ``"drop"`` cuts it to
  a multiple of ``num_shards``; rank ``r`` takes ``order[r::num_shards]``.  Unshuffled streams follow the
  same rule (group ``g`` to rank ``g % num_shards``, equal shards by holding / repeating).
- **Shuffle buffer** (streams): the README documents the buffer, not its random draws, so the order is
  *implementation-defined*: the reference gives only the **multiset** of the rank's groups and the one
  documented bound (a group cannot leave the buffer before ``shuffle_buffer`` later groups arrived:
  output ``k`` is one of the first ``k + shuffle_buffer + 1`` groups of the rank's stream order).  The
  exact order is still checked, as ``workers=0`` against ``workers=1..3``.
- **Resume**: a state at position ``p`` resumes with ``order[p:]``.
- **Decoding**: each field's decoder on the payload; a ``random`` decoder with
  ``key=sample_key(seed, epoch, shard_index, position)`` (README "Reproducible randomness").
- **Batches**: consecutive samples, a short last batch unless ``drop_last``; before an error the samples
  so far come first as a short batch (README "on_error").
- **Damage**: the outcome is decided in ONE place, :func:`corruption_outcome` (see there).
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from parrecio.decoders import ArraySpec
from parrecio.decoders.base import is_random, sample_key

MAGIC = struct.pack("<I", 0xCED7230A)  # b"\x0a\x23\xd7\xce"
LENGTH_MASK = (1 << 29) - 1
TAG = struct.Struct("<4sIHH")           # b"PRDF", group, position, file
MIB = 1 << 20

# How the damage outcome is judged for streamed groups of more than one record, in skip mode
# (see corruption_outcome).  "strict" (default): README "Damage inside a group" (realign by the .idx,
# else stop with a CorruptRecordError naming the damage, in skip mode too); "weak": only 0 vs N
# identical and no mixed groups (what could be required before that rule).
RESYNC_RULE = os.environ.get("PARRECIO_DIFF_RESYNC_RULE", "strict")


# -- decoders (importable by the decoder processes: tests/ is on their sys.path) -------------------
def digest(payload) -> np.ndarray:
    """20 bytes that pin the payload: its length (u32) and its md5."""
    b = bytes(payload)
    return np.frombuffer(struct.pack("<I", len(b)) + hashlib.md5(b).digest(), np.uint8).copy()


class Digest:
    """payload -> uint8 (20,) (length + md5): a fixed-shape field, written into the output slots."""

    output_spec = ArraySpec((20,), np.uint8)

    def __call__(self, payload):
        return digest(payload)

    def decode_into(self, payload, out):
        out[...] = digest(payload)

    def __repr__(self):
        return "Digest()"


class DigestPair:
    """payload -> (uint8 (20,) digest, bytes of its first 12 bytes): a tuple value, half in the slot
    and half travelling back (as ImageRecord's (image, label))."""

    output_spec = (ArraySpec((20,), np.uint8), None)

    def __call__(self, payload):
        return digest(payload), bytes(payload[:12])

    def decode_into(self, payload, out):
        out[0][...] = digest(payload)
        return None, bytes(payload[:12])

    def __repr__(self):
        return "DigestPair()"


def make_decoder(kind: str):
    """The decoder of one field kind of the configuration."""
    from parrecio.decoders import Raw
    if kind == "raw":
        return Raw()
    if kind == "digest":
        return Digest()
    if kind == "pair":
        return DigestPair()
    from parrecio.decoders import Image
    from parrecio.decoders.augment import CenterCrop, RandomResizedCrop
    if kind == "crop":
        return Image(size=(16, 16), crop=RandomResizedCrop(), flip=0.5)
    if kind == "flip":
        return Image(size=(12, 16), flip=0.5)
    if kind == "letterbox":
        return Image(size=(12, 20), resize="letterbox", fill=(9, 99, 199))
    if kind == "center":
        return Image(size=(16, 16), crop=CenterCrop(0.875))
    raise ValueError(kind)


IMAGE_KINDS = ("crop", "flip", "letterbox", "center")


def column_kind(kind: str) -> Any:
    """What a batch column of this field is (README "batch_size"): one stacked array for arrays of one
    shape, a list for ``bytes``, a tuple of columns for tuple values."""
    return {"raw": "l", "none": "l", "pair": ("t", ("a", "l"))}.get(kind, "a")


# -- canonical values ---------------------------------------------------------------------------
def _h(b: bytes) -> Any:
    return b if len(b) <= 24 else ("h", len(b), hashlib.blake2b(b, digest_size=16).digest())


def canon(v: Any) -> Any:
    """A hashable, byte-exact stand-in for a value (large bytes by length and hash)."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        return ("b", _h(bytes(v)))
    if isinstance(v, (np.ndarray, np.generic)):
        a = np.ascontiguousarray(v)
        return ("a", a.dtype.str, a.shape, _h(a.tobytes()))
    if isinstance(v, tuple):
        return ("t",) + tuple(canon(x) for x in v)
    return ("o", type(v).__name__, repr(v))


# -- writing ------------------------------------------------------------------------------------
def frame(part: bytes, cflag: int) -> bytes:
    return MAGIC + struct.pack("<I", (cflag << 29) | len(part)) + part + b"\0" * (-len(part) % 4)


def mxnet_parts(payload: bytes) -> List[bytes]:
    """dmlc-core's writer: a part ends where the magic lies at an aligned offset; those 4 bytes go."""
    parts, start = [], 0
    for i in range(0, len(payload) - 3, 4):
        if payload[i:i + 4] == MAGIC:
            parts.append(payload[start:i])
            start = i + 4
    parts.append(payload[start:])
    return parts


def concat_parts(payload: bytes, size: int) -> List[bytes]:
    """SageMaker's RecordIO wrapper: parts of ``size`` bytes, joined by plain concatenation."""
    if len(payload) <= size:
        return [payload]
    return [payload[i:i + size] for i in range(0, len(payload), size)]


def frames(parts: List[bytes]) -> List[bytes]:
    if len(parts) == 1:
        return [frame(parts[0], 0)]
    flags = [1] + [2] * (len(parts) - 2) + [3]
    return [frame(p, c) for p, c in zip(parts, flags)]


@dataclass
class Rec:
    file: int
    index: int          # record index in its file
    group: int          # global group id (source order)
    pos: int            # position in the group
    offset: int         # byte offset of its first frame in its file
    heads: List[int]    # byte offsets of each of its frames
    payload: bytes


@dataclass
class DataFile:
    name: str
    data: bytes
    idx: Optional[bytes]
    records: List[Rec]


@dataclass
class Damage:
    group: int
    pos: int
    kind: str           # magic | cflag | length | lastpart | truncate
    offset: int         # the frame whose header was damaged (where a framing error is raised)
    file: int
    record: int = 0     # its record's first frame (where RecordReader's skipped region starts)
    index: int = 0      # its record's index in the file


@dataclass
class Region:
    """What RecordReader skips as one corrupt region: damaged records one after another, where a
    later one's first frame is no record head (magic or cflag destroyed: the resync scans past it)."""
    file: int
    start: int          # the first damaged record's first frame
    groups: List[int]   # the groups whose records it swallowed
    followed: bool      # a record of the file comes after it (the stream goes on)


@dataclass
class Dataset:
    files: List[DataFile]
    groups: List[List[Rec]]
    nf: int
    damage: List[Damage] = field(default_factory=list)
    regions: List[Region] = field(default_factory=list)

    @property
    def damaged_groups(self) -> set:
        return {d.group for d in self.damage}


def _payload(rng: np.random.Generator, cfg: Any, g: int, p: int, f: int, size: int,
             image: bool) -> bytes:
    if image:
        return _image(rng)
    body = bytearray(TAG.pack(b"PRDF", g, p, f) + rng.bytes(max(0, size - TAG.size)))[:size]
    if cfg.magic and size >= 4 and rng.random() * 100 < cfg.magic:
        last = (size - 4) & ~3
        spots = {int(rng.integers(0, last // 4 + 1)) * 4 for _ in range(int(rng.integers(1, 4)))}
        r = rng.random()
        if r < 0.15:
            spots.add(0)                                # at the very start: an empty first part
        elif r < 0.3:
            spots.add(last)                             # the last aligned word: an empty last part
        elif r < 0.45 and last >= 4:
            spots.update((last - 4, last))              # two in a row: an empty middle part
        if rng.random() < 0.3 and size >= 6:
            spots.add(1 + int(rng.integers(0, size - 5)))  # unaligned: never a cut, never a resync
        for i in sorted(spots):
            body[i:i + 4] = MAGIC
        if cfg.damage:
            # A damaged stream is resynced by scanning for an aligned magic followed by cflag 0/1: keep
            # the magic in payloads from looking like a record head there (the next word: cflag 2; no
            # magic in the last aligned word, whose next word would be the zero padding).
            for i in range(0, size - 3, 4):
                if body[i:i + 4] == MAGIC:
                    if i + 8 <= size:
                        if body[i + 4:i + 8] != MAGIC:
                            body[i + 7] = (body[i + 7] & 0x1F) | 0x40
                    else:
                        body[i] ^= 0xFF
    return bytes(body)


def _image(rng: np.random.Generator) -> bytes:
    from PIL import Image as PILImage
    w, h = int(rng.integers(6, 40)), int(rng.integers(6, 40))
    y, x = np.mgrid[0:h, 0:w]
    arr = np.stack([(x * int(rng.integers(1, 9))) % 256, (y * int(rng.integers(1, 9))) % 256,
                    rng.integers(0, 256, (h, w))], -1).astype(np.uint8)
    buf = io.BytesIO()
    if rng.random() < 0.5:
        PILImage.fromarray(arr).save(buf, "JPEG", quality=80)
    else:
        PILImage.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def _size(rng: np.random.Generator, sizes: str, ring: int) -> int:
    if sizes == "tiny":
        return int(rng.integers(0, 33))
    if sizes == "small":
        return int(rng.integers(0, 2049))
    if sizes == "bulk":
        return int(rng.integers(48 << 10, 256 << 10))
    r = rng.random()  # mixed
    if r < 0.8:
        return int(rng.integers(0, 4097))
    if r < 0.97:
        return int(rng.integers(4096, 64 << 10))
    w = max(4096, min(8 << 20, ring // 8))  # about one ring window (ring_windows.py): read in place or not
    return int(rng.integers(w - 256, w + 257))


def build(cfg: Any) -> Dataset:
    """The files of a configuration (deterministic in ``cfg``): names, bytes, ``.idx`` text, records,
    and the damage applied."""
    ring = cfg.ring_mib * MIB
    nf = cfg.group
    files: List[DataFile] = []
    groups: List[List[Rec]] = []
    image_pos = {p for p, k in enumerate(cfg.fields) if k in IMAGE_KINDS}
    g = 0
    for f, ngroups in enumerate(cfg.files):
        out = bytearray()
        recs: List[Rec] = []
        for _ in range(ngroups):
            grp = []
            for p in range(nf):
                rng = np.random.default_rng([cfg.seed, g, p])
                size = _size(rng, cfg.sizes, ring)
                if image_pos:
                    size = int(rng.integers(12, 200))  # the tag field of an image group: always whole
                if g in cfg.big and p == cfg.big.index(g) % nf:
                    size = ring // 2 + int(rng.integers(-256, 64 << 10))  # more than half the ring, or about
                payload = _payload(rng, cfg, g, p, f, size, p in image_pos)
                parts = mxnet_parts(payload) if cfg.join == "mxnet" else concat_parts(payload, cfg.part)
                rec = Rec(f, len(recs), g, p, len(out), [], payload)
                for fr in frames(parts):
                    rec.heads.append(len(out))
                    out += fr
                recs.append(rec)
                grp.append(rec)
            groups.append(grp)
            g += 1
        files.append(DataFile(f"part-{f}.rec", bytes(out), None, recs))
    ds = Dataset(files, groups, nf)
    _damage(ds, cfg)
    if cfg.index:
        for df in ds.files:
            df.idx = "".join(f"{r.index}\t{r.offset}\n" for r in df.records).encode()
    return ds


def _damage(ds: Dataset, cfg: Any) -> None:
    """Apply ``cfg.damage``: ``(group, where, kind)`` with where first/middle/last record of the group."""
    if not cfg.damage or not ds.groups:
        return
    datas = [bytearray(df.data) for df in ds.files]
    seen = set()
    for g, where, kind in cfg.damage:
        g %= len(ds.groups)
        p = {"first": 0, "middle": ds.nf // 2, "last": ds.nf - 1}[where]
        rec = ds.groups[g][p]
        if kind == "truncate":  # only ever the last record of a file: the file ends inside it
            rec = ds.files[rec.file].records[-1]
        if (rec.file, rec.index) in seen:
            continue
        seen.add((rec.file, rec.index))
        buf = datas[rec.file]
        off = rec.heads[-1] if kind == "lastpart" else rec.offset
        if kind == "truncate":
            cut = rec.offset + 4 + (len(rec.payload) // 2 if len(rec.payload) > 4 else 0)
            del buf[cut:]
            off = max(h for h in rec.heads if h <= cut)  # the frame the file ends in (or before)
        else:
            lrec = struct.unpack_from("<I", buf, off + 4)[0]
            if kind == "magic":
                buf[off:off + 4] = b"\xde\xad\xbe\xef"
            elif kind == "cflag":
                struct.pack_into("<I", buf, off + 4, (2 << 29) | (lrec & LENGTH_MASK))
            else:  # length (and lastpart): a length word far beyond max_record_bytes
                struct.pack_into("<I", buf, off + 4, (lrec & ~LENGTH_MASK) | LENGTH_MASK)
        ds.damage.append(Damage(rec.group, rec.pos, kind, off, rec.file, rec.offset, rec.index))
    for df, buf in zip(ds.files, datas):
        df.data = bytes(buf)
    ds.damage.sort(key=lambda d: (d.file, d.offset))
    hit = {(d.file, d.index) for d in ds.damage}
    for d in ds.damage:
        last = ds.regions[-1] if ds.regions else None
        if (last is not None and last.file == d.file and prev.index == d.index - 1
                and d.kind in ("magic", "cflag")):
            last.groups.append(d.group)
        else:
            ds.regions.append(Region(d.file, d.record, [d.group], True))
        # followed: a record RecordReader reads comes after it in its file (a damaged one does not:
        # damage that runs on to the end of the file is followed by nothing)
        ds.regions[-1].followed = any(r.index > d.index and (d.file, r.index) not in hit
                                      for r in ds.files[d.file].records)
        prev = d


# -- framing, through a plain RecordReader -------------------------------------------------------
def records_of(ds: Dataset, join: str, on_corrupt: str) -> Tuple[List[List[Tuple[int, bytes]]], int,
                                                                  Optional[Tuple[int, int]]]:
    """Each file's ``(offset, payload)`` records as a plain RecordReader reads them, the corrupt regions
    it skipped, and (``on_corrupt="raise"``) the ``(file, offset)`` of the first framing error."""
    from parrecio.errors import CorruptRecordError
    from parrecio.recordio import RecordReader
    out, skipped, first = [], 0, None
    for f, df in enumerate(ds.files):
        recs = []
        r = RecordReader(io.BytesIO(df.data), join=join, on_corrupt=on_corrupt, source_name=df.name)
        try:
            for rec in r:
                recs.append((rec.offset, rec.payload))
        except CorruptRecordError as exc:
            if first is None:
                first = (f, exc.offset)
        skipped += r.skipped_records
        out.append(recs)
    return out, skipped, first


def check_framing(ds: Dataset, join: str) -> None:
    """The reference's own footing: RecordReader reads back what :func:`build` wrote (skipping exactly
    the damaged records), and a raising reader stops at the first damage."""
    got, skipped, _ = records_of(ds, join, "skip")
    bad = {(d.file, d.offset) for d in ds.damage}
    for f, df in enumerate(ds.files):
        want = [(r.offset, r.payload) for r in df.records
                if not any((f, h) in bad for h in r.heads) and
                not any(d.kind == "truncate" and d.file == f and d.group == r.group and d.pos == r.pos
                        for d in ds.damage)]
        assert got[f] == want, f"reference self-check: RecordReader does not read {df.name} as written"
    assert skipped == len(ds.regions), "reference self-check: one skipped region per run of damage"
    if ds.damage:
        _, _, first = records_of(ds, join, "raise")
        d = ds.damage[0]
        assert first == (d.file, d.offset), "reference self-check: first framing error elsewhere"


# -- the plan ------------------------------------------------------------------------------------
def plan(total: int, *, shuffle: bool, seed: int, epoch: int, num_shards: int, shard_index: int,
         even: Optional[str]) -> List[int]:
    """The rank's order of group indices (README "Distributed training"), written plainly."""
    order = list(np.random.default_rng([seed, epoch]).permutation(total)) if shuffle else list(range(total))
    order = [int(g) for g in order]
    if even == "drop":
        order = order[:total - total % num_shards]
    elif even == "pad" and total % num_shards and total:
        pad = num_shards - total % num_shards
        order = order + [order[i % total] for i in range(pad)]
    return order[shard_index::num_shards]


def emitted_before(order: List[int], stop: int, num_shards: int, even: Optional[str]) -> List[int]:
    """Of a rank's unshuffled stream order, the groups delivered before the stream stops while group
    ``stop`` is read: those before it; with ``drop``, only those whose row of ``num_shards`` groups was
    complete (README: a rank holds back its group of each row until the row is complete)."""
    out = []
    for g in order:
        if g >= stop:
            break
        if even == "drop" and (g // num_shards + 1) * num_shards - 1 >= stop:
            break
        out.append(g)
    return out


@dataclass
class Expected:
    """What one whole pass must deliver.

    ``mode``: ``"exact"`` (``items``: ``(position, group)`` in this order; ``position`` in the rank's
    order gives the sample key), ``"multiset"`` (shuffle buffer: ``items`` the groups in some order,
    output ``k`` decoded with position ``k``; ``window`` the documented bound over ``items``' order) or
    ``"weak"`` (only: every delivered sample is one whole group of ``items``).  ``error``: ``(type name,
    index, file, offset)`` of the error that ends the pass, a field None when not determined;
    ``error_maybe``: whether an error may or may not end it (weak)."""

    mode: str
    items: List[Any]
    error: Optional[Tuple[Optional[str], Optional[int], Optional[int], Optional[int]]] = None
    error_maybe: bool = False
    skipped_records: Optional[int] = None
    skipped: Optional[int] = None
    window: Optional[int] = None
    padded: int = 0           # of ``items``, the copies that pad a rank's lost positions (at the end)
    why: str = ""


def _all_indexed(cfg: Any) -> bool:
    return cfg.index and cfg.source in ("file", "folder", "s3")


def by_index(cfg: Any) -> bool:
    """Groups read by their .idx offsets: every file indexed and a global shuffle or equal shards."""
    return _all_indexed(cfg) and (cfg.shuffle or cfg.even_shards is not None)


def _plan_kw(cfg: Any, epoch: int) -> dict:
    return dict(seed=cfg.reader_seed, epoch=epoch, num_shards=cfg.num_shards, shard_index=cfg.shard_index,
                even=cfg.even_shards)


def expected_pass(ds: Dataset, cfg: Any, epoch: int) -> Expected:
    """A whole pass of ``epoch`` (a resumed one is checked as prefix + rest against this)."""
    buffer = cfg.shuffle and not _all_indexed(cfg)
    if ds.damage:
        return corruption_outcome(ds, cfg, epoch)
    order = plan(len(ds.groups), shuffle=cfg.shuffle and not buffer, **_plan_kw(cfg, epoch))
    if buffer:
        return Expected("multiset", order, window=cfg.shuffle_buffer, skipped=0, skipped_records=0,
                        why="shuffle buffer: its order is implementation-defined")
    return Expected("exact", list(enumerate(order)), skipped=0, skipped_records=0)


def corruption_outcome(ds: Dataset, cfg: Any, epoch: int) -> Expected:
    """THE ONE PLACE where the expected outcome of injected damage is decided.  Adapt it here when the
    resync rule changes.  Fields here are Raw / Digest / DigestPair: none tells a group's first record
    by its payload kind, so only an .idx can realign (README "Damage inside a group").

    - Groups read by ``.idx`` offsets (index shuffle, equal shards of indexed files): a damaged group
      is just that group: ``raise`` stops at the first damaged group of the rank's order
      (``CorruptRecordError``, index = its position, offset = the damaged frame); ``skip`` leaves the
      damaged groups out, the others keep their order and their positions (sample keys).
    - Streamed, ``raise``: the stream stops at its first damage: the groups complete before it, as the
      rank would have delivered them by then (held rows of ``drop`` not yet), then the error naming the
      damaged frame and the rank's sample index.
    - Streamed, ``skip``, groups of one record: every record RecordReader reads (the damaged ones left
      out), then the plan as for healthy data; ``skipped_records`` = RecordReader's count.
    - Streamed, ``skip``, groups of several records, ``RESYNC_RULE="strict"``:
      with an .idx beside every file: each damaged group is lost, every other group delivered, the
      plan over the groups that were formed (the lost ones take no group index);
      without: the pass stops at the first corrupt region that a record follows in its file, with a
      ``CorruptRecordError`` naming the region's start (its first damaged record), after the samples
      of the groups before it; a region that ends its file is followed by nothing: the stream ends
      inside that group, which is lost, and the next file goes on.
      ``RESYNC_RULE="weak"``: only that every sample delivered is one whole undamaged group.
    - Shuffle buffers: the same groups as the stream order above, as a multiset (the buffer's draws are
      implementation-defined): a stop lets out every group the buffer got before the damage, then the
      error (``parrecio.pipeline.groups``)."""
    total = len(ds.groups)
    kw = _plan_kw(cfg, epoch)
    damaged = ds.damaged_groups
    first = ds.damage[0]  # in stream order (file, offset)
    buffer = cfg.shuffle and not _all_indexed(cfg)
    if by_index(cfg):
        order = plan(total, shuffle=cfg.shuffle, **kw)
        bad = {}
        for d in sorted(ds.damage, key=lambda d: (d.group, d.pos)):
            bad.setdefault(d.group, (d.file, d.offset))
        if cfg.on_error == "raise":
            for i, g in enumerate(order):
                if g in damaged:
                    return Expected("exact", list(enumerate(order[:i])),
                                    error=("CorruptRecordError", i) + bad[g])
            return Expected("exact", list(enumerate(order)))
        keep = [(i, g) for i, g in enumerate(order) if g not in damaged]
        lost = len(order) - len(keep)
        if lost and cfg.even_shards is not None and cfg.num_shards > 1:
            # equal shards pad a rank's lost positions with copies of its first sample (README "Equal
            # shards"; parrecio/pipeline/padding.py), at the end of the pass; with none delivered the
            # pass fails, since nothing can be repeated
            if not keep:
                return Expected("exact", [], error=("PipelineError", None, None, None), skipped=lost,
                                why="equal shards: every sample of the rank skipped, nothing to pad with")
            return Expected("exact", keep + [keep[0]] * lost, skipped=lost, padded=lost,
                            why="equal shards: lost positions padded with the first sample")
        return Expected("exact", keep, skipped=lost)
    _, skipped_records, rr_first = records_of(ds, cfg.join, "skip" if cfg.on_error == "skip" else "raise")
    if cfg.on_error == "raise":
        stop_group = first.group
        lost: set = set()
        # RecordReader's offset (a truncated record: where it says the stream ends)
        error = ("CorruptRecordError", None) + tuple(records_of(ds, cfg.join, "raise")[2])
    elif ds.nf == 1:
        kept = [g for g in range(total) if g not in damaged]
        order = [kept[i] for i in plan(len(kept), shuffle=False, **kw)]
        if buffer:
            return Expected("multiset", order, window=cfg.shuffle_buffer, skipped_records=skipped_records,
                            skipped=0, why="shuffle buffer: its order is implementation-defined")
        return Expected("exact", list(enumerate(order)), skipped_records=skipped_records, skipped=0)
    elif RESYNC_RULE != "strict":
        return Expected("weak", [g for g in range(total) if g not in damaged], error_maybe=True,
                        why=f"skip mode, groups of {ds.nf}, resync rule {RESYNC_RULE!r}")
    elif _all_indexed(cfg):  # realigned by the .idx: only the damaged groups are lost
        kept = [g for g in range(total) if g not in damaged]
        order = [kept[i] for i in plan(len(kept), shuffle=False, **kw)]
        if buffer:
            return Expected("multiset", order, window=cfg.shuffle_buffer, skipped_records=skipped_records,
                            why="shuffle buffer: its order is implementation-defined")
        return Expected("exact", list(enumerate(order)), skipped_records=skipped_records,
                        why="skip mode, realigned by the .idx")
    else:  # nothing tells a group's first record: stop at the first damage a record follows
        stops = [r for r in ds.regions if r.followed]
        stop_group = stops[0].groups[0] if stops else total
        lost = {g for r in ds.regions if not r.followed for g in r.groups if g < stop_group}
        error = ("CorruptRecordError", None, stops[0].file, stops[0].start) if stops else None
    formed = [g for g in range(stop_group) if g not in lost]
    # the rank's stream order of the formed groups, without pad's repeats (they come at the stream's end)
    unpadded = dict(kw, even=None if cfg.even_shards == "pad" and error is not None else cfg.even_shards)
    order = plan(len(formed), shuffle=False, **unpadded) if error is not None else \
        plan(len(formed), shuffle=False, **kw)
    if error is None:
        if buffer:
            return Expected("multiset", [formed[j] for j in order], window=cfg.shuffle_buffer,
                            skipped_records=skipped_records, why="shuffle buffer: its order is implementation-defined")
        return Expected("exact", [(i, formed[j]) for i, j in enumerate(order)],
                        skipped_records=skipped_records,
                        why="skip mode: only damaged last groups of files, skipped")
    before = emitted_before(order, len(formed), cfg.num_shards, cfg.even_shards)
    if buffer:  # the groups the stream gave the buffer before the damage all come out, then the error
        return Expected("multiset", [formed[j] for j in before], window=cfg.shuffle_buffer,
                        error=(error[0], len(before)) + error[2:],
                        why="shuffle buffer: its order is implementation-defined")
    return Expected("exact", [(i, formed[j]) for i, j in enumerate(before)],
                    error=(error[0], len(before)) + error[2:])


# -- decoding and batching -------------------------------------------------------------------------
def decode(decoders: Sequence[Any], payloads: Sequence[bytes], key: int) -> Tuple:
    vals = []
    for dec, payload in zip(decoders, payloads):
        if dec is None:
            vals.append(bytes(payload))
        elif is_random(dec):
            vals.append(dec(memoryview(payload).toreadonly(), key=key))
        else:
            vals.append(dec(memoryview(payload).toreadonly()))
    return tuple(vals)


def canon_sample(values: Tuple) -> Tuple:
    return tuple(canon(v) for v in values)


def key_of(cfg: Any, epoch: int, position: int) -> int:
    return sample_key(cfg.reader_seed, epoch, cfg.shard_index, position)


def batch_lengths(n: int, batch_size: Optional[int], drop_last: bool, error: bool) -> List[int]:
    """Lengths of the batches of ``n`` samples (``None``: one sample at a time, as length-1 items)."""
    if batch_size is None:
        return [1] * n
    out = [batch_size] * (n // batch_size)
    if n % batch_size and (error or not drop_last):
        out.append(n % batch_size)
    return out
