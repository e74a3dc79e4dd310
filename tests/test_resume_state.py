"""state_dict / load_state_dict that never repeat or skip: the position after a caught error is the
samples delivered (in every mode, batched or not), set_epoch of the loaded epoch keeps the loaded
position, and a state is refused for data it does not belong to (another file, a file that changed
size, a position past the epoch's end)."""

from __future__ import annotations

import os
import warnings

import pytest

from parrecio import DecodeError, ParallelReader, SourceError
from parrecio.decoders import Json
from parrecio.recordio import RecordWriter


def _write(path, n, bad=(), index=False):
    with RecordWriter(path, index=index) as w:
        for i in range(n):
            w.write(b"not json" if i in bad else b'{"i": %d}' % i)


def _ids(item, batched):
    """The sample numbers of a sample ({"i": {"i": n}}) or a batch ({"i": [{"i": n}, ...]})."""
    return [x["i"] for x in item["i"]] if batched else [item["i"]["i"]]


def _delivered(reader, batched, stop=None):
    out = []
    for item in reader:
        out += _ids(item, batched)
        if stop is not None and len(out) >= stop:
            break
    return out


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 4])
def test_position_after_a_caught_error_is_the_samples_delivered(tmp_path, workers, batch_size, no_leaks):
    path = tmp_path / "e.rec"
    _write(path, 20, bad={5})
    batched = batch_size is not None
    with ParallelReader(path, fields={"i": Json()}, workers=workers, batch_size=batch_size) as r:
        got = []
        with pytest.raises(DecodeError) as info:
            for item in r:
                got += _ids(item, batched)
        assert info.value.index == 5 and got == [0, 1, 2, 3, 4]
        state = r.state_dict()
    assert (state["epoch"], state["position"]) == (0, 5)
    with ParallelReader(path, fields={"i": Json()}, workers=workers, batch_size=batch_size,
                        on_error="skip") as r:
        r.load_state_dict(state)
        assert _delivered(r, batched) == list(range(6, 20))  # 5 skipped this time, nothing repeated


@pytest.mark.parametrize("workers", [0, 2])
def test_set_epoch_of_the_loaded_epoch_resumes_it(tmp_path, workers, no_leaks):
    """The README's distributed loop, resumed: load_state_dict, then set_epoch(state["epoch"])."""
    path = tmp_path / "s.rec"
    _write(path, 40)
    with ParallelReader(path, fields={"i": Json()}, workers=workers) as r:
        r.set_epoch(3)
        assert _delivered(r, False, stop=15) == list(range(15))
        state = r.state_dict()
    assert (state["epoch"], state["position"]) == (3, 15)
    with ParallelReader(path, fields={"i": Json()}, workers=workers) as r:
        r.load_state_dict(state)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            r.set_epoch(state["epoch"])
        assert _delivered(r, False) == list(range(15, 40))
        r.set_epoch(4)
        assert _delivered(r, False) == list(range(40))
    with ParallelReader(path, fields={"i": Json()}, workers=workers) as r:
        r.load_state_dict(state)
        with pytest.warns(UserWarning, match=r"set_epoch\(5\) after load_state_dict\(\) of epoch 3 at "
                                             r"position 15: the saved position is dropped"):
            r.set_epoch(5)
        assert _delivered(r, False) == list(range(40))


def test_a_state_belongs_to_its_data(tmp_path, no_leaks):
    a, b = tmp_path / "a.rec", tmp_path / "b.rec"
    _write(a, 100)
    _write(b, 100)
    with ParallelReader(a, fields={"i": Json()}, workers=0) as r:
        assert _delivered(r, False, stop=60) == list(range(60))
        state = r.state_dict()
    with ParallelReader(b, fields={"i": Json()}, workers=0) as r:
        with pytest.raises(ValueError, match=f"state_dict was saved with source='{a}', this reader has "
                                             f"source='{b}'"):
            r.load_state_dict(state)
    size = os.path.getsize(a)
    _write(a, 50)  # rewritten shorter
    with ParallelReader(a, fields={"i": Json()}, workers=0) as r:
        with pytest.raises(ValueError, match=f"state_dict was saved when {a} had {size} bytes; it has "
                                             f"{os.path.getsize(a)} bytes now"):
            r.load_state_dict(state)
    with ParallelReader(a, fields=[Json(), Json()], workers=0) as r:
        with pytest.raises(ValueError, match="state_dict was saved with nfields=1, this reader has nfields=2"):
            r.load_state_dict(state)


