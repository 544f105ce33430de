# slimrl: `make demo` sets up everything on a fresh machine and runs the main job (`slimrl train` with its
# embedded default); `make test` runs the suite. docs/development.md says what each target runs.
PYTHON ?= python3.11
PY     := .venv/bin/python
ENVS   := $(PYTHON) tools/envs.py  # every virtual environment, declared once (tools/envs.py: MATRIX), built by uv

# Other people's scripts (Unsloth notebooks, TRL example scripts; ../shared/real_scripts and real_scripts2, converted
# by the rule in their READMEs), run from where they are, never copied here. Where a folder is absent (a clone
# outside this workplace) the target says so and skips.
REAL_SCRIPTS ?= $(abspath ../shared/real_scripts)
REAL_SCRIPTS2 ?= $(abspath ../shared/real_scripts2)
REAL_SCRIPTS3 ?= $(abspath ../shared/real_scripts3)
REAL_SCRIPTS4 ?= $(abspath ../shared/real_scripts4)
REAL_SCRIPTS5 ?= $(abspath ../shared/real_scripts5)
SCRIPTS_FAST := trl_sft trl_dpo unsloth_gpt-oss_20B_RL_2048_Game
SCRIPTS_VLLM_FAST := trl_rloo  # TRL's own colocate vLLM path (a model by name): in .venv-vllm
SCRIPTS2_VENV := trl_grpo_vlm trl_grpo_agent  # the second set: TRL's VLM and agent scripts in .venv (no vLLM) ...
SCRIPTS2_VLLM := unsloth_Qwen2.5_VL_7B_GRPO   # ... and Unsloth's vision notebook, which imports vLLM itself
SCRIPTS3 := unsloth_Qwen3_VL_8B_Vision_GRPO trl_gkd  # the third set, in .venv
SCRIPTS4_VENV := trl_sdpo  # the fourth set: TRL's SDPO script (its own config subclass) in .venv ...
SCRIPTS4_VLLM := unsloth_Qwen3_8B_FP8_GRPO  # ... and Unsloth's FP8 notebook, which imports vLLM (run with vLLM's part)
SCRIPTS5 := unsloth_Gemma4_E2B_2048_GRPO  # the fifth set: Unsloth's Gemma 4 2048 notebook (truncated completions masked)
TRL_MATRIX := 1130 1142 1150
# Processes side by side: the suites are single-threaded Python for the most part (a test's user time about equals its
# wall time), so on CI's 2 cores two pytest workers (pytest-xdist) and two make jobs take about half the time.
JOBS   ?= 2
# torch's threads per part while $(JOBS) parts share the cores: each part's own two threads beside another part's made
# the parts side by side take as long as one after another
PART_THREADS ?= $(shell echo $$(( $$(nproc) / $(JOBS) > 0 ? $$(nproc) / $(JOBS) : 1 )))
PYTEST := -q -p no:cacheprovider -n $(JOBS)

.PHONY: demo envs envs-full install test test-full lint test-trl116 test-trl116-fast suite-trl116 suite-trl116-fast \
	verify-trl116 bytecode test-trl112 test-trl112-fast \
	test-trl-matrix test-trl-matrix-fast test-tf-gpu test-vllm test-vllm-fast test-gguf test-gguf-fast test-triton \
	test-openenv test-gpu test-scripts test-scripts-fast test-scripts-vllm-fast test-scripts2 test-scripts3 test-scripts4 test-scripts4-vllm test-scripts5 gpu-wheels clean

# Only what the demo needs: .venv (torch 2.13.0 CPU, slimrl with its extras, the embedded model)
install:
	$(ENVS) --only .venv

demo: install
	.venv/bin/slimrl train --overwrite_output_dir true  # a repeated demo starts over in outputs/slimrl-grpo

# The environments side by side (installing is mostly waiting on the network and the disk), then the 1.16 suite in
# $(JOBS) workers, then the other parts $(JOBS) at a time (each one's output printed whole when it ends), then vLLM's.
envs:
	$(ENVS)

envs-full:
	$(ENVS) --full

# make test: what CI runs (tests marked slow, verify on the middle TRL releases, transformers 5.17 and most of the
# vLLM suite are left to make test-full)
test: envs
	$(MAKE) lint bytecode suite-trl116-fast
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$(PART_THREADS)} $(MAKE) -j$(JOBS) --output-sync=target test-scripts-fast \
	  test-scripts3 test-scripts4 test-scripts5 test-gguf-fast test-trl112-fast verify-trl116 test-trl-matrix-fast test-triton \
	  test-openenv
	$(MAKE) test-vllm-fast test-scripts4-vllm test-scripts-vllm-fast  # alone: vLLM's CPU engine runs a thread on every core

test-full: envs-full
	$(MAKE) lint bytecode suite-trl116
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-$(PART_THREADS)} $(MAKE) -j$(JOBS) --output-sync=target test-scripts-fast \
	  test-scripts3 test-scripts4 test-scripts5 test-trl112 test-trl-matrix test-tf-gpu verify-trl116 test-triton test-openenv
	$(MAKE) test-vllm test-scripts4-vllm

