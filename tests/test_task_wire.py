"""A Task travels to its decoder process as a plain tuple (messages.Task.__reduce__): every field must come
back equal, whatever the place, the arrays (empty too) and the flags."""

from __future__ import annotations

import pickle
from array import array
from multiprocessing.reduction import ForkingPickler

from hypothesis import given, settings
from hypothesis import strategies as st

from parrecio.pipeline.messages import FILE, IN_RING, ONEOFF, Place, Task


def _round_trip(task: Task) -> Task:
    return pickle.loads(ForkingPickler.dumps(task))  # what Connection.send / recv do


def test_each_place_and_flag_comes_back():
    dest = [("parrecio-ab12-slot-3", 0, 5, 64), ("parrecio-ab12-slot-4", 64, 0, 60)]
    for place in (IN_RING, Place(FILE, "file:/data/a.rec"), Place(ONEOFF, "parrecio-ab12-big-7")):
        for isolated, split in ((False, False), (True, False), (False, True)):
            task = Task(9, 1 << 40, 3, 124, place, array("q", range(248)), array("q", range(1, 249)), dest,
                        isolated, split, 17)
            back = _round_trip(task)
            assert back == task
            assert type(back.ring_offs) is array and back.ring_offs.typecode == "q"
            assert back.place.is_file == (place.kind == FILE) and back.place.is_oneoff == (place.kind == ONEOFF)


def test_an_empty_task_comes_back():
    task = Task(0, 0, 0, 0, IN_RING, array("q"), array("q"))
    assert _round_trip(task) == task


@settings(max_examples=60, deadline=None)
@given(offs=st.lists(st.integers(-(1 << 63), (1 << 63) - 1), max_size=40),
       lens=st.lists(st.integers(0, (1 << 63) - 1), max_size=40),
       name=st.text(max_size=30), kind=st.sampled_from([0, 1, 2]), epoch=st.integers(0, 1 << 31))
def test_any_arrays_come_back(offs, lens, name, kind, epoch):
    task = Task(1, 2, 0, len(offs), Place(kind, name), array("q", offs), array("q", lens), [], False, False, epoch)
    assert _round_trip(task) == task