def test_a_state_belongs_to_its_shuffle(tmp_path, no_leaks):
    """The order of a shuffled epoch depends on how it is shuffled: a state saved under a shuffle buffer of
    another size, or by index where now a buffer shuffles (an .idx removed; or added), resumed into
    repeated and missing samples."""
    path = tmp_path / "s.rec"
    _write(path, 300, index=True)
    idx = tmp_path / "s.idx"
    kept = idx.read_bytes()

    def state_after(n, **kw):
        with ParallelReader(path, fields={"i": Json()}, workers=0, shuffle=True, seed=5, **kw) as r:
            assert len(_delivered(r, False, stop=n)) == n
            return r.state_dict()

    by_index = state_after(100)
    idx.unlink()
    by_buffer = state_after(100, shuffle_buffer=64)
    with ParallelReader(path, fields={"i": Json()}, workers=0, shuffle=True, seed=5, shuffle_buffer=32) as r:
        with pytest.raises(ValueError, match="state_dict was saved with shuffle_buffer=64, this reader has "
                                             "shuffle_buffer=32: make the reader"):
            r.load_state_dict(by_buffer)
        with pytest.raises(ValueError, match=r"state_dict was saved with shuffle_mode='index', this reader has "
                                             r"shuffle_mode='buffer' \(a shuffle by index needs an .idx"):
            r.load_state_dict(by_index)
    idx.write_bytes(kept)
    with ParallelReader(path, fields={"i": Json()}, workers=0, shuffle=True, seed=5, shuffle_buffer=64) as r:
        with pytest.raises(ValueError, match="saved with shuffle_mode='buffer', this reader has shuffle_mode='index'"):
            r.load_state_dict(by_buffer)
        r.load_state_dict(by_index)  # the same shuffle: the rest of the epoch
        rest = _delivered(r, False)
    with ParallelReader(path, fields={"i": Json()}, workers=0, shuffle=True, seed=5) as r:
        whole = _delivered(r, False)
    assert rest == whole[100:]
    for bad in ({}, {"epoch": 0}, "epoch"):
        with pytest.raises(ValueError, match="not a state_dict"):
            r.load_state_dict(bad)
    with pytest.raises(ValueError, match="state_dict version 99 is not one this parrecio reads"):
        r.load_state_dict(dict(by_index, version=99))
    old = {k: v for k, v in by_index.items() if k not in ("shuffle_mode", "shuffle_buffer")}
    r.load_state_dict(dict(old, version=2))  # a state saved before the shuffle's kind was: still read


def test_a_position_past_the_end_is_refused(tmp_path, no_leaks):
    path = tmp_path / "i.rec"
    _write(path, 50, index=True)
    with ParallelReader(path, fields={"i": Json()}, workers=0) as r:
        state = dict(r.state_dict(), position=1000)
        with pytest.raises(ValueError, match="state_dict position 1000 is past the end of epoch 0: this "
                                             "shard's order has 50 samples"):
            r.load_state_dict(state)
        r.load_state_dict(dict(state, position=50))  # the end itself: an empty rest of the epoch
        assert _delivered(r, False) == []


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_a_stream_shorter_than_the_saved_position_raises(tmp_path, workers, shuffle, no_leaks):
    """Without an index the epoch's length is known only once it is read: a resumed pass that runs
    out before its position says so instead of ending empty."""
    path = tmp_path / "short.rec"
    _write(path, 100)
    with ParallelReader(path, fields={"i": Json()}, workers=workers, shuffle=shuffle) as r:
        _delivered(r, False, stop=60)
        state = r.state_dict()
    _write(path, 50)
    state["data"] = None  # a stream whose size the state could not record (a FIFO, stdin)
    with ParallelReader(path, fields={"i": Json()}, workers=workers, shuffle=shuffle) as r:
        r.load_state_dict(state)
        with pytest.raises(SourceError, match="the resumed position 60 is past the end of epoch 0: this "
                                              "shard's order has 50 samples now"):
            list(r)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("batch_size,drop_last", [(None, False), (16, False), (16, True), (7, False)])
