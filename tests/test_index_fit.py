"""An ``.idx`` that does not fit its file (docs/ARCHITECTURE.md "Formats": ``.idx``).

Reading by index (a shuffle or equal shards of indexed files, ``IndexedRecordReader``) groups records by
the index's offsets alone.  An index of one line per sample, with a line twice, of a file appended to
after it was written, of another file, or listing a multipart record's parts would pair records of two
samples or leave records out without a word.  Every record read by its index must end where the index
lists the next one (or where the file ends):
- where another record starts there (or the file ends), the index lists not every record: an
  ``IndexMismatch`` whatever ``on_error`` says (not one damaged sample), found before any sample for
  the first group and the last record;
- where no record starts there, the record's length word is damaged: one damaged sample, skipped
  under ``on_error="skip"`` (the index still says where the next group is).
"""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest

from parrecio import CorruptRecordError, IndexedRecordReader, ParallelReader
from parrecio.decoders import Raw
from parrecio.recordio.index import IndexMismatch
from pipeline_helpers import deadline, read_until_error
from recordio_helpers import M, frame

N = 12  # samples of two records: b"S<i>-R<r>|" and filler


def _payload(i: int, r: int) -> bytes:
    return b"S%03d-R%d|" % (i, r) + bytes([65 + (i * 7 + r) % 26]) * ((i * 5 + r * 3) % 23)


def _write(path, records):
    """``records``: payloads or pre-built frame bytes; returns each record's offset."""
    offs, out = [], b""
    for rec in records:
        offs.append(len(out))
        out += rec if isinstance(rec, (bytes, bytearray)) and rec[:4] == M else frame(rec)
    path.write_bytes(out)
    return offs


def _idx(path, offsets):
    path.with_suffix(".idx").write_text("".join(f"{k}\t{o}\n" for k, o in enumerate(offsets)))


def _samples():
    return [(_payload(i, 0), _payload(i, 1)) for i in range(N)]


def _records():
    return [p for s in _samples() for p in s]


def _read(path, workers, on_error, **kw):
    """Every sample a shuffled pass delivers before it ends, and how it ended."""
    with deadline(60), ParallelReader(str(path), fields=[Raw(), Raw()], workers=workers, shuffle=True, seed=3,
                                      on_error=on_error, **kw) as reader:
        got, err = read_until_error(reader, CorruptRecordError, lambda s: tuple(bytes(x) for x in s))
        return got, err, reader.stats.skipped


def _broken_indexes(tmp_path):
    """(name, path) of files whose .idx does not fit them, each with the first group or the last record
    showing it (found before any sample)."""
    out = []
    recs = _records()
    p = tmp_path / "starts.rec"  # one line per sample
    offs = _write(p, recs)
    _idx(p, offs[::2])
    out.append(("one line per sample", p, "another record starts"))
    p = tmp_path / "twice.rec"   # a line twice
    offs = _write(p, recs)
    _idx(p, offs[:9] + [offs[8]] + offs[9:])
    out.append(("a line twice", p, "more than once"))
    p = tmp_path / "appended.rec"  # records added after the .idx was written
    offs = _write(p, recs + [_payload(N, 0), _payload(N, 1)])
    _idx(p, offs[:-2])
    out.append(("appended", p, "another record follows it"))
    p = tmp_path / "empty.rec"  # a writer that died before writing its index
    _write(p, recs)
    _idx(p, [])
    out.append(("empty index", p, "lists no record"))
    p = tmp_path / "nozero.rec"  # its first line lost
    offs = _write(p, recs)
    _idx(p, offs[1:])
    out.append(("no line for byte 0", p, "no record at byte 0"))
    p = tmp_path / "parts.rec"  # a multipart record's parts listed as records (sample 0's first record)
    first = _payload(0, 0)
    parts = [frame(first[:8], 1), frame(first[8:], 3)]
    data, offs = b"", []
    for rec in [parts[0], parts[1]] + recs[1:]:
        offs.append(len(data))
        data += rec if rec[:4] == M else frame(rec)
    p.write_bytes(data)
    _idx(p, offs)
    out.append(("parts listed", p, "another record starts"))
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_an_index_that_does_not_fit_its_file_fails_before_any_sample(tmp_path, workers, on_error, no_leaks):
    for name, path, says in _broken_indexes(tmp_path):
        got, err, _ = _read(path, workers, on_error)
        assert got == [], name
        assert isinstance(err, IndexMismatch), (name, err)
        assert says in str(err) and path.with_suffix(".idx").name in str(err) and str(path) in str(err), (name, err)


