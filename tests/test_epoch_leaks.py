"""Nothing a pass opens outlives it, however many epochs run (docs/ARCHITECTURE.md, "Resources").

A read by index (a shuffle or equal shards of ``.idx`` files) opens an ``IndexedRecordReader`` per file
and pass.  Two leaks grew with the epochs: the reader and its ``join="auto"`` helper referred to each
other, so each pass's parsed ``.idx`` (about 130 bytes a record) stayed until a full garbage collection,
which the few objects involved hardly ever set off; and with ``workers=0`` the pass never closed those
readers (each epoch kept one descriptor per file until the process ran out of them).
"""

from __future__ import annotations

import gc
import os
import weakref

import pytest

from parrecio import IndexedRecordReader, ParallelReader
from parrecio.recordio.writer import RecordWriter


def _write_indexed(folder, files: int, records: int) -> list:
    """``files`` .rec/.idx pairs of ``records`` records each (b"<file>-<record>"); returns the payloads."""
    os.makedirs(folder, exist_ok=True)
    payloads = []
    for j in range(files):
        with RecordWriter(os.path.join(folder, f"part-{j:03d}.rec"), index=True) as w:
            for i in range(records):
                payloads.append(b"%03d-%04d" % (j, i))
                w.write(payloads[-1])
    return payloads


@pytest.fixture
def no_collector():
    """Only reference counting frees objects while the test runs."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def test_an_indexed_reader_is_freed_by_reference_counting(tmp_path, no_collector):
    _write_indexed(tmp_path, 1, 50)
    rec = str(tmp_path / "part-000.rec")
    reader = IndexedRecordReader(rec)  # join="auto": the helper that decides the join is made
    assert reader[3] == b"000-0003"
    gone = weakref.ref(reader)
    del reader
    assert gone() is None  # no cycle left it for the collector (its __del__ closed the file)


def test_shuffled_epochs_leave_no_reader_or_descriptor_behind(tmp_path, no_leaks):
    """workers=0, where the pass runs in this process (with workers, in the reader process: the same
    readers, freed as the test above shows)."""
    files = 12
    payloads = _write_indexed(tmp_path, files, 20)
    fds = lambda: len(os.listdir("/proc/self/fd"))  # noqa: E731
    with ParallelReader(str(tmp_path), workers=0, shuffle=True, seed=3) as reader:
        first = sorted(reader)
        assert first == sorted(payloads)
        before = fds()
        gc.collect()
        gc.disable()  # what is freed below, reference counting frees
        try:
            for _ in range(6):
                assert sorted(reader) == first
            alive = [o for o in gc.get_objects() if isinstance(o, IndexedRecordReader)]
        finally:
            gc.enable()
        assert fds() == before  # each epoch left its 12 files open
        assert alive == []


def test_the_reader_process_does_not_grow_epoch_after_epoch(tmp_path, no_leaks):
    """With workers, a read by index runs in the reader process, which is kept from pass to pass.  Each
    pass's objects there are in reference cycles (the ring's wait calls back into its reader), and with
    them each pass's parsed .idx -- ~13 MiB per 100k records -- stayed until a full collection, which a
    process allocating so few containers almost never runs: its memory grew by that much every epoch,
    without end (28 MiB an epoch for 200k records, 68 -> 899 MiB over 30 epochs).  Now it collects once
    per pass: flat."""
    import numpy as np
    import psutil
    n = 60_000
    path = str(tmp_path / "small.rec")
    with RecordWriter(path, index=True) as w:
        for i in range(n):
            w.write(i.to_bytes(8, "little"))
    uss, pids = [], set()
    with ParallelReader(path, workers=1, shuffle=True) as reader:
        for epoch in range(7):
            reader.set_epoch(epoch)
            for i, view in enumerate(reader.iter_views()):
                if i == n // 2:
                    pid = reader.telemetry()["processes"]["reader"]["pid"]
            del view
            pids.add(pid)
            uss.append(psutil.Process(pid).memory_full_info().uss / 2**20)
    assert len(pids) == 1  # one reader process served every pass
    slope = np.polyfit(np.arange(1, len(uss)), uss[1:], 1)[0]
    assert slope < 1.5, f"the reader process grew {slope:.1f} MiB an epoch: {[round(u, 1) for u in uss]}"
