#!/usr/bin/env bash
# One 8-GPU node: the Lightning learner under torchrun on the first GPUs, a fleet of vLLM
# servers (rollout=remote, filesystem weight sync) on the others.
#
#   bash scripts/launch/single_node.sh EXPERIMENT [extra frlab overrides...]
#   e.g. bash scripts/launch/single_node.sh python_tool_qwen7b trainer.max_steps=10
#
# Layouts (scripts/launch/fleet.sh): r1_distill_1p5b 1 learner + 7 servers; qwen_math_1p5b
# 1 + 3; python_tool_qwen7b / alfworld_qwen7b 4 (trainer=fsdp_7b) + 4; the 30B-A3B setting
# needs 3 nodes: use slurm_learner_fleet.sbatch. Env: RUN_DIR (run folder, shared by all ranks;
# resume with ckpt_path=last), PORT_BASE (8100), HOST (the address the servers listen on and
# the learner reaches them at: 127.0.0.1, this node only), FLEET_SECRET_FILE (the fleet's
# shared secret, created mode 0600 if absent: $RUN_DIR/fleet.secret), SEED, PRINT_ONLY=1
# (print the commands). Every server route but /health needs the secret (scripts/launch/fleet.sh).
# Needs `pip install -e '.[vllm]'` (frlab importable by the servers) and the model weights.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=fleet.sh
source "$HERE/fleet.sh"
EXP="${1:?usage: single_node.sh EXPERIMENT [overrides...]}"
shift
layout "$EXP"
if ((LEARNER_NODES > 1)); then
  echo "$EXP needs $LEARNER_NODES learner nodes: use scripts/launch/slurm_learner_fleet.sbatch" >&2
  exit 2
fi
MODEL="$(model_of "$EXP")"
PORT_BASE="${PORT_BASE:-8100}"
RUN_DIR="${RUN_DIR:-outputs/runs/$EXP/node_$(date +%Y-%m-%d_%H-%M-%S)}"
export HOST="${HOST:-127.0.0.1}" FLEET_SECRET_FILE="${FLEET_SECRET_FILE:-$RUN_DIR/fleet.secret}"
export FLEET_SNAPSHOT_DIR="$RUN_DIR/snapshots"
URLS="$(fleet_urls "$HOST" "$SERVERS" "$PORT_BASE")"
fleet_secret "$FLEET_SECRET_FILE"

trap 'kill $(jobs -p) 2>/dev/null || true' EXIT
start_fleet "$LEARNER_GPUS" "$SERVERS" "$TP" "$PORT_BASE" "$MODEL" "$MAX_MODEL_LEN"
wait_healthy "$URLS"
GPUS="$(seq -s, 0 $((LEARNER_GPUS - 1)))"
run_or_print env CUDA_VISIBLE_DEVICES="$GPUS" OMP_NUM_THREADS=8 \
  torchrun --standalone --nproc-per-node "$LEARNER_GPUS" -m frlab \
  "experiment=$EXP" "trainer=$TRAINER" "trainer.devices=$LEARNER_GPUS" trainer.num_nodes=1 \
  rollout=remote rollout/engine=remote "rollout.remote.servers=[$URLS]" \
  "rollout.remote.snapshot_dir=$FLEET_SNAPSHOT_DIR" rollout.remote.weight_sync=filesystem \
  "rollout.remote.secret_file=$FLEET_SECRET_FILE" "hydra.run.dir=$RUN_DIR" "$@"
