"""What a stream's shuffle buffer holds in the reader process, with and without its byte bound.

    python -m bench.shuffle_memory [--records 400] [--record-bytes 1048576] [--json OUT]

Writes ``--records`` records of about ``--record-bytes`` each (no ``.idx``: a shuffle buffer, as for a
FIFO or Pipe mode), then reads them shuffled (``fields=None``, ``workers=1``, the default
``shuffle_buffer=1024`` groups, an 8 MiB ring) once with the default ``shuffle_buffer_bytes`` (1 GiB) and
once bounded at 32 MiB, and reports the reader process's ``RssAnon`` at its largest (sampled every 20
records, MiB) and ``VmHWM`` at the pass's end.

Prints one JSON document.  Memory, not time: the figures do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Dict

from bench.index_memory import _status, emit


def _pass(rec: str, bound: int) -> Dict[str, float]:
    from parrecio import ParallelReader, Tuning
    with open(rec, "rb") as f, ParallelReader(f, None, workers=1, shuffle=True, seed=1, shuffle_buffer_bytes=bound,
                                              tuning=Tuning(ring_bytes=8 << 20)) as reader:
        it = iter(reader)
        next(it)
        pid = reader._res.run.reader_pid
        most = _status(pid)
        for n, _ in enumerate(it, 2):
            if n % 20 == 0:
                now = _status(pid)
                most = {"RssAnon": max(most["RssAnon"], now["RssAnon"]), "VmHWM": now["VmHWM"]}
        return {k: round(v, 1) for k, v in most.items()}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=400)
    parser.add_argument("--record-bytes", type=int, default=1 << 20)
    parser.add_argument("--json", default=None, help="also write the JSON here")
    args = parser.parse_args(argv)
    import numpy as np
    from parrecio import RecordWriter
    with tempfile.TemporaryDirectory(prefix="parrecio-shufmem-") as tmp:
        rec = os.path.join(tmp, "s.rec")
        blob = np.random.default_rng(0).integers(0, 256, args.record_bytes, dtype=np.uint8).tobytes()
        with RecordWriter(rec) as w:
            for i in range(args.records):
                w.write(blob[:args.record_bytes - i % 7])
        doc = {"records": args.records, "record_bytes": args.record_bytes, "shuffle_buffer": 1024,
               "reader_process_mib": {"bound_1_gib": _pass(rec, 1 << 30), "bound_32_mib": _pass(rec, 32 << 20)}}
    return emit(doc, args.json)


if __name__ == "__main__":
    sys.exit(main())