def test_a_line_missing_mid_index_is_found_at_its_record_under_skip_too(tmp_path, no_leaks):
    """Found when the record before the gap is read (each record's end is checked as it is read)."""
    p = tmp_path / "gap.rec"
    offs = _write(p, _records())
    _idx(p, offs[:11] + offs[12:])  # sample 5's second record
    got, err, _ = _read(p, 0, "raise")  # (an odd count of records: said first)
    assert type(err) is CorruptRecordError and "not a multiple of the group size 2" in str(err)
    got, err, _ = _read(p, 0, "skip")
    assert isinstance(err, IndexMismatch) and err.offset == offs[10], err
    assert f"ends at byte {offs[11]}, where another record starts" in str(err)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("grow", [4, -4, "next"])
def test_a_damaged_length_word_loses_only_its_sample_under_skip(tmp_path, workers, grow, no_leaks):
    """The length word of sample 5's first record changes: it runs on over the next record (which is
    there, where the index says: 4, and "next" -- exactly to the record after, where another record starts
    too), or stops short amid its own bytes (-4).  Damage, not a wrong index: that sample is skipped and
    counted, every other one is exact."""
    p = tmp_path / "len.rec"
    offs = _write(p, _records())
    _idx(p, offs)
    data = bytearray(p.read_bytes())
    at = offs[10]
    (lrec,) = struct.unpack_from("<I", data, at + 4)
    new = offs[12] - at - 8 if grow == "next" else lrec + grow
    struct.pack_into("<I", data, at + 4, new)
    p.write_bytes(bytes(data))
    want = sorted(s for i, s in enumerate(_samples()) if i != 5)
    got, err, skipped = _read(p, workers, "skip")
    assert err is None and skipped == 1
    assert sorted(got) == want
    got, err, _ = _read(p, workers, "raise")
    assert type(err) is CorruptRecordError and err.offset == at
    end = at + 8 + (new + 3) // 4 * 4
    if grow == -4:
        assert f"no record starts at byte {end}: its length word is damaged" in str(err)
    else:
        assert f"the record runs on to byte {end}, past the record that {p.with_suffix('.idx')} lists at byte " \
               f"{offs[11]}: its length word is damaged" in str(err)


def test_bytes_after_the_last_record_are_not_its_damage(tmp_path, no_leaks):
    """Padding after the last record (a writer that rounds the file up) is no reason to refuse it by
    index: every sample, as the streamed read gives it."""
    p = tmp_path / "pad.rec"
    offs = _write(p, _records())
    _idx(p, offs)
    p.write_bytes(p.read_bytes() + b"\0" * 8)
    got, err, skipped = _read(p, 0, "raise")
    assert err is None and skipped == 0 and sorted(got) == sorted(_samples())
    with IndexedRecordReader(p) as r:
        assert r[len(offs) - 1] == _records()[-1]


def test_indexed_record_reader_checks_each_record_against_its_index(tmp_path):
    p = tmp_path / "r.rec"
    recs = _records()
    offs = _write(p, recs + [b"late"])
    _idx(p, offs[:-1])  # "late" was appended after the index was written
    with IndexedRecordReader(p) as r:
        assert [r[k] for k in range(len(recs) - 1)] == recs[:-1]  # exact, up to the last listed record
        with pytest.raises(IndexMismatch, match="another record follows it there"):
            r[len(recs) - 1]
    _idx(p, offs)
    with IndexedRecordReader(p) as r:
        assert [r[k] for k in range(len(r))] == recs + [b"late"]


