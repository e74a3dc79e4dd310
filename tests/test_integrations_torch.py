"""parrecio.integrations.torch: DataLoader over ParallelIterableDataset, zero-copy tensors, a tiny training
run, epochs, cleanup.  Skipped where torch is not installed (.ci/run installs torch==2.13.0, the CPU
build that lies on this kind of machine's disk)."""

from __future__ import annotations

import io
import time
from collections import namedtuple

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from PIL import Image as PILImage  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

from parrecio import ParallelReader, RecordWriter  # noqa: E402
from parrecio.decoders import ClassLabel, Image, Json  # noqa: E402
from parrecio.integrations.torch import DataLoaderWorkerError, ParallelIterableDataset, to_torch  # noqa: E402

N = 40          # samples
BATCH = 8
SIZE = (32, 32)


def _png(seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, size=(20 + seed % 7, 24 + seed % 5, 3), dtype=np.uint8)
    buf = io.BytesIO()
    PILImage.fromarray(arr).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    path = tmp_path_factory.mktemp("torch") / "cls.rec"
    with RecordWriter(str(path)) as w:
        for i in range(N):
            w.write(_png(i))
            w.write(str(i % 3).encode())
    return path


def fields():
    return [Image(size=SIZE), ClassLabel()]


def test_dataloader_batches_zero_copy_and_epochs(rec, no_leaks):
    with ParallelIterableDataset(rec, fields=fields(), workers=2, batch_size=BATCH) as ds:
        assert isinstance(ds, torch.utils.data.IterableDataset)
        loader = DataLoader(ds, batch_size=None, num_workers=0)
        epochs = []
        for _ in range(2):
            seen = []
            for images, labels in loader:
                assert isinstance(images, torch.Tensor) and isinstance(labels, torch.Tensor)
                assert images.dtype == torch.uint8 and labels.dtype == torch.int64
                assert images.shape[1:] == (*SIZE, 3) and labels.shape == images.shape[:1]
                seen.append((images.clone(), labels.clone()))
            epochs.append(seen)
        assert [len(e) for e in epochs] == [N // BATCH, N // BATCH]
        for (a, la), (b, lb) in zip(*epochs):
            assert torch.equal(a, b) and torch.equal(la, lb)
        labels = torch.cat([lab for _, lab in epochs[0]])
        assert labels.tolist() == [i % 3 for i in range(N)]
        # the images are the decoder's output for the stream, in order
        first = torch.from_numpy(Image(size=SIZE)(_png(0)))
        assert torch.equal(epochs[0][0][0][0], first)
        assert len(ds.reader.worker_pids) == 2
    assert ds.reader.state.value == "closed"


def test_zero_copy_data_ptr(rec, no_leaks):
    with ParallelReader(rec, fields=fields(), workers=2, batch_size=BATCH) as reader:
        for images, labels in reader:
            assert not images.flags.owndata and images.flags.writeable
            t_images, t_labels = to_torch((images, labels))
            assert t_images.data_ptr() == images.ctypes.data
            assert t_labels.data_ptr() == labels.ctypes.data
            t_images[0, 0, 0, 0] = 7                      # same memory, both ways
            assert images[0, 0, 0, 0] == 7
            break


def test_tensors_outlive_close(rec, no_leaks):
    ds = ParallelIterableDataset(rec, fields=fields(), workers=1, batch_size=BATCH)
    kept = [images for images, _ in DataLoader(ds, batch_size=None)]
    ds.close()
    ref = torch.from_numpy(Image(size=SIZE)(_png(N - 1)))
    assert torch.equal(kept[-1][-1], ref)
    del kept


def test_tiny_training_two_epochs(rec, no_leaks):
    torch.manual_seed(0)
    model = torch.nn.Linear(SIZE[0] * SIZE[1] * 3, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    before = [p.detach().clone() for p in model.parameters()]
    ds = ParallelIterableDataset(lambda: ParallelReader(rec, fields=fields(), workers=2, batch_size=BATCH))
    loader = DataLoader(ds, batch_size=None, num_workers=0)
    losses = []
    for _ in range(2):
        for images, labels in loader:
            x = images.flatten(1).float() / 255.0
            loss = torch.nn.functional.cross_entropy(model(x), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    pids = list(ds.reader.worker_pids)
    ds.close()
    assert len(losses) == 2 * (N // BATCH)
    assert all(np.isfinite(losses))
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    import psutil
    deadline = time.monotonic() + 5
    while any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids) \
            and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def test_unbatched_dicts_and_non_arrays(rec, no_leaks):
    reader = ParallelReader(rec, fields={"image": Image(size=SIZE), "label": Json()}, workers=1)
    with ParallelIterableDataset(reader) as ds:
        items = list(ds)
    assert len(items) == N
    assert items[0]["image"].shape == (*SIZE, 3) and isinstance(items[0]["image"], torch.Tensor)
    assert [it["label"] for it in items[:4]] == [0, 1, 2, 0]          # JSON values stay Python values


def test_to_torch_structures():
    Pt = namedtuple("Pt", "a b")
    ro = np.arange(6, dtype=np.float32)
    ro.flags.writeable = False
    boxes = [np.zeros((2, 5), np.float32), np.ones((0, 5), np.float32)]
    out = to_torch({"t": (np.arange(3), [b"x", b"yz"]), "p": Pt(np.float32(1.5), "s"), "boxes": boxes,
                    "ro": ro, "swapped": np.arange(4, dtype=">i4"), "rev": np.arange(5)[::-1],
                    "obj": np.array([{"a": 1}], dtype=object), "json": [{"a": 1}]})
    assert isinstance(out["t"], tuple) and isinstance(out["t"][0], torch.Tensor)
    assert out["t"][1] == [b"x", b"yz"]
    assert isinstance(out["p"], Pt) and out["p"].a.shape == () and out["p"].b == "s"
    assert [b.shape for b in out["boxes"]] == [(2, 5), (0, 5)]
    assert out["ro"].tolist() == list(range(6))                  # copied: no warning, still correct
    assert out["swapped"].tolist() == [0, 1, 2, 3]
    assert out["rev"].tolist() == [4, 3, 2, 1, 0]
    assert isinstance(out["obj"], np.ndarray) and out["json"] == [{"a": 1}]


def test_len_follows_reader(rec):
    """No .idx beside the file: the reader's length is unknown before a first pass, and so is the dataset's
    and the DataLoader's (a known length: test_len_when_known)."""
    reader = ParallelReader(rec, fields=fields(), workers=1, batch_size=BATCH)
    ds = ParallelIterableDataset(reader)
    try:
        with pytest.raises(TypeError):
            len(reader)
        with pytest.raises(TypeError):
            len(ds)
        with pytest.raises(TypeError):
            len(DataLoader(ds, batch_size=None))
    finally:
        ds.close()


def test_len_when_known():
    class Sized(ParallelReader):
        def __len__(self):
            return 5

    reader = Sized(io.BytesIO(b""), workers=1)
    ds = ParallelIterableDataset(reader)
    assert len(ds) == 5 and len(DataLoader(ds, batch_size=None)) == 5
    ds.close()


def test_dataloader_workers_refused(rec, no_leaks):
    ds = ParallelIterableDataset(rec, fields=fields(), workers=1, batch_size=BATCH)
    import pickle
    with pytest.raises(TypeError) as caught:
        pickle.dumps(ds)
    # what happened (pickled, not iterated in a worker) and what to do (audit: it said "iterated")
    assert str(caught.value) == (
        "a ParallelIterableDataset cannot be pickled (e.g. sent to the worker processes of a DataLoader with "
        "num_workers > 0 under spawn or forkserver): parrecio runs its own decoder processes and does its own "
        "batching: use DataLoader(dataset, batch_size=None, num_workers=0) and set workers=/batch_size= on the "
        "dataset (ParallelReader) instead.")
    # fork: the dataset is not pickled, the worker iterates it and must refuse
    loader = DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="fork")
    with pytest.raises(DataLoaderWorkerError, match="num_workers=0"):
        next(iter(loader))
    del loader
    ds.close()


def test_constructor_errors_and_pin_memory(rec):
    with pytest.raises(TypeError):
        ParallelIterableDataset()
    reader = ParallelReader(rec, fields=fields(), workers=1)
    with pytest.raises(TypeError):
        ParallelIterableDataset(reader, batch_size=4)
    reader.close()
    bad = ParallelIterableDataset(lambda: "not a reader")
    with pytest.raises(TypeError, match="factory"):
        iter(bad)
    if not torch.cuda.is_available():
        with pytest.warns(RuntimeWarning, match="CUDA"):
            ds = ParallelIterableDataset(rec, fields=fields(), workers=1, pin_memory=True)
        assert ds.pin_memory is False
        ds.close()


def test_early_break_then_next_epoch(rec, no_leaks):
    with ParallelIterableDataset(rec, fields=fields(), workers=2, batch_size=BATCH) as ds:
        loader = DataLoader(ds, batch_size=None)
        for i, (images, labels) in enumerate(loader):
            if i == 1:
                break
        full = [labels.tolist() for _, labels in loader]
    assert sum(full, []) == [i % 3 for i in range(N)]


def test_dataloader_default_batch_size_is_refused_for_batched_readers(rec, no_leaks):
    """DataLoader(ds) batches with batch_size=1 by default: over a batching reader that would silently
    give [1, 8, ...] tensors.  It is refused with the fix in the message; an unbatched reader may be
    batched by the DataLoader."""
    with ParallelIterableDataset(rec, fields=fields(), workers=1, batch_size=BATCH) as ds:
        with pytest.raises(TypeError, match=r"would batch them again .*DataLoader\(dataset, batch_size=None\)"):
            next(iter(DataLoader(ds)))
        images, labels = next(iter(DataLoader(ds, batch_size=None)))
        assert images.shape == (BATCH, *SIZE, 3)
        # inside a wrapper too: ChainDataset's generator calls iter(ds), driven by the DataLoader's fetcher
        from torch.utils.data import ChainDataset
        with pytest.raises(TypeError, match=r"would batch them again"):
            next(iter(DataLoader(ChainDataset([ds]))))
        images, labels = next(iter(DataLoader(ChainDataset([ds]), batch_size=None)))
        assert images.shape == (BATCH, *SIZE, 3)

        class Rows(torch.utils.data.IterableDataset):  # a wrapper of the user's that unbatches: let be
            def __iter__(self):
                for images, labels in ds:
                    yield from zip(images, labels)
        images, labels = next(iter(DataLoader(Rows(), batch_size=3)))
        assert images.shape == (3, *SIZE, 3) and labels.tolist() == [0, 1, 2]
    with ParallelIterableDataset(rec, fields=fields(), workers=1) as ds:
        images, labels = next(iter(DataLoader(ds, batch_size=4)))
        assert images.shape == (4, *SIZE, 3) and labels.tolist() == [0, 1, 2, 0]


def test_dataset_forwards_set_epoch_and_state_dict(tmp_path, no_leaks):
    path = tmp_path / "e.rec"
    with RecordWriter(str(path), index=str(tmp_path / "e.idx")) as w:
        for i in range(30):
            w.write(b"%d" % i, key=i)
    kw = dict(fields=Json(), workers=1, batch_size=4, shuffle=True, seed=5)
    with ParallelIterableDataset(path, **kw) as ds:
        ds.set_epoch(2)
        loader = DataLoader(ds, batch_size=None)
        it = iter(loader)
        head = [next(it) for _ in range(3)]
        state = ds.state_dict()
        assert (state["epoch"], state["position"]) == (2, 12)
    with ParallelIterableDataset(path, **kw) as ds:
        ds.load_state_dict(state)
        tail = list(DataLoader(ds, batch_size=None))
    with ParallelIterableDataset(path, **kw) as ds:
        ds.set_epoch(2)
        whole = list(DataLoader(ds, batch_size=None))
    assert [list(b) for b in head + tail] == [list(b) for b in whole]


def _ids(batches):
    return [int(x) for b in batches for x in b]


def test_set_epoch_and_load_state_dict_between_iter_and_the_first_batch(tmp_path, no_leaks):
    """``it = iter(loader); ds.set_epoch(e)``: the pass begins at the first batch, so it is epoch e (the
    pass began at iter(), and the loop read epochs 0, 0, 1, 2: epoch 0 twice, silently); an iterator made
    and dropped unused does not put its epoch back over a set_epoch() since (the next loop read epoch 0
    after set_epoch(5)); and a set_epoch() during a pass is what state_dict() says once it ended."""
    path = tmp_path / "e.rec"
    with RecordWriter(str(path), index=str(tmp_path / "e.idx")) as w:
        for i in range(30):
            w.write(b"%d" % i, key=i)
    kw = dict(fields=Json(), workers=1, batch_size=4, shuffle=True, seed=5)

    def epoch_ids(e):
        with ParallelReader(path, **{**kw, "workers": 0}) as r:
            r.set_epoch(e)
            return _ids(r)

    want = {e: epoch_ids(e) for e in (0, 1, 2, 5, 7, 8)}
    assert len({tuple(v) for v in want.values()}) == 6
    with ParallelIterableDataset(path, **kw) as ds:
        loader = DataLoader(ds, batch_size=None)
        for e in (0, 1, 2):
            it = iter(loader)
            ds.set_epoch(e)
            assert _ids(it) == want[e], e
        it = iter(loader)
        ds.set_epoch(5)
        del it
        assert _ids(loader) == want[5]
        state = ds.state_dict()
        assert (state["epoch"], state["position"]) == (6, 0)
        it = iter(loader)
        ds.load_state_dict({**state, "epoch": 7, "position": 8})
        assert _ids(it) == want[7][8:]
        it = iter(loader)
        head = [next(it) for _ in range(2)]
        ds.set_epoch(1)  # during a pass: the next one
        rest = list(it)
        assert _ids(head + rest) == want[8]  # (the pass after epoch 7's rest)
        assert (ds.state_dict()["epoch"], ds.state_dict()["position"]) == (1, 0)
        assert _ids(loader) == want[1]
    with ParallelReader(path, **kw) as r:  # the reader alone: an iterator made, then set_epoch, dropped
        it = iter(r)
        r.set_epoch(5)
        del it
        assert _ids(r) == want[5] and r.state_dict()["epoch"] == 6


def test_torchrun_ddp_two_ranks_gloo_equal_steps(tmp_path, no_leaks):
    """examples/ddp_train.py under torchrun with 2 processes (gloo, CPU): 101 samples, even_shards="pad",
    a global shuffle per epoch: both ranks finish every epoch with equal step counts, together they see
    every sample each epoch, and each rank's default workers is the CPUs divided by LOCAL_WORLD_SIZE."""
    import json
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                           "2", os.path.join(root, "examples", "ddp_train.py"), "--data", str(tmp_path / "d"),
                           "--epochs", "3", "--samples", "101", "--batch-size", "8"],
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["world"] == 2
    assert report["steps"] == [[7, 7]] * 3           # ceil(ceil(101 / 2) / 8) steps each, every epoch
    assert report["samples_seen"] == [True] * 3
    assert report["workers_per_rank"] == max(1, len(os.sched_getaffinity(0)) // 2)
    assert (report["state"]["epoch"], report["state"]["position"]) == (3, 0)
