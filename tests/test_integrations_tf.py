"""parrecio.integrations.tf and .keras with TensorFlow for real: the tf.data dataset gives exactly the
reader's batches on every pass (dense, ragged, strings, dicts, unbatched), its tensors are copies (the
reader's shared memory stays bounded), a new pass from another tf.data thread ends an unfinished one, and
Keras ``fit`` trains on every batch of every epoch.  Skipped where TensorFlow is not installed (.ci/run
installs tensorflow-cpu; the framework-free parts are in test_integrations_misc.py)."""

from __future__ import annotations

import gc
import os
import time

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up notices: not on every failure
tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from image_helpers import gt_boxes_json, png  # noqa: E402
from parrecio import ParallelReader, RecordWriter  # noqa: E402
from parrecio.decoders import BoundingBoxes, ClassLabel, Image, Json, Raw  # noqa: E402
from parrecio.integrations.keras import TrainedState, generator, steps_per_epoch  # noqa: E402
from parrecio.integrations.tf import FieldSpec, dataset  # noqa: E402
from parrecio.pipeline.shm import leftover  # noqa: E402
from pipeline_helpers import deadline  # noqa: E402

N = 37          # samples: 4 full batches of 8 and a last one of 5
BATCH = 8
SIZE = (32, 32)
BATCHES = -(-N // BATCH)


def _boxes(i: int) -> list:
    """Sample i has i % 4 boxes: every batch of 8 mixes 0, 1, 2 and 3 boxes (ragged)."""
    return [(j % 4, 2 + j, 3 + j, 10 + i % 5, 8) for j in range(i % 4)]


@pytest.fixture(scope="module")
def rec(tmp_path_factory):
    """[image, Ground Truth boxes JSON, class label] per sample; the images differ in size."""
    path = tmp_path_factory.mktemp("tf") / "det.rec"
    with RecordWriter(str(path)) as w:
        for i in range(N):
            width, height = 40 + i % 5, 30 + i % 3
            w.write(png(width, height, seed=i))
            w.write(gt_boxes_json(_boxes(i), width, height))
            w.write(str(i % 3).encode())
    return path


@pytest.fixture(scope="module")
def cls_rec(tmp_path_factory):
    """[image, class label] per sample: items are (x, y) as Keras takes them."""
    path = tmp_path_factory.mktemp("tf") / "cls.rec"
    with RecordWriter(str(path)) as w:
        for i in range(N):
            w.write(png(40 + i % 5, 30 + i % 3, seed=i))
            w.write(str(i % 3).encode())
    return path


def fixed_fields():
    return [Image(SIZE), BoundingBoxes(max_boxes=4), ClassLabel()]


def _copy(item):
    """A deep copy of a reader's item (its arrays are views of shared memory)."""
    if isinstance(item, dict):
        return {k: _copy(v) for k, v in item.items()}
    if isinstance(item, tuple):
        return tuple(_copy(v) for v in item)
    if isinstance(item, list):
        return [_copy(v) for v in item]
    if isinstance(item, (np.ndarray, np.generic)):
        return np.array(item, copy=True)
    return item


def assert_same(got, want, where="item"):
    """``got`` (what tf.data gave) is ``want`` (what the reader gave): structure, dtypes, shapes, bytes."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and set(got) == set(want), where
        for k in want:
            assert_same(got[k], want[k], f"{where}[{k!r}]")
    elif isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), where
        for i, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, list) and all(isinstance(v, bytes) for v in want):
        assert isinstance(got, tf.Tensor) and got.dtype == tf.string, where
        assert got.numpy().tolist() == want, where
    elif isinstance(want, list):  # ragged: one array per sample, of varying first dimension
        assert isinstance(got, tf.RaggedTensor), f"{where}: {type(got).__name__}"
        assert got.row_lengths().numpy().tolist() == [len(w) for w in want], where
        rows = [r.numpy() for r in got]
        for j, (r, w) in enumerate(zip(rows, want)):
            assert r.dtype == w.dtype and r.shape == w.shape, f"{where} row {j}"
            assert r.tobytes() == w.tobytes(), f"{where} row {j}"
    else:
        assert isinstance(got, tf.Tensor), f"{where}: {type(got).__name__}"
        g = got.numpy()
        assert g.dtype == want.dtype and g.shape == want.shape, f"{where}: {g.dtype}{g.shape} != {want.dtype}{want.shape}"
        assert g.tobytes() == want.tobytes(), f"{where}: values differ"


def assert_passes(ds, want, passes=2):
    for p in range(passes):
        got = list(ds)
        assert len(got) == len(want), f"pass {p}"
        for b, (g, w) in enumerate(zip(got, want)):
            assert_same(g, w, f"pass {p} batch {b}")


def test_fixed_shapes_every_pass_byte_exact(rec, no_leaks):
    """Image + padded boxes + label: the signature is inferred from the first batch, and each of two
    passes over the dataset (the second through prefetch, so from other tf.data threads) gives exactly the
    reader's own batches, the short last batch included."""
    with ParallelReader(rec, fields=fixed_fields(), workers=2, batch_size=BATCH) as reader:
        want = [_copy(b) for b in reader]
        assert [len(b[0]) for b in want] == [BATCH] * (N // BATCH) + [N % BATCH]
        ds = dataset(reader)
        assert ds.element_spec == (tf.TensorSpec((None, *SIZE, 3), tf.uint8),
                                   tf.TensorSpec((None, 4, 5), tf.float32),
                                   tf.TensorSpec((None,), tf.int64))
        assert_passes(ds, want, passes=1)
        assert_passes(ds.prefetch(2), want, passes=1)
        assert reader.stats.epochs == 3           # the reference pass and one per pass of the dataset
        assert [int(x) for x in tf.concat([y for _, _, y in ds], 0)] == [i % 3 for i in range(N)]


def test_ragged_boxes_strings_and_dicts(rec, no_leaks):
    """Dict fields; BoundingBoxes() without max_boxes gives a list of (k, 5) arrays per batch, fed as a
    tf.RaggedTensor; Raw() gives bytes, fed as tf.string."""
    fields = {"image": Image(SIZE), "boxes": BoundingBoxes(), "label": Raw()}
    with ParallelReader(rec, fields=fields, workers=2, batch_size=BATCH) as reader:
        want = [_copy(b) for b in reader]
        assert isinstance(want[0]["boxes"], list)               # ragged in the reader's own output
        ds = dataset(reader)
        assert ds.element_spec == {
            "image": tf.TensorSpec((None, *SIZE, 3), tf.uint8),
            "boxes": tf.RaggedTensorSpec((None, None, 5), tf.float32, ragged_rank=1, row_splits_dtype=tf.int64),
            "label": tf.TensorSpec((None,), tf.string)}
        assert_passes(ds, want)
        got = next(iter(ds))
        np.testing.assert_array_equal(got["boxes"][3].numpy()[:, 0], [0, 1, 2])   # sample 3: 3 boxes


def test_unbatched_samples(rec, no_leaks):
    with ParallelReader(rec, fields=fixed_fields(), workers=1) as reader:
        want = [_copy(s) for s in reader]
        ds = dataset(reader)
        assert ds.element_spec == (tf.TensorSpec((*SIZE, 3), tf.uint8), tf.TensorSpec((4, 5), tf.float32),
                                   tf.TensorSpec((), tf.int64))
        assert_passes(ds, want)


def _py_number(payload):
    """A decoder that returns a plain Python number: an int label, a float after record 12."""
    i = int(bytes(payload))
    return i % 10 if i < 12 else i / 4


@pytest.mark.parametrize("workers", [0, 1])
def test_a_decoders_python_numbers_batched(tmp_path, workers, no_leaks):
    """A decoder returning Python ints, batched: the reader's column is a list; dataset() described it as
    a (None,) int64 tensor and then refused that same list as 'values of different shapes' (audit).  A
    later float where the first batch gave integers is refused by name, not truncated."""
    path = str(tmp_path / "n.rec")
    with RecordWriter(path) as w:
        for i in range(20):
            w.write(b"%d" % i)
    with ParallelReader(path, fields=_py_number, workers=workers, batch_size=6) as reader:
        ds = dataset(reader)
        assert ds.element_spec == tf.TensorSpec((None,), tf.int64)
        it = iter(ds)
        assert [next(it).numpy().tolist() for _ in range(2)] == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 0, 1]]
        with pytest.raises(Exception, match=r"a column described as a int64 tensor \(from the first batch\) "
                                            r"came with float64 values \(\[3\.0, 3\.25"):
            next(it)


