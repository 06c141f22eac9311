# Two commands for a newcomer: `make run` executes the series, `make test` tests it.
# Both create .venv and install the pinned dependencies first (once; again when they change).
#
# Install options (see docs/INSTRUCTORS.md):
#   make install TORCH=cpu            PyTorch's CPU-only wheels, about a tenth of the download
#   make install WHEELHOUSE=wheels    no network: everything from a folder made by `make wheelhouse`
# Recorded mode (replay the runs shipped in recordings/ instead of launching):
#   make lab RECORDED=1

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
NOTEBOOKS := $(sort $(wildcard notebooks/[0-9]*.ipynb))
SOLUTIONS := $(sort $(wildcard solutions/[0-9]*.ipynb))
ANALYSIS_LESSONS := $(filter-out notebooks/01% notebooks/02%,$(NOTEBOOKS))
# The recorded lessons, the longest first (recorded mode, 2 cores: 13 takes 12 s, 06 2 s), so that
# neither process of `make test-recorded` is left with a long one at the end; every other lesson
# follows in its order.
LONGEST_RECORDED := $(foreach n,13 16 15 10 12,$(filter notebooks/$(n)_%,$(ANALYSIS_LESSONS)))
RECORDED_LESSONS := $(LONGEST_RECORDED) $(filter-out $(LONGEST_RECORDED),$(ANALYSIS_LESSONS))
TORCH ?= default
WHEELHOUSE ?=
RECORDED ?=
TORCH_PINS := $(shell grep -E '^(torch|torchvision)==' requirements.txt)
# Kernels started by nbconvert and JupyterLab talk to them over encrypted local sockets
# (ipykernel otherwise warns about plain-text TCP once per notebook).
QUIET_KERNELS := --KernelManager.transport_encryption=auto
# Notebooks run by make show no progress bars: their outputs are committed, or compared.
EXECUTE := PDP_NO_PROGRESS=1 $(BIN)/jupyter nbconvert --to notebook --execute --ExecutePreprocessor.timeout=900 $(QUIET_KERNELS)
# Tests keep their compiled bytecode (a machine that sets PYTHONDONTWRITEBYTECODE would have
# pytest rewrite and compile every test module again in every worker, about 5 s each time).
PYTEST := PDP_NO_PROGRESS=1 PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -p no:cacheprovider
NBVAL := $(PYTEST) --nbval --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg \
	--nbval-cell-timeout=600
# Unit tests and recorded lessons run in JOBS processes at once (pytest-xdist; measured on 2
# cores: 600 s of unit tests in 339 s, the recorded lessons' 60 s in 33 s); the live lessons and
# solutions one at a time, as a learner runs them.
JOBS ?= 2
PARALLEL := -n $(JOBS)
LAB_SETTINGS := $(VENV)/share/jupyter/lab/settings
# JupyterLab's HTML with each figure's alternative text (tools/nbconvert/series).
HTML_TEMPLATE := --TemplateExporter.extra_template_basedirs=tools/nbconvert --template series

.PHONY: install run test test-quick lint test-recorded lab refresh record doctor wheelhouse \
	test-offline benchmark clean-traces gpu-rehearsal site

install: $(STAMP)

$(STAMP): requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
ifneq ($(WHEELHOUSE),)
	$(BIN)/python -m pip install --no-index --find-links $(WHEELHOUSE) -r requirements.txt
else
	$(BIN)/python -m pip install --upgrade pip
ifeq ($(TORCH),cpu)
	$(BIN)/python -m pip install --index-url https://download.pytorch.org/whl/cpu $(TORCH_PINS)
endif
	$(BIN)/python -m pip install -r requirements.txt
endif
	$(BIN)/python -m pip install --no-deps --no-build-isolation -e .
	@# JupyterLab opens without asking about news and updates
	mkdir -p $(LAB_SETTINGS)
	printf '%s\n' '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' \
		> $(LAB_SETTINGS)/overrides.json
	touch $(STAMP)

# Execute every notebook headless, in order, into build/ (the committed notebooks stay untouched);
# one that fails stops at its failing cell, the others still run, and a summary says what failed
# and what to do (exit status 1). One lesson: make run NOTEBOOKS=notebooks/09_....ipynb
run: install
	@mkdir -p build/notebooks build/html
	@PDP_NO_PROGRESS=1 PDP_RECORDED=$(RECORDED) $(BIN)/python tools/run_series.py \
	  --out build/notebooks $(if $(RECORDED),--recorded) $(NOTEBOOKS); status=$$?; \
	$(BIN)/jupyter nbconvert --to html $(HTML_TEMPLATE) --output-dir build/html --log-level WARN \
	  $(addprefix build/notebooks/,$(notdir $(NOTEBOOKS))); \
	echo ""; \
	echo "Executed notebooks: build/notebooks/   HTML: build/html/"; \
	echo "Traces of every run: traces/<experiment>/<run-id>/ (manifest: run.json)"; \
	exit $$status

