# Two commands for a fresh clone: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
JOBS ?= 2

.PHONY: install demo test bench clean report

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt torch==2.13.0
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	touch $(STAMP)

# one thread, as README's table was made: the last digits of a float sum depend on the thread count
demo: $(STAMP)
	OMP_NUM_THREADS=1 $(VENV)/bin/ovq-cl demo

test: $(STAMP)
	$(PY) -m pytest -q -n $(JOBS)

# one study of experiments/studies/: its sweeps, then RESULTS.md (e.g. make study-icr_long)
study-%: $(STAMP)
	$(VENV)/bin/ovq-cl study $*

report: $(STAMP)
	$(VENV)/bin/ovq-cl report

clean:
	rm -rf $(VENV) mlruns.db mlruns outputs
