# The Makefile is the contract: CI calls the same targets a person does.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip
PYTEST ?= $(PYTHON) -m pytest
# Torch first and pinned: on these machines 2.13.0 is a CPU wheel already on disk; an unpinned torch would pull
# several GB of CUDA packages. Override on a GPU box: make install TORCH_SPEC=torch
TORCH_SPEC ?= torch==2.13.0
# pytest-xdist workers for `make test`: a test file is one unit of work and the slurm tier one unit (tests/conftest.py).
# Two fill the idle time of the slurm tier's scheduling and of single-threaded unit tests on a 2-core machine.
TEST_WORKERS ?= 2

.DEFAULT_GOAL := help
.PHONY: help install test test-unit test-dist test-slurm test-gpu test-containers gpu-check lint docs reference bench bench-quick slurm-install slurm-up slurm-down sshd-install sshd-up sshd-down containers-install containers-up containers-down clean

help: ## list the targets
	@grep -E '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-18s %s\n", $$1, $$2}'

install: ## install slurmtrain (editable) with its dev, docs, deepspeed, hf, eval, fp8 and ft extras
	$(PIP) install $(TORCH_SPEC)
	# compat: a path entry rather than an import hook, so Hydra's plugin scan finds hydra_plugins/ (sweeps)
	$(PIP) install --config-settings editable_mode=compat -e '.[dev,docs,deepspeed,hf,eval,fp8,ft]'

test: ## run every test tier this machine supports (unit, dist, slurm when `make slurm-up` ran, gpu with CUDA)
	$(PYTEST) tests -q --durations=40 -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

test-unit: ## fast unit tests
	$(PYTEST) tests/unit -q

test-dist: ## multi-process gloo tests
	$(PYTEST) tests/dist -q

test-slurm: ## tests against the local SLURM cluster (run `make slurm-up` first)
	$(PYTEST) tests/slurm -q

test-gpu: ## CUDA tests (skipped without a GPU)
	$(PYTEST) tests/gpu -q

test-containers: ## tests on real container runtimes: Charliecloud, enroot, Podman, pyxis (run `make containers-up` first)
	$(PYTEST) tests/containers -q

gpu-check: ## on a lent GPU, under 8 min: test-gpu, loop_overhead's GPU arm (MFU, tokens/s vs bare loop), memory estimate vs peak; bench/results/gpu/DATE_DEVICE/
	$(PYTHON) -m bench.gpu_check

lint: ## ruff, mypy, the import-linter contracts between launcher/, train/ and contract/ (pyproject.toml), no import circles
	$(PYTHON) -m ruff check launcher train contract tests bench
	$(PYTHON) -m mypy launcher contract
	lint-imports
	$(PYTHON) -m pytest -q -p no:cacheprovider tests/unit/test_import_graph.py

docs: ## the documentation site into site/ (MkDocs, warnings are errors); its figures are generated, and it fails while a reference page is stale
	NO_MKDOCS_2_WARNING=1 $(PYTHON) -m mkdocs build --strict --site-dir site

reference: ## write docs/reference/config.md and commands.md again from the schema and the commands (commit them)
	$(PYTHON) -m launcher.docs.references

bench: ## benchmarks under bench/, ratios measured in one run; report in bench/results/REPORT.md
	$(PYTHON) -m bench

bench-quick: ## the same benchmarks, fewer repetitions and smaller sizes (CI smoke); bench/results/quick/
	$(PYTHON) -m bench --quick

slurm-install: ## install the Debian packages for the local SLURM cluster
	bash scripts/slurm/install.sh

slurm-up: slurm-install ## bring up a local SLURM cluster (controller, accounting, nodes n1 n2 n3)
	bash scripts/slurm/up.sh

slurm-down: ## tear the local SLURM cluster down
	bash scripts/slurm/down.sh

sshd-install: ## install Debian's openssh-server (and rsync) for the local login node of the remote tests
	bash scripts/sshd/install.sh

sshd-up: sshd-install ## start a local login node: sshd on 127.0.0.1:16022 with a test key, in front of the SLURM cluster
	PYTHON=$(PYTHON) bash scripts/sshd/up.sh

sshd-down: ## stop the local login node's sshd
	bash scripts/sshd/down.sh

containers-install: ## install Charliecloud and Podman (Debian) and build enroot 4.1.2 and pyxis 0.24.0 (about 80 s once)
	bash scripts/containers/install.sh

containers-up: containers-install ## pyxis into the local SLURM cluster (after slurm-up), runtime configs, the test image under /var/tmp/slurmtrain-containers (built once)
	PYTHON=$(PYTHON) TORCH_SPEC=$(TORCH_SPEC) bash scripts/containers/up.sh

containers-down: ## take pyxis out of the local SLURM cluster (slurmd restarted); the images and runtimes stay
	bash scripts/containers/down.sh

clean: ## remove caches and local outputs
	rm -rf outputs multirun site .pytest_cache .ruff_cache .mypy_cache
