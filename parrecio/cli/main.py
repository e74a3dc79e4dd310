"""The ``parrecio`` command line: a small dispatcher over subcommand modules.

Each subcommand is a module listed in :data:`COMMANDS` that defines:

- ``NAME`` (the subcommand, e.g. ``"pipe-serve"``) and ``HELP`` (one line for ``parrecio --help``);
- ``add_arguments(parser)``, which fills its ``argparse`` parser (``parser.description`` may be set there);
- ``run(args) -> int``, the exit status.

Keep the modules light at import time (``parrecio --help`` imports them all); import heavy things in
``run``.  A :class:`~parrecio.errors.ParrecioError` from ``run`` is printed as one line, exit status 1;
Ctrl-C exits with status 130 (``pack`` and ``pipe-serve`` take SIGTERM as Ctrl-C too:
:func:`~parrecio.cli.cat.sigterm_interrupts`).  Writing stdout, every subcommand ends quietly (status 0) on
a closed pipe (``| head``), and on any other error (a full disk) says ``parrecio CMD: error: stdout: ...``,
status 1 (:class:`~parrecio.cli.cat.MarkedStdout` tells those errors from others).
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
    from .cat import ClosedStdout, MarkedStdout

    stdout = sys.stdout
    sys.stdout = MarkedStdout(ClosedStdout() if stdout is None else stdout)  # type: ignore[assignment]
    status = 0
    try:
        status = int(run(args) or 0)
        sys.stdout.flush()  # what is still buffered: an error writing it is this command's
        return status
    except ParrecioError as exc:
        _after_stdout_error(exc)
        print(f"parrecio {args.command}: error: {_explained(exc, args.command)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"parrecio {args.command}: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        if not _after_stdout_error(exc):
            raise
        if isinstance(exc, BrokenPipeError):  # the reader has gone (| head): nothing to say, as cat
            return status
        print(f"parrecio {args.command}: error: stdout: {exc.strerror or exc}", file=sys.stderr)
        return 1
    finally:
        sys.stdout = stdout


def _after_stdout_error(exc: BaseException) -> bool:
    """Whether ``exc`` is, or was caused by, an error writing stdout; if so stdout is pointed at /dev/null,
    so that what is still buffered in it goes nowhere at exit instead of failing again there."""
    from .cat import is_stdout_error, silence_broken_pipe

    seen = set()
    cause: Optional[BaseException] = exc
    while cause is not None and id(cause) not in seen:
        if is_stdout_error(cause):
            silence_broken_pipe()
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


#: How to read past a damaged record, per subcommand that can (extract reads through an .idx without
#: scanning, and then cannot: the record asked for is the damaged one).
SKIP_HINTS = {"cat": "--skip-corrupt reads past it",
              "extract": "--skip-corrupt reads past it when scanning (--all; --index without an .idx, or --no-index)",
              "bench": "--skip-errors reads past it"}


#: The subcommands that take ``--max-record-bytes``.
MAX_RECORD_BYTES_COMMANDS = ("cat", "extract", "inspect")


def _explained(exc: ParrecioError, command: str) -> str:
    """A framing error at byte 0 of a file means the file is no RecordIO at all, unless RecordIO records
    follow (its start is damaged): say what the file is, the same way for every subcommand
    (parrecio.tools.inspect.not_recordio), or that its start is damaged and how to read past it."""
    from ..errors import CorruptRecordError
    from ..recordio.joins import AmbiguousJoin
    from ..tools.inspect import head_of, not_recordio, records_after_damage
    if isinstance(exc, AmbiguousJoin):  # (its advice is worded for the Python API)
        import re
        return re.sub(r"join='(\w+)'", r"--join \1", str(exc))
    from ..recordio.index import IndexMismatch
    if isinstance(exc, CorruptRecordError) and exc.offset == 0 and not isinstance(exc, IndexMismatch):
        head = head_of(exc.source)
        if head is not None:
            size = os.path.getsize(exc.source)
            found = records_after_damage(exc.source, size)
            if found is None:  # (a damaged length word, a cut download: the reader's own words)
                return str(not_recordio(exc.source, head, size)) if "bad magic" in exc.reason else str(exc)
            # the reader's guess at byte 0 ("not a RecordIO stream? it starts with ...") is wrong here
            reason = exc.reason.split("; not a RecordIO stream?")[0]
            hint = SKIP_HINTS.get(command, "'parrecio inspect' lists the damaged regions")
            if "max_record_bytes" in reason:  # (a whole record that large, or a damaged length word)
                more = ", or --max-record-bytes N reads it whole" if command in MAX_RECORD_BYTES_COMMANDS else ""
                return (f"{reason} (byte offset 0 of {exc.source}): RecordIO records follow (a frame head at "
                        f"byte offset {found}): the first record is that large, or its length word is damaged; "
                        f"{hint}{more}")
            return (f"{reason} (byte offset 0 of {exc.source}): the file's start is damaged, but RecordIO "
                    f"records follow (a frame head at byte offset {found}); {hint}")
    return str(exc)


if __name__ == "__main__":
    sys.exit(main())
