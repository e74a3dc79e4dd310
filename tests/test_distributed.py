"""Distributed semantics: a global shuffle before sharding, equal shard lengths (pad / drop), set_epoch,
the epoch counter, resuming mid-epoch from state_dict() in a new process, and the per-rank default of
``workers``."""

from __future__ import annotations

import collections
import json
import os
import pickle
import subprocess
import sys

import pytest

from parrecio import ParallelReader, PipelineError, RecordWriter
from parrecio.pipeline.parallel_reader import _default_workers, local_ranks
from parrecio.pipeline.plan import EvenShards, indexed_order, shard_length

HERE = os.path.dirname(os.path.abspath(__file__))


class Echo:
    def __call__(self, payload):
        return bytes(payload)


def _write(path, n, index=True, group=1):
    """n groups of ``group`` records; record j of group i is b"g<i>.<j>"."""
    with RecordWriter(str(path), index=str(path)[:-4] + ".idx" if index else None) as w:
        for i in range(n):
            for j in range(group):
                w.write(b"g%05d.%d" % (i, j), key=i * group + j)
    return [tuple(b"g%05d.%d" % (i, j) for j in range(group)) if group > 1 else b"g%05d.0" % i
            for i in range(n)]


def _ranks(path, ranks, epoch, **kw):
    out = []
    for r in range(ranks):
        with ParallelReader(path, num_shards=ranks, shard_index=r, **kw) as reader:
            reader.set_epoch(epoch)
            assert reader.epoch == epoch
            got = list(reader)
            assert len(got) == len(reader)  # the .idx files say it up front
            out.append(got)
    return out


# -- the plan, as pure functions ---------------------------------------------------------------------------
def test_indexed_order_is_distributed_sampler_s():
    """perm(seed, epoch) over all groups, padded with its own start or cut to a multiple, then strided."""
    import numpy as np
    counts = [4, 0, 6, 3]  # 13 groups in 4 files
    for even in (None, "pad", "drop"):
        for r in range(3):
            got = indexed_order(counts, shuffle=True, seed=9, epoch=2, num_shards=3, shard_index=r, even=even)
            perm = list(np.random.default_rng([9, 2]).permutation(13))
            if even == "pad":
                perm += perm[:2]
            elif even == "drop":
                perm = perm[:12]
            starts = [0, 4, 4, 10]
            assert [starts[f] + g for f, g in got] == perm[r::3]
            assert len(got) == shard_length(13, 3, r, even)
    assert indexed_order([2], shuffle=False, seed=0, epoch=0, num_shards=5, shard_index=4, even="pad") == [(0, 0)]


def test_even_shards_of_a_stream_match_the_indexed_rule():
    for total in range(0, 14):
        for n in (1, 2, 3, 5):
            for even in ("pad", "drop"):
                want = [[g for _, g in indexed_order([total], shuffle=False, seed=0, epoch=0, num_shards=n,
                                                     shard_index=r, even=even)] for r in range(n)]
                got = []
                for r in range(n):
                    es, mine = EvenShards(n, r, even), []
                    for g in range(total):
                        mine += es.group(g, g if g % n == r or es.wants_copy(g) else None)
                    got.append(mine + es.end(total))
                assert got == want, (total, n, even)


# -- the pipeline --------------------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_three_ranks_four_epochs_global_shuffle_then_shard(tmp_path, workers, no_leaks):
    path = tmp_path / "d.rec"
    groups = _write(path, 100, group=2)  # 100 groups: not a multiple of 3
    subsets = []
    for epoch in range(4):
        parts = _ranks(path, 3, epoch, fields=[Echo(), Echo()], workers=workers, shuffle=True, seed=3,
                       even_shards="pad")
        assert [len(p) for p in parts] == [34, 34, 34]            # equal, with pad
        count = collections.Counter(g for p in parts for g in p)
        assert set(count) == set(groups)                           # every group in every epoch ...
        assert sorted(count.values()) == [1] * 98 + [2, 2]         # ... once, 2 repeated to pad
        subsets.append([set(p) for p in parts])
    for e in range(3):  # each rank sees another part of the data every epoch
        assert all(subsets[e][r] != subsets[e + 1][r] for r in range(3))
    drop = _ranks(path, 3, 0, fields=[Echo(), Echo()], workers=workers, shuffle=True, seed=3,
                  even_shards="drop")
    assert [len(p) for p in drop] == [33, 33, 33] and len(set().union(*map(set, drop))) == 99