@pytest.mark.parametrize("index", [True, False], ids=["idx", "stream"])
def test_len_of_a_resumed_pass_is_what_it_yields(tmp_path, workers, batch_size, drop_last, index, no_leaks):
    """#24: len() of a resumed epoch counted the whole epoch (8 batches where the pass yields 5).  It is
    the length of the pass being (or next) iterated: the rest of the resumed epoch, then whole epochs;
    with a stream, known once a complete pass was seen."""
    path = str(tmp_path / "n.rec")
    _write(path, 120, index=index and str(tmp_path / "n.idx"))
    kw = dict(fields={"i": Json()}, workers=workers, batch_size=batch_size, drop_last=drop_last)

    def batches(n):
        return n if batch_size is None else n // batch_size if drop_last else -(-n // batch_size)

    with ParallelReader(path, **kw) as r:
        if not index:
            list(r)  # a stream's length is known after one complete pass
        it = iter(r)
        for _ in range(3):
            next(it)
        state = r.state_dict()
        it.close()
    position = state["position"]
    assert position == 3 * (batch_size or 1)
    with ParallelReader(path, **kw) as r:
        if not index:
            list(r)
        r.load_state_dict(state)
        assert len(r) == batches(120 - position)
        seen = 0
        for _ in r:
            assert len(r) == batches(120 - position)  # also while the resumed pass runs
            seen += 1
        assert seen == batches(120 - position)
        assert len(r) == batches(120)  # the following epochs are whole
        assert sum(1 for _ in r) == batches(120)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("batch_size,drop_last,stop", [(None, False, 7), (4, False, 3), (4, True, 3)])
