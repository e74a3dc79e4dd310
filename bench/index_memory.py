"""What a shuffled read by ``.idx`` holds in the reader process, per record: the parsed indexes and the
epoch's order.

    python -m bench.index_memory [--records 1000000] [--json OUT]

Writes ``--records`` one-record groups (4-byte payloads) and their ``.idx`` to a temp dir, then:

- ``index``: ``IndexedRecordReader(rec)`` in this process, traced by ``tracemalloc``: bytes a record held
  after it is made, and at its peak (while the ``.idx`` is parsed);
- ``reader_process``: ``ParallelReader(rec, shuffle=True, workers=1, batch_size=1024)``: the reader
  process's ``RssAnon`` and ``VmHWM`` (``/proc/PID/status``, MiB) mid-pass, with its baseline (the same
  reader over a 1-record file) to subtract.

Prints one JSON document.  Memory, not time: the figures do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import json
import os
import struct
import sys
import tempfile
import tracemalloc
from typing import Dict


def _write(folder: str, n: int) -> str:
    rec = os.path.join(folder, f"r{n}.rec")
    frame = struct.pack("<II", 0xCED7230A, 4)
    with open(rec, "wb") as f:
        for i in range(0, n, 65536):
            f.write(b"".join(frame + b"%04d" % (j % 10000) for j in range(i, min(n, i + 65536))))
    with open(rec[:-4] + ".idx", "w") as f:
        for i in range(0, n, 65536):
            f.write("".join(f"{j}\t{12 * j}\n" for j in range(i, min(n, i + 65536))))
    return rec


def _status(pid: int) -> Dict[str, float]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("RssAnon", "VmHWM"):
                out[key] = int(value.split()[0]) / 1024
    return out


def _reader_process(rec: str) -> Dict[str, float]:
    from parrecio import ParallelReader
    with ParallelReader(rec, None, workers=1, shuffle=True, seed=1, batch_size=1024) as reader:
        half = len(reader) // 2  # (from the .idx)
        it = iter(reader)
        next(it)
        pid = reader._res.run.reader_pid
        mid = None
        for n, _ in enumerate(it, 2):
            if n >= half and mid is None:
                mid = _status(pid)
        return mid or _status(pid)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--json", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    from parrecio.recordio import IndexedRecordReader
    with tempfile.TemporaryDirectory(prefix="parrecio-idxmem-") as tmp:
        rec, one = _write(tmp, args.records), _write(tmp, 1)
        tracemalloc.start()
        reader = IndexedRecordReader(rec)
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        reader.close()
        del reader
        baseline = _reader_process(one)
        loaded = _reader_process(rec)
    doc = {
        "records": args.records,
        "index": {"held_bytes_per_record": round(held / args.records, 1),
                  "peak_bytes_per_record": round(peak / args.records, 1)},
        "reader_process": {"mid_pass_mib": loaded, "baseline_mib": baseline,
                           "rss_anon_bytes_per_record": round(
                               (loaded["RssAnon"] - baseline["RssAnon"]) * 2**20 / args.records, 1)},
    }
    return emit(doc, args.json)


def emit(doc: dict, path: "str | None") -> int:
    """Print ``doc`` as JSON, and write it to ``path`` too when given."""
    text = json.dumps(doc, indent=2)
    print(text)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