# Unit tests of helpers/ (the site built and driven in Chromium included; JOBS at once), every
# lesson and every solution under nbval (one at a time), and the analysis lessons again in
# recorded mode; each part names its slowest tests at the end, to show where the time goes.
test: install lint
	$(PYTEST) $(PARALLEL) --durations=15 tests
	PDP_CHECKS_MUST_PASS=1 $(NBVAL) --durations=15 notebooks solutions
	$(MAKE) --no-print-directory test-recorded

# A contributor's quick loop (about 3 minutes on 2 cores: 160 to 186 s on 2026-12-04): lint,
# the unit tests that launch no process (one case of each job in a sweep over the recordings and
# real traces; a test of it that starts a process fails), and the analysis lessons in recorded
# mode. `make test` before a submission.
test-quick: install lint
	$(PYTEST) $(PARALLEL) -m "not slow" tests
	$(MAKE) --no-print-directory test-recorded

# Style: ruff's lint and format on the code and the notebooks (seconds); a contributor's quick
# loop is `make lint` and `pytest -m "not slow" tests`.
lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python tools/clean_notebooks.py --check $(NOTEBOOKS) $(SOLUTIONS)

test-recorded: install
	PDP_RECORDED=1 $(NBVAL) $(PARALLEL) --dist loadfile $(RECORDED_LESSONS)

# The series as a static site in build/site/, from the committed notebooks as committed (never
# executed for it), the solutions, docs/ and the README (tools/site/build.py; about half a minute).
site: install
	$(BIN)/python tools/site/build.py --out build/site

# Open the series in JupyterLab.
lab: install
	PDP_RECORDED=$(RECORDED) $(BIN)/jupyter lab $(QUIET_KERNELS) notebooks

# Maintainers: re-execute the lessons and solutions in place so their committed outputs are fresh.
refresh: install
	rm -f notebooks/*.py solutions/*.py  # the scripts they write: fresh, so outputs say "Writing"
	@for nb in $(NOTEBOOKS) $(SOLUTIONS); do \
	  echo "== refreshing $$nb"; \
	  PDP_CHECKS_MUST_PASS=1 $(EXECUTE) --inplace "$$nb" || exit 1; \
	done
	$(BIN)/python tools/clean_notebooks.py $(NOTEBOOKS) $(SOLUTIONS)

# Maintainers: record the lessons' runs anew into recordings/ (what recorded mode replays), then
# every run the checks of exercises 11.2 and 14.2 can draw. recordings/gpu (`make gpu-rehearsal`,
# made on a GPU machine) is kept.
record: install
	find recordings -mindepth 1 -maxdepth 1 ! -name gpu -exec rm -rf {} + ; rm -f notebooks/*.py
	mkdir -p recordings build/record
	@for nb in $(NOTEBOOKS); do \
	  echo "== recording the runs of $$nb"; \
	  PDP_RECORD=1 $(EXECUTE) --output-dir build/record "$$nb" || exit 1; \
	done
	cd notebooks && PDP_RECORD=1 ../$(BIN)/python ../tools/record_check_runs.py
	du -sh recordings

# Pre-flight check of this machine before a workshop.
doctor: install
	$(BIN)/python -m helpers.doctor

# A folder of every pinned wheel, to install with no network (put it on a USB stick).
wheelhouse:
	$(PYTHON) -m pip download --only-binary=:all: --dest wheelhouse -r requirements.txt
	du -sh wheelhouse

# Maintainers: a fresh virtual environment installed from the wheelhouse alone passes make doctor.
test-offline: wheelhouse
	tests/offline_install.sh wheelhouse

# Benchmarks of the trace layer (minutes; figures in README.md): the loader on 64 ranks of 8 MB,
# then a run of 256 ranks of 32 MB (8 GB of JSON, generated once into $(BIG_RUN)) summarised
# rank by rank (the critical path strung together from each rank's part included), and the
# report command on it and on a lesson's run; the critical path and its replay error on every
# recording and real trace with steps, and on the real NCCL jobs.
BIG_RUN ?= /tmp/pdp-rank-by-rank
benchmark: install
	$(BIN)/python -m pip install -r benchmarks/requirements.txt
	$(BIN)/python benchmarks/critical_path.py
	$(BIN)/python benchmarks/nccl_path_checks.py
	rm -rf build/what-if-pairs  # fresh runs: the record is of runs the model never saw
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/what_if_pairs.py --repeats 5 --runs build/what-if-pairs --record
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/pipeline_cases.py --repeats 3
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/hang_cases.py --cases 24 --out build/hang-cases
	$(BIN)/python benchmarks/bench_traces.py
	$(BIN)/python benchmarks/rank_by_rank.py --ranks 256 --mb-per-rank 32 --folder $(BIG_RUN)
	$(BIN)/python benchmarks/report_big_run.py --ranks 256 --mb-per-rank 32 --folder $(BIG_RUN)

# The series' GPU path on this machine's GPUs (docs/INSTRUCTORS.md: the day before a workshop):
# doctor, lesson 2 on the GPU, lesson 3's script with nccl (and, on one GPU, two gloo ranks
# sharing it), lessons 3, 4 and 9; every trace checked; report in build/gpu-rehearsal.md, runs
# recorded under recordings/gpu/. Without a GPU: one line, exit 0.
gpu-rehearsal: install
	$(BIN)/python -m helpers.rehearsal

clean-traces:
	find traces -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