def test_an_index_that_fits_reads_as_before(tmp_path, no_leaks):
    """The checks cost nothing to a good index: every sample, each once, with shuffles, shards, skip."""
    p = tmp_path / "ok.rec"
    offs = _write(p, _records())
    _idx(p, offs)
    for workers in (0, 2):
        got, err, skipped = _read(p, workers, "raise")
        assert err is None and skipped == 0 and sorted(got) == sorted(_samples())
    shards = []
    for k in range(3):
        with deadline(60), ParallelReader(str(p), fields=[Raw(), Raw()], workers=1, shuffle=True, seed=1,
                                          num_shards=3, shard_index=k) as reader:
            shards += [tuple(bytes(x) for x in s) for s in reader]
    assert sorted(shards) == sorted(_samples())
    assert np.unique(np.array([s[0] for s in shards], dtype=object)).size == N


def test_len_is_not_taken_from_an_index_that_does_not_fit(tmp_path, no_leaks):
    """len() counts the .idx lines (also for a streamed pass, shuffle=False): records appended after the
    index was written made it short of the pass (10 of 15 samples), which Keras takes as an epoch."""
    p = tmp_path / "appended.rec"
    offs = _write(p, _records() + [_payload(N, 0), _payload(N, 1)])
    _idx(p, offs[:-2])
    with ParallelReader(str(p), fields=[Raw(), Raw()], workers=0) as reader:
        with pytest.raises(TypeError, match="not known: an .idx does not fit its file: .*another record follows "
                                            "it there") as info:
            len(reader)
        assert isinstance(info.value.__cause__, IndexMismatch)
        # the stream itself is read whole (its .idx is read only after damage); list() asks len() for a hint
        assert len(list(reader)) == N + 1 and len(reader) == N + 1  # (from the pass now)
    _idx(p, offs)
    with ParallelReader(str(p), fields=[Raw(), Raw()], workers=0) as reader:
        assert len(reader) == N + 1


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("defect", ["line lost", "line twice"])
def test_a_read_in_order_does_not_realign_by_an_index_that_does_not_fit(tmp_path, workers, defect, no_leaks):
    """Read in order, the .idx is read only after damage, to find the next group start: with a line lost
    before the damage its group starts were the second records of the stream's groups (S03R1+S04R0, ...
    to the end, under skip, without a word).  The last group read whole before the damage must start where
    the index lists a group start, and the offsets must be an index's: else an IndexMismatch, after the
    samples before."""
    p = tmp_path / "s.rec"
    offs = _write(p, _records())
    listed = offs[:3] + offs[4:] if defect == "line lost" else offs[:3] + offs[2:]
    _idx(p, listed)
    data = bytearray(p.read_bytes())
    data[offs[14]:offs[14] + 4] = b"XXXX"  # sample 7's first record: damage, which needs the index
    p.write_bytes(bytes(data))
    with deadline(60), ParallelReader(str(p), fields=[Raw(), Raw()], workers=workers, on_error="skip") as reader:
        got, err = read_until_error(reader, CorruptRecordError, lambda s: tuple(bytes(x) for x in s))
    assert got == _samples()[:7]
    assert isinstance(err, IndexMismatch)
    if defect == "line lost":
        assert f"the last group read before the corrupt region at byte {offs[14]} starts at byte {offs[12]}, " \
               f"where {p.with_suffix('.idx')} lists no group start" in str(err)
    else:
        assert "more than once" in str(err)


