"""A /dev/shm as small as Docker's default (64 MiB): the reader shrinks its ring and its output slots to
what is there, says so in one line, and delivers exactly what it would with more.  Run for real in a
private mount namespace with a 64 MiB tmpfs on /dev/shm (``unshare -m``, as root), and as a pure
function of the free bytes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from parrecio import ParallelReader
from parrecio.decoders import BoundingBoxes, Image
from parrecio.pipeline.resources import fit_memory

HERE = os.path.dirname(os.path.abspath(__file__))
MIB = 2 ** 20


def test_fit_memory_as_a_function_of_the_free_bytes(tmp_path):
    (tmp_path / "x.rec").write_bytes(b"")
    with ParallelReader(tmp_path / "x.rec", fields=[Image(size=(224, 224)), BoundingBoxes(max_boxes=16)],
                        workers=2, batch_size=64) as r:
        cfg = r.config
    slot = cfg.layout.nbytes
    assert 9 * MIB < slot < 10 * MIB  # 64 images of 224x224x3 and their boxes
    same, n, said = fit_memory(cfg, 10, 5, 10 << 30)
    assert same is cfg and n == 10 and said is None          # room enough: as asked
    small, n, said = fit_memory(cfg, 10, 5, 64 * MIB)
    assert 5 <= n < 10 and small.ring_bytes < cfg.ring_bytes
    assert 2 * small.ring_bytes + n * slot <= 64 * MIB       # the ring, its one-off budget, the slots
    assert small.oneoff_budget == small.ring_bytes and small.mapped_budget == 4 * small.ring_bytes
    assert "64 MiB free" in said and "--shm-size" in said and f"{n} output slots" in said
    none, n, said = fit_memory(cfg, 10, 5, 20 * MIB)          # not even the minimum: ask, and fail there
    assert none is cfg and n == 10 and said is None
    # values that travel pickled (no output slots): the ring alone is spoken of ("0 output slots of
    # 0.0 MiB (instead of 0)" was said)
    with ParallelReader(tmp_path / "x.rec", fields=lambda p: len(p), workers=2) as r:
        raw = r.config
    small, n, said = fit_memory(raw, 0, 0, 8 * MIB)
    assert small.ring_bytes == 2 * MIB and n == 0
    assert said.startswith("parrecio: /dev/shm has 8 MiB free, less than the 128 MiB asked for; using a 2.0 MiB "
                           "input ring (ring_bytes=67108864), which may be slower")


SCRIPT = textwrap.dedent("""\
    import glob, io, logging, os, sys
    import numpy as np
    from PIL import Image as PILImage
    from parrecio import ParallelReader, RecordWriter
    from parrecio.decoders import BoundingBoxes, Image

    def main():
        path = sys.argv[1]
        with ParallelReader(path, fields=[Image(size=(224, 224)), BoundingBoxes(max_boxes=16)], workers=2,
                            batch_size=64) as r:
            n = 0
            for images, boxes in r:
                assert images.shape[1:] == (224, 224, 3) and boxes.shape[1:] == (16, 5)
                n += len(images)
            print("samples", n, "ring", r.config.ring_bytes, "slots", len(r._res.slots.segments), flush=True)
        print("left", len(glob.glob("/dev/shm/parrecio-*")), flush=True)

    if __name__ == "__main__":
        main()
    """)


def _manifest_stream(path, n=200):
    import io
    import json
    import numpy as np
    from PIL import Image as PILImage
    from parrecio import RecordWriter
    rng = np.random.default_rng(0)
    with RecordWriter(str(path)) as w:
        for i in range(n):
            buf = io.BytesIO()
            PILImage.fromarray(rng.integers(0, 256, (90, 120, 3), dtype=np.uint8)).save(buf, "JPEG")
            w.write(buf.getvalue())
            w.write(json.dumps({"image_size": [{"width": 120, "height": 90, "depth": 3}],
                                "annotations": [{"class_id": 1, "left": 3, "top": 4, "width": 50,
                                                 "height": 20}]}).encode())


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare -m")
def test_docker_sized_dev_shm(tmp_path):
    path = tmp_path / "m.rec"
    _manifest_stream(path)
    script = tmp_path / "small_shm.py"
    script.write_text(SCRIPT)
    cmd = f"mount -t tmpfs -o size=64m tmpfs /dev/shm && {sys.executable} {script} {path}"
    proc = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True, timeout=180)
    if proc.returncode != 0 and "mount" in proc.stderr and "permission" in proc.stderr.lower():
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    words = proc.stdout.split()
    assert words[:2] == ["samples", "200"], proc.stdout
    assert int(words[3]) < 64 * MIB and 5 <= int(words[5]) < 10
    assert words[-2:] == ["left", "0"]
    warnings = [line for line in proc.stderr.splitlines() if "MiB free" in line]
    assert len(warnings) == 1 and "--shm-size" in warnings[0], proc.stderr
