"""IRHeader pack/unpack beyond the golden cases: buffer types, no-copy views, short payloads."""

from __future__ import annotations

import numpy as np
import pytest

from parrecio import DecodeError, IRHeader, pack, unpack
from parrecio.recordio import IR_SIZE


def test_scalar_label_forces_flag_zero():
    h, data = unpack(pack(IRHeader(7, 3, 11, 12), b"img"))
    assert h == IRHeader(0, 3.0, 11, 12) and data == b"img"
    h, _ = unpack(pack(IRHeader(1, np.float32(2.5), 0, 0), b""))
    assert h.flag == 0 and h.label == 2.5


def test_sequence_label_sets_flag_and_zero_label():
    s = pack((0, (1, 2, 3), 5, 0), b"img")
    assert len(s) == IR_SIZE + 12 + 3
    h, data = unpack(s)
    assert h.flag == 3 and data == b"img"
    np.testing.assert_array_equal(h.label, np.array([1, 2, 3], np.float32))
    h, _ = unpack(pack((0, np.array(4.0), 5, 0), b""))  # a 0-d array is a sequence of one
    assert h.flag == 1


def test_memoryview_data_is_not_copied():
    backing = bytearray(pack((0, [1.0, 2.0], 9, 0), b"JPEG" * 100))
    mv = memoryview(backing)
    h, data = unpack(mv)
    assert isinstance(data, memoryview) and data.obj is backing
    backing[IR_SIZE + 8] = ord("X")
    assert bytes(data[:4]) == b"XPEG"
    h.label[0] = 99  # the labels are a copy: they do not pin or alias the buffer
    assert unpack(mv)[0].label[0] == 1.0


def test_numpy_payload_gives_a_view():
    arr = np.frombuffer(pack((0, 1.0, 2, 3), b"abcdef"), np.uint8).copy()
    h, data = unpack(arr)
    assert isinstance(data, np.ndarray) and np.shares_memory(data, arr)
    assert data.tobytes() == b"abcdef" and h.id == 2 and h.id2 == 3


def test_other_buffer_types():
    s = pack((0, 1.0, 2, 3), b"abc")
    assert unpack(bytearray(s))[1] == bytearray(b"abc")
    assert bytes(unpack(memoryview(s).cast("B", (1, len(s))))[1]) == b"abc"


@pytest.mark.parametrize("payload", [b"", b"x" * (IR_SIZE - 1)])
def test_short_header_raises(payload):
    with pytest.raises(DecodeError, match="shorter than"):
        unpack(payload)


def test_short_labels_raise():
    s = pack((0, [1.0, 2.0, 3.0], 1, 0), b"")
    with pytest.raises(DecodeError, match="3 float32 labels"):
        unpack(s[:-1])
    with pytest.raises(DecodeError):
        unpack(memoryview(s)[:IR_SIZE + 4])
