# shellcheck shell=bash
# Shared helpers of the frlab launch recipes (sourced, not run): the GPU layout of each paper
# setting, the fleet's shared secret, a vLLM server fleet with frlab's worker extension and
# guard, and a health wait.
# PRINT_ONLY=1 prints every command (one per line, shell-quoted) instead of running it; the
# tests use it to check the commands compose.

# layout EXPERIMENT -> sets TRAINER LEARNER_GPUS LEARNER_NODES SERVERS TP MAX_MODEL_LEN
# HF_OVERRIDES. Learner GPUs per node x nodes = trainer.devices x trainer.num_nodes; SERVERS
# vLLM servers of TP GPUs each (the paper does not state its GPU counts: these are frlab's
# sizing). HF_OVERRIDES (vLLM --hf-overrides): Qwen2.5-Math-1.5B's config declares 4,096
# positions and the reference runs it at 6,144 tokens of context.
layout() {
  HF_OVERRIDES=""
  case "$1" in
    r1_distill_1p5b)  TRAINER=gpu;          LEARNER_GPUS=1; LEARNER_NODES=1; SERVERS=7; TP=1; MAX_MODEL_LEN=9216 ;;
    qwen_math_1p5b)   TRAINER=gpu;          LEARNER_GPUS=1; LEARNER_NODES=1; SERVERS=3; TP=1; MAX_MODEL_LEN=6144
                      HF_OVERRIDES='{"max_position_embeddings": 6144}' ;;
    python_tool_qwen7b) TRAINER=fsdp_7b;    LEARNER_GPUS=4; LEARNER_NODES=1; SERVERS=4; TP=1; MAX_MODEL_LEN=8192 ;;
    alfworld_qwen7b)  TRAINER=fsdp_7b;      LEARNER_GPUS=4; LEARNER_NODES=1; SERVERS=4; TP=1; MAX_MODEL_LEN=16384 ;;
    python_tool_qwen3_30b_a3b) TRAINER=fsdp_30b_a3b; LEARNER_GPUS=8; LEARNER_NODES=2; SERVERS=4; TP=2; MAX_MODEL_LEN=16384 ;;
    *) echo "unknown experiment '$1' (one of: r1_distill_1p5b qwen_math_1p5b python_tool_qwen7b alfworld_qwen7b python_tool_qwen3_30b_a3b)" >&2; return 2 ;;
  esac
}

# The Hugging Face model of each paper setting (what the vLLM servers load).
model_of() {
  case "$1" in
    r1_distill_1p5b) echo deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B ;;
    qwen_math_1p5b) echo Qwen/Qwen2.5-Math-1.5B ;;
    python_tool_qwen7b|alfworld_qwen7b) echo Qwen/Qwen2.5-7B-Instruct ;;
    python_tool_qwen3_30b_a3b) echo Qwen/Qwen3-30B-A3B ;;
    *) return 2 ;;
  esac
}

run_or_print() {
  if [[ "${PRINT_ONLY:-0}" == 1 ]]; then printf '%q ' "$@"; echo; else "$@"; fi
}

# fleet_secret FILE: the fleet's shared secret in FILE, created once (32 random bytes as hex,
# mode 0600 from the start) and reused by a resumed or requeued job. Its value never appears
# on a command line: servers get the file's path (FRLAB_FLEET_SECRET_FILE), the learner
# rollout.remote.secret_file, vLLM's own --api-key guard the value through its environment.
fleet_secret() {
  local file="$1"
  if [[ "${PRINT_ONLY:-0}" == 1 ]]; then run_or_print fleet_secret "$file"; return 0; fi
  [[ -s "$file" ]] && return 0
  mkdir -p "$(dirname "$file")"
  (umask 077 && head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$file.tmp.$$" \
    && mv "$file.tmp.$$" "$file")
}

# serve_words MODEL: the words that start vLLM's OpenAI server on MODEL. VLLM_ENTRY=cli:
# `vllm serve MODEL`; module: `python -m vllm.entrypoints.openai.api_server --model MODEL`
# (the same server and flags; vLLM's CPU build needs it: its `vllm` command looks up the
# distribution named `vllm`); auto (default): cli where the `vllm` command runs, else module
# where python imports vllm, else cli. PRINT_ONLY=1 without VLLM_ENTRY prints the cli form.
serve_words() {
  local entry="${VLLM_ENTRY:-auto}"
  if [[ "$entry" == auto ]]; then
    if [[ "${PRINT_ONLY:-0}" == 1 ]] || vllm --version > /dev/null 2>&1; then entry=cli
    elif "${PYTHON:-python}" -c "import vllm" > /dev/null 2>&1; then entry=module
    else entry=cli; fi
  fi
  case "$entry" in
    cli) SERVE_WORDS=(vllm serve "$1") ;;
    module) SERVE_WORDS=("${PYTHON:-python}" -m vllm.entrypoints.openai.api_server --model "$1") ;;
    *) echo "VLLM_ENTRY must be cli, module or auto, got '$entry'" >&2; return 2 ;;
  esac
}