@pytest.mark.parametrize("workers", [0, 1])
def test_the_index_check_reads_by_the_readers_join(tmp_path, workers, no_leaks):
    """A multipart record of 4-byte parts fits both conventions: join="auto" cannot read it, join="concat"
    can.  len() checked the index with a reader of join="auto", so len(), and list() (which asks it),
    raised AmbiguousJoin under join="concat" (found by the long differential tier)."""
    from parrecio.recordio.joins import AmbiguousJoin
    payload = bytes(range(1, 21))
    parts = [payload[i:i + 4] for i in range(0, 20, 4)]
    rec = tmp_path / "p.rec"
    rec.write_bytes(b"".join(frame(p, cflag=c) for p, c in zip(parts, [1, 2, 2, 2, 3])))
    (tmp_path / "p.idx").write_text("0\t0\n")
    with ParallelReader(str(rec), join="concat", workers=workers) as r:
        assert len(r) == 1
        assert list(r) == [payload]
    with ParallelReader(str(rec), workers=workers) as r:  # auto: the index fits; the record is what it cannot read
        assert len(r) == 1
        with deadline(60), pytest.raises(AmbiguousJoin, match="cannot tell how the multipart record at byte 0"):
            list(iter(r))


@pytest.mark.parametrize("workers", [0, 2])
def test_len_follows_files_refreshed_between_passes(tmp_path, workers, no_leaks):
    """len() was the last complete pass's count, or the .idx files' count read once: files refreshed to
    500 records (and their .idx) kept it at 300; records appended after the .idx gave 300 instead of the
    TypeError of an .idx that does not fit."""
    from parrecio import ParallelReader, RecordWriter

    def write(n, index=True):
        with RecordWriter(str(tmp_path / "d.rec"), index=str(tmp_path / "d.idx") if index else None) as w:
            for i in range(n):
                w.write(b"%d" % i, key=i)

    write(300)
    with ParallelReader(str(tmp_path / "d.rec"), workers=workers) as reader:
        assert len(reader) == 300 and len(list(reader)) == 300
        write(500)
        assert len(reader) == 500 and len(list(reader)) == 500
        with open(tmp_path / "d.rec", "ab") as f:                 # appended to, its .idx left as it was
            f.write((tmp_path / "d.rec").read_bytes()[:16])
        with pytest.raises(TypeError, match="an .idx does not fit its file"):
            len(reader)


