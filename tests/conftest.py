"""Shared fixtures.  Helpers for particular test files live in *_helpers.py beside them."""

from __future__ import annotations

import gc
import os
import time

import pytest

from parrecio.pipeline.shm import leftover
from pipeline_helpers import our_children


@pytest.fixture
def no_leaks():
    """After the test: no process of ours and no /dev/shm segment of ours is left (segments are named
    after the consumer's pid, so other programs' readers do not count)."""
    mine = f"parrecio-{os.getpid()}-"
    before = set(leftover(mine))
    yield
    gc.collect()
    deadline = time.monotonic() + 5
    while (our_children() or set(leftover(mine)) - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert our_children() == []
    assert set(leftover(mine)) - before == set()


# Hypothesis profiles: PARRECIO_HYPOTHESIS_PROFILE=long for long runs (tests/test_differential.py then
# explores for PARRECIO_DIFF_BUDGET_S seconds; other tests keep their own max_examples); unset: the
# defaults (the differential tier's are in its module).
from hypothesis import HealthCheck as _HealthCheck, settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("long", max_examples=100_000, deadline=None,
                                      suppress_health_check=[_HealthCheck.too_slow])
if os.environ.get("PARRECIO_HYPOTHESIS_PROFILE"):
    _hypothesis_settings.load_profile(os.environ["PARRECIO_HYPOTHESIS_PROFILE"])
