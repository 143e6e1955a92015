#!/usr/bin/env bash
# frlab GPU check: a few asynchronous FlashREINFORCE updates on CUDA in bf16 at Qwen2.5-0.5B's
# shape (random init, no download): torch engine + pool + Lightning learner + weight sync, then
# the GPU-marked tests, packed micro-batches on CUDA (scripts/gpu_packing_check.py: exactness
# per attention kernel, packed vs padded speed), and bench/gpu_mfu.py (learner MFU at
# Qwen2.5-1.5B's shape with its profile and a plain transformers step, peak memory against the
# dry run's memory plan, torch-engine decode throughput, the compiled learner). Prints rollout
# tokens/s, learner tokens/s and step time (scripts/gpu_check.py). The parts' timeouts add up
# to 8 minutes (90 + 75 + 60 + 255 s) on one H200 without vLLM.
#
# With vllm installed (the `vllm` extra: frlab/rollout/vllm/releases.py), also
# scripts/gpu_check_vllm.py: the
# in-process vLLM engine with a weight update and its processed log-probs against the
# learner's (max / mean |diff|, bf16), then one `vllm serve` server with the recipes' flags,
# filesystem weight sync and a short `rollout=remote` run. Without vllm that part prints
# "SKIPPED (vllm is not installed)" and the rest runs. NOT run yet on a GPU with vllm.
#
# STATUS: run once on one H200 (2026-12-04) before the varlen attention, the device-sized
# LM-head chunks, fused AdamW and model.compile; its figures are in docs/gpu.md. What was
# added since (the profile, the plain-transformers arm, plan against measured memory, the
# compile part, bf16 varlen exactness) has run on a CPU only (tests/test_gpu_check.py,
# tests/bench/test_gpu_mfu.py).
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

# Each part has its own timeout (seconds, overridable; together at most 8 minutes) and its
# output kept in $LOGS/<part>.log (LOGS defaults to $OUT on the device, else ./gpu_check_logs).
LOGS=${LOGS:-${OUT:-gpu_check_logs}}
mkdir -p "$LOGS"
part() {  # part NAME SECONDS COMMAND...: run it under its timeout, output to the log and stdout
  local name=$1 seconds=$2
  shift 2
  echo "== $name (timeout ${seconds} s)"
  timeout "$seconds" "$@" 2>&1 | tee "$LOGS/$name.log"
  local rc=${PIPESTATUS[0]}
  [ "$rc" -eq 124 ] && echo "gpu_check: $name timed out after ${seconds} s"
  return "$rc"
}

part async "${T_ASYNC:-90}" "$PY" scripts/gpu_check.py "$@"
check_rc=$?

part gpu_tests "${T_TESTS:-75}" "$PY" -m pytest -q -m gpu tests/
test_rc=$?
[ "$test_rc" -eq 5 ] && { echo "gpu_check: no GPU-marked tests collected"; test_rc=0; }

# packed micro-batches: exactness per kernel, then packed vs padded learner speed
part packing "${T_PACKING:-60}" "$PY" scripts/gpu_packing_check.py --repeats "${PACKING_REPEATS:-1}"
packing_rc=$?

# learner MFU + profile + plain transformers step, peak memory vs plan, decode, then the
# compiled learner against the uncompiled step (one process; each line printed as it comes)
part mfu "${T_MFU:-255}" "$PY" bench/gpu_mfu.py --parts mfu,memory,decode,compile
mfu_rc=$?

if "$PY" -c "import vllm" 2>/dev/null; then
  part vllm "${T_VLLM:-300}" "$PY" scripts/gpu_check_vllm.py
  vllm_rc=$?
  part vllm_tests "${T_VLLM_TESTS:-300}" "$PY" -m pytest -q -m vllm tests/
  vllm_tests_rc=$?
  [ "$vllm_tests_rc" -eq 5 ] && vllm_tests_rc=0
else
  echo "gpu_check: vLLM parts SKIPPED (vllm is not installed)"
  vllm_rc=0
  vllm_tests_rc=0
fi

echo "gpu_check.sh: check rc=$check_rc, gpu tests rc=$test_rc, packing rc=$packing_rc," \
  "mfu rc=$mfu_rc, vllm rc=$vllm_rc, vllm tests rc=$vllm_tests_rc" \
  "(logs in $LOGS)"
[ "$check_rc" -eq 0 ] && [ "$test_rc" -eq 0 ] && [ "$packing_rc" -eq 0 ] && [ "$mfu_rc" -eq 0 ] \
  && [ "$vllm_rc" -eq 0 ] && [ "$vllm_tests_rc" -eq 0 ]
