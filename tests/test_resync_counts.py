"""What damage costs is counted (docs/ARCHITECTURE.md "Formats": resync; README "Reliability").

Random damage to the frame headers of a stream of ``[Raw()] * nf`` groups with its ``.idx``, read in
order under ``on_error="skip"``: no sample pairs records of two samples, the order holds, and -- where
the pass ends without an error -- every group that was not delivered is counted in ``stats.skipped``
(with the ``.idx``: exactly; groups one corrupt region swallowed whole, and damage that runs on to the
end of the file, included).  A plain reference (the payloads are tagged by sample and record) says
which groups were delivered.

The damage is to what framing can see: the magic and the continuation flag (a length word changed so
that the record still frames, ending on another record's start, swallows records without a trace in a
stream: RecordIO has no checksum; read by index, the record's end is checked, tests/test_index_fit.py).
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from parrecio import CorruptRecordError, ParallelReader
from parrecio.decoders import Raw
from pipeline_helpers import read_until_error
from recordio_helpers import frame

N = 16


def _groups(nf):
    return [[(b"S%03d-R%d|" % (i, r)) * (1 + (i * 7 + r * 13) % 5) for r in range(nf)] for i in range(N)]


def _tag(payload):
    b = bytes(payload)
    if b[:1] == b"S" and b[4:6] == b"-R" and b"|" in b:
        return int(b[1:4]), int(b[6:b.index(b"|")])
    return None


def _read(path, nf):
    """One pass under on_error="skip": the samples (lists of payload bytes), the error that ended it (or
    None), stats.skipped."""
    with ParallelReader(str(path), fields=[Raw()] * nf, workers=0, on_error="skip") as reader:
        got, err = read_until_error(reader, CorruptRecordError, lambda s: [bytes(p) for p in s])
        return got, err, reader.stats.skipped


def _write(path, groups):
    data, offs = b"", []
    for g in groups:
        for rec in g:
            offs.append(len(data))
            data += frame(rec)
    path.write_bytes(data)
    path.with_suffix(".idx").write_text("".join(f"{k}\t{o}\n" for k, o in enumerate(offs)))
    return bytearray(data), offs


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(nf=st.sampled_from([1, 2, 3]), cut=st.booleans(),
       hits=st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from([0, 1, 2, 3, 7]), st.integers(1, 255)),
                     min_size=1, max_size=3))
def test_damaged_headers_lose_only_counted_groups(tmp_path_factory, nf, cut, hits):
    path = tmp_path_factory.mktemp("dmg") / "d.rec"
    groups = _groups(nf)
    data, offs = _write(path, groups)
    for rec, byte, x in hits:
        data[offs[rec % len(offs)] + byte] ^= x if byte < 4 else x & 0xE0 or 0x20  # (byte 7: the flag bits)
    if cut:  # and the file ends inside its last records
        data = data[:offs[-1] + 5 + hits[0][0] % 20]
    path.write_bytes(bytes(data))
    out, err, skipped = _read(path, nf)
    seen, changed = [], 0
    for sample in out:
        tags = [_tag(p) for p in sample]
        owners = {t[0] for t in tags if t is not None}
        assert len(owners) <= 1, f"records of samples {sorted(owners)} paired in one sample"
        assert all(t is None or t[1] == r for r, t in enumerate(tags)), tags
        if not owners:
            changed += 1
            continue
        i = owners.pop()
        if [bytes(p) for p in sample] != groups[i]:  # a length word damaged within its record's bytes
            changed += 1
        seen.append(i)
    assert seen == sorted(set(seen))
    if err is None:
        assert skipped == N - len(seen) - changed, (skipped, N, seen, changed)


def _read_skip(path, nf):
    got, err, skipped = _read(path, nf)
    assert err is None, err
    return got, skipped


@pytest.mark.parametrize("tail", [b"\0" * 8, b"\0" * 3, b"\x0a\x23\xd7"])
@pytest.mark.parametrize("index", [False, True])
def test_bytes_after_the_last_group_are_no_lost_group(tmp_path, tail, index):
    """Padding or a torn magic after the last whole group: every group delivered, none counted lost."""
    path = tmp_path / "t.rec"
    groups = _groups(2)
    data, _ = _write(path, groups)
    if not index:
        path.with_suffix(".idx").unlink()
    path.write_bytes(bytes(data) + tail)
    got, skipped = _read_skip(path, 2)
    assert got == groups and skipped == 0


@pytest.mark.parametrize("g, over", [(3, 1), (N - 2, 1), (3, 2), (3, 3)])
def test_groups_swallowed_by_the_length_word_before_them_are_counted(tmp_path, g, over):
    """Group g's last record runs on over the groups after it, ending 4 bytes into a record of the
    ``over``-th: g is delivered (its last record changed: RecordIO has no checksum), the groups it ran
    into are lost -- and counted, the .idx saying they were there."""
    path = tmp_path / "r.rec"
    groups = _groups(2)
    data, offs = _write(path, groups)
    at = offs[2 * g + 1]
    into = min(2 * (g + over) + 1, len(offs) - 1)  # (the second record of group g + over)
    struct.pack_into("<I", data, at + 4, offs[into] - at - 8 + 4)
    path.write_bytes(bytes(data))
    got, skipped = _read_skip(path, 2)
    tags = [_tag(s[0])[0] for s in got]
    lost = list(range(g + 1, min(g + over, N - 1) + 1))
    assert [t for t in range(N) if t not in tags] == lost and skipped == len(lost)


def test_two_damaged_groups_are_counted_once_each(tmp_path):
    """The second damage's group is counted from where reading went on after the first (it counted the
    first one's group again: 3 for 2)."""
    path = tmp_path / "d.rec"
    groups = _groups(2)
    data, offs = _write(path, groups)
    for k in (4, 7):  # group 2's first record, group 3's second
        data[offs[k]] ^= 1
    path.write_bytes(bytes(data))
    got, skipped = _read_skip(path, 2)
    assert [_tag(s[0])[0] for s in got] == [0, 1] + list(range(4, N)) and skipped == 2


