"""``python -m parrecio.cli ...``: the same as the ``parrecio`` command."""

import sys

from .main import main

sys.exit(main())
