#!/usr/bin/env bash
# frlab GPU check: a few asynchronous FlashREINFORCE updates on CUDA in bf16 at Qwen2.5-0.5B's
# shape (random init, no download): torch engine + pool + Lightning learner + weight sync, then
# the GPU-marked tests, packed micro-batches on CUDA (scripts/gpu_packing_check.py: exactness
# per attention implementation, packed vs padded speed), and bench/gpu_mfu.py (learner MFU at
# Qwen2.5-1.5B's shape, peak memory at 8,192-token trajectories, torch-engine decode
# throughput). Prints rollout tokens/s, learner tokens/s and step time (scripts/gpu_check.py).
# Sized for about 8 minutes on one H200.
#
# With vllm installed (the `vllm` extra: frlab/rollout/engines/vllm_releases.py), also
# scripts/gpu_check_vllm.py: the
# in-process vLLM engine with a weight update and its processed log-probs against the
# learner's (max / mean |diff|, bf16), then one `vllm serve` server with the recipes' flags,
# filesystem weight sync and a short `rollout=remote` run. Without vllm that part prints
# "SKIPPED (vllm is not installed)" and the rest runs. NOT run yet on a GPU with vllm.
#
# STATUS: written and tested on CPU only (`--tiny --device cpu`, tests/test_gpu_check.py);
# the session that wrote it had no GPU lent, so it has NOT run on a GPU yet.
#
# The H200 image has torch 2.11 (CUDA 13), lightning 2.6.6, transformers 5.17, torchmetrics,
# tokenizers, safetensors, pytest, pyyaml, jinja2, numpy, but no hydra-core, omegaconf or
# antlr4 (needed to collect tests/) and no network. Carry them as wheels (3 pure-python
# py3-none-any files, ~384 KiB). Once, here, from the repo root:
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 \
#     -d .whl hydra-core==1.3.8 omegaconf==2.3.1
#   python3 -m pip wheel --no-deps -w .whl antlr4-python3-runtime==4.9.3
# (antlr4-python3-runtime 4.9.3 is published as an sdist only; it is pure python, so the
# wheel built here is py3-none-any and installs on 3.12. PyYAML is in the image: not carried.)
#
# On the device (run tool), with carry [".whl"] (.whl is git-ignored, so it travels only
# when carried), the whole command is:
#   bash scripts/gpu_check.sh 2>&1 | tee $OUT/gpu_check.log
# Arguments go to gpu_check.py (e.g. --steps 4 --new-tokens 128). PYTHON overrides python3.
# The script installs the wheels itself:
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
#   export PYTHONPATH=/tmp/site:$PWD     # frlab runs from the checkout, not pip-installed
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-python3}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PY" -c "import hydra, omegaconf, antlr4" 2>/dev/null; then
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "gpu_check: hydra-core/omegaconf/antlr4 missing and no .whl/ carried (see header)" >&2
    exit 1
  fi
  "$PY" -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
"$PY" -c "import torch, lightning, transformers as t; print('torch', torch.__version__, \
'cuda', torch.version.cuda, '| lightning', lightning.__version__, '| transformers', t.__version__)"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null

echo "== async updates (torch engine + learner)"
timeout 300 "$PY" scripts/gpu_check.py "$@"
check_rc=$?

echo "== pytest -m gpu"
timeout 120 "$PY" -m pytest -q -m gpu tests/
test_rc=$?
[ "$test_rc" -eq 5 ] && { echo "gpu_check: no GPU-marked tests collected"; test_rc=0; }

echo "== packed micro-batches on CUDA: exactness, then packed vs padded learner speed"
timeout 300 "$PY" scripts/gpu_packing_check.py --repeats "${PACKING_REPEATS:-1}"
packing_rc=$?

echo "== learner MFU (Qwen2.5-1.5B shape), peak memory at 8192-token trajectories, decode"
timeout 300 "$PY" bench/gpu_mfu.py
mfu_rc=$?

echo "== vLLM: in-process engine + one vllm serve server (skipped without vllm)"
timeout 600 "$PY" scripts/gpu_check_vllm.py
vllm_rc=$?
if "$PY" -c "import vllm" 2>/dev/null; then
  echo "== pytest -m vllm"
  timeout 300 "$PY" -m pytest -q -m vllm tests/
  vllm_tests_rc=$?
  [ "$vllm_tests_rc" -eq 5 ] && vllm_tests_rc=0
else
  echo "gpu_check: pytest -m vllm SKIPPED (vllm is not installed)"
  vllm_tests_rc=0
fi

echo "gpu_check.sh: check rc=$check_rc, gpu tests rc=$test_rc, packing rc=$packing_rc," \
  "mfu rc=$mfu_rc, vllm rc=$vllm_rc, vllm tests rc=$vllm_tests_rc"
[ "$check_rc" -eq 0 ] && [ "$test_rc" -eq 0 ] && [ "$packing_rc" -eq 0 ] && [ "$mfu_rc" -eq 0 ] \
  && [ "$vllm_rc" -eq 0 ] && [ "$vllm_tests_rc" -eq 0 ]
