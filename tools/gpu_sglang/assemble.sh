#!/usr/bin/env bash
# Run on the GPU machine after every .gpu_sglang/pNN folder was copied into /tmp/sgl (one call each; README.md):
#   bash /tmp/sgl/assemble.sh
# Joins the split wheels, installs everything into /tmp/sglsite (the machine's own torch 2.11 stays where it
# is, shadowed through PYTHONPATH), then imports the GPU pieces and prints their versions. Re-runnable.
# Then, in every later call:
#   source /tmp/sglsite/env.sh     # PYTHONPATH=/tmp/sglsite, CUDA_HOME, HF_HUB_OFFLINE=1, TRANSFORMERS_OFFLINE=1
#   python3 -m pip install -q --no-deps --no-build-isolation --upgrade --target /tmp/sglsite .   # this checkout
set -euo pipefail
cd /tmp/sgl
for first in *.part00; do
  [ -e "$first" ] || continue
  w=${first%.part00}
  cat $(ls "$w".part* | sort) > "$w" && rm -f "$w".part*
done
echo "assemble: $(ls *.whl | wc -l) wheels ($(grep -c '^[^#]*==' deps.txt) pinned in deps.txt), $(du -sh --apparent-size . | cut -f1)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/sglsite /tmp/sgl/*.whl
# PYTHONPATH entries get no .pth processing, and nvidia-cutlass-dsl puts its `cutlass` package (CuTe DSL, used by
# FlashInfer, quack and flash-attn-4) on sys.path through a .pth file: this sitecustomize.py processes
# /tmp/sglsite as a site dir, then runs the machine's own sitecustomize, if there is one (ours shadows it).
cat > /tmp/sglsite/sitecustomize.py <<'PY'
import os, site, sys
_here = os.path.dirname(os.path.abspath(__file__))
site.addsitedir(_here)
for _p in list(sys.path):
    _f = os.path.join(_p, "sitecustomize.py")
    if _p and os.path.abspath(_p) != _here and os.path.isfile(_f):
        exec(compile(open(_f).read(), _f, "exec"), {"__name__": "sitecustomize", "__file__": _f})
        break
PY
# The machine's CUDA 13.0 toolkit, for the JIT builds of FlashInfer and SGLang (the driver is CUDA 13.0 too).
if [ -z "${CUDA_HOME:-}" ]; then
  if [ -x /usr/local/cuda/bin/nvcc ]; then CUDA_HOME=/usr/local/cuda
  elif command -v nvcc >/dev/null; then CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  else CUDA_HOME=/usr/local/cuda; fi
fi
echo "CUDA_HOME=$CUDA_HOME ($("$CUDA_HOME/bin/nvcc" --version 2>/dev/null | grep -o 'release [0-9.]*' || echo 'no nvcc there'))"
cat > /tmp/sglsite/env.sh <<SH
# source /tmp/sglsite/env.sh   (written by assemble.sh)
export PYTHONPATH=/tmp/sglsite\${PYTHONPATH:+:\$PYTHONPATH}
export CUDA_HOME=$CUDA_HOME
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# torch 2.14.1 was built with cuDNN 9.24, the machine has an older one and it is not carried (README.md)
export PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1
SH
PYTHONPATH=/tmp/sglsite${PYTHONPATH:+:$PYTHONPATH} CUDA_HOME=$CUDA_HOME PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK=1 python3 - <<'PY'
import importlib.metadata as md, torch
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "", "from", torch.__file__)
print("nccl", ".".join(map(str, torch.cuda.nccl.version())))
try:
    print("cudnn", torch.backends.cudnn.version())
except Exception as e:  # torch refuses a cuDNN older than the one it was built with (README.md, caveats)
    print("cudnn: not usable:", str(e).splitlines()[0])
import triton, transformers, sglang, flashinfer, cutlass
import sgl_kernel  # loads its sm_90 ops: needs the GPU's libcuda and torch 2.14.1's ABI
from sgl_kernel.flash_attn import flash_attn_with_kvcache  # SGLang's default (fa3) attention on sm_90
for d in ("triton", "transformers", "sglang", "sglang-kernel", "flashinfer-python", "xgrammar", "torchvision"):
    print(d, md.version(d))
x = torch.randn(4, 8, device="cuda", dtype=torch.bfloat16)
print("sgl_kernel silu_and_mul ok:", tuple(sgl_kernel.silu_and_mul(x).shape))
PY
