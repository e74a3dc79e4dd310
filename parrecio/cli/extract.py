"""``parrecio extract``: one record, or every record, of a RecordIO stream to files.

The implementation lives in :mod:`parrecio.cli.cat` (next to ``parrecio cat``); this module only registers
it with the dispatcher, which wants one module per subcommand.
"""

from .cat import EXTRACT_HELP as HELP
from .cat import EXTRACT_NAME as NAME
from .cat import add_extract_arguments as add_arguments
from .cat import run_extract as run

__all__ = ["NAME", "HELP", "add_arguments", "run"]