lint:
	.venv/bin/ruff check slimrl tests bench examples tools
	.venv/bin/ruff format --check slimrl tests bench examples tools

# The project's own .pyc, written once (PYTHONDONTWRITEBYTECODE keeps every test process from caching them;
# tools/envs.py does the same for the installed packages)
bytecode:
	@$(PY) -m compileall -qq slimrl tests bench examples tools

test-trl116: suite-trl116 verify-trl116
test-trl116-fast: suite-trl116-fast verify-trl116

suite-trl116:
	$(PY) -m pytest $(PYTEST) --durations=15  # the slowest, for keeping make test in its budget

suite-trl116-fast:
	$(PY) -m pytest $(PYTEST) -m "not slow" --durations=15

verify-trl116:
	$(PY) -m slimrl verify --all --tiny --quiet

test-trl112-fast:
	.venv-trl112/bin/python -m pytest -q -p no:cacheprovider tests/patching/test_patchfastrl.py \
	  tests/patching/routes/test_shared_prefix.py tests/patching/test_agentic_parity.py tests/patching/online/test_oom.py \
	  tests/patching/test_future_trl.py tests/patching/online/test_degenerate_batches.py \
	  tests/patching/test_every_trainer.py::test_every_config_subclassed_as_trls_scripts_do_gets_the_first_contact \
	  tests/models/test_generate_after_training.py
	.venv-trl112/bin/python -m slimrl verify --all --tiny --quiet

test-trl112:
	.venv-trl112/bin/python -m pytest -q -p no:cacheprovider tests/patching tests/models tests/e2e tests/health \
	  --ignore=tests/models/test_hub_loading.py  # ops/compat/hub loading do not depend on the TRL release
	.venv-trl112/bin/python -m slimrl verify --all --tiny --quiet

# The TRL releases between 1.12 and 1.16 (copies of .venv with only trl swapped): every patch declared for them
# finds its target, and (test-full) verify passes on each.
test-trl-matrix-fast:
	@for v in $(TRL_MATRIX); do echo "== .venv-trl$$v"; \
	  .venv-trl$$v/bin/python -m pytest -q -p no:cacheprovider tests/patching/test_patchfastrl.py \
	  tests/patching/test_future_trl.py::test_installed_trl_signatures_are_recorded || exit 1; done

test-trl-matrix:
	@for v in $(TRL_MATRIX); do echo "== .venv-trl$$v"; \
	  .venv-trl$$v/bin/python -m slimrl verify --all --tiny --quiet || exit 1; \
	  .venv-trl$$v/bin/python -m pytest -q -p no:cacheprovider tests/patching/test_patchfastrl.py || exit 1; done

# The lent GPU machines' transformers (5.17) with TRL 1.16 and slimrl: what those machines run has run here.
test-tf-gpu:
	.venv-tf517/bin/python -m slimrl verify --all --tiny --quiet
	.venv-tf517/bin/python -m pytest -q -p no:cacheprovider tests/patching/trainers/test_grpo.py tests/health

test-vllm-fast:
	.venv-vllm/bin/python -m pytest -q -p no:cacheprovider -m "not slow" tests/vllm/test_grpo_engine.py \
	  tests/vllm/test_plan_engine.py tests/vllm/test_agentic_engine.py tests/vllm/test_4bit_engine.py \
	  tests/vllm/test_gpu_start.py tests/vllm/test_engine_api.py tests/vllm/test_two_engines.py \
	  tests/vllm/test_engine_families.py tests/vllm/test_trl_colocate.py

test-vllm:
	.venv-vllm/bin/python -m pytest -q -p no:cacheprovider tests/vllm

# GGUF export read back by llama.cpp itself (greedy continuations, K-quants) and by transformers, in .venv-gguf;
# make test's share is tests/gguf and the q4_k_m read-back.
test-gguf:
	.venv-gguf/bin/python -m pytest -q -p no:cacheprovider tests/gguf tests/e2e/test_smollm2_export.py tests/export

test-gguf-fast:
	@if [ -f .gguf-wheels/.nocompiler ]; then echo "SKIPPED: llama.cpp checks (no C/C++ compiler to build it)"; \
	else .venv-gguf/bin/python -m pytest -q -p no:cacheprovider tests/gguf \
	  "tests/e2e/test_smollm2_export.py::test_gguf_reads_back_to_the_merged_model[q4_k_m]"; fi

# OpenEnv environments (openenv-core in its own environment: its server framework pins an older pillow)
test-openenv:
	.venv-openenv/bin/python -m pytest -q -p no:cacheprovider tests/environments

# TRL's Triton fused-head kernel under Triton's interpreter (tests/triton; skipped in every other environment)
test-triton:
	TRITON_INTERPRET=1 .venv-triton/bin/python -m pytest -q -p no:cacheprovider tests/triton

# CUDA tests (skipped where there is no CUDA device); on the GPU machine: `make test-gpu PY=python3`
test-gpu:
	$(PY) -m pytest -q -p no:cacheprovider tests/gpu