def test_given_signature_tf_and_fieldspec(rec, no_leaks):
    """output_signature given as tf specs (a RaggedTensorSpec included) or as FieldSpecs: no pass starts
    before the dataset is iterated, and the values are shaped for the signature."""
    fields = [Image(SIZE), BoundingBoxes(), ClassLabel()]
    with ParallelReader(rec, fields=fields, workers=2, batch_size=BATCH) as reader:
        want = [_copy(b) for b in reader]
        sig = (tf.TensorSpec((None, *SIZE, 3), tf.uint8),
               tf.RaggedTensorSpec((None, None, 5), tf.float32, ragged_rank=1, row_splits_dtype=tf.int64),
               tf.TensorSpec((None,), tf.int64))
        ds = dataset(reader, output_signature=sig)
        assert reader.stats.epochs == 1 and ds.element_spec == sig
        assert_passes(ds, want, passes=1)
        neutral = (FieldSpec("tensor", (None, *SIZE, 3), "uint8"), FieldSpec("ragged", (None, None, 5), "float32"),
                   FieldSpec("tensor", (None,), "int64"))
        ds = dataset(reader, output_signature=neutral)
        assert ds.element_spec == sig
        assert_passes(ds, want, passes=1)
        for bad in (tf.RaggedTensorSpec((None, None, None, 5), tf.float32, ragged_rank=2),
                    tf.RaggedTensorSpec((None, None, 5), tf.float32, ragged_rank=1, row_splits_dtype=tf.int32)):
            with pytest.raises(ValueError, match="ragged_rank=1, row_splits_dtype=tf.int64"):
                dataset(reader, output_signature=(sig[0], bad, sig[2]))
        assert reader.stats.epochs == 3                          # a refused signature starts no pass