def test_unshuffled_equal_shards_of_indexed_and_streamed_files_agree(tmp_path, no_leaks):
    indexed, streamed = tmp_path / "i.rec", tmp_path / "s.rec"
    _write(indexed, 40)
    _write(streamed, 40, index=False)
    for even in (None, "pad", "drop"):
        a = _ranks(indexed, 3, 0, fields=Echo(), workers=1, even_shards=even)
        b = [list(ParallelReader(streamed, fields=Echo(), workers=1, num_shards=3, shard_index=r,
                                 even_shards=even)) for r in range(3)]
        assert a == b
        assert [len(p) for p in a] == {None: [14, 13, 13], "pad": [14, 14, 14], "drop": [13, 13, 13]}[even]


@pytest.mark.parametrize("workers", [0, 2])
def test_every_rank_of_a_stream_counts_its_damage_whole(tmp_path, workers, no_leaks):
    """Framing damage takes no position in a stream (README, Distributed training): every rank reads
    the whole stream, loses the same records and counts them all, not a share."""
    src = tmp_path / "s.rec"
    groups = _write(src, 40, index=False)
    data = bytearray(src.read_bytes())
    step = len(data) // 40  # every record is b"g00000.0" in one 16-byte frame
    data[10 * step] ^= 0xFF  # record 10's magic
    data[20 * step + 5] ^= 0x7F  # record 20's length word: 32 KB, past the end
    src.write_bytes(bytes(data))
    survivors = [g for i, g in enumerate(groups) if i not in (10, 20)]
    got, counts = [], []
    for r in range(3):
        with ParallelReader(str(src), fields=Echo(), workers=workers, num_shards=3, shard_index=r,
                            shuffle=False, on_error="skip") as reader:
            got.append(list(reader))
            st = reader.stats
            counts.append((st.skipped_records, st.skipped_bytes))
    assert sorted(g for p in got for g in p) == survivors
    assert [p == survivors[r::3] for r, p in enumerate(got)] == [True] * 3
    assert counts == [(2, 32)] * 3, counts


def test_streams_of_a_pipe_get_equal_shards(tmp_path, no_leaks):
    """A stream read once (stdin-like: a FIFO): the counts are known at its end; pad repeats the first
    groups, drop holds back each rank's group until its row is complete."""
    src = tmp_path / "s.rec"
    groups = _write(src, 31, index=False)
    for even, want in (("pad", 11), ("drop", 10)):
        got = []
        for r in range(3):
            fifo = tmp_path / f"f{even}{r}"
            os.mkfifo(fifo)
            feeder = subprocess.Popen(["sh", "-c", f"cat {src} > {fifo}"])
            with ParallelReader(str(fifo), fields=Echo(), workers=2, num_shards=3, shard_index=r,
                                even_shards=even) as reader:
                got.append(list(reader))
            feeder.wait()
        assert [len(p) for p in got] == [want] * 3
        flat = [g for p in got for g in p]
        assert set(flat) == (set(groups) if even == "pad" else set(groups[:30]))


RESUME = r"""
import json, pickle, sys
sys.path.insert(0, sys.argv[1])
from parrecio import ParallelReader
from test_distributed import Echo

def main():
    path, mode, k, state_path, out_path, workers = sys.argv[2:8]
    kw = dict(fields=Echo(), workers=int(workers), batch_size=4, shuffle=True, seed=11, num_shards=2,
              shard_index=1)
    got = []
    with ParallelReader(path, **kw) as reader:
        if mode == "first":
            reader.set_epoch(3)
            for i, batch in enumerate(reader):
                got += batch
                if i + 1 == int(k):
                    break
            state = reader.state_dict()
            pickle.dump(state, open(state_path, "wb"))
        else:
            reader.load_state_dict(pickle.load(open(state_path, "rb")))
            assert reader.epoch == 3
            for batch in reader:
                got += batch
            assert reader.state_dict()["epoch"] == 4 and reader.state_dict()["position"] == 0
    json.dump([g.decode() for g in got], open(out_path, "w"))

if __name__ == "__main__":
    main()
"""


