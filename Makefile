# Two commands for a newcomer: `make run` executes the series, `make test` tests it.
# Both create .venv and install the pinned dependencies first (once; again when they change).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9]*.ipynb))

.PHONY: install run test lab refresh benchmark clean-traces

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip
	$(BIN)/python -m pip install -r requirements.txt
	$(BIN)/python -m pip install --no-deps --no-build-isolation -e .
	touch $(STAMP)

# Execute every notebook headless, in order, into build/ (the committed notebooks stay untouched).
run: install
	@mkdir -p build/notebooks build/html
	@for nb in $(NOTEBOOKS); do \
	  echo "== executing $$nb"; \
	  $(BIN)/jupyter nbconvert --to notebook --execute --ExecutePreprocessor.timeout=900 \
	    --output-dir build/notebooks "$$nb" || exit 1; \
	done
	$(BIN)/jupyter nbconvert --to html --output-dir build/html build/notebooks/*.ipynb
	@echo ""
	@echo "Executed notebooks: build/notebooks/   HTML: build/html/"
	@echo "Traces of every run: traces/<experiment>/<run-id>/ (manifest: run.json)"

# Unit tests of helpers/ and every notebook under nbval.
test: install
	$(BIN)/python -m pytest -p no:cacheprovider tests notebooks \
	  --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
	  --nbval-cell-timeout=600

# Open the series in JupyterLab.
lab: install
	$(BIN)/jupyter lab notebooks

# Maintainers: re-execute the notebooks in place so their committed outputs are fresh.
refresh: install
	rm -f notebooks/*.py  # the scripts the notebooks write: fresh, so outputs say "Writing"
	@for nb in $(NOTEBOOKS); do \
	  echo "== refreshing $$nb"; \
	  $(BIN)/jupyter nbconvert --to notebook --execute --inplace \
	    --ExecutePreprocessor.timeout=900 "$$nb" || exit 1; \
	done

benchmark: install
	$(BIN)/python -m pip install -r benchmarks/requirements.txt
	$(BIN)/python benchmarks/bench_traces.py

clean-traces:
	find traces -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
