"""RecordIO-protobuf records/s: parrecio against a one-process loop of the protobuf package.

    .venv/bin/python -m bench.bench_protobuf [--records 40000] [--rounds 3]

Two files, written with parrecio's writer (the SageMaker SDK's bytes, tests/test_protobuf_record.py):
dense rows of 256 float32 (1 KiB of values) with a float32 label, and sparse rows of 200 non-zeros out
of 100000 columns.  Each is read, in one run, rounds interleaved, best round kept:

- ``protobuf loop``: ``RecordReader`` + the protobuf package's ``Record.ParseFromString`` (the SDK's
  generated ``record_pb2``; its backend is printed) + numpy arrays of the values (and keys), one process;
- ``hand parser loop``: the same loop with ``ProtobufRecord()`` (parrecio's parser: its C part) instead,
  and ``..., Python only``: without the C part (a build without a compiler);
- ``parrecio workers=0`` and ``workers=2``: ``ParallelReader(fields=ProtobufRecord(), batch_size=256)``,
  the batches stacked (dense) or COO (sparse), as a training loop gets them.

Prints one JSON document: records/s per case and file, and the ratios to the protobuf loop.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from typing import Callable, Dict

import numpy as np

from parrecio import ParallelReader, RecordReader
from parrecio.decoders import ProtobufRecord
from parrecio.recordio.protobuf_writer import write_dense, write_sparse


def make_files(folder: str, n: int) -> Dict[str, str]:
    import scipy.sparse
    rng = np.random.default_rng(0)
    dense = os.path.join(folder, "dense.rec")
    write_dense(dense, rng.normal(size=(n, 256)).astype(np.float32), rng.integers(0, 10, n).astype(np.float32))
    cols = 100_000
    indptr = np.arange(n + 1, dtype=np.int64) * 200
    indices = np.concatenate([np.sort(rng.choice(cols, 200, replace=False)) for _ in range(n)])
    m = scipy.sparse.csr_matrix((rng.normal(size=n * 200).astype(np.float32), indices, indptr), shape=(n, cols))
    sparse = os.path.join(folder, "sparse.rec")
    write_sparse(sparse, m, rng.integers(0, 2, n).astype(np.float32))
    return {"dense 1 KiB": dense, "sparse 200 nnz": sparse}


def protobuf_loop(path: str) -> int:
    from sagemaker.amazon.record_pb2 import Record
    rec, n = Record(), 0
    for r in RecordReader(path):
        rec.ParseFromString(r.payload)
        t = rec.features["values"].float32_tensor
        values = np.array(t.values, np.float32)
        if len(t.keys):
            keys = np.array(t.keys, np.uint64)
            assert len(keys) == len(values)
        label = np.array(rec.label["values"].float32_tensor.values, np.float32)
        n += len(label) > 0
    return n


def hand_loop(path: str) -> int:
    dec, n = ProtobufRecord(), 0
    for r in RecordReader(path):
        n += "label_values" in dec(r.payload)
    return n


def python_loop(path: str) -> int:
    """The hand parser without its C part (what a build without a compiler gets)."""
    from parrecio.decoders import protobuf_record
    saved, protobuf_record._protobuf = protobuf_record._protobuf, None
    try:
        return hand_loop(path)
    finally:
        protobuf_record._protobuf = saved


def pipeline(workers: int) -> Callable[[str], int]:
    def run(path: str) -> int:
        n = 0
        with ParallelReader(path, fields=ProtobufRecord(), workers=workers, batch_size=256) as reader:
            for batch in reader:
                n += len(batch["label_values"])
        return n
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=40_000, help="records per file (default 40000)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds, best kept (default 3)")
    args = parser.parse_args()
    os.environ.setdefault("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
    from google.protobuf.internal import api_implementation
    cases = {"protobuf loop": protobuf_loop, "hand parser loop": hand_loop,
             "hand parser loop, Python only": python_loop,
             "parrecio workers=0": pipeline(0), "parrecio workers=2": pipeline(2)}
    best: Dict[str, Dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        files = make_files(folder, args.records)
        sizes = {name: os.path.getsize(p) // args.records for name, p in files.items()}
        for _ in range(args.rounds):
            for fname, path in files.items():
                for cname, fn in cases.items():
                    t0 = time.perf_counter()
                    n = fn(path)
                    rate = n / (time.perf_counter() - t0)
                    assert n == args.records, (cname, fname, n)
                    slot = best.setdefault(fname, {})
                    slot[cname] = max(slot.get(cname, 0.0), rate)
    doc = {"records": args.records, "record_bytes": sizes, "cpus": os.cpu_count(),
           "protobuf_backend": api_implementation.Type(),
           "records_per_s": {f: {c: round(r) for c, r in v.items()} for f, v in best.items()},
           "ratio_to_protobuf_loop": {f: {c: round(r / v["protobuf loop"], 2) for c, r in v.items()}
                                      for f, v in best.items()}}
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
