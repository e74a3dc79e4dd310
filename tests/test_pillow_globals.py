"""SharedSetting (parrecio/decoders/pillow_globals.py): a module global that concurrent holders share at
one value; a holder of another value waits; the last one out puts back what it found; a forked child
does not inherit a holder."""

from __future__ import annotations

import os
import threading
import time
import types

from parrecio.decoders.pillow_globals import SharedSetting


def test_holders_of_one_value_share_it_and_another_waits():
    owner = types.SimpleNamespace(flag="user's")
    setting = SharedSetting(owner, "flag")
    events = []
    release = threading.Event()

    def hold(value, entered):
        with setting.holding(value):
            events.append(("in", value, owner.flag))
            entered.set()
            release.wait(5)
            events.append(("out", value))

    entered = [threading.Event() for _ in range(3)]
    threads = [threading.Thread(target=hold, args=(v, e)) for v, e in zip((True, True, False), entered)]
    threads[0].start()
    assert entered[0].wait(5)
    threads[1].start()  # the same value: enters beside the first
    assert entered[1].wait(5)
    threads[2].start()
    time.sleep(0.2)
    assert not entered[2].is_set()  # another value waits for both holders of True
    release.set()
    for t in threads:
        t.join(5)
    assert events[:2] == [("in", True, True), ("in", True, True)]
    assert sorted(events[2:4]) == [("out", True), ("out", True)]
    assert events[4:] == [("in", False, False), ("out", False)]
    assert owner.flag == "user's"


def test_a_forked_child_does_not_wait_for_its_parents_holder():
    owner = types.SimpleNamespace(flag=0)
    setting = SharedSetting(owner, "flag")
    entered, release = threading.Event(), threading.Event()

    def hold():
        with setting.holding(1):
            entered.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    assert entered.wait(5)
    pid = os.fork()
    if pid == 0:  # the holder's thread is not here: holding another value must not wait for it
        code = 1
        try:
            with setting.holding(2):
                code = 0 if owner.flag == 2 else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 10
    while True:  # (a child that waits for the holder would wait for ever)
        done, status = os.waitpid(pid, os.WNOHANG)
        if done or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    if not done:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    release.set()
    t.join(5)
    assert done and os.waitstatus_to_exitcode(status) == 0
    assert owner.flag == 0
