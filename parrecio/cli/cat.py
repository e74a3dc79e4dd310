"""``parrecio cat`` and ``parrecio extract``: get payloads out of a RecordIO stream.

Examples::

    parrecio cat train.rec --start 10 --count 2 --format json-lines    # offsets, kinds, base64 / text
    parrecio cat - --join concat --separator '\\n' < pipe.rec            # raw payloads, one per line
    parrecio extract train.rec --index 42 --out 42.bin                 # uses train.idx when present
    parrecio extract train.rec --all --out images/ --strip-header      # images/000000.jpg, ...

This module also holds the small helpers the other subcommands share (stream options, stdin/stdout,
a broken pipe).
"""

from __future__ import annotations

import argparse
import base64
import codecs
import contextlib
import os
import sys
from typing import Any, Iterator, List, Optional

NAME = "cat"
HELP = "write record payloads to stdout (raw, hex or JSON lines)"

# ``parrecio extract`` is implemented here too (add_extract_arguments, run_extract); the dispatcher wants one
# module per subcommand, so ``parrecio/cli/extract.py`` only names it and points here.
EXTRACT_NAME = "extract"
EXTRACT_HELP = "write one record (--index, --key) or every record (--all) to files"

EXTENSIONS = {"jpeg": "jpg", "png": "png", "gif": "gif", "bmp": "bmp", "webp": "webp", "tiff": "tif",
              "json": "json", "text": "txt", "empty": "bin", "other": "bin"}
"""File extension per :func:`~parrecio.decoders.sniff.sniff` kind, for ``extract --all``."""


# -- shared helpers ------------------------------------------------------------------------------------

def add_stream_options(parser: argparse.ArgumentParser) -> None:
    """``--join`` and ``--max-record-bytes``, as every reading subcommand takes them."""
    parser.add_argument("--join", choices=("auto", "mxnet", "concat"), default="auto",
                        help="multipart convention: auto (default: decided from the stream's multipart "
                             "records; an error where they fit both), mxnet (MXNet/im2rec .rec files) or "
                             "concat (SageMaker Pipe-mode streams, 'parrecio pack manifest --split-bytes')")
    parser.add_argument("--max-record-bytes", type=positive_bytes, default=64 << 20, metavar="N",
                        help="records larger than this are treated as corrupt (default 64 MiB)")


def at_least_one(unit: str):
    """An ``argparse`` type: a count of ``unit`` (``"byte"``) of at least 1 (a usage error, exit status 2,
    otherwise)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number of {unit}s, not {text!r}") from None
        if value < 1:
            raise argparse.ArgumentTypeError(f"must be at least 1 {unit}, not {value}")
        return value
    return parse


# The reader takes 0 too, but then every non-empty record is "corrupt": never what a user means.
positive_bytes = at_least_one("byte")


def input_source(path: str):
    """What :class:`~parrecio.recordio.RecordReader` should read: the path, or a raw stdin for ``-``."""
    if path == "-":
        if sys.stdin is None:  # (started with stdin closed: `<&-`)
            from ..errors import SourceError
            raise SourceError("cannot use stdin ('-'): it is closed")
        return open(sys.stdin.fileno(), "rb", buffering=0, closefd=False)
    from ..sources.fifo import is_fifo
    if is_fifo(path):  # (opened as ParallelReader opens one: a wait for its writer is said after 2 s)
        from ..sources.files import open_for_reading
        return open_for_reading(path)
    return path


def refuse_no_records(reader: Any, records: int) -> None:
    """``--skip-corrupt`` skipped every byte of the input and found no record: it is no RecordIO at all
    (or nothing but damage).  Fail with the error of its start, as without the option (the CLI words it:
    what the file is), not with an empty success."""
    if records == 0 and reader.first_error is not None:
        raise reader.first_error


def binary_stdout():
    """The binary standard output."""
    return sys.stdout.buffer


def refuse_terminal(what: str, hint: str = "redirect it, or use --out") -> None:
    """Raise when binary data would go to a terminal."""
    from ..errors import ParrecioError
    if sys.stdout.isatty():
        raise ParrecioError(f"refusing to write {what} to a terminal: {hint}")


def silence_broken_pipe() -> int:
    """After ``BrokenPipeError`` on stdout (``| head``): point stdout at /dev/null so the exit is quiet."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except OSError:
        pass
    return 0


def os_error(exc: OSError, what: str):
    """An ``OSError`` as a one-line :class:`~parrecio.errors.SourceError` (``stdout: ...`` for an error
    writing stdout, :func:`is_stdout_error`)."""
    from ..errors import SourceError
    name = "stdout" if is_stdout_error(exc) else exc.filename if exc.filename is not None else what
    return SourceError(f"{name}: {exc.strerror or exc}")


