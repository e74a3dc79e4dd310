"""The ``parrecio`` command line: a small dispatcher over subcommand modules.

Each subcommand is a module listed in :data:`COMMANDS` that defines:

- ``NAME`` (the subcommand, e.g. ``"pipe-serve"``) and ``HELP`` (one line for ``parrecio --help``);
- ``add_arguments(parser)``, which fills its ``argparse`` parser (``parser.description`` may be set there);
- ``run(args) -> int``, the exit status.

Keep the modules light at import time (``parrecio --help`` imports them all); import heavy things in
``run``.  A :class:`~parrecio.errors.ParrecioError` from ``run`` is printed as one line, exit status 1;
Ctrl-C exits with status 130.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import List, Optional

from .. import __version__
from ..errors import ParrecioError

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS = (
    "parrecio.cli.demo",
    "parrecio.cli.pipe_serve",
    "parrecio.cli.inspect",
    "parrecio.cli.cat",
    "parrecio.cli.extract",
    "parrecio.cli.pack",
    "parrecio.cli.bench",
)
"""The subcommand modules, in ``--help`` order."""


def build_parser() -> argparse.ArgumentParser:
    """The ``parrecio`` parser with every subcommand of :data:`COMMANDS` registered."""
    parser = argparse.ArgumentParser(
        prog="parrecio", description="RecordIO streams to decoded numpy batches: tools.")
    parser.add_argument("--version", action="version", version=f"parrecio {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMANDS:
        module = importlib.import_module(module_name)
        command = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        module.add_arguments(command)
        command.set_defaults(_run=module.run)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    """Run ``parrecio`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    run = getattr(args, "_run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(run(args) or 0)
    except ParrecioError as exc:
        print(f"parrecio {args.command}: error: {_explained(exc)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"parrecio {args.command}: interrupted", file=sys.stderr)
        return 130


def _explained(exc: ParrecioError) -> str:
    """A framing error at byte 0 of a file means the file is no RecordIO at all: say what it is, the same
    way for every subcommand (parrecio.tools.inspect.not_recordio)."""
    from ..errors import CorruptRecordError
    from ..tools.inspect import head_of, not_recordio
    if isinstance(exc, CorruptRecordError) and exc.offset == 0 and "bad magic" in exc.reason:
        head = head_of(exc.source)
        if head is not None:
            return str(not_recordio(exc.source, head, os.path.getsize(exc.source)))
    return str(exc)


if __name__ == "__main__":
    sys.exit(main())
