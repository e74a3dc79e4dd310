"""Keras adapter: an endless ``(x, y)`` generator for ``model.fit``, and ``steps_per_epoch``.

::

    from parrecio import ParallelReader
    from parrecio.decoders import Image, ClassLabel
    from parrecio.integrations.keras import generator, steps_per_epoch

    reader = ParallelReader("train.rec", fields={"image": Image(size=(224, 224)), "label": ClassLabel()},
                            workers=8, batch_size=64)
    model.fit(generator(reader, inputs="image", targets="label", epochs=10),
              steps_per_epoch=steps_per_epoch(reader) or 1000, epochs=10)
    reader.close()

The generator runs pass after pass of the reader (a Keras generator must not run dry between epochs);
give it ``fit``'s ``epochs`` too: Keras reads a generator ahead (``prefetch``), so an endless one has a
pass more started when training ends (one batch read of it: 376 samples read for 3 epochs of 120; on a
Pipe-mode channel that pass waits for a FIFO SageMaker never creates).  It yields plain numpy arrays (views
of shared memory, no copy; Keras converts them). With the TensorFlow
backend, Keras feeds a generator through ``tf.data.Dataset.from_generator`` and ``prefetch``, which may
wrap those arrays without copying them: the batches it holds (the first ones it peeks at to infer the
signature, those it prefetches) keep their output slots until Keras is done with them, a bounded number.
For mid-epoch checkpoints take the reader's state from a :class:`TrainedState`
(``reader.state_dict()`` counts the batches Keras read ahead too).
``steps_per_epoch`` is the batches of a whole pass when the reader knows its length, else ``None``: then
give Keras the number of batches of one pass yourself, or Keras's epochs and the reader's passes drift
apart (harmless, but epochs no longer mean passes). Nothing here imports Keras or TensorFlow. For ``tf.data``, and
``model.fit(ds, epochs=n)`` without ``steps_per_epoch``, see :func:`parrecio.integrations.tf.dataset`.

Tested with TensorFlow 2.21 (tensorflow-cpu) and Keras 3 in ``tests/test_integrations_tf.py``.
"""

from __future__ import annotations

import threading
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Union

__all__ = ["generator", "steps_per_epoch", "select", "TrainedState"]

Key = Union[int, str]
Selection = Union[None, Key, Sequence[Key], Mapping[str, Key]]


def select(item: Any, selection: Selection) -> Any:
    """Pick columns of one item: a key (an index into a tuple item, a name of a dict item) gives that
    column; a list/tuple of keys gives a tuple of columns; a dict ``{keras_input_name: key}`` gives a
    dict of columns; ``None`` gives the whole item (a reader with a single field)."""
    if selection is None:
        return item
    if isinstance(selection, Mapping):
        return {name: _column(item, key) for name, key in selection.items()}
    if isinstance(selection, (list, tuple)):
        return tuple(_column(item, key) for key in selection)
    return _column(item, selection)


def _column(item: Any, key: Key) -> Any:
    if isinstance(item, Mapping):
        try:
            return item[key]
        except KeyError:
            raise KeyError(f"no column {key!r}; the reader's columns are {list(item)}") from None
    if isinstance(item, tuple):
        if isinstance(key, str):
            fields = getattr(item, "_fields", None)
            if fields and key in fields:
                return getattr(item, key)
            raise KeyError(f"column {key!r}: this reader yields tuples, select columns by index "
                           f"(0..{len(item) - 1})" + (f" or name {list(fields)}" if fields else ""))
        try:
            return item[key]
        except IndexError:
            raise IndexError(f"column {key}: the reader's items have {len(item)} columns") from None
    raise TypeError(f"cannot select column {key!r} of a {type(item).__name__}: the reader has a single "
                    f"field; use inputs=None (the whole item)")


