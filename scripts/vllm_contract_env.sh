#!/usr/bin/env bash
# Build (or reuse) the Python environment of the `vllm_contract` test tier: frlab's vLLM
# adapters exercised against vLLM's REAL Python code on a CPU machine.
#
#   bash scripts/vllm_contract_env.sh            # prints the environment's python at the end
#   FRLAB_REQUIRE_VLLM_CONTRACT=1 "$(bash scripts/vllm_contract_env.sh | tail -1)" \
#       -m pytest -q -m vllm_contract tests/vllm_contract
#
# vLLM has no CPU wheel and its dependencies pull CUDA, so the environment is built by hand:
# torch==2.13.0 (the CPU wheel; vllm 0.28/0.29 pin this torch), the vllm wheel with --no-deps,
# the pure-Python packages its imports need (scripts/vllm_contract_requirements.txt, bounds
# from the wheel's metadata), xgrammar and apache-tvm-ffi (two small compiled wheels its
# structured-output module imports at load time) with --no-deps, frlab itself (editable, with
# its dependencies) and pytest. No CUDA package is installed; only package registries are used.
#
# Env: FRLAB_VLLM_CONTRACT_VENV (the venv; default $FRLAB_CACHE/vllm-contract-venv when
# FRLAB_CACHE is set, else .venv-vllm-contract/ in the repository, ignored by git);
# FRLAB_VLLM_CONTRACT_VLLM (the pip requirement of vllm, default vllm==0.29.0; 0.28.0 works
# too). An environment already built from the same inputs is reused (a stamp file holds a
# hash of vllm's requirement, the requirements file and pyproject.toml).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
if [[ -n "${FRLAB_VLLM_CONTRACT_VENV:-}" ]]; then
  VENV="$FRLAB_VLLM_CONTRACT_VENV"
elif [[ -n "${FRLAB_CACHE:-}" ]]; then
  VENV="$FRLAB_CACHE/vllm-contract-venv"
else
  VENV="$ROOT/.venv-vllm-contract"
fi
VLLM_REQ="${FRLAB_VLLM_CONTRACT_VLLM:-vllm==0.29.0}"
REQS="$ROOT/scripts/vllm_contract_requirements.txt"
STAMP="$VENV/.frlab-contract-stamp"
want="$(printf '%s\n' "$VLLM_REQ" | cat - "$REQS" "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
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
    | { grep -Ev "^vllm .* requires |dependency resolver|dependency conflicts|Location '" || true; }
  return "${PIPESTATUS[0]}"
}
# two pip runs (each resolves once): the packages installed without their dependencies, then
# everything else with theirs
pip_ --no-deps "$VLLM_REQ" "xgrammar>=0.2.1,<1.0.0" "apache-tvm-ffi==0.1.11"
pip_ torch==2.13.0 "pytest>=8" -r "$REQS" -e "$ROOT"
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
