#!/usr/bin/env bash
# The benchmarks' side environments, each apart from the runtime venv (every one of them pulls plain
# Pillow, which would replace Pillow-SIMD there):
#   bench/.venvs/torch    torch 2.13.0 (the CPU build on this machine's disk), the STOCK Pillow, numpy
#   bench/.venvs/mx       mxnet 1.9.1 + numpy 1.23.5 (ImageRecordIter; also tests/make_golden.py)
#   bench/.venvs/imgdata  scikit-image + matplotlib (the bundled photographs, and the plot)
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PY="${PYTHON:-python3}"
venv() { [ -x "$HERE/.venvs/$1/bin/python" ] || "$PY" -m venv "$HERE/.venvs/$1"; }
venv torch
"$HERE/.venvs/torch/bin/pip" install --quiet "torch==2.13.0" pillow numpy
venv mx
"$HERE/.venvs/mx/bin/pip" install --quiet "mxnet==1.9.1" "numpy==1.23.5"
venv imgdata
"$HERE/.venvs/imgdata/bin/pip" install --quiet scikit-image matplotlib
"$HERE/.venvs/torch/bin/python" - <<'PY'
import importlib.metadata as md, torch, PIL, numpy
print("torch venv:", "torch", torch.__version__, "|", md.distribution("pillow").metadata["Name"], PIL.__version__,
      "| numpy", numpy.__version__)
PY
"$HERE/.venvs/mx/bin/python" -c "import mxnet, numpy; print('mx venv: mxnet', mxnet.__version__, '| numpy', numpy.__version__)"
echo "imgdata venv: ready"
