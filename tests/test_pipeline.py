"""ParallelReader: output equals a sequential decode, in order, for any number of workers and batch
sizes; framing, group and decode errors follow the policy; memory handed out is never overwritten;
nothing is left behind."""

from __future__ import annotations

import itertools
import os
import time

import numpy as np
import pytest

from parrecio import CorruptRecordError, DecodeError, ParallelReader, Tuning
from parrecio.decoders import Json, Raw
from pipeline_helpers import (Fixed, FixedNoInto, FailOn, Pair, Ragged, Sleepy, deadline, digest_array, feed_fifo,
                              payloads, write_rec)


@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    recs = payloads(400, seed=1)
    path = tmp_path_factory.mktemp("pipe") / "s.rec"
    offsets = write_rec(path, recs)
    return path, recs, offsets


def flatten(batches):
    return [x for b in batches for x in b]


@pytest.mark.parametrize("workers", [1, 2, 3, 8])
@pytest.mark.parametrize("batch_size", [None, 1, 7, 64])
def test_equals_sequential_decode(stream, workers, batch_size, no_leaks):
    path, recs, _ = stream
    expected = [digest_array(r) for r in recs]
    with ParallelReader(path, fields=Sleepy(2.0), workers=workers, batch_size=batch_size,
                        tuning=Tuning(chunk_groups=5)) as reader:
        out = list(reader)
        assert len(reader.worker_pids) == workers
    if batch_size is None:
        got = out
    else:
        assert [len(b) for b in out] == [min(batch_size, len(recs) - i) for i in range(0, len(recs), batch_size)]
        assert all(isinstance(b, np.ndarray) and b.dtype == np.uint8 for b in out)
        got = flatten(out)
    assert len(got) == len(expected)
    for i, (a, b) in enumerate(zip(got, expected)):
        assert np.array_equal(a, b), f"sample {i} differs"