@pytest.mark.parametrize("even_shards,num_shards", [("pad", 2), ("drop", 3)])
def test_a_resumed_epoch_pads_for_the_samples_skipped_before_it(tmp_path, workers, batch_size, drop_last, stop,
                                                                even_shards, num_shards, no_leaks):
    """With equal shards and on_error="skip", a rank pads its pass for the samples it skipped.  A resumed
    pass padded only for its own: the samples skipped before the saved position were lost for good, and
    the resumed rank yielded fewer samples and batches than the others (45 batches against 50: DDP waits
    forever).  The state holds the samples delivered; the epoch's counts are those of an uninterrupted
    run, every rank's, and so is len() of the resumed pass; so are the samples and their copies."""
    path = str(tmp_path / "p.rec")
    _write(path, 240, bad=set(range(0, 240, 7)), index=str(tmp_path / "p.idx"))  # on every rank, early
    batched = batch_size is not None
    for rank in range(num_shards):
        kw = dict(fields={"i": Json()}, workers=workers, batch_size=batch_size, drop_last=drop_last,
                  on_error="skip", num_shards=num_shards, shard_index=rank, even_shards=even_shards)
        with warnings.catch_warnings(), ParallelReader(path, **kw) as r:
            whole = [_ids(item, batched) for item in r]
            padded = r.stats.padded
        assert padded > 0
        with ParallelReader(path, **kw) as r:
            it = iter(r)
            first = [_ids(next(it), batched) for _ in range(stop)]
            state = r.state_dict()
            it.close()
        assert state["delivered"] == sum(map(len, first)) < state["position"]  # skipped ones before it
        with ParallelReader(path, **kw) as r:
            r.load_state_dict(state)
            n = len(r)
            rest = [_ids(item, batched) for item in r]
        assert len(first) + len(rest) == len(whole) and n == len(rest)
        assert list(map(len, first + rest)) == list(map(len, whole))
        assert first + rest == whole  # the copies too: of the epoch's first sample, read again


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("batch_size", [None, 3, 4])
@pytest.mark.parametrize("n,bad,num_shards,rank", [(20, (), 2, 0), (20, (4,), 2, 0), (23, (0, 5), 3, 2)])
@pytest.mark.parametrize("index", [False, True])
def test_a_state_taken_at_the_end_of_a_padded_epoch(tmp_path, workers, batch_size, n, bad, num_shards, rank, index,
                                                    no_leaks):
    """A state taken after every item of an epoch that pads (its last batch, a copy, the last real
    sample before its copies) resumes with exactly the rest of the epoch -- the copies it still owes,
    of the epoch's first sample, or nothing -- then whole epochs.  The last batch and the copies were not
    counted in "delivered": a resumed rank found copies owed and no sample of its own to copy, and raised
    "every sample of shard 0 ... was skipped" (13% of padding configurations in a randomized audit), or
    padded too much.  (23 records, 0 and 5 bad, rank 2 of 3: the shard's last position, the pad that
    repeats group 0, is skipped; the state's position must still cover the copies in the last batch.)"""
    path = str(tmp_path / "p.rec")
    _write(path, n, bad=set(bad), index=str(tmp_path / "p.idx") if index else False)
    batched = batch_size is not None
    kw = dict(fields={"i": Json()}, workers=workers, batch_size=batch_size, on_error="skip", num_shards=num_shards,
              shard_index=rank, even_shards="pad")
    with warnings.catch_warnings(), ParallelReader(path, **kw) as r:
        whole = [_ids(item, batched) for item in r]
        second = [_ids(item, batched) for item in r]
    assert sum(map(len, whole)) == -(-n // num_shards) and second == whole
    for k in range(len(whole) + 1):
        with warnings.catch_warnings(), ParallelReader(path, **kw) as r:
            it = iter(r)
            first = [_ids(next(it), batched) for _ in range(k)]
            state = r.state_dict()
            it.close()
        assert state["delivered"] == sum(map(len, first)), (k, state)
        with warnings.catch_warnings(), ParallelReader(path, **kw) as r:
            r.load_state_dict(state)
            n = len(r) if index else None
            rest = [_ids(item, batched) for item in r]
            after = [_ids(item, batched) for item in r]
        assert first + rest == whole, (k, state, rest)
        assert after == whole and n in (None, len(rest)), (k, after, n)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 4])
def test_an_iterator_dropped_before_its_first_next_leaves_nothing_open(tmp_path, workers, batch_size, no_leaks):
    """``iter(loader)`` only to look at it: a generator never started runs no ``finally``, and its pass
    stayed open -- load_state_dict() refused ("while a pass is being iterated") and the next loop was the
    next epoch's shuffle.  A file can be read again: the pass does not count, the next loop is epoch 0."""
    import gc
    path = str(tmp_path / "s.rec")
    _write(path, 30, index=True)
    kw = dict(fields={"i": Json()}, workers=workers, batch_size=batch_size, shuffle=True, seed=5)
    with ParallelReader(path, **kw) as reader:
        epoch0 = _delivered(reader, batch_size is not None)
        epoch1 = _delivered(reader, batch_size is not None)
    assert sorted(epoch0) == sorted(epoch1) == list(range(30)) and epoch0 != epoch1
    with ParallelReader(path, **kw) as reader:
        state = reader.state_dict()
        it = iter(reader)
        del it
        gc.collect()
        reader.load_state_dict(state)  # (refused before)
        assert _delivered(reader, batch_size is not None) == epoch0
        it = iter(reader)
        del it
        gc.collect()
        assert reader.epoch == 1 and _delivered(reader, batch_size is not None) == epoch1
        assert reader.stats.epochs == 2