_STDOUT_MARK = "_parrecio_stdout"


class MarkedStdout:
    """``sys.stdout`` (or its ``buffer``) while a subcommand runs: an ``OSError`` raised writing or
    flushing it is marked as stdout's (:func:`is_stdout_error`) and raised on, so that the dispatcher tells
    a closed pipe or a full disk on stdout from any other error.  Everything else is the stream's own."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    @property
    def buffer(self) -> "MarkedStdout":
        return MarkedStdout(self._stream.buffer)

    def write(self, data: Any) -> Any:
        return self._marked(self._stream.write, data)

    def writelines(self, lines: Any) -> Any:
        return self._marked(self._stream.writelines, lines)

    def flush(self) -> Any:
        return self._marked(self._stream.flush)

    @staticmethod
    def _marked(call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except OSError as exc:
            setattr(exc, _STDOUT_MARK, True)
            raise


class ClosedStdout:
    """``sys.stdout`` when there is none (started with stdout closed, ``>&-``): writing it fails as writing
    a closed descriptor does (EBADF), so that a command that writes stdout says so in one line."""

    buffer = property(lambda self: self)

    def write(self, data: Any) -> int:
        import errno
        raise OSError(errno.EBADF, "Bad file descriptor (stdout is closed)")

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        pass  # (nothing was written)

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        import errno
        raise OSError(errno.EBADF, "stdout is closed")


@contextlib.contextmanager
def sigterm_interrupts() -> Iterator[None]:
    """Within: SIGTERM (``kill``, ``timeout``, a container stop) raises KeyboardInterrupt, as Ctrl-C does,
    so that ``finally`` blocks clean up (a pack's or a demo's temporary files).  Not installed outside the
    main thread, nor where SIGTERM is ignored.  (A SIGTERM sent to a demo's whole process group kills the
    reader's processes too; its shutdown then meets them dead, which it handles as it handles any death:
    tests/test_cli_outputs.py checks that nothing is left.)"""
    import signal
    import threading

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.getsignal(signal.SIGTERM)
        if previous == signal.SIG_IGN:
            previous = None
        else:
            signal.signal(signal.SIGTERM, _interrupt)
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def is_stdout_error(exc: BaseException) -> bool:
    """Whether ``exc`` was raised writing stdout through :class:`MarkedStdout`."""
    return bool(getattr(exc, _STDOUT_MARK, False))


def parse_separator(text: str) -> bytes:
    """``'\\n'``, ``'\\x00'``, ... (Python escapes) -> bytes."""
    from ..errors import ParrecioError
    try:
        return codecs.escape_decode(text.encode("utf-8"))[0]
    except ValueError as exc:
        raise ParrecioError(f"bad --separator {text!r}: {exc}") from None


# -- cat -----------------------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Write the payloads of a RecordIO stream to stdout, in stream order. raw: the bytes "
                          "themselves (with --separator between them); hex: 'index<TAB>offset<TAB>hex' lines; "
                          "json-lines: one JSON object per record with index, offset, size, kind and the "
                          "payload as 'text' (UTF-8) or 'base64'.")
    parser.add_argument("file", metavar="FILE", help="RecordIO file, or - for stdin")
    parser.add_argument("--start", type=int, default=0, metavar="N", help="skip the first N records")
    parser.add_argument("--count", type=int, default=None, metavar="K", help="write at most K records")
    parser.add_argument("--format", choices=("raw", "hex", "json-lines"), default="raw",
                        help="output format (default raw)")
    parser.add_argument("--separator", default="", metavar="SEP",
                        help="raw format: bytes written between payloads, Python escapes allowed, e.g. '\\n' "
                             "(default: none)")
    parser.add_argument("--skip-corrupt", action="store_true",
                        help="skip broken framing (resync on the next record) instead of failing")
    add_stream_options(parser)


def run(args: argparse.Namespace) -> int:
    import orjson

    from ..tools.inspect import payload_kind
    from ..errors import ParrecioError
    from ..recordio import RecordReader

    if args.start < 0 or (args.count is not None and args.count < 0):
        raise ParrecioError("--start and --count must be >= 0")
    sep = parse_separator(args.separator)
    out = binary_stdout()
    if args.format == "raw":
        refuse_terminal("raw payloads", "redirect it, or use --format hex or json-lines")
    stop = None if args.count is None else args.start + args.count
    written = 0
    try:
        with RecordReader(input_source(args.file), join=args.join, max_record_bytes=args.max_record_bytes,
                          on_corrupt="skip" if args.skip_corrupt else "raise",
                          source_name="<stdin>" if args.file == "-" else None) as reader:
            if stop == args.start:
                return 0
            index = -1
            for index, (offset, view) in enumerate(reader.iter_views()):
                if index < args.start:
                    continue
                if args.format == "raw":
                    if written and sep:
                        out.write(sep)
                    out.write(view)
                elif args.format == "hex":  # (in pieces: a record's text is never whole in memory twice)
                    out.write(f"{index}\t{offset}\t".encode("ascii"))
                    for i in range(0, len(view), _HEX_PIECE):
                        out.write(view[i:i + _HEX_PIECE].hex().encode("ascii"))
                    out.write(b"\n")
                else:
                    doc = {"index": index, "offset": offset, "size": len(view), "kind": payload_kind(view)}
                    try:
                        doc["text"] = str(view, "utf-8")
                    except UnicodeDecodeError:
                        doc["base64"] = base64.b64encode(view).decode("ascii")
                    out.write(orjson.dumps(doc, option=orjson.OPT_APPEND_NEWLINE))  # (no copy for the newline)
                    del doc
                written += 1
                if stop is not None and index + 1 >= stop:
                    break
            else:
                refuse_no_records(reader, index + 1)
        out.flush()
    except BrokenPipeError:
        return silence_broken_pipe()
    return 0


_HEX_PIECE = 1 << 20  # payload bytes written as hex at a time


# -- extract -------------------------------------------------------------------------------------------

def add_extract_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Write record I (0-based, in stream order) of a RecordIO file to a file or stdout; "
                          "with an .idx next to the file it is read directly, else found by scanning. --all "
                          "writes every record to DIR/000000.<ext>, the extension from the payload's kind "
                          "(jpg, png, json, txt, bin, ...).")
    parser.add_argument("file", metavar="FILE", help="RecordIO file, or - for stdin")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--index", type=int, metavar="I", help="the record at position I (0-based)")
    which.add_argument("--key", metavar="K", help="the record stored under key K in the .idx file")
    which.add_argument("--all", action="store_true", help="every record, into the folder --out DIR")
    parser.add_argument("--out", default="-", metavar="PATH",
                        help="output file (default: stdout); with --all the output folder (created if needed)")
    parser.add_argument("--strip-header", action="store_true",
                        help="MXNet image records: drop the IRHeader (and labels), write the image bytes only")
    parser.add_argument("--no-index", action="store_true", help="scan the stream even if an .idx file exists")
    parser.add_argument("--skip-corrupt", action="store_true",
                        help="skip broken framing while scanning (positions then count intact records only)")
    add_stream_options(parser)


def run_extract(args: argparse.Namespace) -> int:
    from ..errors import ParrecioError

    if args.all:
        if args.out == "-":
            raise ParrecioError("--all needs --out DIR")
        return _extract_all(args)
    if args.index is not None and args.index < 0:
        raise ParrecioError(f"--index must be >= 0, not {args.index}")
    payload = _extract_one(args)
    if args.strip_header:
        payload = _strip(payload, args.index if args.index is not None else args.key)
    try:
        if args.out == "-":
            refuse_terminal("a record")
            out = binary_stdout()
            out.write(payload)
            out.flush()
        else:
            with open(args.out, "wb") as f:
                f.write(payload)
    except BrokenPipeError:
        return silence_broken_pipe()
    except OSError as exc:
        raise os_error(exc, args.out) from exc
    return 0


def _idx_path(path: str):
    if path == "-":
        return None
    from ..recordio.paths import index_path
    idx = index_path(path)
    return idx if os.path.isfile(idx) and os.path.isfile(path) else None


def _extract_one(args: argparse.Namespace) -> bytes:
    from ..errors import ParrecioError
    from ..recordio import IndexedRecordReader, RecordReader
    from ..recordio.index import IndexMismatch, check_index

    idx = None if args.no_index else _idx_path(args.file)
    if args.key is not None:
        if idx is None:
            from ..recordio.paths import index_path
            if args.file == "-":
                raise ParrecioError("--key needs the .rec file's index: it cannot be used with stdin (give the "
                                    "file's path, or --index N for the N-th record)")
            if args.no_index:
                raise ParrecioError("--key looks the key up in the .rec file's index: it cannot be used with "
                                    "--no-index")
            if os.path.isfile(index_path(args.file)) and not os.path.isfile(args.file):
                raise ParrecioError(f"--key reads the record at the offset its index lists: {args.file} is not "
                                    f"a regular file (a FIFO or a device cannot be read by offset); use "
                                    f"--index N (the N-th record) instead")
            raise ParrecioError(f"--key needs an index file next to {args.file} ({index_path(args.file)})")
        with IndexedRecordReader(args.file, idx, join=args.join, max_record_bytes=args.max_record_bytes) as rec:
            try:
                check_index(rec, sorted(set(rec.offsets)), 1)
            except IndexMismatch as exc:
                raise ParrecioError(f"{exc}; --index N with --no-index counts the file's records instead") \
                    from exc
            keys = rec.keys
            key = args.key
            if keys and isinstance(keys[0], int):
                try:
                    key = int(key)
                except ValueError:
                    pass
            if key not in rec:
                raise ParrecioError(f"no key {args.key!r} in {idx} ({len(rec)} keys)")
            return rec[key]
    if idx is not None:
        with IndexedRecordReader(args.file, idx, join=args.join, max_record_bytes=args.max_record_bytes) as rec:
            offsets = sorted(set(rec.offsets))
            # A stale index (a line missing, records appended, offsets past the end) would give another
            # record, or none, with status 0: check it as the pipeline does, and that every record up to
            # this one ends where the index lists the next (their frame heads only).
            try:
                check_index(rec, offsets, 1)
                if args.index >= len(offsets):
                    raise ParrecioError(f"no record {args.index}: {idx} lists {len(offsets)} records")
                _check_chain(args.file, idx, offsets, args.index, rec.size)
                return rec.read_at(offsets[args.index])
            except IndexMismatch as exc:
                raise ParrecioError(f"{exc}; --no-index counts the file's records instead") from exc
    with RecordReader(input_source(args.file), join=args.join, max_record_bytes=args.max_record_bytes,
                      on_corrupt="skip" if args.skip_corrupt else "raise",
                      source_name="<stdin>" if args.file == "-" else None) as reader:
        n = 0
        for n, (_, view) in enumerate(reader.iter_views(), 1):
            if n - 1 == args.index:
                return view.tobytes()
    raise ParrecioError(f"no record {args.index}: {'<stdin>' if args.file == '-' else args.file} has {n} records")


def _check_chain(path: str, idx: str, offsets: List[int], upto: int, size: int) -> None:
    """Raise :class:`IndexMismatch` when one of the records the sorted ``offsets`` list before the
    ``upto``-th does not end where the next listed one starts (a line missing from the ``.idx``): each
    record's frame heads are followed, its payload not read.  A damaged frame head is that record's
    damage, not the index's: passed over."""
    from ..errors import CorruptRecordError
    from ..recordio.framing import CFLAG_FULL, CFLAG_LAST, frame_at
    from ..recordio.index import IndexMismatch, check_end

    with open(path, "rb") as f:
        def peek(at: int, n: int) -> bytes:
            f.seek(at)
            return f.read(n)

        for i in range(upto):
            pos, want = offsets[i], offsets[i + 1]
            while True:
                frame = frame_at(peek, pos)
                if frame is None:
                    pos = -1
                    break
                cflag, pos = frame
                # (the record goes on at ``want``: the index lists one of its parts, no record start)
                if cflag in (CFLAG_FULL, CFLAG_LAST) or pos > want:
                    break
            if pos >= 0 and pos != want:
                try:
                    check_end(offsets[i], pos, want, size, path, idx, peek)
                except IndexMismatch:
                    raise
                except CorruptRecordError:
                    pass  # (that record's length word is damaged: not the index's business)


