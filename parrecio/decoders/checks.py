"""Checks of decoder parameters: a bad value is refused when the decoder is made, naming the parameter.

One rule for every decoder: a TypeError when the value is of the wrong kind (``2.5`` or ``True`` for a
count, ``"no"`` for a flag), a ValueError when it is of the right kind but out of range.
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional

import numpy as np

__all__ = ["is_int", "is_real", "check_int", "check_real", "check_bool"]


def is_int(value: Any) -> bool:
    """An int (numpy's too), or a float spelling one (``2.0``); not a bool, not ``2.5``, NaN or inf."""
    if isinstance(value, (float, np.floating)):
        return math.isfinite(value) and float(value).is_integer()
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def check_int(name: str, value: Any, minimum: Optional[int] = None, maximum: Optional[int] = None,
              want: Optional[str] = None) -> int:
    """``value`` as an ``int`` in ``minimum..maximum`` (either bound may be None), else a TypeError (not an
    int: ``2.5``, a bool, a string; ``2.0`` is taken for 2) or a ValueError (out of range), both naming
    ``name``; ``want`` replaces the message's description of the range."""
    if want is None:
        bounds = (f" in {minimum}..{maximum}" if minimum is not None and maximum is not None
                  else f" >= {minimum}" if minimum is not None else f" <= {maximum}" if maximum is not None else "")
        want = "an int" + bounds
    if not is_int(value):
        raise TypeError(f"{name} must be {want}, got {value!r}")
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be {want}, got {value!r}")
    return int(value)


def check_real(name: str, value: Any, low: float, high: float, low_open: bool = False,
               high_open: bool = False, want: Optional[str] = None) -> float:
    """``value`` as a finite ``float`` in the interval from ``low`` to ``high`` (open at an end with
    ``low_open``/``high_open``), else a TypeError (not a number, a bool) or a ValueError naming ``name``;
    ``want`` replaces the message's description of the interval."""
    if want is None and high == math.inf:
        want = f"a finite number {'>' if low_open else '>='} {low:g}"
    elif want is None:
        want = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if not is_real(value):
        raise TypeError(f"{name} must be {want}, got {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < low or number > high or (low_open and number == low) \
            or (high_open and number == high):
        raise ValueError(f"{name} must be {want}, got {value!r}")
    return number


def check_bool(name: str, value: Any) -> bool:
    """``value`` as a ``bool`` (``True``/``False`` or a numpy bool), else a TypeError naming ``name``: a
    string such as ``"no"`` is not taken for ``True``."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return bool(value)