test-scripts-vllm-fast:
	@if [ -f $(REAL_SCRIPTS)/run_all.sh ]; then \
	  PY=$(abspath .venv-vllm/bin/python) bash $(REAL_SCRIPTS)/run_all.sh $(SCRIPTS_VLLM_FAST) | tee .real-scripts-vllm.log; \
	  tail -1 .real-scripts-vllm.log | grep -q " 0 failed$$"; \
	else echo "real scripts: none at $(REAL_SCRIPTS) (set REAL_SCRIPTS=...): skipped"; fi

test-scripts-fast:
	@if [ -f $(REAL_SCRIPTS)/run_all.sh ]; then \
	  PY=$(abspath $(PY)) bash $(REAL_SCRIPTS)/run_all.sh $(SCRIPTS_FAST) | tee .real-scripts.log; \
	  tail -1 .real-scripts.log | grep -q " 0 failed$$"; \
	else echo "real scripts: none at $(REAL_SCRIPTS) (set REAL_SCRIPTS=...): skipped"; fi
	$(MAKE) test-scripts2

test-scripts3:
	@if [ -f $(REAL_SCRIPTS3)/run_all.sh ]; then \
	  PY=$(abspath $(PY)) bash $(REAL_SCRIPTS3)/run_all.sh $(SCRIPTS3) | tee .real-scripts3.log; \
	  tail -1 .real-scripts3.log | grep -q " 0 failed$$"; \
	else echo "real scripts: none at $(REAL_SCRIPTS3) (set REAL_SCRIPTS3=...): skipped"; fi

# trl_sdpo is TRL's own training on the CPU (a first-contact trainer): over 12 minutes alone here, near the runner's
# default 900 s while it shares the cores with make test's other parts
test-scripts4:
	@if [ -f $(REAL_SCRIPTS4)/run_all.sh ]; then \
	  RC_TIMEOUT=$${RC_TIMEOUT:-1800} PY=$(abspath $(PY)) bash $(REAL_SCRIPTS4)/run_all.sh $(SCRIPTS4_VENV) \
	  | tee .real-scripts4.log; \
	  tail -1 .real-scripts4.log | grep -q " 0 failed$$"; \
	else echo "real scripts: none at $(REAL_SCRIPTS4) (set REAL_SCRIPTS4=...): skipped"; fi

test-scripts5:
	@if [ -f $(REAL_SCRIPTS5)/run_all.sh ]; then \
	  PY=$(abspath $(PY)) bash $(REAL_SCRIPTS5)/run_all.sh $(SCRIPTS5) | tee .real-scripts5.log; \
	  tail -1 .real-scripts5.log | grep -q " 0 failed$$"; \
	else echo "real scripts: none at $(REAL_SCRIPTS5) (set REAL_SCRIPTS5=...): skipped"; fi

test-scripts4-vllm:
	@if [ -f $(REAL_SCRIPTS4)/run_all.sh ]; then \
	  PY=$(abspath $(PY)) PY_VLLM=$(abspath .venv-vllm/bin/python) bash $(REAL_SCRIPTS4)/run_all.sh $(SCRIPTS4_VLLM) \
	  | tee .real-scripts4-vllm.log; tail -1 .real-scripts4-vllm.log | grep -q " 0 failed$$"; \
	else echo "real scripts: none at $(REAL_SCRIPTS4) (set REAL_SCRIPTS4=...): skipped"; fi

test-scripts2:
	@if [ -f $(REAL_SCRIPTS2)/run_all.sh ]; then \
	  PY=$(abspath $(PY)) bash $(REAL_SCRIPTS2)/run_all.sh $(SCRIPTS2_VENV) | tee .real-scripts2.log; \
	  tail -1 .real-scripts2.log | grep -q " 0 failed$$"; \
	  PY=$(abspath .venv-vllm/bin/python) bash $(REAL_SCRIPTS2)/run_all.sh $(SCRIPTS2_VLLM) | tee .real-scripts2.log; \
	  tail -1 .real-scripts2.log | grep -q " 0 failed$$"; \
	else echo "real scripts: none at $(REAL_SCRIPTS2) (set REAL_SCRIPTS2=...): skipped"; fi

test-scripts:
	@if [ -f $(REAL_SCRIPTS)/run_all.sh ]; then \
	  PY=$(abspath .venv-vllm/bin/python) bash $(REAL_SCRIPTS)/run_all.sh | tee .real-scripts.log; \
	  tail -1 .real-scripts.log | grep -q " 0 failed$$"; \
	else echo "real scripts: none at $(REAL_SCRIPTS) (set REAL_SCRIPTS=...): skipped"; fi
	$(MAKE) test-scripts2 test-scripts3 test-scripts4 test-scripts4-vllm test-scripts5

# The lent GPU machine's two carry sets (bench/gpu_wheels.py: slimrl's and Unsloth's, 17 MiB, one carry)
gpu-wheels:
	$(ENVS) --only .gpu-wheels

clean:
	rm -rf .venv* .tools build *.egg-info .gguf-wheels .gpu-wheels