@pytest.mark.parametrize("index,workers", [(True, 2), (True, 0), (False, 2), (False, 0)])
def test_resume_in_a_new_process_equals_one_uninterrupted_epoch(tmp_path, index, workers, no_leaks):
    path = tmp_path / "r.rec"
    _write(path, 203, index=index)
    script = tmp_path / "resume_child.py"
    script.write_text(RESUME)
    with ParallelReader(path, fields=Echo(), workers=workers, batch_size=4, shuffle=True, seed=11,
                        num_shards=2, shard_index=1) as reader:
        reader.set_epoch(3)
        whole = [g.decode() for batch in reader for g in batch]
    state, first, rest = tmp_path / "state.pkl", tmp_path / "a.json", tmp_path / "b.json"
    for mode, out in (("first", first), ("rest", rest)):
        subprocess.run([sys.executable, str(script), HERE, str(path), mode, "7", str(state), str(out),
                        str(workers)], check=True, timeout=120)
    saved = pickle.load(open(state, "rb"))
    assert saved["epoch"] == 3 and saved["position"] == 28 and saved["seed"] == 11
    a, b = json.load(open(first)), json.load(open(rest))
    assert len(a) == 28 and a + b == whole and len(whole) == 101


def test_state_dict_round_trip_and_checks(tmp_path, no_leaks):
    path = tmp_path / "s.rec"
    groups = _write(path, 30)
    with ParallelReader(path, fields=Echo(), workers=1, shuffle=True, seed=2) as reader:
        assert reader.state_dict()["epoch"] == 0 and reader.state_dict()["position"] == 0
        it = iter(reader)
        head = [next(it) for _ in range(5)]
        st = reader.state_dict()
        assert (st["epoch"], st["position"]) == (0, 5)
        it.close()
        assert (reader.state_dict()["epoch"], reader.state_dict()["position"]) == (0, 5)
        reader.load_state_dict(st)
        tail = list(reader)
        assert sorted(head + tail) == groups and len(tail) == 25
        assert (reader.state_dict()["epoch"], reader.state_dict()["position"]) == (1, 0)
        assert reader.epoch == 1
        with pytest.raises(ValueError, match="seed=2"):
            ParallelReader(path, fields=Echo(), workers=1, shuffle=True, seed=3).load_state_dict(st)
        it = iter(reader)
        next(it)
        with pytest.raises(PipelineError, match="while a pass is being iterated"):
            reader.load_state_dict(st)
        it.close()