@pytest.mark.parametrize("workers", [0, 2])
def test_set_epoch_after_an_iterator_dropped_before_its_first_next(tmp_path, workers, no_leaks):
    """The dropped pass is ended before set_epoch sets the next one (it set back its own epoch after)."""
    import gc
    path = str(tmp_path / "s.rec")
    _write(path, 30, index=True)
    kw = dict(fields={"i": Json()}, workers=workers, shuffle=True, seed=5)
    with ParallelReader(path, **kw) as reader:
        reader.set_epoch(3)
        epoch3 = _delivered(reader, False)
    with ParallelReader(path, **kw) as reader:
        it = iter(reader)
        del it
        gc.collect()
        reader.set_epoch(3)
        assert _delivered(reader, False) == epoch3
        assert reader.state_dict()["epoch"] == 4
        it = iter(reader)
        del it
        gc.collect()
        assert reader.state_dict()["epoch"] == 4 and reader.state_dict()["position"] == 0


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 2, 3])
def test_len_of_a_resumed_stream_leaves_out_the_samples_skipped_before_it(tmp_path, workers, batch_size, no_leaks):
    """Without an .idx, len() is the count a complete pass delivered (the skipped samples left out), and a
    resumed pass took the saved *position* from it -- which counts the skipped samples' places too: 11
    where the pass yields 14 (a Keras steps_per_epoch, or DDP ranks' equal steps, cut the epoch short)."""
    path = tmp_path / "s.rec"
    _write(path, 20, bad={1, 2, 3, 15})
    kw = dict(fields={"i": Json()}, workers=workers, batch_size=batch_size, on_error="skip")
    batched = batch_size is not None
    with ParallelReader(path, **kw) as r:
        it = iter(r)
        got = []
        while len(got) < 3:
            got += _ids(next(it), batched)
        state = r.state_dict()
        it.close()
    assert state["delivered"] == len(got) and state["position"] == len(got) + 3
    with ParallelReader(path, **kw) as r:
        whole = _delivered(r, batched)
        assert len(whole) == 16 and len(r) == (16 if not batched else -(-16 // batch_size))
        r.load_state_dict(state)
        n = len(r)
        rest = list(r)
        assert n == len(rest) and got + [i for item in rest for i in _ids(item, batched)] == whole


def _damage_magic(path, record):
    """Break the magic of the ``record``-th record of ``path`` (written with an .idx, which is removed)."""
    idx = path.with_suffix(".idx")
    offset = int(idx.read_text().splitlines()[record].split("\t")[1])
    idx.unlink()
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\x11\x22\x33\x44")


def test_a_shuffle_buffers_state_after_damage_belongs_to_its_on_error(tmp_path, no_leaks):
    """A shuffle buffer is emptied at damage under on_error="raise" and drawn on past it under "skip": a
    state saved after the caught error and loaded with "skip" repeated two samples and lost two."""
    path = tmp_path / "d.rec"
    _write(path, 30, index=True)
    _damage_magic(path, 12)
    kw = dict(fields={"i": Json()}, workers=0, shuffle=True, seed=1, shuffle_buffer=8)
    from parrecio import CorruptRecordError
    with ParallelReader(path, on_error="raise", **kw) as r:
        with pytest.raises(CorruptRecordError):
            _delivered(r, False)
        state = r.state_dict()
    assert state["buffer_on_error"] == "raise"
    with ParallelReader(path, on_error="skip", **kw) as r:
        with pytest.raises(ValueError, match=r"saved with buffer_on_error='raise', this reader has buffer_on_error="
                                             r"'skip' \(the on_error of a shuffle buffer: past damage it draws other "
                                             r"samples; start the epoch again with set_epoch\(\) to change it\)"):
            r.load_state_dict(state)
        r.set_epoch(0)
        assert sorted(_delivered(r, False)) == [i for i in range(30) if i != 12]
    with ParallelReader(path, on_error="raise", **kw) as r:
        r.load_state_dict(state)  # the same on_error: accepted (and the same damage stops it again)
        with pytest.raises(CorruptRecordError):
            list(r)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_of_equal_shards_belongs_to_its_index(tmp_path, workers, no_leaks):
    """Equal shards read in order go by the .idx where every file has one (a damaged group keeps its place)
    and as a stream where not (it takes none): a state saved with the .idx and loaded without it was
    taken, and lost three samples."""
    path = tmp_path / "e.rec"
    _write(path, 12, bad={2}, index=True)
    kw = dict(fields={"i": Json()}, workers=workers, num_shards=2, shard_index=0, even_shards="drop",
              on_error="skip")
    with ParallelReader(path, **kw) as r:
        assert len(_delivered(r, False, stop=2)) == 2
        state = r.state_dict()
    assert state["by_index"] is True
    path.with_suffix(".idx").unlink()
    with ParallelReader(path, **kw) as r:
        with pytest.raises(ValueError, match=r"saved with by_index=True, this reader has by_index=False \(read by "
                                             r"the .idx beside every file, or as a stream where one is missing: an "
                                             r".idx was added or removed\)"):
            r.load_state_dict(state)
        r.load_state_dict({k: v for k, v in state.items() if k != "by_index"})  # (saved by an older version)


@pytest.mark.parametrize("workers", [0, 2])
def test_len_of_a_fifo_is_kept_while_its_writer_writes(tmp_path, workers, no_leaks):
    """len() of a stream is the count of its last complete pass, for the same data: a FIFO's size and time
    were part of that key, and every write into it sets its time -- the next pass's writer made the length
    unknown ("before a first complete pass"), mid-pass and after load_state_dict alike."""
    import os
    import threading
    path, fifo = tmp_path / "s.rec", tmp_path / "s.fifo"
    _write(path, 20, bad={3})
    os.mkfifo(fifo)
    data = path.read_bytes()

    def write():
        try:
            with open(fifo, "wb") as f:
                f.write(data)
        except BrokenPipeError:  # (a pass left early closed its end)
            pass

    def feed():
        t = threading.Thread(target=write)
        t.start()
        return t

    with ParallelReader(str(fifo), fields={"i": Json()}, workers=workers, on_error="skip") as r:
        t = feed()
        assert len(_delivered(r, False)) == 19 and len(r) == 19
        t.join(10)
        t = feed()
        it = iter(r)
        got = [next(it)["i"]["i"] for _ in range(5)]
        assert got == [0, 1, 2, 4, 5] and len(r) == 19  # (the writer has written into the FIFO meanwhile)
        state = r.state_dict()
        it.close()
        t.join(10)
        r.load_state_dict(state)
        assert state["delivered"] == 5 and len(r) == 14
        t = feed()
        assert [x["i"]["i"] for x in r] == [i for i in range(6, 20)]
        t.join(10)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("batch_size", [None, 4])
def test_a_state_after_damage_that_ends_a_skipping_pass_is_at_the_failed_sample(tmp_path, workers, batch_size,
                                                                                 no_leaks):
    """Sample 6 skipped (bad JSON), then damage at sample 7 that cannot be realigned (groups of two JSON
    records) ends the pass under on_error="skip": the state is at sample 7, where the error is, not at the
    skipped sample 6 -- which a resume decoded and skipped again (stats.skipped twice for one sample)."""
    from parrecio import CorruptRecordError
    path = tmp_path / "d.rec"
    with RecordWriter(path, index=True) as w:
        for i in range(12):
            w.write(b"not json" if i == 6 else b'{"i": %d}' % i)
            w.write(b"%d" % i)
    _damage_magic(path, 2 * 7)
    kw = dict(fields={"i": Json(), "j": Json()}, workers=workers, batch_size=batch_size, on_error="skip")
    batched = batch_size is not None
    with ParallelReader(path, **kw) as r:
        got = []
        with pytest.raises(CorruptRecordError) as info:
            for item in r:
                got += _ids(item, batched)
        assert (got, info.value.index, r.stats.skipped) == ([0, 1, 2, 3, 4, 5], 7, 1)
        state = r.state_dict()
    assert (state["position"], state["delivered"]) == (7, 6)
    with ParallelReader(path, **kw) as r:
        r.load_state_dict(state)
        with pytest.raises(CorruptRecordError) as info:
            list(r)
        assert (info.value.index, r.stats.skipped, r.stats.samples) == (7, 0, 0)