# start_server HOST_GPUS PORT MODEL TP MAX_LEN: one vLLM OpenAI server in the background (dev
# mode for /collective_rpc and /server_info, frlab's worker extension for versioned weight
# loads, log-probs of the distribution actually sampled from, which the importance ratios
# need, and vLLM's neutral sampling defaults instead of the model's generation_config.json),
# bound to HOST (the address the learner reaches it by; required, never 0.0.0.0). Every route
# but /health needs the fleet's secret (FLEET_SECRET_FILE, required): frlab's guard
# (--middleware frlab.rollout.remote.auth.FleetGuard, added last so it sees every request
# first) and vLLM's own --api-key guard (its /v1... routes), given the value as VLLM_API_KEY
# in the server's environment, never on its command line. Snapshots are read only below
# FLEET_SNAPSHOT_DIR (FRLAB_SNAPSHOT_ROOT: the run's snapshot folder).
# VLLM_EXTRA_ARGS (split on spaces) is appended, e.g. the CPU build's
# "--kv-cache-memory-bytes 1073741824 --enforce-eager". LORA_RANK=R (a model.lora run) serves
# the base with LoRA adapters of rank <= R loaded at run time (vLLM accepts R in 1, 8, 16, 32,
# 64, 128, 256, 320, 512). These flags are checked with vLLM's own argument parsers by
# tests/vllm_contract, and run on a real CPU server by tests/vllm_cpu.
start_server() {
  local gpus="$1" port="$2" model="$3" tp="$4" max_len="$5" extra=() lora_env=() lora=()
  local host="${HOST:-}" secret="${FLEET_SECRET_FILE:-}" root=()
  if [[ -z "$host" || "$host" == 0.0.0.0 || "$host" == "::" ]]; then
    echo "start_server: set HOST to the address the learner reaches this server at (not '$host')" >&2
    return 2
  fi
  if [[ -z "$secret" ]]; then
    echo "start_server: set FLEET_SECRET_FILE to the fleet's secret file (fleet_secret FILE)" >&2
    return 2
  fi
  if [[ -n "${FLEET_SNAPSHOT_DIR:-}" ]]; then root=(FRLAB_SNAPSHOT_ROOT="$FLEET_SNAPSHOT_DIR"); fi
  serve_words "$model" || return
  if [[ -n "${LORA_RANK:-}" ]]; then
    lora_env=(VLLM_ALLOW_RUNTIME_LORA_UPDATING=True)
    lora=(--enable-lora --max-lora-rank "$LORA_RANK" --max-loras 1)
  fi
  local cmd=(env CUDA_VISIBLE_DEVICES="$gpus" VLLM_SERVER_DEV_MODE=1 "${lora_env[@]}"
    FRLAB_FLEET_SECRET_FILE="$secret" "${root[@]}"
    "${SERVE_WORDS[@]}" --host "$host" --port "$port" --tensor-parallel-size "$tp"
    --max-model-len "$max_len" --seed "${SEED:-0}"
    --worker-extension-cls frlab.rollout.vllm.worker_extension.WeightUpdateExtension
    --logprobs-mode processed_logprobs --generation-config vllm "${lora[@]}")
  if [[ -n "${HF_OVERRIDES:-}" ]]; then cmd+=(--hf-overrides "$HF_OVERRIDES"); fi
  if [[ -n "${VLLM_EXTRA_ARGS:-}" ]]; then read -ra extra <<< "$VLLM_EXTRA_ARGS"; cmd+=("${extra[@]}"); fi
  cmd+=(--middleware frlab.rollout.remote.auth.FleetGuard)
  if [[ "${PRINT_ONLY:-0}" == 1 ]]; then
    printf 'VLLM_API_KEY="$(< %q)" ' "$secret"; run_or_print "${cmd[@]}"
  else
    VLLM_API_KEY="$(< "$secret")" "${cmd[@]}" &
  fi
}

# start_fleet FIRST_GPU COUNT TP PORT_BASE MODEL MAX_LEN: COUNT servers on consecutive GPUs.
start_fleet() {
  local first="$1" count="$2" tp="$3" port="$4" model="$5" max_len="$6" i g gpus
  for ((i = 0; i < count; i++)); do
    gpus=""
    for ((g = first + i * tp; g < first + (i + 1) * tp; g++)); do gpus="${gpus:+$gpus,}$g"; done
    start_server "$gpus" $((port + i)) "$model" "$tp" "$max_len"
  done
}

# node_address NODE: the IPv4 address this host reaches NODE at (its first, as getent
# resolves the name), or NODE itself where it does not resolve (PRINT_ONLY's made-up names).
node_address() {
  local addr
  addr="$(getent ahostsv4 "$1" 2> /dev/null | awk 'NR == 1 {print $1}')" || true
  echo "${addr:-$1}"
}

# fleet_urls HOST COUNT PORT_BASE -> http://HOST:PORT,... (comma separated)
fleet_urls() {
  local host="$1" count="$2" port="$3" i urls=""
  for ((i = 0; i < count; i++)); do urls="${urls:+$urls,}http://$host:$((port + i))"; done
  echo "$urls"
}

# wait_healthy URL,URL,... [TIMEOUT_S]: every server answers /health (loading takes minutes).
wait_healthy() {
  [[ "${PRINT_ONLY:-0}" == 1 ]] && return 0
  local deadline=$((SECONDS + ${2:-1800})) url
  for url in ${1//,/ }; do
    until curl -sf "$url/health" > /dev/null; do
      if ((SECONDS > deadline)); then echo "server $url not healthy in time" >&2; return 1; fi
      sleep 10
    done
  done
}