def steps_per_epoch(reader: Any) -> Optional[int]:
    """Batches of a whole pass (``len(reader)``) when the reader knows it, else ``None``.

    Keras gives every epoch this many steps, so a reader resumed mid-epoch (``load_state_dict``), whose
    next pass is only the rest of its epoch, still gets the whole pass's number -- the rest's would
    shorten every later epoch -- with a ``UserWarning``: fit the rest of that epoch on its own first
    (``model.fit(generator(reader, epochs=1), steps_per_epoch=len(reader), initial_epoch=e, epochs=e + 1)``),
    else Keras's epochs and the reader's passes drift apart by the batches delivered before the save."""
    length = getattr(reader, "_length", None)
    try:
        if length is None:
            return len(reader)
        steps = length(whole=True)
    except TypeError:
        return None
    rest = len(reader) if getattr(reader, "resuming", False) else 0
    if rest:  # (a state saved after an epoch's last batch leaves nothing of it: the next pass is the next epoch)
        import warnings
        warnings.warn(f"steps_per_epoch: this reader resumes epoch {reader.epoch} mid-way, {rest} of its "
                      f"{steps} batches left; Keras gives every epoch {steps} steps, so fit the rest of the "
                      f"epoch on its own first (model.fit(generator(reader, epochs=1), steps_per_epoch={rest}, "
                      f"initial_epoch={reader.epoch}, epochs={reader.epoch + 1})), else Keras's epochs and "
                      f"the reader's passes drift apart", UserWarning, stacklevel=2)
    return steps


class TrainedState:
    """The reader's ``state_dict()`` after the batches Keras has *trained on*, for mid-epoch checkpoints.

    Keras reads a generator ahead (its ``from_generator`` and ``prefetch``), so ``reader.state_dict()``
    taken in a callback counts batches Keras holds but has not trained on, and a resume from it skips
    them.  Give one of these to :func:`generator` (``trained=``) and its :meth:`callback` to ``fit``, first
    in the list: the generator notes the reader's state after each batch it yields, the callback counts
    the batches trained, and :meth:`state_dict` is the state after the last of them::

        trained = TrainedState()
        model.fit(generator(reader, epochs=10, trained=trained), steps_per_epoch=steps_per_epoch(reader),
                  epochs=10, callbacks=[trained.callback(), MyCheckpoint(trained)])
        # MyCheckpoint.on_train_batch_end: save(trained.state_dict())

    One generator per ``fit`` (a generator fit twice lost the batches the first ``fit`` read ahead).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: Dict[int, dict] = {}  # batches yielded -> the reader's state after them
        self._trained = self._base = 0      # batches trained in this fit; those before this epoch
        self._generators = self._fits = 0
        self._count = 0                     # batches the generator yielded
        self._yielded_all = 1 << 62         # the same, once it has ended (else more than any count)

    def callback(self) -> Any:
        """A ``keras.callbacks.Callback`` that tells this object the batches trained (imports Keras)."""
        import keras

        owner = self

        class _Trained(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                with owner._lock:
                    owner._fits += 1
                    owner._trained = owner._base = 0

            def on_epoch_begin(self, epoch, logs=None):
                with owner._lock:
                    owner._base = owner._trained

            def on_train_batch_end(self, batch, logs=None):
                # ``batch``: the index in this epoch of the last batch trained (the last step of an
                # execution when ``steps_per_execution`` > 1: the callback is not called for every batch;
                # a last execution cut short by the generator's end still says a whole one)
                with owner._lock:
                    owner._trained = min(owner._base + batch + 1, owner._yielded_all)
                    for n in [n for n in owner._states if n < owner._trained]:
                        del owner._states[n]

        return _Trained()

    def state_dict(self) -> dict:
        """The reader's state after the batches trained so far in this ``fit`` (before the first: the
        state the generator started from).  Raises ``RuntimeError`` when :meth:`callback` is not in
        ``fit``'s callbacks or :func:`generator` was not given this object (or a generator was fit twice)."""
        with self._lock:
            if not self._fits or not self._generators:
                raise RuntimeError("TrainedState: give it to generator(..., trained=) and its callback() to "
                                   "model.fit(callbacks=[...]) before asking for the state")
            if self._generators != self._fits:
                raise RuntimeError(f"TrainedState: {self._fits} fits over {self._generators} generators; use "
                                   f"a new generator(..., trained=) for each model.fit, with this object's callback() "
                                   f"in its callbacks")
            try:
                return self._states[self._trained]
            except KeyError:
                raise RuntimeError(f"TrainedState: no state after batch {self._trained}: is the callback "
                                   f"in the fit of this object's generator?") from None

    def _begin(self, reader: Any) -> None:
        with self._lock:
            self._generators += 1
            self._states = {0: reader.state_dict()}
            self._count, self._yielded_all = 0, 1 << 62

    def _yielded(self, reader: Any) -> None:
        state = reader.state_dict()
        with self._lock:
            self._count += 1
            self._states[self._count] = state

    def _ended(self) -> None:
        with self._lock:
            self._yielded_all = self._count


