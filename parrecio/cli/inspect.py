"""``parrecio inspect``: what a RecordIO stream holds, in one streaming pass.

Example::

    $ parrecio inspect train.rec
    stream:       train.rec (1.2 MiB, join mxnet)
    records:      128 (multipart: 0)
    record size:  min 147 B, mean 9.6 KiB, max 21.3 KiB, total 1.2 MiB
    groups:       64 of 2 records (group size guessed from the first 64 records)
      position 0: jpeg 64
      position 1: json 64
    corrupt:      none

The work is :func:`parrecio.tools.inspect.inspect_stream`; this module formats it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

NAME = "inspect"
HELP = "count, size and classify the records of a RecordIO stream; report corrupt regions"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .cat import add_stream_options

    parser.description = ("Read a RecordIO stream once (bounded memory; a file or - for stdin) and report the "
                          "record count, payload sizes, multipart records, the content kind at each position "
                          "of a group (jpeg, png, json, imagerecord/jpeg, ...) with the likely group size, "
                          "and the byte offsets of corrupt regions (skipped, reading resyncs).")
    parser.add_argument("file", metavar="FILE", help="RecordIO file, or - for stdin")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    parser.add_argument("--max-group", type=int, default=8, metavar="G",
                        help="largest group size considered when guessing (default 8)")
    add_stream_options(parser)


def run(args: argparse.Namespace) -> int:
    from ..tools.inspect import inspect_stream
    from .cat import input_source, os_error

    try:
        source = input_source(args.file)
        report = inspect_stream(source, join=args.join, name="<stdin>" if args.file == "-" else args.file,
                                max_record_bytes=args.max_record_bytes, max_group=max(1, args.max_group))
    except OSError as exc:
        raise os_error(exc, args.file) from exc
    if args.json:
        sys.stdout.write(json_text(report))
    else:
        sys.stdout.write(format_report(report))
    return 0


def json_text(doc: Any) -> str:
    """``doc`` as indented JSON text and a newline.  A file name that is not UTF-8 (Python's
    surrogate escapes: ``n\xffx.rec`` is ``"n\udcffx.rec"``), which orjson refuses, is written as
    :mod:`json` writes it, an escape that ``json.loads`` reads back as the same ``str``."""
    import orjson

    try:
        return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS).decode() + "\n"
    except TypeError:
        import json
        return json.dumps(doc, indent=2) + "\n"


def human_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def format_report(r: dict) -> str:
    """The text form of an :func:`~parrecio.tools.inspect.inspect_stream` report."""
    s = r["sizes"]
    lines = [f"stream:       {r['source']} ({human_bytes(r['stream_bytes'])}, join {r['join']})",
             f"records:      {r['records']} (multipart: {r['multipart_records']})"]
    if r["records"]:
        lines.append(f"record size:  min {human_bytes(s['min'])}, mean {human_bytes(s['mean'])}, "
                     f"max {human_bytes(s['max'])}, total {human_bytes(s['total'])}")
        g = r["group_size"]
        left = f", {r['leftover_records']} records left over" if r["leftover_records"] else ""
        lines.append(f"groups:       {r['groups']} of {g} record{'s' if g > 1 else ''}{left} (group size guessed "
                     f"from the first {r['group_size_from']} records)")
        for field in r["fields"]:
            kinds = ", ".join(f"{k} {n}" for k, n in field["kinds"].items())
            lines.append(f"  position {field['position']}: {kinds}")
    regions = r["corrupt_regions"]
    if not r["skipped_records"]:
        lines.append("corrupt:      none")
    else:
        lines.append(f"corrupt:      {r['skipped_records']} regions, {human_bytes(r['skipped_bytes'])} skipped")
        for reg in regions:
            lines.append(f"  offset {reg['offset']}: {reg['bytes']} bytes")
        if len(regions) < r["skipped_records"]:
            lines.append(f"  ... {r['skipped_records'] - len(regions)} more")
    return "\n".join(lines) + "\n"