def test_per_rank_default_workers(monkeypatch):
    cpus = len(os.sched_getaffinity(0))
    for name in ("LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"):
        monkeypatch.delenv(name, raising=False)
    assert local_ranks() == 1 and _default_workers() == cpus
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2")
    assert local_ranks() == 2 and _default_workers() == max(1, cpus // 2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "64")  # torchrun's wins; never below one worker
    assert local_ranks() == 64 and _default_workers() == max(1, cpus // 64)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "nonsense")
    assert local_ranks() == 2


def test_even_shards_is_checked():
    with pytest.raises(ValueError, match="even_shards must be None, 'pad' or 'drop'"):
        ParallelReader("x.rec", even_shards="equal")


@pytest.mark.parametrize("workers", [0, 1])
def test_index_with_an_incomplete_last_group(tmp_path, workers, no_leaks):
    from parrecio import CorruptRecordError
    path = tmp_path / "odd.rec"
    with RecordWriter(str(path), index=str(tmp_path / "odd.idx")) as w:
        for i in range(7):  # 3 groups of 2, and one record alone
            w.write(b"r%d" % i, key=i)
    kw = dict(fields=[Echo(), Echo()], workers=workers, shuffle=True, even_shards="pad", num_shards=2)
    with pytest.raises(CorruptRecordError, match="lists 7 records, not a multiple of the group size 2"):
        list(ParallelReader(path, **kw))
    with ParallelReader(path, on_error="skip", **kw) as reader:
        got = list(reader)
        assert len(got) == 2 and reader.stats.skipped == 1  # 3 whole groups, padded to 2 per shard
        assert all(a[1:] == b"%d" % (int(b[1:]) - 1) for a, b in got)


def test_tuning_and_the_removed_keywords(tmp_path, no_leaks):
    """The first release's tuning keywords (deprecated for one release) are refused with where they
    moved; poll_interval is refused; a Tuning checks its values when it is made."""
    import warnings
    from parrecio import Tuning
    path = tmp_path / "t.rec"
    groups = _write(path, 20)
    with pytest.raises(TypeError, match=r"^ParallelReader\(ring_bytes=131072, prefetch=3\): these are settings "
                                        r"of tuning=Tuning\(ring_bytes=131072, prefetch=3\)$"):
        ParallelReader(path, fields=Echo(), workers=1, ring_bytes=128 << 10, prefetch=3)
    with pytest.raises(TypeError, match=r"takes no poll_interval"):
        ParallelReader(path, fields=Echo(), poll_interval=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = ParallelReader(path, Echo(), workers=1, tuning=Tuning(ring_bytes=128 << 10, prefetch=3))
    with new:
        assert (new.config.ring_bytes, new.config.prefetch) == (128 << 10, 3) and list(new) == groups
    with pytest.raises(ValueError, match="prefetch must be >= 1"):
        Tuning(prefetch=0)
    with pytest.raises(ValueError, match="start_method must be one of"):
        Tuning(start_method="thread")
    with pytest.raises(TypeError, match="tuning must be a parrecio.Tuning"):
        ParallelReader(path, tuning={"prefetch": 2})
    assert Tuning() == Tuning() and Tuning(prefetch=3) != Tuning() and hash(Tuning()) == hash(Tuning())


def test_unbatched_slots_are_sized_from_the_outputs(tmp_path):
    from parrecio import Tuning
    from parrecio.decoders import Image
    path = tmp_path / "s.rec"
    _write(path, 3)
    with ParallelReader(path, fields=Image(size=(224, 224))) as r:
        assert r.config.slot_size == (4 << 20) // (224 * 224 * 3) == 27   # about 4 MiB of images
    with ParallelReader(path, fields=Image(size=(8, 8))) as r:
        assert r.config.slot_size == 256                                 # small outputs: at most 256
    with ParallelReader(path, fields=Image(size=(2048, 2048))) as r:
        assert r.config.slot_size == 8                                   # huge ones: at least 8
    with ParallelReader(path, fields=Image(size=(224, 224)), tuning=Tuning(slot_samples=5)) as r:
        assert r.config.slot_size == 5
    with ParallelReader(path, fields=Image(size=(224, 224)), batch_size=32) as r:
        assert r.config.slot_size == 32                                  # with batches: the batch


def test_an_epochs_order_is_two_arrays_not_a_list_of_tuples():
    """The order of a shuffled read by index was a list of (file, group) tuples, ~100 B a group in the
    reader process (1M groups: 100 MB); it is two int64 arrays now, 16 B a group, read as the same pairs."""
    import numpy as np
    from parrecio.pipeline.plan import Order
    order = indexed_order([300_000, 0, 700_000], shuffle=True, seed=1, epoch=0, num_shards=1, shard_index=0,
                          even=None)
    assert isinstance(order, Order) and order.files.nbytes + order.groups.nbytes == 16 * 1_000_000
    perm = np.random.default_rng([1, 0]).permutation(1_000_000)
    pairs = list(order)
    assert len(pairs) == 1_000_000 and all(type(f) is int and type(g) is int for f, g in pairs[:10])
    assert [300_000 * (f == 2) + g for f, g in pairs] == perm.tolist()
    assert order[5:][0] == pairs[5] and order[-1] == pairs[-1] and len(order[999_990:]) == 10
