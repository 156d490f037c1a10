# The two commands of the README. Both create .venv on first use (torch's local CPU build first,
# so pip never resolves a multi-GB CUDA wheel), then run.
PY ?= python3
VENV := .venv
STAMP := $(VENV)/.installed

.PHONY: train warm-start test test-slow test-faults test-hostile test-browser typecheck lint docs setup clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(VENV)/bin/pip install -q torch==2.13.0
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	$(VENV)/bin/grpoflow train $(ARGS)

# rebuild the shipped warm start that `make train` starts from (grpoflow/models/warm_start.py says why it ships)
warm-start: $(STAMP)
	$(VENV)/bin/grpoflow sft model.path=builtin:tiny-4m sft.steps=900 sft.until_accuracy=0.35 \
	  trainer.output_dir=runs/warm-start
	$(VENV)/bin/python -m grpoflow.models.warm_start runs/warm-start/sft_model

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest tests -m "not slow and not faults and not hostile and not browser" --durations=20

test-slow: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest tests -m slow --durations=0

# fault injection: signals, storage faults, NaN, dead reward workers, Ray nodes and engines that die (.ci/faults_stage)
test-faults: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest tests/faults -m faults

# a hostile or careless user: sandbox escapes, damaged or shared run folders, bad callbacks (.ci/hostile_stage)
test-hostile: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest tests/hostile -m hostile

# grpoflow view in headless Chromium (Debian's chromium; .ci/viewer_stage installs it and the extras)
test-browser: $(STAMP)
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest tests/browser -m browser

# mypy on the package (must pass), and on tests/typecheck/wrong_calls.py, whose three wrong worker calls it must catch
typecheck: $(STAMP)
	$(VENV)/bin/python -m mypy grpoflow
	@out=$$($(VENV)/bin/python -m mypy tests/typecheck/wrong_calls.py 2>&1); \
	  n=$$(printf '%s\n' "$$out" | grep -c ': error:'); \
	  if [ "$$n" -ne 3 ]; then printf '%s\n' "$$out"; echo "typecheck: expected 3 errors in wrong_calls.py, got $$n"; exit 1; fi; \
	  echo "typecheck: the 3 wrong worker calls in tests/typecheck/wrong_calls.py are caught"

# ruff with the rules in pyproject.toml ([tool.ruff]): pyflakes, pycodestyle at 120 columns, import order, bugbear
lint: $(STAMP)
	$(VENV)/bin/ruff check .

# the documentation site (mkdocs.yml: docs/ and the API page of the extension points) into site/, with --strict: a
# broken link, a page missing from the nav or a docstring mkdocstrings cannot render fails; installs the `docs` extra
# into .venv on first use
docs: $(STAMP)
	$(VENV)/bin/python -c "import mkdocs, material, mkdocstrings_handlers.python" 2>/dev/null \
	  || $(VENV)/bin/pip install -q -e '.[docs]'
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) runs .pytest_cache site
