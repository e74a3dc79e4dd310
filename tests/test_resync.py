"""Groups after a corrupt region (parrecio/pipeline/resync.py): a resync never pairs records of two
samples.  It realigns where it can know -- the .idx lists the group starts, or the fields' payload
kinds tell a group's first record -- and otherwise stops with a CorruptRecordError naming the damage,
under on_error="skip" too.  workers=0 and workers=2 give the same samples, errors and counts.

The reported case: ten [a_i][b_i] groups with the magic of a_5 destroyed used to give, in both modes,
(a4, b4), (b5, a6), (b6, a7), ... -- every later image paired with the next sample's label."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from PIL import Image as PILImage

from parrecio import CorruptRecordError, ParallelReader, RecordWriter
from parrecio.decoders import Image, Json, Raw
from parrecio.pipeline.resync import EXTRA_DROPS, Realigner
from parrecio.recordio.index import IndexMismatch


def _jpeg(i: int) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", (8, 8), (i % 256, 7, 9)).save(buf, "JPEG")
    return buf.getvalue()


def _write(path, groups, index: bool):
    """Write the groups; return every record's byte offset."""
    offsets = []
    with RecordWriter(path, index=index) as w:
        for g in groups:
            for rec in g:
                offsets.append(w.tell())
                w.write(rec)
    return offsets


def _damage(path, offsets, hits, how="magic"):
    data = bytearray(path.read_bytes())
    for k in hits:
        at = offsets[k]
        if how == "magic":
            data[at] ^= 0xFF
        else:  # a length word past the end: the frame cannot be read
            struct.pack_into("<I", data, at + 4, (1 << 29) - 1)
    path.write_bytes(bytes(data))


def _read(path, fields, workers, **kw):
    """(samples, error, skipped) of one pass."""
    out, err = [], None
    with ParallelReader(path, fields=fields, workers=workers, on_error="skip", **kw) as r:
        try:
            for s in r:
                out.append(s)
        except CorruptRecordError as exc:
            err = exc
        return out, err, r.stats.skipped


def _both(path, fields, **kw):
    a = _read(path, fields, 0, **kw)
    b = _read(path, fields, 2, **kw)
    assert len(a[0]) == len(b[0])
    for x, y in zip(a[0], b[0]):
        assert all(np.array_equal(u, v) if isinstance(u, np.ndarray) else u == v for u, v in zip(x, y))
    assert (type(a[1]), a[1] and (a[1].offset, a[1].index, str(a[1]))) == \
        (type(b[1]), b[1] and (b[1].offset, b[1].index, str(b[1])))
    assert a[2] == b[2] or a[1] is not None
    return a


def _raw_groups(n, nf):
    return [[b"%c%d" % (97 + r, i) * 8 for r in range(nf)] for i in range(n)]


def test_the_reported_case_stops_instead_of_mispairing(tmp_path, no_leaks):
    path = tmp_path / "ten.rec"
    groups = _raw_groups(10, 2)
    offsets = _write(path, groups, index=False)
    _damage(path, offsets, [10])  # a_5's magic
    out, err, _ = _both(path, [Raw(), Raw()])
    assert out == [tuple(g) for g in groups[:5]]
    assert isinstance(err, CorruptRecordError) and (err.offset, err.index) == (offsets[10], 5)
    assert str(err).startswith(f"cannot tell which record starts the next sample after the corrupt "
                               f"region at byte {offsets[10]}: the record at byte {offsets[11]} is text")
    assert "could be field '0', '1'" in str(err)


@pytest.mark.parametrize("nf", [2, 3, 4])
@pytest.mark.parametrize("how", ["magic", "length"])
def test_the_idx_realigns_at_the_next_group(tmp_path, nf, how, no_leaks):
    """Damage at every record position of a group: the .idx gives the next group's start; only the
    damaged group is lost, in both modes."""
    groups = _raw_groups(12, nf)
    for r in range(nf):
        path = tmp_path / f"idx{nf}{how}{r}.rec"
        offsets = _write(path, groups, index=True)
        _damage(path, offsets, [6 * nf + r], how)
        out, err, skipped = _both(path, [Raw()] * nf)
        assert err is None
        assert out == [tuple(g) for i, g in enumerate(groups) if i != 6]
        assert skipped == 1


@pytest.mark.parametrize("damaged", [0, 1])
def test_a_files_own_idx_realigns_where_another_file_has_none(tmp_path, damaged, no_leaks):
    """A channel of two files, one with its .idx: damage in that one is realigned by it.  It was used only
    when every file had one (the error even advised "a .idx beside the file", which was there)."""
    groups = _raw_groups(20, 2)
    paths = [tmp_path / "a.rec", tmp_path / "b.rec"]
    offsets = [_write(p, half, index=(i == damaged)) for i, (p, half) in enumerate(zip(paths, (groups[:10], groups[10:])))]
    _damage(paths[damaged], offsets[damaged], [9])  # group 4's second record in its file
    out, err, skipped = _both([str(p) for p in paths], [Raw(), Raw()])
    lost = 4 + 10 * damaged
    assert err is None and skipped == 1
    assert out == [tuple(g) for i, g in enumerate(groups) if i != lost]


