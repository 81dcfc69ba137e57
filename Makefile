# The README's two commands. Both create .venv when it is missing and install latecast
# (editable, with the dev extras) into it; pip takes torch/torchvision from the
# machine's local wheel store where one is configured.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.latecast-installed

.PHONY: demo test gpu-check clean

$(PY):
	$(PYTHON) -m venv $(VENV)

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/latecast train

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest

# On a GPU machine with torch, torchvision, matplotlib and pytest already installed and
# no network: runs from the checkout, installs nothing.
gpu-check:
	bash benchmarks/gpu_check.sh

clean:
	rm -rf $(VENV) runs gpu-results .pytest_cache .hypothesis