@pytest.mark.parametrize("workers", [0, 2])
def test_len_of_a_file_rewritten_at_the_same_size_is_counted_again(tmp_path, workers, no_leaks):
    """No .idx: len() is the last complete pass's count, kept while the file is unchanged -- judged by its
    size alone, so a file rewritten as 50 records of the same total size as its 100 kept len() == 100.
    Its time counts too now: unknown again until a pass has read it."""
    import os
    from parrecio import ParallelReader, RecordWriter
    path = tmp_path / "s.rec"

    def write(n, size):
        with RecordWriter(str(path)) as w:
            for i in range(n):
                w.write(b"%0*d" % (size, i))

    write(100, 8)
    with ParallelReader(str(path), workers=workers) as reader:
        assert len(list(reader)) == 100 and len(reader) == 100
        before = os.stat(path)
        write(50, 24)  # 100 x (8 + 8) bytes, and 50 x (8 + 24): the same size
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns + 1_000_000))  # (a coarse clock: a new time)
        assert os.path.getsize(path) == before.st_size
        with pytest.raises(TypeError, match=r"not known: the files changed since the complete pass that counted "
                                            r"them \(no .idx file next to every .rec file\)"):
            len(reader)
        assert len(list(reader)) == 50 and len(reader) == 50


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("change, moved", [("insert", 8), ("insert", 12), ("remove", 4), ("remove", 8)])
def test_bytes_inserted_or_removed_after_the_index_was_written_are_a_mismatch(tmp_path, workers, change, moved,
                                                                              no_leaks):
    """Every offset the .idx lists after the change is off by as much: each group read there failed as a
    damaged sample, and under on_error="skip" the rest of the file was skipped one group at a time (100 of
    200 samples, no error).  Now an IndexMismatch names the change, under skip too; a record whose own head
    is damaged is still one sample (records of one size: the next record's start is no shift)."""
    path = tmp_path / "s.rec"
    records = _records()
    offs = _write(path, records)
    _idx(path, offs)
    data = path.read_bytes()
    at = offs[2 * (N // 2)]  # the first record of the middle sample
    if change == "insert":
        data = data[:at] + b"\0" * moved + data[at:]
    else:  # the record before it loses its last ``moved`` bytes (its length word says so)
        before = offs[2 * (N // 2) - 1]
        n = struct.unpack_from("<I", data, before + 4)[0]
        assert n % 4 == 0 or n > moved
        new = frame(records[2 * (N // 2) - 1][:n - moved])
        data = data[:before] + new + data[at:]
        assert len(data) in (len(path.read_bytes()) - moved, len(data))
    path.write_bytes(data)
    # (bytes removed from a record: read first, it ends short of its listed end, check_end's mismatch)
    how = "bytes were inserted into the file after the index was written" if change == "insert" else \
        "bytes were removed from the file after the index was written|the index is not this file's"
    got, err, _ = _read(path, workers, "skip")
    assert isinstance(err, IndexMismatch) and re.search(how, str(err)), err
    with IndexedRecordReader(path) as r:
        with pytest.raises(IndexMismatch, match=how):
            [r[k] for k in range(len(offs))]


@pytest.mark.parametrize("workers", [0, 2])
def test_bytes_between_records_removed_after_the_index_was_written_are_a_mismatch(tmp_path, workers, no_leaks):
    """Bytes that started no record (a writer's padding) removed after the index listed the records after
    them: every later listed offset is 8 bytes past its record's start."""
    path = tmp_path / "p.rec"
    records = _records()
    at = 2 * (N // 2)
    offs = _write(path, records[:at])
    tail = _write(tmp_path / "tail.rec", records[at:])
    head = path.read_bytes()
    _idx(path, offs + [len(head) + 8 + o for o in tail])
    path.write_bytes(head + (tmp_path / "tail.rec").read_bytes())
    got, err, _ = _read(path, workers, "skip")
    assert isinstance(err, IndexMismatch), err
    assert "starts at byte %d, and ends where the next would, 8 bytes earlier too: bytes were removed from the " \
           "file" % (len(head) + tail[1]) in str(err) or "8 bytes earlier too: bytes were removed from" in str(err)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_damaged_head_among_records_of_one_size_is_one_sample_not_a_shift(tmp_path, workers, no_leaks):
    path = tmp_path / "e.rec"
    records = [b"%04d" % i * 6 for i in range(2 * N)]  # every frame 32 bytes
    offs = _write(path, records)
    _idx(path, offs)
    data = bytearray(path.read_bytes())
    data[offs[8]] ^= 0x40  # sample 4's first record: its magic
    path.write_bytes(bytes(data))
    got, err, skipped = _read(path, workers, "skip")
    assert err is None and skipped == 1
    assert sorted(got) == [(records[2 * i], records[2 * i + 1]) for i in range(N) if i != 4]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("damaged", [1, 5])
def test_a_damaged_head_over_a_payload_of_recordio_frames_is_one_sample_not_a_shift(tmp_path, workers, damaged,
                                                                                   no_leaks):
    """Payloads that hold whole RecordIO frames (a nested .rec): with the damaged record's head gone, a frame
    inside its payload ended where a move would put the next record (one of the next record's size), or at
    the file's end (the last record) -- and the whole pass was an IndexMismatch (an audit).  A move is told
    only where the next listed record is missing too."""
    path = tmp_path / "n.rec"
    nested = frame(b"x" * 16)  # 24 bytes: one whole frame
    records = [b"pfx!" + frame(b"%d" % i * 4) + nested if i in (1, 5) else b"y" * 16 for i in range(6)]
    # (record 2's frame is the size of the one nested in record 1's payload; record 5's last frame ends
    # at the file's end)
    offs = _write(path, records)
    _idx(path, offs)
    data = bytearray(path.read_bytes())
    data[offs[damaged]:offs[damaged] + 4] = b"XXXX"
    path.write_bytes(bytes(data))
    with deadline(60), ParallelReader(str(path), workers=workers, shuffle=True, seed=3, on_error="skip") as r:
        got = sorted(bytes(p) for p in r)
        assert r.stats.skipped == 1
    assert got == sorted(records[i] for i in range(6) if i != damaged)