@pytest.mark.parametrize("order,nf", [("image-first", 2), ("image-first", 3), ("json-first", 2)])
def test_payload_kinds_realign_without_an_index(tmp_path, order, nf, no_leaks):
    """[Image, Json], [Image, Json, Json] or [Json, Image]: a record only the first field reads starts a
    group.  Damage first, in the middle, at the end of a group, and across two groups."""
    def group(i):
        labels = [b'{"i": %d, "r": %d}' % (i, r) for r in range(nf - 1)]
        return [_jpeg(i)] + labels if order == "image-first" else [labels[0], _jpeg(i)] + labels[1:]
    fields = ([Image(size=4)] + [Json()] * (nf - 1) if order == "image-first"
              else [Json(), Image(size=4)] + [Json()] * (nf - 2))
    groups = [group(i) for i in range(12)]
    label = 1 if order == "image-first" else 0
    cases = [([4 * nf + r], {4}) for r in range(nf)] + [([4 * nf + nf - 1, 5 * nf], {4, 5})]
    for k, (hits, lost) in enumerate(cases):
        path = tmp_path / f"kinds{k}.rec"
        offsets = _write(path, groups, index=False)
        _damage(path, offsets, hits)
        out, err, skipped = _both(path, fields)
        assert err is None, err
        assert [s[label]["i"] for s in out] == [i for i in range(12) if i not in lost]
        assert all(s[label]["r"] == 0 for s in out)
        # one region across two groups: without an index, one broken group is all that is known
        assert skipped == (len(lost) if len(hits) == 1 else 1)


@pytest.mark.parametrize("image", [False, True], ids=["json-json", "json-image-json"])
def test_kinds_that_overlap_the_first_field_stop(tmp_path, image, no_leaks):
    """[Json, Json] or [Json, Image, Json]: after the damage a JSON record could be the first field or
    the last."""
    groups = [[b'{"a": %d}' % i] + ([_jpeg(i)] if image else []) + [b'{"b": %d}' % i] for i in range(8)]
    fields = [Json()] + ([Image(size=4)] if image else []) + [Json()]
    nf = len(fields)
    path = tmp_path / "jj.rec"
    offsets = _write(path, groups, index=False)
    hit = 3 * nf + nf - 1  # the last record of group 3
    _damage(path, offsets, [hit])
    out, err, _ = _both(path, fields)
    assert [s[0]["a"] for s in out] == [0, 1, 2]
    assert isinstance(err, CorruptRecordError) and err.offset == offsets[hit] and err.index == 3
    assert f"the record at byte {offsets[hit + 1]} is JSON text" in str(err)


def _damage_both(path, offsets, magic_at, length_at):
    """A run of damage: record ``magic_at``'s magic destroyed, the next one's length word too -- two
    regions for RecordReader, one right after the other, no record between them."""
    data = bytearray(path.read_bytes())
    data[offsets[magic_at]] ^= 0xFF
    struct.pack_into("<I", data, offsets[length_at] + 4, (1 << 29) - 1)
    path.write_bytes(bytes(data))


def test_a_run_of_damage_is_named_by_its_first_region(tmp_path, no_leaks):
    """[Raw] x 3, group 0's middle record has no magic and its last one a broken length word: the resync
    past the first lands on the second.  The stop names where the damage began (the differential test's
    find: it named the second region's byte, 3584 instead of 1752)."""
    groups = _raw_groups(4, 3)
    path = tmp_path / "run.rec"
    offsets = _write(path, groups, index=False)
    _damage_both(path, offsets, 1, 2)
    out, err, _ = _both(path, [Raw()] * 3)
    assert out == []
    assert isinstance(err, CorruptRecordError) and (err.offset, err.index) == (offsets[1], 0)
    assert f"after the corrupt region at byte {offsets[1]}: the record at byte {offsets[3]} is" in str(err)


def test_a_run_of_damage_that_ends_the_file_loses_its_group_and_nothing_else(tmp_path, no_leaks):
    """The same run in the file's last group: no record follows it, so none can be mispaired: the group
    is lost, the pass ends without an error (the differential reference called the first region
    "followed" by the broken record after it, and expected a stop)."""
    groups = _raw_groups(3, 3)
    path = tmp_path / "end.rec"
    offsets = _write(path, groups, index=False)
    _damage_both(path, offsets, 7, 8)
    out, err, skipped = _both(path, [Raw()] * 3)
    assert err is None and out == [tuple(g) for g in groups[:2]]
    assert skipped == 1