def test_tensors_are_copies_shared_memory_stays_bounded(rec, no_leaks):
    """Keeping every batch of a pass (as prefetch, shuffle or cache would) keeps no output slot of the
    reader: tf.data would otherwise wrap the aligned shared-memory arrays as they are, and the reader
    would allocate a new slot for each batch kept."""
    mine = f"parrecio-{os.getpid()}-"
    with ParallelReader(rec, fields=fixed_fields(), workers=2, batch_size=2) as reader:
        ds = dataset(reader)
        for _ in ds:
            pass
        segments = len(leftover(mine))
        kept = list(ds)
        assert len(kept) == -(-N // 2)
        assert len(leftover(mine)) == segments
        images = kept[0][0].numpy()
        reference = Image(SIZE)(png(40, 30, seed=0))
        np.testing.assert_array_equal(images[0], reference)
    np.testing.assert_array_equal(kept[0][0].numpy()[0], reference)      # still valid after close()
    del kept, images
    gc.collect()


def test_new_iteration_ends_an_unfinished_one(rec, no_leaks):
    """tf.data runs each iteration of the dataset in its own thread: a new one while an older iterator is
    unfinished ends that older pass (instead of the reader refusing a pass from another thread), and the
    older iterator then raises a clear error after what it had buffered."""
    with ParallelReader(rec, fields=fixed_fields(), workers=2, batch_size=BATCH) as reader:
        want = [_copy(b) for b in reader]
        ds = dataset(reader)
        first = next(iter(ds))                                   # a peek: that iterator is dropped at once
        assert_same(first, want[0])
        old = iter(ds)
        assert_same(next(old), want[0])
        assert_same(next(old), want[1])
        assert_passes(ds, want, passes=1)                        # while `old` is alive and unfinished
        with pytest.raises(tf.errors.OpError, match="ended by a newer one"):
            for b, item in enumerate(old, start=2):              # buffered batches first, then the error
                assert_same(item, want[b])
        del old
        assert_passes(ds, want, passes=1)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_new_iteration_ends_an_older_one_whose_prefetch_waits_inside_its_pass(tmp_path, workers, no_leaks):
    """After the first epoch, an older iterator kept after one batch (a notebook's peek) while a new one
    runs: tf.data's prefetch thread (added to every dataset) is then inside the older pass's next(), waiting
    for slow batches, and the older generator cannot be closed.  The new iteration asks the reader to end
    that pass there and waits for the thread to come out (it raised "being iterated by another iterator"
    in 35 of 36 tries), and reads a whole epoch; the older iterator raises "ended by a newer one"."""
    from pipeline_helpers import Sleepy, digest_array, payloads, write_rec
    recs = payloads(60, seed=4)
    path = tmp_path / "slow.rec"
    write_rec(path, recs)
    want = np.stack([digest_array(p) for p in recs])
    with deadline(120), ParallelReader(path, fields=Sleepy(max_ms=40.0), workers=workers, batch_size=6) as reader:
        ds = dataset(reader)
        assert len(list(ds)) == 10                                 # the first epoch
        for attempt in range(3):
            old = iter(ds)
            np.testing.assert_array_equal(next(old).numpy(), want[:6])
            got = np.concatenate([b.numpy() for b in ds])            # while `old` waits on its next batch
            np.testing.assert_array_equal(got, want, err_msg=f"attempt {attempt}")
            with pytest.raises(tf.errors.OpError, match="ended by a newer one"):
                for _ in old:
                    pass
            del old
        np.testing.assert_array_equal(np.concatenate([b.numpy() for b in ds]), want)


class _SlowIterable:
    """Not a ParallelReader: any iterable of batches may be given to dataset()."""
    batch_size = 2

    def __iter__(self):
        for i in range(6):
            time.sleep(0.05)
            yield np.full((2, 3), i, np.int32)


def test_a_new_iteration_of_a_plain_iterable_waits_for_the_older_one():
    """Without a ParallelReader to ask, a new iteration waits for tf.data's thread to come out of the
    older pass's next() (it raised AttributeError: no _end_pass_elsewhere)."""
    ds = dataset(_SlowIterable())
    assert len(list(ds)) == 6
    old = iter(ds)
    assert next(old).numpy().tolist() == [[0, 0, 0], [0, 0, 0]]
    time.sleep(0.05)  # (tf.data's prefetch thread is inside the older pass's next() now)
    assert [int(b.numpy()[0, 0]) for b in ds] == [0, 1, 2, 3, 4, 5]
    del old


def test_errors_are_clear(tmp_path, rec, no_leaks):
    # a column that cannot be described: TypeError naming it, and the first pass is ended
    with ParallelReader(rec, fields=[Image(SIZE), Json(), ClassLabel()], workers=1, batch_size=BATCH) as reader:
        with pytest.raises(TypeError, match=r"\[1\].*pass output_signature"):
            dataset(reader)
        assert len(list(reader)) == BATCHES
    # the first batch is uniform (one box each), a later one is not: inferred dense, then a clear error
    path = tmp_path / "uniform-first.rec"
    with RecordWriter(str(path)) as w:
        for i in range(8):
            w.write(gt_boxes_json(_boxes(1) if i < 4 else _boxes(i)))
    with ParallelReader(path, fields=BoundingBoxes(), workers=1, batch_size=4) as reader:
        ds = dataset(reader)
        assert ds.element_spec == tf.TensorSpec((None, 1, 5), tf.float32)
        with pytest.raises(tf.errors.OpError, match=r"max_boxes"):
            list(ds)
    # an empty stream cannot give a signature
    empty = tmp_path / "empty.rec"
    RecordWriter(str(empty)).close()
    with ParallelReader(empty, fields=fixed_fields(), workers=1, batch_size=BATCH) as reader:
        with pytest.raises(ValueError, match="empty"):
            dataset(reader)


# -- Keras ----------------------------------------------------------------------------------------

class CountBatches(keras.callbacks.Callback):
    def __init__(self):
        super().__init__()
        self.per_epoch = []

    def on_epoch_begin(self, epoch, logs=None):
        self.per_epoch.append(0)

    def on_train_batch_end(self, batch, logs=None):
        self.per_epoch[-1] += 1


def _model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((*SIZE, 3)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten(),
                              keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def _fit(model, data, **kw):
    count = CountBatches()
    before = [w.copy() for w in model.get_weights()]
    history = model.fit(data, callbacks=[count], verbose=0, shuffle=False, **kw)
    assert all(np.isfinite(history.history["loss"]))
    assert any(not np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    return count.per_epoch


def test_keras_fit_dataset_every_batch_of_both_epochs(cls_rec, rec, no_leaks):
    """model.fit(dataset(reader), epochs=2): one reader pass per epoch, every batch of it trained on
    (the length is unknown before the first pass: Keras learns it at the end of the first epoch)."""
    model = _model()
    with ParallelReader(cls_rec, fields=[Image(SIZE), ClassLabel()], workers=2, batch_size=BATCH) as reader:
        with pytest.warns(UserWarning, match="ran out of data"):
            assert _fit(model, dataset(reader).prefetch(tf.data.AUTOTUNE), epochs=2) == [BATCHES, BATCHES]
        assert reader.stats.epochs == 2 and len(reader) == BATCHES
        # a known length: given to Keras up front, no warning, still every batch
        ds = dataset(reader).apply(tf.data.experimental.assert_cardinality(len(reader)))
        assert _fit(model, ds, epochs=2) == [BATCHES, BATCHES]
        assert reader.stats.epochs == 4
    # dict fields (and a column the model does not use): mapped to (x, y)
    fields = {"image": Image(SIZE), "boxes": BoundingBoxes(), "label": ClassLabel()}
    with ParallelReader(rec, fields=fields, workers=2, batch_size=BATCH) as reader:
        ds = dataset(reader).map(lambda d: (d["image"], d["label"]))
        with pytest.warns(UserWarning, match="ran out of data"):
            assert _fit(model, ds, epochs=2) == [BATCHES, BATCHES]


def test_keras_fit_generator_every_batch_of_both_epochs(rec, no_leaks):
    """model.fit(generator(reader), steps_per_epoch=...): Keras's epochs are the reader's passes."""
    model = _model()
    fields = {"image": Image(SIZE), "boxes": BoundingBoxes(max_boxes=4), "label": ClassLabel()}
    with ParallelReader(rec, fields=fields, workers=2, batch_size=BATCH) as reader:
        assert steps_per_epoch(reader) is None                   # no .idx: not known before a first pass
        assert len(list(reader)) == BATCHES
        steps = steps_per_epoch(reader)
        assert steps == BATCHES
        gen = generator(reader, inputs="image", targets="label")
        assert _fit(model, gen, steps_per_epoch=steps, epochs=2) == [BATCHES, BATCHES]
        gen.close()


def test_keras_generator_with_epochs_reads_exactly_those_passes(cls_rec, no_leaks):
    """#24: an endless generator is read ahead by Keras's prefetch, so fit(epochs=3) started a fourth pass
    (one batch of it: stats.samples 376 for 3 x 120; on a Pipe-mode channel that pass waits for a FIFO
    SageMaker never creates).  generator(reader, epochs=3) ends with the third pass: exactly 3 x N
    samples read, every batch trained on, and no "ran out of data" warning."""
    import warnings
    model = _model()
    with ParallelReader(cls_rec, fields=[Image(SIZE), ClassLabel()], workers=2, batch_size=BATCH) as reader:
        list(reader)  # the length, for steps_per_epoch
        before = reader.stats.samples
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=".*ran out of data")
            assert _fit(model, generator(reader, epochs=3), steps_per_epoch=steps_per_epoch(reader),
                        epochs=3) == [BATCHES] * 3
        assert reader.stats.samples - before == 3 * N and reader.stats.epochs == 4
        # the endless generator: Keras asks it for more than it trains on (pinned, so that the README's
        # advice is checked against the Keras in CI: if this starts failing, Keras stopped reading ahead)
        before = reader.stats.epochs  # (passes begun: samples count what was handed out once a block ends)
        assert _fit(model, generator(reader), steps_per_epoch=BATCHES, epochs=3) == [BATCHES] * 3
        assert reader.stats.epochs - before == 4  # a fourth pass begun for the batch Keras read ahead


class _Interrupt(Exception):
    pass


class _StopAt(keras.callbacks.Callback):
    """Saves trained.state_dict() after every batch (after the TrainedState's own callback), and ends
    fit with _Interrupt after batch `stop` = (epoch, index in the epoch), as a killed job would."""

    def __init__(self, trained, stop=None):
        super().__init__()
        self.trained, self.stop, self.saved = trained, stop, []

    def on_train_batch_end(self, batch, logs=None):
        self.saved.append(self.trained.state_dict())
        if self.stop is not None and (self.epoch, batch) == self.stop:
            raise _Interrupt()

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch


def _tapped(gen, seen):
    """The generator's batches as they are yielded (still a generator, which Keras requires)."""
    for batch in gen:
        seen.append((batch[0].tobytes(), batch[1].tobytes()))
        yield batch


@pytest.mark.parametrize("stop", [(0, 2), (0, BATCHES - 1), (1, 0)])
def test_trained_state_resumes_after_the_batches_keras_trained_on(cls_rec, no_leaks, stop):
    """reader.state_dict() in a Keras callback counts the batches Keras read ahead and has not trained on
    (a resume from it skipped 1-2 batches; 32 of 360 samples in the audit).  TrainedState gives the state
    after the batches trained: an interrupted fit resumed from it trains on every sample of every epoch
    exactly once, in the uninterrupted order (shuffled), whether it stopped mid-epoch, after an epoch's
    last batch or after a new epoch's first."""
    kw = dict(fields=[Image(SIZE), ClassLabel()], workers=2, batch_size=BATCH, shuffle=True, seed=3)
    epochs = 2
    with ParallelReader(cls_rec, **kw) as reader:
        want = [(x.tobytes(), y.tobytes()) for _ in range(epochs) for x, y in reader]
    model = _model()
    with ParallelReader(cls_rec, **kw) as reader:
        list(reader)  # the length, for steps_per_epoch
        reader.set_epoch(0)
        trained, seen = TrainedState(), []
        stopper = _StopAt(trained, stop)
        with pytest.raises(_Interrupt):
            model.fit(_tapped(generator(reader, epochs=epochs, trained=trained), seen), epochs=epochs,
                      steps_per_epoch=steps_per_epoch(reader), callbacks=[trained.callback(), stopper], verbose=0)
        state = trained.state_dict()
        done = stop[0] * BATCHES + stop[1] + 1
        assert len(seen) >= done and (state["epoch"], state["position"]) == divmod(done * BATCH, BATCHES * BATCH) \
            or (done % BATCHES == 0 and (state["epoch"], state["position"]) == (done // BATCHES - 1, N))
        # every save was the state after exactly the batches trained by then
        for n, saved in enumerate(stopper.saved, 1):
            e, b = divmod(n, BATCHES)
            assert (saved["epoch"], saved["position"]) in {(e, min(b * BATCH, N)), (e - 1, N)}
        got = seen[:done]
    with ParallelReader(cls_rec, **kw) as reader:
        reader.load_state_dict(state)
        e, rest = state["epoch"], -(-(N - state["position"]) // BATCH)  # (no .idx: len(reader) is not known)
        seen2 = []
        if rest:  # the rest of the interrupted epoch, on its own
            model.fit(_tapped(generator(reader, epochs=1), seen2), steps_per_epoch=rest,
                      initial_epoch=e, epochs=e + 1, verbose=0)
        e += 1
        if e < epochs:
            model.fit(_tapped(generator(reader, epochs=epochs - e), seen2), steps_per_epoch=BATCHES,
                      initial_epoch=e, epochs=epochs, verbose=0)
        got += seen2
    assert len(got) == len(want) and got == want


def test_trained_state_counts_steps_per_execution_and_refuses_misuse(cls_rec, no_leaks):
    """With steps_per_execution=2 Keras calls the batch callbacks every second batch (with the last
    batch's index); the state still follows the batches trained.  Without the callback, or a generator
    fit twice, state_dict raises instead of returning a state that would skip or repeat batches."""
    model = _model()
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  steps_per_execution=2)
    with ParallelReader(cls_rec, fields=[Image(SIZE), ClassLabel()], workers=0, batch_size=BATCH) as reader:
        list(reader)
        trained = TrainedState()
        with pytest.raises(RuntimeError, match="generator.*callback"):
            trained.state_dict()
        stopper = _StopAt(trained)
        model.fit(generator(reader, epochs=1, trained=trained), steps_per_epoch=4, epochs=1,
                  callbacks=[trained.callback(), stopper], verbose=0)
        assert [s["position"] for s in stopper.saved] == [2 * BATCH, 4 * BATCH]
        # an execution cut short by the generator's end (5 batches, 3 a step): Keras still says a whole
        # one (batch index 5 of 5) -- "no state after batch 6" at the epoch's end, the checkpoint that
        # matters most; it is the state after the 5 the generator yielded
        model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      steps_per_execution=3)
        stopper = _StopAt(trained)
        model.fit(generator(reader, epochs=1, trained=trained), steps_per_epoch=BATCHES, epochs=1,
                  callbacks=[trained.callback(), stopper], verbose=0)
        assert [(s["epoch"], s["position"]) for s in stopper.saved] == [(2, 3 * BATCH), (2, N)]
        gen = generator(reader, epochs=2, trained=trained)
        with pytest.raises(RuntimeError, match="callback"):  # not in this fit's callbacks
            model.fit(gen, steps_per_epoch=1, epochs=1, callbacks=[_StopAt(trained)], verbose=0)
        del gen  # (tf.data's thread may still be inside it: close() would raise "already executing")
        with pytest.raises(TypeError, match="TrainedState"):
            generator(reader, trained=object())


def _resumed_at_epoch_end(path):
    """The state of a reader saved right after epoch 0's last batch (its position: the epoch's length)."""
    with ParallelReader(path, fields=[Image(SIZE), ClassLabel()], workers=0, batch_size=BATCH) as reader:
        it = iter(reader)
        want = [_copy(next(it)) for _ in range(BATCHES)]  # (the loop has not asked for the end yet)
        state = reader.state_dict()
        it.close()
    assert (state["epoch"], state["position"]) == (0, N)
    return state, want


@pytest.mark.parametrize("workers", [0, 2])
def test_generator_and_dataset_of_a_reader_resumed_after_an_epochs_last_batch(cls_rec, no_leaks, workers):
    """Checkpoints every k steps, k a divisor of the epoch's batches: the state is (epoch e, its length).
    The resumed pass (the rest of epoch e) is empty; the generator and the dataset go on with the next
    epoch instead of calling the stream empty."""
    state, want = _resumed_at_epoch_end(cls_rec)
    kw = dict(fields=[Image(SIZE), ClassLabel()], workers=workers, batch_size=BATCH)
    with ParallelReader(cls_rec, **kw) as reader:
        reader.load_state_dict(state)
        it = iter(reader)  # (made and dropped before its first next(): the resumed position is given back)
        del it
        got = list(generator(reader, epochs=2))
        assert len(got) == 2 * BATCHES and reader.epoch == 3
        for b, (x, y) in enumerate(got):
            assert x.tobytes() == want[b % BATCHES][0].tobytes() and y.tobytes() == want[b % BATCHES][1].tobytes()
    with ParallelReader(cls_rec, **kw) as reader:
        reader.load_state_dict(state)
        ds = dataset(reader)
        assert_passes(ds, want, passes=1)
        assert reader.epoch == 2
    empty = cls_rec.parent / "empty.rec"
    empty.write_bytes(b"")
    with ParallelReader(empty, fields=[Raw(), Raw()], workers=workers, batch_size=BATCH) as reader:
        with pytest.raises(ValueError, match="stream is empty"):  # not resumed: at once (a FIFO would wait)
            next(generator(reader, epochs=1))
        assert reader.epoch == 1


@pytest.mark.parametrize("workers", [0, 2])
def test_an_empty_fifo_is_an_empty_stream_at_once(tmp_path, workers, no_leaks):
    """Only the empty rest of a resumed epoch is passed over: an empty FIFO raises at once (a second pass
    would wait for a writer that never comes)."""
    import threading
    fifo = tmp_path / "f.fifo"
    os.mkfifo(fifo)
    for make in (lambda r: next(generator(r, epochs=1)), dataset):
        writer = threading.Thread(target=lambda: open(fifo, "wb").close(), daemon=True)
        writer.start()
        with deadline(30), ParallelReader(str(fifo), fields=[Raw(), Raw()], workers=workers,
                                          batch_size=BATCH) as reader:
            with pytest.raises(ValueError, match="stream is empty"):
                make(reader)
        writer.join(10)
        assert not writer.is_alive()


# -- where the stream stands through a dataset: the batch dataset() looks at is not handed out yet ---------
def _shuffled(path, workers):
    return ParallelReader(path, fields=[Image(SIZE), ClassLabel()], workers=workers, batch_size=BATCH,
                          shuffle=True, seed=7)


def _epoch_batches(path, epoch):
    """Epoch ``epoch``'s batches of :func:`_shuffled`, read by the reader alone (workers=0)."""
    with _shuffled(path, 0) as reader:
        reader.set_epoch(epoch)
        return [_copy(b) for b in reader]


@pytest.mark.parametrize("workers", [0, 2])
def test_state_dict_through_a_dataset_counts_the_batches_handed_out(cls_rec, workers, no_leaks):
    """Right after dataset() (its first batch taken to infer the signature) the position is 0, and after
    k batches taken from an iterator of the dataset it is k batches: tf.data's own prefetch is not
    injected.  A reader resumed from there gives exactly the rest of the epoch.  (The position was one
    batch ahead at dataset(), and 2-3 batches ahead while iterating.)"""
    want = _epoch_batches(cls_rec, 0)
    with _shuffled(cls_rec, workers) as reader:
        ds = dataset(reader)
        assert reader.state_dict()["position"] == 0 and reader.epoch == 0
        it = iter(ds)
        got = [next(it) for _ in range(2)]
        time.sleep(0.3)  # (a prefetch thread would have taken more by now)
        state = reader.state_dict()
        assert (state["epoch"], state["position"]) == (0, 2 * BATCH)
        for b, g in enumerate(got):
            assert_same(g, want[b], f"batch {b}")
        del it
    with _shuffled(cls_rec, workers) as reader:
        reader.load_state_dict(state)
        rest = list(dataset(reader))
        assert len(rest) == BATCHES - 2
        for b, g in enumerate(rest):
            assert_same(g, want[2 + b], f"resumed batch {b}")


@pytest.mark.parametrize("workers", [0, 2])
def test_set_epoch_and_load_state_dict_after_dataset_apply_to_its_first_iteration(cls_rec, workers, no_leaks):
    """The pass dataset() began to infer the signature is not the user's yet: set_epoch(5) makes the
    first iteration epoch 5 (it was epoch 0's order, silently); set_epoch of that same epoch keeps it
    (no second start); load_state_dict is the rest of the saved epoch (it was refused: 'while a pass is
    being iterated')."""
    want0, want5 = _epoch_batches(cls_rec, 0), _epoch_batches(cls_rec, 5)
    with _shuffled(cls_rec, workers) as reader:
        ds = dataset(reader)
        reader.set_epoch(5)
        assert reader.epoch == 5 and reader.state_dict()["epoch"] == 5
        got = list(ds)
        assert len(got) == BATCHES and reader.state_dict()["epoch"] == 6
        for b, g in enumerate(got):
            assert_same(g, want5[b], f"batch {b}")
    with _shuffled(cls_rec, workers) as reader:
        ds = dataset(reader)
        reader.set_epoch(0)  # (the README's loop: set_epoch(epoch) before each epoch)
        got = list(ds)
        assert reader.stats.epochs == 1  # the pass begun by dataset(), not a second one
        for b, g in enumerate(got):
            assert_same(g, want0[b], f"batch {b}")
    with _shuffled(cls_rec, workers) as reader:
        ds = dataset(reader)
        reader.load_state_dict({**reader.state_dict(), "epoch": 5, "position": 3 * BATCH})
        got = list(ds)
        assert len(got) == BATCHES - 3
        for b, g in enumerate(got):
            assert_same(g, want5[3 + b], f"resumed batch {b}")


def test_load_state_dict_after_dataset_of_a_stream_is_refused(tmp_path, cls_rec, no_leaks):
    """A FIFO cannot be read again: the pass dataset() began cannot be ended and begun elsewhere, so
    load_state_dict says so (and set_epoch warns that it applies to the pass after it)."""
    import threading
    fifo = tmp_path / "f.fifo"
    os.mkfifo(fifo)
    data = cls_rec.read_bytes()
    writer = threading.Thread(target=lambda: open(fifo, "wb").write(data), daemon=True)
    writer.start()
    with deadline(60), ParallelReader(str(fifo), fields=[Image(SIZE), ClassLabel()], workers=2,
                                      batch_size=BATCH) as reader:
        ds = dataset(reader)
        state = reader.state_dict()
        assert (state["epoch"], state["position"]) == (0, 0)
        with pytest.raises(Exception, match="cannot be read again; call load_state_dict before dataset"):
            reader.load_state_dict(state)
        with pytest.warns(UserWarning, match="cannot be read again, so that pass stays epoch 0"):
            reader.set_epoch(3)
        reader.set_epoch(0)  # back to the pass begun: then the one after it is epoch 1 again (it stayed 3)
        assert len(list(ds)) == BATCHES  # the pass goes on, whole
        assert reader.epoch == 1 and reader.state_dict()["epoch"] == 1
    writer.join(10)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_dataset_that_fails_after_its_first_batch_leaves_the_pass_unbegun(cls_rec, workers, monkeypatch,
                                                                             no_leaks):
    """dataset() interrupted after it took the first batch (a Ctrl-C while the signature is converted):
    the pass it began is given back -- position 0 of epoch 0, and the next pass is epoch 0 whole (it was
    recorded as a pass that had handed out its first batch: epoch 0 at position 8, then epoch 1)."""
    import parrecio.integrations.tf as tfi
    want = _epoch_batches(cls_rec, 0)

    def interrupted(signature):
        raise KeyboardInterrupt

    with _shuffled(cls_rec, workers) as reader:
        monkeypatch.setattr(tfi, "to_tensor_specs", interrupted)
        with pytest.raises(KeyboardInterrupt):
            dataset(reader)
        monkeypatch.undo()
        state = reader.state_dict()
        assert (state["epoch"], state["position"], reader.epoch) == (0, 0, 0)
        got = list(dataset(reader))
        assert len(got) == BATCHES and reader.stats.epochs == 1
        for b, g in enumerate(got):
            assert_same(g, want[b], f"batch {b}")


def test_steps_per_epoch_of_a_resumed_reader_is_a_whole_pass_with_a_warning(cls_rec, no_leaks):
    """Keras gives every epoch steps_per_epoch steps: the rest of a resumed epoch (1 batch) cut every later
    epoch to 1 batch; now it is the whole pass's 5, and a warning says to fit the rest on its own."""
    kw = dict(fields=[Image(SIZE), ClassLabel()], workers=0, batch_size=BATCH)
    with ParallelReader(cls_rec, **kw) as reader:
        assert steps_per_epoch(reader) is None  # (no .idx: known after a first pass)
        assert len(list(reader)) == BATCHES and steps_per_epoch(reader) == BATCHES
        reader.load_state_dict({**reader.state_dict(), "epoch": 0, "position": (BATCHES - 1) * BATCH})
        assert len(reader) == 1
        with pytest.warns(UserWarning, match=r"resumes epoch 0 mid-way, 1 of its 5 batches left.*"
                                             r"steps_per_epoch=1, initial_epoch=0, epochs=1"):
            assert steps_per_epoch(reader) == BATCHES
        assert len(list(reader)) == 1 and steps_per_epoch(reader) == BATCHES
    # a state saved after the epoch's last batch leaves nothing of it: no warning (its advice,
    # steps_per_epoch=0, made Keras train the next pass as epoch 0), the next pass is the next epoch
    state, _ = _resumed_at_epoch_end(cls_rec)
    with ParallelReader(cls_rec, **kw) as reader:
        list(reader)  # (the length)
        reader.load_state_dict(state)
        import warnings
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert len(reader) == 0 and steps_per_epoch(reader) == BATCHES
