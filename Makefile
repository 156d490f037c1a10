# The two commands of the README. Both create .venv on first use (torch's local CPU build first,
# so pip never resolves a multi-GB CUDA wheel), then run.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: train test test-slow setup clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	$(VENV)/bin/grpoflow train $(ARGS)

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest tests -m "not slow"

test-slow: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest tests -m slow

clean:
	rm -rf $(VENV) runs .pytest_cache