def test_recordreader_says_where_a_run_of_damage_began(tmp_path):
    from parrecio import RecordReader
    recs = [b"r%d" % i * 5 for i in range(8)]
    path = tmp_path / "rr.rec"
    offsets = _write(path, [[r] for r in recs], index=False)
    _damage_both(path, offsets, 1, 2)        # one run: two regions back to back
    _damage(path, offsets, [5])              # another, after records 3 and 4
    with RecordReader(str(path), on_corrupt="skip") as r:
        seen = []
        for rec in r:
            seen.append((rec.payload, r.last_corrupt, r.corrupt_run))
    assert [p for p, _, _ in seen] == [recs[i] for i in (0, 3, 4, 6, 7)]
    assert [(lc, run) for _, lc, run in seen] == [(None, None), (offsets[2], offsets[1]), (offsets[2], offsets[1]),
                                                  (offsets[5], offsets[5]), (offsets[5], offsets[5])]
    assert r.skipped_records == 3


def test_groups_of_one_skip_the_damage(tmp_path, no_leaks):
    recs = [[b"r%d" % i] for i in range(10)]
    path = tmp_path / "one.rec"
    offsets = _write(path, recs, index=False)
    _damage(path, offsets, [3, 4, 8])
    out, err, _ = _both(path, [Raw()])
    assert err is None and [s[0] for s in out] == [b"r%d" % i for i in (0, 1, 2, 5, 6, 7, 9)]


def test_raise_mode_still_raises_at_the_damage(tmp_path, no_leaks):
    path = tmp_path / "raise.rec"
    offsets = _write(path, _raw_groups(6, 2), index=True)
    _damage(path, offsets, [5])
    for workers in (0, 2):
        with ParallelReader(path, fields=[Raw(), Raw()], workers=workers) as r:
            with pytest.raises(CorruptRecordError) as info:
                list(r)
        assert (info.value.offset, info.value.index) == (offsets[5], 2)


def test_realigner_gives_up_when_nothing_can_start_a_group():
    """A stream of records the first field never reads (the wrong fields): not a silent drop of the
    rest of the stream."""
    r = Realigner((frozenset({"jpeg"}), frozenset({"json"})), ("image", "label"), "s.rec")
    r.damaged(100, open_group=False)
    for k in range(1 + EXTRA_DROPS):
        assert r.starts_group(200 + k, b'{"x": 1}') is False
    with pytest.raises(CorruptRecordError, match="could not realign the groups of 2 records after the "
                                                 "corrupt region at byte 100: 10 records dropped"):
        r.starts_group(300, b'{"x": 1}')


def test_realigner_with_an_index_that_does_not_match():
    r = Realigner((None, None), ("a", "b"), "s.rec", index=lambda: [0, 10, 20, 30])
    r.damaged(5, open_group=True)
    assert r.starts_group(10, b"x") is False   # the second record of group 0
    assert r.starts_group(20, b"x") is True    # group 1
    assert r.skipped_groups == 1
    r.damaged(25, open_group=True)             # inside group 1; no group starts after it
    for k in range(1 + EXTRA_DROPS):
        assert r.starts_group(40 + k, b"x") is False
    with pytest.raises(IndexMismatch) as caught:
        r.starts_group(99, b"x")
    assert str(caught.value).startswith(
        "could not realign the groups of 2 records after the corrupt region at byte 25: 10 records dropped, "
        "and its .idx lists no group start after it: the index does not fit this stream (bytes inserted or "
        "removed, or the file changed after it was written)")


@pytest.mark.parametrize("workers", [0, 2])
def test_bytes_inserted_after_the_idx_read_in_order_are_an_index_mismatch(tmp_path, workers, no_leaks):
    """4 bytes inserted between two groups after the .idx was written, read in order: the realignment by
    the .idx found no record at its next group start and gave up with a plain CorruptRecordError ('its
    .idx lists no group start there'), where a read by that index raises IndexMismatch (audit).  Now an
    IndexMismatch too, naming the .idx and the start it lists; the samples before it are delivered."""
    path = tmp_path / "g.rec"
    with RecordWriter(str(path), index=str(tmp_path / "g.idx")) as w:
        for i in range(20):
            w.write(b"img-%02d" % i)
            w.write(b"lbl-%02d" % i)
    data = path.read_bytes()
    at = 7 * 2 * 16  # group 7's first record (each record a 16-byte frame)
    path.write_bytes(data[:at] + b"\x11\x22\x33\x44" + data[at:])
    got = []
    with ParallelReader(str(path), fields=[Raw(), Raw()], workers=workers, on_error="skip") as reader:
        with pytest.raises(IndexMismatch) as caught:
            for a, b in reader:
                got.append((bytes(a), bytes(b)))
    assert got == [(b"img-%02d" % i, b"lbl-%02d" % i) for i in range(7)]
    assert str(caught.value).startswith(
        f"could not realign the groups of 2 records after the corrupt region at byte {at}: 10 records dropped, "
        f"and {tmp_path / 'g.idx'} lists the next group start at byte {at + 32}, where no record of this stream "
        f"starts: the index does not fit this stream (bytes inserted or removed")
