"""SharedSetting (parrecio/decoders/pillow_globals.py): a module global that concurrent holders share at
one value; a holder of another value waits; the last one out puts back what it found; a forked child
does not inherit a holder."""

from __future__ import annotations

import os
import signal
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


def test_a_waiter_for_another_value_is_not_starved_by_newcomers():
    """Holders of one value that keep overlapping never let the count of holders reach 0: a waiter for the
    other value waited for as long as they came (1 lenient decode in 5 s beside 4 strict threads: an
    audit).  Newcomers now wait behind it."""
    owner = types.SimpleNamespace(flag=False)
    setting = SharedSetting(owner, "flag")
    stop, got = threading.Event(), []

    def strict():
        while not stop.is_set():
            with setting.holding(False):
                time.sleep(0.002)

    def lenient():
        for _ in range(20):
            with setting.holding(True):
                got.append(owner.flag)

    threads = [threading.Thread(target=strict) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    waiter = threading.Thread(target=lenient)
    waiter.start()
    waiter.join(10)
    starved = waiter.is_alive()
    stop.set()  # (then the strict holders stop, and a starved waiter gets in at last)
    for t in threads + [waiter]:
        t.join(5)
    assert not starved and got == [True] * 20
    assert owner.flag is False


def test_a_forked_child_gets_the_users_value_and_a_free_lock():
    """A child forked while a thread held a setting kept the decode's value for good (the user's
    MAX_IMAGE_PIXELS = None there), and one forked while a thread held the image decoder's warnings lock
    hung at its first decode; holding another value there must not wait for the parent's holder."""
    from parrecio.decoders.pillow_globals import ForkSafeLock
    owner = types.SimpleNamespace(flag="user's")
    setting, lock = SharedSetting(owner, "flag"), ForkSafeLock()
    entered, release = threading.Event(), threading.Event()

    def hold():
        with setting.holding("a decode's"), lock:
            entered.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    assert entered.wait(5)
    pid = os.fork()
    if pid == 0:  # the holder's thread is not here: nothing of it is waited for
        code = 1
        try:
            signal.alarm(5)  # (a child that waits for the lock or the holder dies of it)
            restored = owner.flag == "user's"
            with lock, setting.holding("the child's"):
                code = 0 if restored and owner.flag == "the child's" else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    release.set()
    t.join(5)
    assert os.waitstatus_to_exitcode(status) == 0
    assert owner.flag == "user's"