def generator(reader: Any, inputs: Selection = 0, targets: Selection = 1, *,
              sample_weights: Selection = None, epochs: Optional[int] = None,
              trained: Optional[TrainedState] = None) -> Iterator[Any]:
    """Yield ``(x, y)`` (or ``(x, y, sample_weight)``, or ``x`` alone when ``targets`` is None) from
    pass after pass of ``reader``: endless by default, ``epochs`` passes if given.

    ``inputs``/``targets``/``sample_weights`` select columns (see :func:`select`): default ``0`` and
    ``1``, the ``(image, label)`` of ``fields=[Image(...), ClassLabel()]``; names for dict fields, e.g.
    ``inputs="image", targets="label"``; ``inputs={"pixels": "image", "meta": "extra"}`` for a model
    with named inputs. ``epochs``: the passes to run, ``fit``'s ``epochs`` (see the module's docstring for
    why); ``None``: endless. The empty rest of a resumed epoch (a reader resumed from a state saved after
    the epoch's last batch) does not count; any other empty pass raises ``ValueError`` (the stream is
    empty).  ``trained``: a :class:`TrainedState` that notes the reader's state after each batch, for
    checkpoints of the batches Keras trained on (``reader.state_dict()`` counts those it read ahead too).
    The reader is not closed when the generator ends: close it yourself.
    """
    if epochs is not None and epochs < 0:
        raise ValueError(f"epochs must be >= 0 or None, not {epochs}")
    if trained is not None and not isinstance(trained, TrainedState):
        raise TypeError(f"trained must be a TrainedState, not {type(trained).__name__}")
    return _generate(reader, inputs, targets, sample_weights, epochs, trained)


def _generate(reader, inputs, targets, sample_weights, epochs, trained):
    if trained is None:
        yield from _passes(reader, inputs, targets, sample_weights, epochs, None)
        return
    trained._begin(reader)
    try:
        yield from _passes(reader, inputs, targets, sample_weights, epochs, trained)
    finally:
        trained._ended()


def _passes(reader, inputs, targets, sample_weights, epochs, trained):
    done = empty = 0
    while epochs is None or done < epochs:
        resumed = bool(getattr(reader, "resuming", False))
        it = iter(reader)
        produced = False
        try:
            for item in it:
                produced = True
                if trained is not None:
                    trained._yielded(reader)
                x = select(item, inputs)
                if targets is None:
                    yield x
                elif sample_weights is None:
                    yield x, select(item, targets)
                else:
                    yield x, select(item, targets), select(item, sample_weights)
        finally:
            close = getattr(it, "close", None)
            if close is not None:
                close()
        if produced:
            done, empty = done + 1, 0
            continue
        # The empty rest of a resumed epoch (a state saved after its last batch) is not an epoch of
        # training: the next pass is the next epoch.  Any other empty pass: the stream is empty (asking
        # again could wait for ever, on a FIFO).
        if not resumed or empty:
            raise ValueError("the reader's stream is empty: an endless generator would never yield")
        empty += 1
