"""Generate the RecordIO golden files in ``tests/golden/`` with MXNet itself.

Run from the repository root with the MXNet venv (mxnet 1.9.1, numpy 1.23)::

    bench/.venvs/mx/bin/python tests/make_golden.py

It writes, overwriting:

- ``tests/golden/mxnet.rec`` and ``tests/golden/mxnet.idx`` -- written by ``mx.recordio.MXIndexedRecordIO``
  with int keys, one record per case below;
- ``tests/golden/manifest.json`` -- what was written: per record its key, payload (hex) and a short name;
  per ``mx.recordio.pack`` case the header, the data, MXNet's packed bytes and MXNet's ``unpack`` result.

Cases: payload lengths 0..9 (padding), the magic at 4-byte-aligned offsets (start, middle, end,
consecutive, the whole payload), the magic at unaligned offsets (not split), a payload ending with the
magic, IRHeaders whose ``id``/``id2`` low word or a float32 label equals the magic (the writer splits inside
the header), multi-label headers (flag > 0), and a larger pseudo-random payload salted with the magic.
The tests read these files without MXNet; never import mxnet in the library or the tests.
"""

import json
import os
import random
import struct
import sys

import mxnet as mx
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "golden")
M = struct.pack("<I", 0xCED7230A)
MAGIC_F32 = float(np.frombuffer(M, np.float32)[0])


def pack_cases():
    """(name, header tuple, data): inputs of mx.recordio.pack."""
    return [
        ("scalar_label", (0, 3.0, 17, 0), b"JPEGDATA"),
        ("scalar_label_flag_forced_0", (5, 2.5, 1, 2), b"x"),
        ("id_low_word_is_magic", (0, 1.0, 0xCED7230A, 0), b"imagebytes"),
        ("id_both_words_magic", (0, 7.0, (0xCED7230A << 32) | 0xCED7230A, 0), b"ab"),
        ("id2_low_word_is_magic", (0, 4.0, 9, 0xCED7230A), b"abcd" + M),
        ("multi_label", (0, [1.5, 2.0, -3.25], 42, 0), b"PNGDATA!"),
        ("multi_label_numpy", (0, np.arange(5, dtype=np.float32), 43, 1), b""),
        ("label_bits_are_magic", (0, [MAGIC_F32, 1.0], 44, 0), b"tail"),
        ("single_label_list", (0, [8.0], 45, 0), b"y" * 9),
    ]


def record_cases(packed):
    """(name, payload): the records of mxnet.rec, in order."""
    cases = [(f"len_{n}", b"0123456789"[:n]) for n in range(10)]
    cases += [
        ("magic_only", M),
        ("magic_at_start", M + b"tail"),
        ("magic_at_start_padded", M + b"xy"),
        ("magic_in_middle", b"abcd" + M + b"efgh"),
        ("magic_at_end", b"abcd" + M),
        ("magic_aligned_then_odd_tail", b"abcd" + M + b"z"),
        ("magic_consecutive", M + M + M),
        ("magic_consecutive_middle", b"abcd" + M + M + b"efgh" + M),
        ("magic_unaligned_1", b"a" + M + b"bcd"),
        ("magic_unaligned_2", b"ab" + M),
        ("magic_unaligned_3", b"abc" + M + b"x"),
        ("ends_with_unaligned_magic", b"abcde" + M),
        ("aligned_and_unaligned", b"a" + M + b"bcd" + M + b"xx" + M),
        ("empty_again", b""),
    ]
    rng = random.Random(1234)
    big = bytearray(rng.getrandbits(8) for _ in range(400))
    for at in (0, 96, 200, 396):
        big[at:at + 4] = M
    big[301:305] = M  # unaligned
    cases.append(("random_400_salted", bytes(big)))
    cases += [(f"packed_{name}", data) for name, data in packed]
    return cases


def main():
    os.makedirs(OUT, exist_ok=True)
    packs = []
    for name, header, data in pack_cases():
        s = mx.recordio.pack(mx.recordio.IRHeader(*header), data)
        h, rest = mx.recordio.unpack(s)
        label = h.label.tolist() if isinstance(h.label, np.ndarray) else float(h.label)
        hdr_in = list(header)
        if isinstance(hdr_in[1], np.ndarray):
            hdr_in[1] = hdr_in[1].tolist()
        packs.append({"name": name, "header": hdr_in, "label_is_sequence": not isinstance(header[1], float),
                      "data": data.hex(), "packed": s.hex(),
                      "unpacked": {"flag": h.flag, "label": label, "id": h.id, "id2": h.id2,
                                   "data": bytes(rest).hex()}})
    cases = record_cases([(p["name"], bytes.fromhex(p["packed"])) for p in packs])
    rec, idx = os.path.join(OUT, "mxnet.rec"), os.path.join(OUT, "mxnet.idx")
    keys = [1000 + 7 * i for i in range(len(cases))]  # not 0..n-1, so key lookups are really by key
    w = mx.recordio.MXIndexedRecordIO(idx, rec, "w")
    for key, (_, payload) in zip(keys, cases):
        w.write_idx(key, payload)
    w.close()
    r = mx.recordio.MXIndexedRecordIO(idx, rec, "r")
    for key, (name, payload) in zip(keys, cases):
        assert r.read_idx(key) == payload, name
    r.close()
    manifest = {
        "generator": f"tests/make_golden.py with mxnet {mx.__version__}, numpy {np.__version__}, "
                     f"python {sys.version.split()[0]}",
        "records": [{"name": name, "key": key, "payload": payload.hex()}
                    for key, (name, payload) in zip(keys, cases)],
        "packs": packs,
    }
    with open(os.path.join(OUT, "manifest.json"), "w") as f:  # one entry per line: small, diffable
        f.write("{\n" + f'"generator": {json.dumps(manifest["generator"])},\n')
        for part in ("records", "packs"):
            f.write(f'"{part}": [\n' + ",\n".join(json.dumps(e) for e in manifest[part])
                    + ("\n],\n" if part == "records" else "\n]\n"))
        f.write("}\n")
    print(f"wrote {len(cases)} records ({os.path.getsize(rec)} bytes) and {len(packs)} pack cases to {OUT}")


if __name__ == "__main__":
    main()
