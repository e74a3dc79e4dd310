"""parrecio.integrations without any framework installed: tf.data signature inference and generator
plumbing, the Keras generator, DLPack mapping, and that importing parrecio imports no framework."""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
from collections import namedtuple

import numpy as np
import pytest

from parrecio import ParallelReader
from parrecio.integrations import dlpack as dl
from parrecio.integrations import keras as kr
from parrecio.integrations import tf as tfi
from parrecio.integrations.tf import FieldSpec, flatten_ragged, infer_signature, prepare
from pipeline_helpers import Fixed, Ragged, digest_array, payloads, write_rec

HEAVY = ("torch", "tensorflow", "keras", "jax")


# -- import weight ----------------------------------------------------------------------------------

def test_import_parrecio_imports_no_framework():
    code = ("import sys, parrecio, parrecio.integrations, parrecio.integrations.torch, "
            "parrecio.integrations.tf, parrecio.integrations.keras, parrecio.integrations.dlpack\n"
            "import parrecio.integrations as I; I.tf; I.keras\n"
            f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_integrations_attribute_access():
    import parrecio.integrations as integ
    assert integ.keras is kr and integ.dlpack is dl
    with pytest.raises(AttributeError):
        integ.nope


# -- tf: signature inference (pure) -----------------------------------------------------------------

def test_infer_batched_tuple():
    batch = (np.zeros((8, 32, 32, 3), np.uint8), np.zeros((8,), np.int64), [b"a", b"bc"],
             [np.zeros((2, 5), np.float32), np.zeros((0, 5), np.float32)])
    sig = infer_signature(batch)
    assert sig == (FieldSpec("tensor", (None, 32, 32, 3), "uint8"), FieldSpec("tensor", (None,), "int64"),
                   FieldSpec("string", (None,), "string"), FieldSpec("ragged", (None, None, 5), "float32"))


def test_infer_dict_nested_and_unbatched():
    Pair = namedtuple("Pair", "img lab")
    batch = {"rec": Pair(np.zeros((4, 2, 2), np.float32), np.zeros((4, 3), np.float32)),
             "name": ["x", "y", "z", "w"], "s": np.array([b"ab", b"c"])}
    sig = infer_signature(batch)
    assert sig == {"rec": (FieldSpec("tensor", (None, 2, 2), "float32"), FieldSpec("tensor", (None, 3), "float32")),
                   "name": FieldSpec("string", (None,), "string"),
                   "s": FieldSpec("string", (None,), "string")}
    sample = (np.zeros((5, 5), np.uint8), np.int64(3), b"raw", 2.5, True)
    assert infer_signature(sample, batched=False) == (
        FieldSpec("tensor", (5, 5), "uint8"), FieldSpec("tensor", (), "int64"), FieldSpec("string", (), "string"),
        FieldSpec("tensor", (), "float32"), FieldSpec("tensor", (), "bool"))


@pytest.mark.parametrize("bad, batched, words", [
    ([{"a": 1}], True, "dict"),
    ([np.zeros((2, 3)), np.zeros((2, 4))], True, "more than their first"),
    ([np.zeros(2, np.int32), np.zeros(2, np.float32)], True, "dtypes"),
    ([], True, "empty"),
    (np.zeros(3, dtype="datetime64[s]"), True, "datetime64"),
    (np.float32(1), True, "batch dimension"),
    (b"x", True, "list or array"),
    ([1, 2], False, "inside a sample"),
    (object(), False, "object"),
])
def test_infer_refuses(bad, batched, words):
    with pytest.raises(TypeError, match=words):
        infer_signature((np.zeros(2), bad), batched=batched)


def test_infer_error_names_column():
    with pytest.raises(TypeError, match=r"\['meta'\]"):
        infer_signature({"img": np.zeros((2, 2)), "meta": [{"a": 1}, {"b": 2}]})


def test_prepare_and_flatten_ragged():
    boxes = [np.arange(10, dtype=np.float32).reshape(2, 5), np.zeros((0, 5), np.float32),
             np.ones((1, 5), np.float32)]
    values, lengths = flatten_ragged(boxes)
    assert values.shape == (3, 5) and lengths.tolist() == [2, 0, 1]
    sig = infer_signature((np.zeros((3, 4), np.uint8), boxes))
    img, (v, n) = prepare((np.zeros((3, 4), np.uint8), boxes), sig)
    assert img.shape == (3, 4) and v.shape == (3, 5) and n.tolist() == [2, 0, 1]
    # a ragged column whose batch happened to be uniform (stacked by collate) still flattens
    v2, n2 = prepare(np.zeros((2, 1, 5), np.float32), sig[1])
    assert v2.shape == (2, 5) and n2.tolist() == [1, 1]
    # the other way round: dense signature, ragged batch -> a clear error
    dense = infer_signature((np.zeros((2, 1, 5), np.float32),))
    with pytest.raises(TypeError, match="max_boxes"):
        prepare(([np.zeros((1, 5)), np.zeros((2, 5))],), dense)
    assert prepare({"a": (1, 2)}, {"a": (FieldSpec("tensor", (), "int64"),) * 2}, lambda v, n: "R") == {"a": (1, 2)}
    # a ragged column inferred from a batch whose images agreed in width: a later width is a clear error
    # (it was numpy's own concatenate error, naming no column)
    images = infer_signature([np.zeros((30, 40, 3), np.uint8), np.zeros((31, 40, 3), np.uint8)])
    assert images == FieldSpec("ragged", (None, None, 40, 3), "uint8")
    with pytest.raises(TypeError, match=r"ragged \(None, None, 40, 3\) uint8 came with an array of shape "
                                        r"\(30, 41, 3\): its values vary in more than their first dimension"):
        prepare([np.zeros((30, 40, 3), np.uint8), np.zeros((30, 41, 3), np.uint8)], images)
    with pytest.raises(TypeError, match=r"shape \(30, 40\)"):  # (a rank that differs, too)
        prepare([np.zeros((30, 40), np.uint8)], images)
    assert prepare([np.zeros((0, 40, 3), np.uint8)], images)[1].tolist() == [0]


def test_tf_dataset_needs_tensorflow():
    if importlib.util.find_spec("tensorflow") is not None:
        pytest.skip("tensorflow is installed")
    with pytest.raises(ImportError):
        tfi.dataset([1, 2])


# -- tf generator plumbing and keras over a real reader --------------------------------------------

@pytest.fixture(scope="module")
def stream(tmp_path_factory):
    recs = payloads(60, seed=3)
    path = tmp_path_factory.mktemp("integ") / "s.rec"
    write_rec(path, recs)
    return path, recs


def test_tf_batches_generator_peeks_first_then_passes(stream):
    path, recs = stream
    with ParallelReader(path, fields=[Fixed(), Ragged()], workers=2, batch_size=16) as reader:
        it = iter(reader)
        first = next(it)
        sig = infer_signature(first)
        assert sig[0] == FieldSpec("tensor", (None, 4, 3), "uint8")
        assert sig[1].kind in ("ragged", "tensor") and sig[1].dtype == "int32"
        gen = tfi.batches(reader, first, it)
        epoch1 = [b[0].copy() for b in gen()]
        epoch2 = [b[0].copy() for b in gen()]
    assert len(epoch1) == len(epoch2) == 2              # 30 groups of 2 records; peeked batch comes first
    want = np.stack([digest_array(r) for r in recs[0::2]])
    np.testing.assert_array_equal(np.concatenate(epoch1), want)
    np.testing.assert_array_equal(np.concatenate(epoch2), want)


def test_keras_generator_two_epochs(stream):
    path, recs = stream
    with ParallelReader(path, fields={"x": Fixed(), "y": Fixed((2,)), "w": Fixed((1,))}, workers=2,
                        batch_size=5) as reader:          # 20 groups of 3 records: 4 batches a pass
        assert kr.steps_per_epoch(reader) in (None, 4)
        gen = kr.generator(reader, inputs="x", targets="y", epochs=2)
        items = list(gen)
        assert len(items) == 8
        for x, y in items:
            assert x.shape == (5, 4, 3) and y.shape == (5, 2)
        np.testing.assert_array_equal(np.concatenate([x for x, _ in items[:4]]),
                                      np.concatenate([x for x, _ in items[4:]]))
        np.testing.assert_array_equal(np.concatenate([x for x, _ in items[:4]]),
                                      np.stack([digest_array(r) for r in recs[0::3]]))
        np.testing.assert_array_equal(np.concatenate([y for _, y in items[:4]]),
                                      np.stack([digest_array(r, (2,)) for r in recs[1::3]]))
        # endless by default: more than one pass, then stop consuming
        endless = kr.generator(reader, inputs=["x"], targets={"out": "y"}, sample_weights="w")
        got = [next(endless) for _ in range(9)]
        endless.close()
        assert isinstance(got[0][0], tuple) and set(got[0][1]) == {"out"} and got[0][2].shape == (5, 1)
        np.testing.assert_array_equal(got[8][0][0], items[0][0])      # third pass, first batch
        # targets=None: x only
        assert next(kr.generator(reader, inputs="x", targets=None)).shape == (5, 4, 3)


def test_keras_select_errors():
    assert kr.select((1, 2, 3), [2, 0]) == (3, 1)
    assert kr.select((1, 2), None) == (1, 2)
    P = namedtuple("P", "a b")
    assert kr.select(P(1, 2), "b") == 2
    with pytest.raises(KeyError, match="columns are"):
        kr.select({"a": 1}, "b")
    with pytest.raises(KeyError, match="by index"):
        kr.select((1, 2), "a")
    with pytest.raises(IndexError, match="2 columns"):
        kr.select((1, 2), 5)
    with pytest.raises(TypeError, match="single"):
        kr.select(np.zeros(3), 0)
    with pytest.raises(ValueError):
        kr.generator([], epochs=-1)


def test_keras_steps_and_empty():
    class Sized(list):
        batch_size = 1

    assert kr.steps_per_epoch(Sized([1, 2, 3])) == 3
    assert kr.steps_per_epoch(iter([])) is None
    with pytest.raises(ValueError, match="empty"):
        next(kr.generator([], inputs=None, targets=None))


def test_keras_over_unsized_reader():
    reader = ParallelReader(io.BytesIO(b""), workers=1)
    try:
        with pytest.raises(TypeError):
            len(reader)  # a one-pass stream, not read yet: no length
        assert kr.steps_per_epoch(reader) is None
    finally:
        reader.close()


# -- dlpack ---------------------------------------------------------------------------------------

def test_map_arrays_zero_copy_roundtrip_through_dlpack(stream):
    path, _ = stream
    with ParallelReader(path, fields=Fixed(), workers=1, batch_size=10) as reader:
        batch = next(iter(reader))
        assert dl.exportable(batch)
        out = dl.map_arrays(batch, np.from_dlpack)
        assert out.ctypes.data == batch.ctypes.data            # numpy <- numpy over DLPack: no copy


def test_map_arrays_structures():
    ro = np.arange(3)
    ro.flags.writeable = False
    seen = []
    out = dl.map_arrays({"a": (ro, [b"x"]), "b": [np.zeros(2), "s"], "c": np.array(["u"]), "d": np.int8(3)},
                        lambda a: seen.append(a) or ("T", a.shape))
    assert out == {"a": (("T", (3,)), [b"x"]), "b": [("T", (2,)), "s"], "c": out["c"], "d": ("T", ())}
    assert isinstance(out["c"], np.ndarray)
    assert seen[0].flags.writeable                             # the read-only one was copied
    kept = dl.map_arrays(ro, lambda a: a, copy_unexportable=False)
    assert kept is ro