@pytest.mark.parametrize("damage", ["magic", "swallow", "cut"])
@pytest.mark.parametrize("workers, shards", [(0, 1), (2, 1), (2, 2)])
def test_records_of_groups_of_one_lost_to_damage_are_counted_by_the_idx(tmp_path, damage, workers, shards,
                                                                        no_leaks):
    """Groups of one record need no realigning, and their losses were counted only as corrupt regions:
    one region for three records swallowed by the length word before them.  With the .idx, stats.skipped
    counts each record lost inside the file, and the one a cut file ends inside (every path: the reader
    process's loop, workers=0's, and shards, whose ranks each count the stream's losses)."""
    path = tmp_path / "o.rec"
    records = [g[0] for g in _groups(1)]
    data, offs = _write(path, [[r] for r in records])
    if damage == "magic":
        data[offs[5]] ^= 1
        lost = [5]
    elif damage == "swallow":  # record 3 runs on 4 bytes into record 6
        struct.pack_into("<I", data, offs[3] + 4, offs[6] - offs[3] - 8 + 4)
        lost = [4, 5, 6]
    else:  # (records past the cut are not counted: cut at a record's end, nothing would show them)
        data = data[:offs[8] + 20]
        lost = list(range(8, N))
    path.write_bytes(bytes(data))
    seen = []
    for k in range(shards):
        with ParallelReader(str(path), workers=workers, on_error="skip", num_shards=shards, shard_index=k) as r:
            seen += [_tag(p)[0] for p in r if _tag(p) is not None]
            assert r.stats.skipped == (1 if damage == "cut" else len(lost)) and r.stats.skipped_records == 1
    assert sorted(seen) == [i for i in range(N) if i not in lost]
    path.with_suffix(".idx").unlink()  # without it, only the corrupt region is counted
    with ParallelReader(str(path), workers=workers, on_error="skip") as r:
        assert len(list(r)) == N - len(lost)  # (record 3 delivered with the bytes it ran over: no checksum)
        assert (r.stats.skipped, r.stats.skipped_records) == (0, 1)


def test_an_index_of_a_longer_file_counts_only_the_records_lost_inside_this_one(tmp_path, no_leaks):
    """Groups of one record: the count of records lost is those the .idx lists inside the file less those
    framed.  An index written for a longer version of the file (offsets past its end) counted 81 records
    lost to one damaged head (an audit); it counts the one."""
    path = tmp_path / "s.rec"
    records = [g[0] for g in _groups(1)]
    _, long_offs = _write(path, [[r] for r in records * 6])  # the .idx of a file 6 times as long
    data, offs = _write(path, [[r] for r in records])
    path.with_suffix(".idx").write_text("".join(f"{k}\t{o}\n" for k, o in enumerate(long_offs)))
    data[offs[5]] ^= 1
    path.write_bytes(bytes(data))
    for workers in (0, 2):
        with ParallelReader(str(path), workers=workers, on_error="skip") as r:
            assert len(list(r)) == N - 1
            assert (r.stats.skipped, r.stats.skipped_records) == (1, 1)
