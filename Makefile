# The README's two commands. Both create .venv when it is missing and install latecast
# (editable, with the dev extras) into it; pip takes torch/torchvision from the
# machine's local wheel store where one is configured.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.latecast-installed

.PHONY: demo test docs gpu-check shared-carry clean

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
	$(PY) -m pytest -n auto --maxprocesses 4 --dist worksteal

# The site (docs/, its API reference from the docstrings) into site/, warnings as errors
# (NO_MKDOCS_2_WARNING: without the theme's banner about MkDocs 2).
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# On a GPU machine with torch, torchvision, matplotlib and pytest already installed and
# no network: runs from the checkout, installs nothing.
gpu-check:
	bash benchmarks/gpu_check.sh

# What gpu-check's side by side with airbench reads, copied into the checkout (only the
# checkout travels to the GPU machine; send this ignored folder along with it): the CIFAR-10
# JPEG copy and the airbench sdist from ../shared, checked against their SHA-256 sums.
SHARED ?= ../shared
CARRY := shared-carry
shared-carry:
	mkdir -p $(CARRY)
	cp -f $(SHARED)/datasets/cifar10-jpg/cifar10-jpg.tar.gz $(SHARED)/peers/airbench-0.1.8.tar.gz $(CARRY)/
	cat $(SHARED)/datasets/cifar10-jpg/SHA256SUMS $(SHARED)/peers/SHA256SUMS > $(CARRY)/SHA256SUMS
	cd $(CARRY) && sha256sum -c SHA256SUMS
	exclude=$$(git rev-parse --git-path info/exclude) && mkdir -p "$$(dirname "$$exclude")" && \
		{ grep -qxF '/$(CARRY)/' "$$exclude" 2>/dev/null || echo '/$(CARRY)/' >> "$$exclude"; }

clean:
	rm -rf $(VENV) runs gpu-results site .pytest_cache .hypothesis
