"""Progress bars of the long-running subcommands: total, rate and ETA on a terminal, silent elsewhere.

tqdm draws them (a dependency: pure Python, it pulls in nothing, plain Pillow least of all).  A bar is
disabled when stderr is not a terminal, so logs and pipes get only the subcommands' summary lines.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

__all__ = ["bar"]


def bar(total: Optional[int], desc: str, unit: str = "records") -> Any:
    """A progress bar on stderr for ``total`` items (None: unknown, no ETA); a context manager with
    ``update(n)``."""
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=f" {unit}", file=sys.stderr, disable=None, leave=False,
                dynamic_ncols=True, smoothing=0.1)