def _strip(payload, which) -> bytes:
    from ..errors import ParrecioError
    from ..recordio import unpack
    try:
        return bytes(unpack(memoryview(payload))[1])
    except ParrecioError as exc:
        raise ParrecioError(f"record {which}: --strip-header: {exc}") from None


def _indexed_count(path: str) -> Optional[int]:
    """Records listed by the ``.idx`` beside ``path`` (None: no index, or stdin)."""
    from ..recordio.index import indexed_count
    return None if path == "-" else indexed_count(path)


def _extract_all(args: argparse.Namespace) -> int:
    from ..decoders.sniff import sniff
    from ..recordio import RecordReader

    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as exc:
        raise os_error(exc, args.out) from exc
    from .progress import bar

    n = 0
    total = _indexed_count(args.file)
    with RecordReader(input_source(args.file), join=args.join, max_record_bytes=args.max_record_bytes,
                      on_corrupt="skip" if args.skip_corrupt else "raise",
                      source_name="<stdin>" if args.file == "-" else None) as reader, \
            bar(total, "extract") as shown:
        for n, (_, view) in enumerate(reader.iter_views(), 1):
            shown.update(1)
            data = _strip(view, n - 1) if args.strip_header else view
            path = os.path.join(args.out, f"{n - 1:06d}.{EXTENSIONS.get(sniff(data), 'bin')}")
            try:
                with open(path, "wb") as f:
                    f.write(data)
            except OSError as exc:
                raise os_error(exc, path) from exc
        refuse_no_records(reader, n)
    print(f"extract: {n} records written to {args.out}", file=sys.stderr)
    return 0
