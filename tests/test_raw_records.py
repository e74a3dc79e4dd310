"""Raw records (``fields=None``) at memory speed: the paths that make them fast, checked for what they
deliver -- byte-exact payloads in stream order, resumable positions, clean ends.

- the reader process frames plain records of a mapped file in bulk (``RecordReader.scan_flat``) and
  lets the general framing take the record it stops at (multipart, damage, the end);
- an unbatched pass hands out a chunk's payloads copied lazily, each just before the user gets it
  (``feed.Payloads``: slices of the ring or of the mapping, ``os.pread`` for large ones), and releases
  the chunk only once all were taken;
- ``ParallelReader._iterate`` drives the pipeline once per span, not per sample.

See docs/ARCHITECTURE.md, "Raw records".
"""

from __future__ import annotations

import os
import threading
from array import array

import pytest
from hypothesis import given, settings, strategies as st

from parrecio import ParallelReader, RecordReader, Tuning
from parrecio.errors import PipelineError
from parrecio.pipeline.feed import PREAD_BYTES
from pipeline_helpers import deadline, our_children, write_rec
from recordio_helpers import concat_frames, frame


# -- scan_flat against iter_views ------------------------------------------------------------------------

def _stream(kinds, sizes, seed=0):
    """Frames for ``kinds`` (0: plain, 1: multipart by concatenation, 2: a damaged header), and the
    payloads a reader must return under on_corrupt="skip", join="concat"."""
    import random
    rnd = random.Random(seed)
    out, want = [], []
    for kind, size in zip(kinds, sizes):
        payload = bytes(rnd.getrandbits(8) for _ in range(size))
        if kind == 1 and size >= 2:
            out.append(concat_frames(payload, [size // 2]))
            want.append(payload)
        elif kind == 2:
            out.append(b"\x01\x02\x03\x04" + frame(payload)[4:])  # bad magic: skipped as damage
        else:
            out.append(frame(payload))
            want.append(payload)
    return b"".join(out), want


def _scan_all(data, steps):
    """Every record of ``data`` as (offset, payload), by scan_flat with the limits ``steps`` (cycled)
    and one iter_views step whenever it stops before a limit -- the reader process's loop."""
    r = RecordReader.over(data, 0, join="concat", on_corrupt="skip")
    got = []
    i = 0
    while True:
        max_n, max_b = steps[i % len(steps)]
        i += 1
        offs, lens, soffs = array("q"), array("q"), []
        n, nb = r.scan_flat(offs, lens, soffs, max_n, max_b)
        assert n == len(offs) == len(lens) == len(soffs) and nb == sum(lens)
        assert n <= max_n
        assert n == 0 or sum(lens[:-1]) < max_b  # it stops after the record that reaches max_bytes
        got += [(s, bytes(data[o:o + k])) for o, k, s in zip(offs, lens, soffs)]
        if n == max_n or nb >= max_b:
            continue
        views = r.iter_views()
        one = next(views, None)
        views.close()
        if one is None:
            return got, r
        got.append((one[0], bytes(one[1])))


@settings(max_examples=60, deadline=None)
@given(kinds=st.lists(st.sampled_from([0, 0, 0, 1, 2]), min_size=0, max_size=40),
       steps=st.lists(st.tuples(st.integers(1, 7), st.integers(1, 300)), min_size=1, max_size=4),
       seed=st.integers(0, 1000))
def test_scan_flat_frames_what_iter_views_frames(kinds, steps, seed):
    sizes = [(seed * 7 + i * 13) % 90 for i in range(len(kinds))]
    data, want = _stream(kinds, sizes, seed)
    ref = RecordReader.over(data, 0, join="concat", on_corrupt="skip")
    expected = [(o, bytes(v)) for o, v in ref.iter_views()]
    got, r = _scan_all(data, steps)
    assert got == expected
    assert [p for _, p in got] == want
    assert (r.skipped_records, r.skipped_bytes) == (ref.skipped_records, ref.skipped_bytes)


def test_scan_flat_needs_a_reader_over_a_buffer(tmp_path):
    write_rec(tmp_path / "a.rec", [b"x"])
    with RecordReader(str(tmp_path / "a.rec")) as r:
        with pytest.raises(RuntimeError, match="RecordReader.over"):
            r.scan_flat([], [], [], 1, 1)


def test_scan_flat_stops_at_a_truncated_last_record_and_iter_views_reports_it():
    data = frame(b"abcd") + frame(b"efghij")[:-3]
    r = RecordReader.over(data, 0, on_corrupt="raise")
    offs, lens, soffs = [], [], []
    assert r.scan_flat(offs, lens, soffs, 10, 10**6) == (1, 4)
    assert (offs, lens, soffs) == ([8], [4], [0])
    with pytest.raises(Exception, match="offset 12"):
        list(r.iter_views())


# -- whole passes ------------------------------------------------------------------------------------------

def _records(n, seed, big_every=0, big=0):
    """``n`` payloads of 0..300 bytes, every ``big_every``-th one ``big`` bytes long."""
    import random
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        k = big if big_every and i % big_every == big_every - 1 else rnd.randrange(0, 301)
        out.append(rnd.randbytes(k) if k else b"")
    return out


SMALL_RING = Tuning(ring_bytes=1 << 20)


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_raw_pass_is_byte_exact_over_many_ring_wraps(tmp_path, no_leaks, workers):
    """0-byte to 600 KB records (over half the 1 MiB ring: one-off segments when streamed; pread when
    mapped), from a mapped file and from a stream, two epochs each, against the plain list."""
    recs = _records(3000, 1, big_every=97, big=600_000)
    recs[5] = b"\x0a\x23\xd7\xce" * 50  # contains the magic: a multipart record for MXNet's writer
    path = tmp_path / "raw.rec"
    write_rec(path, recs)
    assert sum(map(len, recs)) > 10 * (1 << 20)  # the ring wraps many times
    with deadline(120):
        with ParallelReader(str(path), workers=workers, tuning=SMALL_RING) as r:
            for _ in range(2):
                got = list(r)
                assert len(got) == len(recs)
                assert all(type(g) is bytes for g in got)
                assert got == recs
        with open(path, "rb") as f, ParallelReader(f, workers=workers, tuning=SMALL_RING) as r:
            assert list(r) == recs  # a file object: read into the ring, not mapped


def test_large_payloads_of_a_mapped_file_are_preaded_exactly(tmp_path, no_leaks):
    sizes = [PREAD_BYTES - 1, PREAD_BYTES, PREAD_BYTES + 1, 0, 3 * PREAD_BYTES + 5, 1]
    recs = [bytes([i]) * k for i, k in enumerate(sizes)] * 40
    path = tmp_path / "big.rec"
    write_rec(path, recs)
    with ParallelReader(str(path), workers=2) as r:
        assert list(r) == recs
    with ParallelReader(str(path), workers=2, batch_size=7) as r:  # batched: copied a chunk at once
        got = [x for b in r for x in b]
        assert got == recs


def test_held_payloads_do_not_change_when_the_ring_is_reused(tmp_path, no_leaks):
    """Lazily copied payloads are copies: kept while the ring wraps underneath, they stay as read."""
    recs = _records(4000, 2, big_every=50, big=200_000)
    path = tmp_path / "held.rec"
    write_rec(path, recs)
    with open(path, "rb") as f, ParallelReader(f, workers=1, tuning=SMALL_RING) as r:
        held = []
        for x in r:
            held.append(x)
        assert held == recs


@pytest.mark.parametrize("workers", [0, 2])
def test_early_break_and_resume_give_each_record_once(tmp_path, no_leaks, workers):
    recs = _records(5000, 3)
    path = tmp_path / "resume.rec"
    write_rec(path, recs)
    for stop in (1, 777, 4999):
        with ParallelReader(str(path), workers=workers, tuning=SMALL_RING) as r:
            head = []
            for x in r:
                head.append(x)
                if len(head) == stop:
                    state = r.state_dict()
                    break
            assert our_children() == [] or workers
        with ParallelReader(str(path), workers=workers, tuning=SMALL_RING) as r:
            r.load_state_dict(state)
            tail = list(r)
        assert head + tail == recs, stop


def test_state_dict_mid_span_counts_the_samples_handed_out(tmp_path, no_leaks):
    recs = _records(2000, 4)
    path = tmp_path / "pos.rec"
    write_rec(path, recs)
    with ParallelReader(str(path), workers=2) as r:
        it = iter(r)
        for i in range(1, 1500):
            assert next(it) == recs[i - 1]
            if i in (1, 2, 333, 1499):
                assert r.state_dict()["position"] == i


def test_close_from_another_thread_ends_a_raw_pass(tmp_path, no_leaks):
    recs = _records(200_000, 5)
    path = tmp_path / "close.rec"
    write_rec(path, recs)
    r = ParallelReader(str(path), workers=2)
    taken = []
    with deadline(60):
        with pytest.raises(PipelineError, match="ended by close"):
            for x in r:
                taken.append(x)
                if len(taken) == 1000:
                    threading.Thread(target=r.close).start()
    assert taken == recs[:len(taken)]
    r.close()


def test_a_damaged_record_in_a_mapped_file_is_skipped_and_the_rest_kept(tmp_path, no_leaks):
    recs = _records(3000, 6)
    path = tmp_path / "damaged.rec"
    offsets = write_rec(path, recs)
    data = bytearray(path.read_bytes())
    data[offsets[1234]:offsets[1234] + 4] = b"\0\0\0\0"  # its magic
    path.write_bytes(bytes(data))
    for workers in (0, 2):
        with ParallelReader(str(path), workers=workers, on_error="skip") as r:
            got = list(r)
            assert got == recs[:1234] + recs[1235:]
            assert r.stats.skipped_records == 1
        with ParallelReader(str(path), workers=workers) as r:
            got = []
            with pytest.raises(Exception, match=f"offset {offsets[1234]}"):
                for x in r:
                    got.append(x)
            assert got == recs[:1234]


def test_an_empty_and_a_one_record_file(tmp_path, no_leaks):
    (tmp_path / "empty.rec").write_bytes(b"")
    write_rec(tmp_path / "one.rec", [b""])
    for workers in (0, 2):
        with ParallelReader(str(tmp_path / "empty.rec"), workers=workers) as r:
            assert list(r) == []
        with ParallelReader(str(tmp_path / "one.rec"), workers=workers) as r:
            assert list(r) == [b""]


def test_no_shared_memory_left_after_a_killed_reader_process(tmp_path, no_leaks):
    recs = _records(100_000, 7)
    path = tmp_path / "kill.rec"
    write_rec(path, recs)
    with ParallelReader(str(path), workers=2, tuning=SMALL_RING) as r:
        it = iter(r)
        assert next(it) == recs[0]
        os.kill(r._res.run.reader_pid, 9)
        with deadline(60):
            with pytest.raises(PipelineError):
                for _ in it:
                    pass


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_more_files_than_stay_mapped_read_back_exactly(tmp_path, no_leaks, workers):
    """A directory of 20 files, more than the 16 that one process keeps mapped (``MappedFiles``): a
    file's mapping and descriptor are closed while later files are read, and a lazily copied payload
    (``pread`` of 32 KiB and more, slices below) must still come from its own file."""
    from parrecio.pipeline.mapped import MappedFiles
    files = 20
    assert files > MappedFiles().capacity
    root = tmp_path / "many"
    root.mkdir()
    want = []
    for i in range(files):
        sizes = [0, 5, PREAD_BYTES - 1, PREAD_BYTES, 3 * PREAD_BYTES + i, 100 + i]
        recs = [bytes([i]) * 3 + os.urandom(k) for k in sizes]  # each payload names its file
        write_rec(root / f"part-{i:02d}.rec", recs)
        want += recs
    with deadline(120), ParallelReader(str(root), workers=workers, tuning=SMALL_RING) as r:
        for _ in range(2):
            assert list(r) == want
    with deadline(120), ParallelReader(str(root), workers=workers, batch_size=5) as r:
        assert [x for b in r for x in b] == want