def test_tuples_dicts_and_mixed_fields(stream, no_leaks):
    path, recs, _ = stream
    groups = [recs[i:i + 3] for i in range(0, len(recs) - len(recs) % 3, 3)]
    with ParallelReader(path, fields={"a": Raw(), "b": Fixed(), "c": Ragged()}, workers=2,
                        on_error="skip") as reader:
        out = list(reader)
    assert len(out) == len(groups)
    for s, g in zip(out, groups):
        assert s["a"] == g[0]
        assert np.array_equal(s["b"], digest_array(g[1]))
        assert np.array_equal(s["c"], np.frombuffer(g[2][: len(g[2]) // 4 * 4], np.int32))
    # 400 records in groups of 3: one record left over, counted as a skipped (broken) group
    assert reader.stats.skipped == 1
    with ParallelReader(path, fields=(Raw(), Pair()), workers=2, batch_size=16) as reader:
        batches = list(reader)
    b0 = batches[0]
    assert isinstance(b0, tuple) and len(b0) == 2
    assert b0[0] == recs[0:32:2]
    images, infos = b0[1]
    assert images.shape == (16, 4, 3) and np.array_equal(images[3], digest_array(recs[7]))
    assert infos == [{"n": len(r)} for r in recs[1:32:2]]


def test_fixed_spec_without_decode_into_and_ragged_batches(stream, no_leaks):
    path, recs, _ = stream
    with ParallelReader(path, fields=[FixedNoInto(), Ragged()], workers=2, batch_size=10) as reader:
        batches = list(reader)
    fixed = np.concatenate([b[0] for b in batches])
    assert np.array_equal(fixed, np.stack([digest_array(r) for r in recs[0::2]]))
    # ragged arrays of different lengths stay a list
    assert isinstance(batches[0][1], list)
    assert all(np.array_equal(x, np.frombuffer(r[: len(r) // 4 * 4], np.int32))
               for x, r in zip(flatten(b[1] for b in batches), recs[1::2]))


def test_raw_passthrough_of_100k_small_records(tmp_path, no_leaks):
    recs = [i.to_bytes(4, "little") * (i % 5) for i in range(100_000)]
    path = tmp_path / "small.rec"
    write_rec(path, recs)
    with ParallelReader(path, workers=2) as reader:
        out = list(reader)
        assert reader.worker_pids == []  # nothing to decode: no decoder process at all
    assert out == recs
    assert reader.stats.samples == 100_000 and reader.stats.records == 100_000


def test_empty_and_huge_records_larger_than_the_ring(tmp_path, no_leaks):
    rng = np.random.default_rng(5)
    big = rng.integers(0, 256, 3 << 20, dtype=np.uint8).tobytes()
    recs = [b"", big, b"x", b"", big[:1 << 20], b"tail"]
    path = tmp_path / "big.rec"
    write_rec(path, recs)
    for fields in (None, Fixed()):
        with ParallelReader(path, fields=fields, workers=2, tuning=Tuning(ring_bytes=1 << 20)) as reader:
            out = list(reader)
        if fields is None:
            assert out == recs
        else:
            assert all(np.array_equal(a, digest_array(r)) for a, r in zip(out, recs))
            assert len(out) == len(recs)


@pytest.mark.parametrize("group", [1, 2, 3])
def test_group_sizes(stream, group, no_leaks):
    path, recs, offsets = stream
    n = len(recs) // group * group
    fields = [Raw()] * group
    with ParallelReader(path, fields=fields, workers=2, on_error="raise") as reader:
        it = iter(reader)
        got = []
        if n == len(recs):
            got = list(it)
        else:
            with pytest.raises(CorruptRecordError) as ei:
                for s in it:
                    got.append(s)
            err = ei.value
            assert err.offset == offsets[n]
            assert err.index == n // group
            assert f"byte offset {offsets[n]}" in str(err) and f"sample {n // group}" in str(err)
            assert "inside a group" in str(err)
    assert got == [tuple(recs[i:i + group]) for i in range(0, n, group)]


def test_decode_error_is_raised_at_its_position(tmp_path, no_leaks):
    recs = [b"ok%d" % i for i in range(100)]
    recs[37] = b"BAD-record"
    path = tmp_path / "e.rec"
    offsets = write_rec(path, recs)
    got = []
    with ParallelReader(path, fields=FailOn(b"BAD"), workers=2, tuning=Tuning(chunk_groups=4)) as reader:
        with pytest.raises(DecodeError) as ei:
            for s in reader:
                got.append(s)
    err = ei.value
    assert len(got) == 37 and all(np.array_equal(a, digest_array(r)) for a, r in zip(got, recs))
    assert (err.index, err.offset) == (37, offsets[37])
    assert "sample 37" in str(err) and f"byte offset {offsets[37]}" in str(err)
    assert "refusing" in str(err) and isinstance(err.__cause__, ValueError)
    with ParallelReader(path, fields=FailOn(b"BAD"), workers=2, batch_size=10, on_error="skip") as reader:
        out = flatten(list(reader))
        assert reader.stats.skipped == 1
    assert len(out) == 99
    assert all(np.array_equal(a, digest_array(r)) for a, r in zip(out, recs[:37] + recs[38:]))


def test_json_field_errors_name_the_field(tmp_path, no_leaks):
    recs = [b"img", b'{"a": 1}', b"img", b"{not json"]
    path = tmp_path / "j.rec"
    offsets = write_rec(path, recs)
    with ParallelReader(path, fields={"image": Raw(), "label": Json()}, workers=1) as reader:
        it = iter(reader)
        assert next(it) == {"image": b"img", "label": {"a": 1}}
        with pytest.raises(DecodeError, match=r"field 'label'.*invalid JSON.*sample 1, byte offset") as ei:
            next(it)
    assert ei.value.offset == offsets[2]


def test_held_arrays_are_never_overwritten(stream, no_leaks):
    path, recs, _ = stream
    expected = [digest_array(r) for r in recs]
    with ParallelReader(path, fields=Fixed(), workers=2, batch_size=8, tuning=Tuning(prefetch=1, chunk_groups=4)) as reader:
        held = list(reader)          # every batch kept: the pool must grow, never recycle
        again = flatten(list(reader))  # a second epoch while the first is still held
    assert all(np.array_equal(a, b) for a, b in zip(flatten(held), expected))
    assert all(np.array_equal(a, b) for a, b in zip(again, expected))
    # arrays stay valid (and unchanged) after close()
    assert np.array_equal(held[3][2], expected[26])


def test_slots_are_recycled_when_views_die(stream, no_leaks):
    path, recs, _ = stream
    with ParallelReader(path, fields=Fixed(), workers=2, batch_size=8) as reader:
        next(iter(reader))
        initial = len(reader._res.slots.segments)
        for _ in range(3):
            for batch in reader:
                pass
        n_slots = len(reader._res.slots.segments)
    # bounded by what is in flight, not by the stream's length (50 batches x 3): no growth at all
    assert n_slots == initial < 50


def test_zero_copy_batches_are_views_of_shared_memory(stream, no_leaks):
    path, _, _ = stream
    with ParallelReader(path, fields=Fixed(), workers=2, batch_size=16) as reader:
        batch = next(iter(reader))
        assert not batch.flags.owndata and batch.shape == (16, 4, 3)


def test_early_break_leaves_nothing_behind(stream, no_leaks):
    path, _, _ = stream
    reader = ParallelReader(path, fields=Sleepy(), workers=2, batch_size=4)
    for i, _ in enumerate(reader):
        if i == 3:
            break
    assert reader.state.value == "idle"
    assert len(reader.worker_pids) == 2
    reader.close()


@pytest.mark.parametrize("workers", [0, 1, 3])
@pytest.mark.parametrize("batch_size", [None, 10])
def test_stats_samples_counts_what_was_handed_out_after_a_break(stream, workers, batch_size, no_leaks):
    """stats.samples is the samples delivered: with workers, a pass left after 3 items counted the whole
    chunks the consumer had taken in (64 after 3 batches of 10)."""
    path, recs, _ = stream
    with ParallelReader(path, workers=workers, batch_size=batch_size) as reader:
        it = iter(reader)
        got = sum(1 if batch_size is None else len(b) for b in itertools.islice(it, 3))
        it.close()
        assert reader.stats.samples == got == 3 * (batch_size or 1)
        assert sum(1 if batch_size is None else len(b) for b in reader) == len(recs)
        assert reader.stats.samples == got + len(recs)


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_stats_samples_leaves_out_what_was_never_handed_out(tmp_path, workers, no_leaks):
    """stats.samples follows what the cursor hands out (an audit): a short last batch that drop_last drops
    was counted (257 for 8 batches of 32), and with equal shards under "skip" a loop left after 2 batches
    counted the whole shard (86 for 64: the batch padding holds back let the pass complete) -- and so
    telemetry's rate.  Mid-pass it moves once per block, in every mode."""
    from pipeline_helpers import write_rec
    path = tmp_path / "c.rec"
    write_rec(path, [b"%d" % i for i in range(257)])
    with ParallelReader(str(path), workers=workers, batch_size=32, drop_last=True) as reader:
        assert sum(len(b) for b in reader) == 256
        assert reader.stats.samples == 256
    for even in ("pad", "drop"):
        with ParallelReader(str(path), workers=workers, batch_size=32, num_shards=3, shard_index=0,
                            even_shards=even, on_error="skip") as reader:
            it = iter(reader)
            got = sum(len(b) for b in itertools.islice(it, 2))
            it.close()
            assert (got, reader.state_dict()["position"], reader.stats.samples) == (64, 64, 64)
            whole = sum(len(b) for b in reader)  # rank 0's 86 groups: ceil(257 / 3); drop: floor, 85
            assert whole == {"pad": 86, "drop": 85}[even]
            assert reader.stats.samples == 64 + whole
        # drop_last with equal shards: the batch padding holds back, then drops (counted: a review audit)
        with ParallelReader(str(path), workers=workers, batch_size=7, drop_last=True, num_shards=3,
                            shard_index=0, even_shards=even, on_error="skip") as reader:
            whole = sum(len(b) for b in reader)
            assert (whole, reader.stats.samples) == (84, 84)  # 12 batches of 7 of rank 0's 86 (85)


def test_exception_in_loop_body_and_dropped_reader(stream, no_leaks):
    path, _, _ = stream
    with pytest.raises(KeyError):
        with ParallelReader(path, fields=Fixed(), workers=2) as reader:
            for _ in reader:
                raise KeyError("user code")
    reader = ParallelReader(path, fields=Fixed(), workers=2)
    it = iter(reader)
    next(it)
    del it, reader  # no close(): the finalizer must clean up


@pytest.mark.parametrize("method", ["spawn", "forkserver", "fork"])
def test_start_methods(stream, method, no_leaks):
    path, recs, _ = stream
    with ParallelReader(path, fields=[Fixed(), Raw()], workers=2, tuning=Tuning(start_method=method)) as reader:
        out = list(reader)
    assert [bytes(b) for _, b in out] == recs[1::2]
    assert all(np.array_equal(a, digest_array(r)) for (a, _), r in zip(out, recs[0::2]))


def test_fifo_fed_slowly_by_another_process(tmp_path, no_leaks):
    recs = payloads(60, seed=3)
    src = tmp_path / "src.rec"
    write_rec(src, recs)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    feeder = feed_fifo(src, fifo, 997, 0.002)
    try:
        with ParallelReader(str(fifo), fields=Fixed(), workers=2, batch_size=5) as reader:
            t0 = time.monotonic()
            first = next(iter(reader))
            latency = time.monotonic() - t0
            assert first.shape == (5, 4, 3)
    finally:
        feeder.wait(10)
    assert np.array_equal(first[4], digest_array(recs[4]))
    assert latency < 5  # records flow as they arrive, not at EOF


def test_fifo_whole_stream_in_order(tmp_path, no_leaks):
    recs = payloads(300, seed=4, max_len=3000)
    src = tmp_path / "src.rec"
    write_rec(src, recs)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    feeder = feed_fifo(src, fifo, 4093, 0.001)
    try:
        with ParallelReader(str(fifo), workers=2) as reader:
            out = list(reader)
    finally:
        feeder.wait(10)
    assert out == recs


def test_file_object_and_stdin_like_sources(stream, no_leaks):
    import io
    path, recs, _ = stream
    data = open(path, "rb").read()
    with ParallelReader(io.BytesIO(data), workers=1) as reader:
        assert list(reader) == recs
    with open(path, "rb") as f, ParallelReader(f, fields=Fixed(), workers=1, batch_size=100) as reader:
        out = flatten(list(reader))
    assert all(np.array_equal(a, digest_array(r)) for a, r in zip(out, recs))


def test_sharding_splits_the_stream_into_disjoint_complete_parts(stream, no_leaks):
    path, recs, _ = stream
    parts = []
    for k in range(3):
        with ParallelReader(path, workers=1, num_shards=3, shard_index=k) as reader:
            parts.append(list(reader))
            assert reader.stats.sharded_out == len(recs) - len(parts[-1])
    assert parts[0] == recs[0::3] and parts[1] == recs[1::3] and parts[2] == recs[2::3]


def test_stats_and_arguments(stream, no_leaks):
    path, recs, _ = stream
    t0 = time.perf_counter()
    with ParallelReader(path, fields=Fixed(), workers=2, batch_size=32) as reader:
        n = sum(len(b) for b in reader)
        st = reader.stats
    elapsed = time.perf_counter() - t0
    assert n == st.samples == len(recs) and st.records == len(recs)
    assert st.bytes == sum(map(len, recs))
    assert sum(st.decoded.values()) == len(recs)
    # The first batch always makes the consumer wait for a worker; the reader always times a read.
    assert 0 < st.read_time <= elapsed
    assert 0 < st.wait_workers_time <= st.wall_time <= elapsed
    with pytest.raises(ValueError):
        ParallelReader(path, on_error="ignore")
    with pytest.raises(ValueError):
        ParallelReader(path, batch_size=0)
    with pytest.raises(TypeError):
        ParallelReader(path, fields=[Raw(), 3])


def test_a_new_iteration_ends_the_unfinished_one(stream, no_leaks):
    from parrecio import PipelineError
    path, recs, _ = stream
    with ParallelReader(path, workers=1) as reader:
        first = iter(reader)
        assert next(first) == recs[0]
        second = iter(reader)
        assert list(second) == recs
        with pytest.raises(PipelineError, match="ended by close"):
            next(first)
        third = iter(reader)
        assert next(third) == recs[0]
    with pytest.raises(PipelineError, match="ended by close"):
        next(third)
    with pytest.raises(PipelineError, match="closed"):
        iter(reader)


def test_bottleneck_verdict_and_telemetry(stream, no_leaks):
    path, recs, _ = stream
    with ParallelReader(path, fields=Sleepy(20.0), workers=1, batch_size=8) as reader:
        for i, _ in enumerate(reader):
            if i == 5:
                snap = reader.telemetry()
        assert reader.stats.bottleneck == "decode"
    assert set(snap["processes"]) >= {"worker 0"}
    worker = snap["processes"]["worker 0"]
    assert worker["rss_bytes"] > 0 and 0 < worker["private_bytes"] < worker["rss_bytes"]
    assert snap["queues"]["ring_bytes"] == 64 << 20 and snap["queues"]["slots"] >= 1
    with ParallelReader(path, fields=Fixed(), workers=2, batch_size=8) as reader:
        for _ in reader:
            time.sleep(0.02)  # a slow training step
        assert reader.stats.bottleneck == "consumer"
        assert reader.stats.user_time >= 0.02 * 50
        assert reader.stats.as_dict()["bottleneck"] == "consumer"
        text = repr(reader.stats)
    assert text.startswith(f"Stats(epochs=1, samples={len(recs)}, records={len(recs)}, ")
    assert text.endswith("workers=2, bottleneck='consumer')") and "reruns" not in text  # 0: left out
    times = dict(part.split("=") for part in text[6:-1].split(", "))
    assert all(float(times[name]) == float(f"{float(times[name]):.4g}")  # four digits, no more
               for name in ("wall_time", "read_time", "user_time", "decode_cpu"))


def test_shards_from_the_environment(stream, monkeypatch, no_leaks):
    path, recs, _ = stream
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    with ParallelReader(path, workers=1, num_shards="env") as reader:
        assert list(reader) == recs[3::4]
    with pytest.raises(ValueError, match=r'num_shards="env" takes the shard index from RANK: leave shard_index '
                                         r'out \(it is 2\)'):  # (it was ignored: rank 3's shard, silently)
        ParallelReader(path, num_shards="env", shard_index=2)
    with pytest.raises(ValueError, match=r"leave shard_index out \(it is 0\)"):  # (0 too: not rank 3's shard)
        ParallelReader(path, num_shards="env", shard_index=0)
    monkeypatch.setenv("RANK", "4")  # (the message named neither variable: "need 0 <= shard_index < ...")
    with pytest.raises(ValueError, match=r'num_shards="env": RANK=4 must be in 0..WORLD_SIZE - 1 \(WORLD_SIZE=4\)'):
        ParallelReader(path, num_shards="env")
    monkeypatch.setenv("RANK", "3")
    monkeypatch.delenv("RANK")
    with pytest.raises(ValueError, match=r"RANK is not set \(the other is '4'\)"):
        ParallelReader(path, num_shards="env")
    # a plain run of a torchrun script (#24): neither variable set reads everything, and says so
    monkeypatch.delenv("WORLD_SIZE")
    with pytest.warns(UserWarning, match=r'num_shards="env": WORLD_SIZE and RANK are not set .* one shard'):
        reader = ParallelReader(path, workers=1, num_shards="env")
    with reader:
        assert (reader.config.num_shards, reader.config.shard_index) == (1, 0)
        assert list(reader) == recs


def test_unpicklable_decoder_is_refused_up_front(stream):
    """A lambda travels by value (cloudpickle, tests/test_shipping.py); what not even cloudpickle can
    pickle is refused before anything starts, naming the field."""
    import threading
    path, _, _ = stream
    lock = threading.Lock()
    with pytest.raises(TypeError, match="field '1'.*cannot be pickled, not even by value"):
        ParallelReader(path, fields=[Raw(), lambda b: (lock, b)])


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_stdin_channel_end_to_end(stream, method):
    """`... | python train.py` with ParallelReader("-"): the reader process gets stdin under every start
    method; a second epoch is refused (a pipe can be read once)."""
    import hashlib
    import subprocess
    import sys
    path, recs, _ = stream
    script = (
        "import hashlib, sys\n"
        "from parrecio import ParallelReader, SourceError, Tuning\n"
        "if __name__ == '__main__':\n"
        f"    with ParallelReader('-', workers=1, tuning=Tuning(start_method={method!r})) as r:\n"
        "        h = hashlib.sha256(); n = 0\n"
        "        for rec in r:\n"
        "            h.update(rec); n += 1\n"
        "        try:\n"
        "            list(r)\n"
        "        except SourceError as e:\n"
        "            print('second epoch:', 'once' in str(e))\n"
        "    print(n, h.hexdigest())\n")
    out = subprocess.run([sys.executable, "-c", script], stdin=open(path, "rb"), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    expected = hashlib.sha256(b"".join(recs)).hexdigest()
    assert out.stdout.split("\n")[:2] == ["second epoch: True", f"{len(recs)} {expected}"]


def test_full_dev_shm_is_a_clear_error_not_a_sigbus(stream, monkeypatch, no_leaks):
    import errno
    from parrecio import PipelineError
    path, _, _ = stream

    def full(fd, offset, size):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)
    reader = ParallelReader(path, fields=Fixed(), workers=1)
    with pytest.raises(PipelineError, match=r"cannot allocate 64\.0 MiB of shared memory.*--shm-size"):
        iter(reader)
    assert reader.state.value == "new"  # freed, and ready to try again (tests/test_interrupted_start.py)
    monkeypatch.undo()
    with deadline(60):
        assert len(list(reader)) > 0
    reader.close()


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_stats_count_the_records_framed_before_an_error_that_ends_the_pass(tmp_path, workers):
    """The reader process's fast loop for one-record groups of a mapped file kept its counts in locals:
    a pass that ended on an error (a record over max_record_bytes) said stats.records == 0 after 1000
    delivered samples with workers >= 1, where workers=0 said 1000."""
    from recordio_helpers import frame
    path = tmp_path / "a.rec"
    path.write_bytes(b"".join(frame(b"x" * 1000) for _ in range(1000)) + frame(b"y" * 200_000) + frame(b"z"))
    with ParallelReader(path, None, workers=workers, tuning=Tuning(max_record_bytes=100_000)) as reader:
        got = []
        with pytest.raises(CorruptRecordError, match=r"exceeds max_record_bytes.*sample 1000"):
            for payload in reader:
                got.append(payload)
        assert got == [b"x" * 1000] * 1000
        assert (reader.stats.samples, reader.stats.records, reader.stats.bytes) == (1000, 1000, 1_000_000)


@pytest.mark.parametrize("workers", [0, 1, 3])
@pytest.mark.parametrize("fixed", [False, True])
def test_decoded_arrays_keep_their_dtype_byte_order_and_padding(tmp_path, no_leaks, workers, fixed):
    """Ragged values travel back joined in one array, batches of several places (after a skip) are
    joined, padded batches too: NumPy 2's concatenate and stack made the dtype canonical, so a ``>f4``
    came back ``<f4`` and a padded struct packed (itemsize 24 -> 12, its fields at other offsets), with
    workers only, or only in the batches after a skipped sample.  Every value keeps the decoder's dtype."""
    from pipeline_helpers import PADDED, NonNative
    path = tmp_path / "d.rec"
    write_rec(path, [bytes([i]) for i in range(16)])
    dtypes = (np.dtype(">f4"), PADDED)
    for part, fail, batch_size in itertools.product((None, 0, 1), (-1, 5), (None, 4)):
        want = [NonNative(fixed, part=part)(bytes([i])) for i in range(16) if i != fail]
        with deadline(60), ParallelReader(path, NonNative(fixed, fail=fail, part=part), workers=workers,
                                          batch_size=batch_size, on_error="skip") as r:
            got = list(r)
        if batch_size is not None:  # (a batch: a column per part, a row per sample)
            if fixed:
                assert all((b.dtype if part is not None else tuple(c.dtype for c in b)) ==
                           (dtypes[part] if part is not None else dtypes) for b in got)
            got = [(b[k] if part is not None else tuple(c[k] for c in b)) for b in got
                   for k in range(len(b) if part is not None else len(b[0]))]
        assert len(got) == len(want)
        for g, w in zip(got, want):
            for a, b, dtype in zip((g,) if part is not None else g, (w,) if part is not None else w,
                                   (dtypes[part],) if part is not None else dtypes):
                assert (a.dtype, a.dtype.itemsize) == (dtype, dtype.itemsize), (part, fail, batch_size)
                for name in dtype.names or (None,):  # (a struct's padding bytes are no value)
                    assert (a if name is None else a[name]).tolist() == (b if name is None else b[name]).tolist()


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("even", [None, "pad"])
def test_stats_samples_after_a_break_that_crossed_skipped_samples(tmp_path, workers, even, no_leaks):
    """With skips before the break (workers=0 counted what it had decoded: 15 after 12), and with equal
    shards (not corrected at all: 29 after 1 sample) -- an audit of the first fix."""
    path = tmp_path / "j.rec"
    write_rec(path, [b"not json" if i in (3, 7, 20, 41) else b'{"i": %d}' % i for i in range(60)])
    with ParallelReader(path, fields=Json(), workers=workers, batch_size=4, on_error="skip",
                        num_shards=2 if even else 1, shard_index=0, even_shards=even) as reader:
        it = iter(reader)
        got = sum(len(b) for b in itertools.islice(it, 3))
        it.close()
        assert reader.stats.samples == got == 12
