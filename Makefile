# The README's two commands. Both create (or reuse) the virtual environment in .venv themselves.
#   make demo   the main job end to end on a small embedded default (CPU when there is no GPU)
#   make test   install what is needed and run the tests (make test-all: the slow ones too)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test test-all lint install tokenizer bytecode gpu-report clean

install: $(STAMP)

# Re-installs only when the pins or the package metadata change.
$(STAMP): setup.py pyproject.toml requirements/pinned.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "aogpt needs python >= 3.10")'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements/pinned.txt
	$(PY) -m pip install -q --no-deps mosaicml-streaming==0.13.0
	$(PY) -m pip install -q --no-deps -e .
	touch $@

# GPT-2's BPE ranks for offline use, from the openai-whisper sdist on PyPI (verified by sha256).
tokenizer: $(STAMP)
	$(PY) -m aogpt.data_prep.tokenizer fetch

lint: $(STAMP)
	$(PY) -m ruff check .

# The fast set: the suite without the tests marked slow. test-all adds those (multi-process
# DeepSpeed runs, SLURM, the demo and the findings suite end to end), as CI does (.ci/run). Both
# run one pytest-xdist worker per core (at most 4; each test file stays on one worker, so that
# a file's fixtures are built once; TEST_WORKERS=0 runs them in this process) and end with the
# slowest tests, so that growth is seen where it happens.
TEST_WORKERS ?= auto
DURATIONS := --durations=25
PYTEST := $(PY) -m pytest -n $(TEST_WORKERS) --maxprocesses 4 --dist loadfile $(DURATIONS)

test: $(STAMP) tokenizer lint bytecode
	$(PYTEST) -m "not slow"

test-all: $(STAMP) tokenizer lint bytecode
	$(PYTEST)

# The project's own modules as bytecode, as pip compiles an installed package's (an editable
# install is not compiled). Where PYTHONDONTWRITEBYTECODE is set, as CI containers often have it,
# Python never writes them itself, and each of the suite's hundreds of processes would compile
# every module it imports again: ~0.5 s of CPU for trainer/main.py's. Only changed files are
# compiled again; the files go to __pycache__/ (git-ignored).
PY_FOLDERS := aogpt model data_prep trainer benchmarks tools experiments tests
bytecode: $(STAMP)
	$(PY) -m compileall -q -j 0 $(PY_FOLDERS)

demo: $(STAMP) tokenizer bytecode
	$(PY) tools/demo.py

# Every GPU check and measurement -> docs/gpu-report.md, in one 10-minute device call (the plan:
# python benchmarks/gpu_report.py --dry-run). PAPER: the paper's code for the side-by-side, a
# git-ignored folder of its files (the report says how to make it). REPORT_FLAGS=--merge measures
# what an earlier call left out. On the lent GPU machine, which has no network for the virtual
# environment: make gpu-report PY=python3
PAPER ?= .paper
REPORT_FLAGS ?=
gpu-report: $(if $(filter $(VENV)/bin/python,$(PY)),$(STAMP) tokenizer)
	$(PY) benchmarks/gpu_report.py --paper $(PAPER) $(REPORT_FLAGS)

clean:
	rm -rf $(VENV) build *.egg-info
