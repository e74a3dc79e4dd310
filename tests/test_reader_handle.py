"""The consumer's end of the reader process (parrecio/pipeline/reader_handle.py): a reader that sent its
``ReaderEnd`` and exited is never taken for dead.

``receive()`` drains the data pipe and asks whether the process has exited.  It asked after the drain (and,
exited, drained once more and asked again): a reader that sent its ``ReaderEnd`` and exited between the two
questions was reported as "the reader process died (exit code 0) before the end of the stream" with its
``ReaderEnd`` -- the pass's CorruptRecordError, under ``on_error="raise"`` -- unread in the pipe.  An audit
reproduced it 1 time in 80 on a loaded machine with another busy thread in the consumer; here the two moments
are played in order, deterministically.
"""

from __future__ import annotations

import pytest

from parrecio import PipelineError
from parrecio.pipeline.messages import ReaderEnd
from parrecio.pipeline.reader_handle import ReaderHandle


class _Pipe:
    """The data pipe: what the reader wrote by each moment."""

    def __init__(self, script):
        self.script, self.eof = list(script), False

    def read(self):
        return self.script.pop(0) if self.script else []


class _Exited:
    """The process's sentinel, asked at successive moments."""

    def __init__(self, answers):
        self.answers = list(answers)

    def ready(self):
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


class _Proc:
    exitcode = 0

    def join(self, timeout=None):
        pass


def _handle(pipe, exited):
    h = ReaderHandle.__new__(ReaderHandle)
    h.ended, h.begun, h.source_name = False, True, "s.rec"
    h._inbox, h._exited, h.proc = pipe, exited, _Proc()
    return h


def test_a_reader_that_ends_and_exits_between_the_drain_and_the_check_is_not_dead():
    end = ReaderEnd(900, {}, None)
    # the drain finds nothing yet; the reader then writes its ReaderEnd and exits, before the question
    handle = _handle(_Pipe([[], [end]]), _Exited([False, True]))
    assert handle.receive() == [] and not handle.ended
    assert handle.receive() == [end] and handle.ended


def test_a_reader_that_exits_without_its_reader_end_is_dead():
    handle = _handle(_Pipe([[]]), _Exited([True]))
    with pytest.raises(PipelineError, match=r"the reader process died \(exit code 0\) before the end of the "
                                            r"stream 's\.rec'"):
        handle.receive()
