# Two commands on a fresh machine: `make lab` and `make test`. Both set up .venv first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup lab test test-fast clean

setup: $(STAMP)

# Re-install only when the pins or the package metadata change, so repeat runs are quick.
$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -e .
	$(PY) -m ipykernel install --sys-prefix --name python3 --display-name "Python 3 (course)" >/dev/null
	@touch $(STAMP)

# LAB_ARGS passes extra options, e.g. make lab LAB_ARGS="--no-browser --port 8899".
# JupyterLab refuses to run as root unless told; containers and CI boxes often are root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
lab: setup
	$(VENV)/bin/jupyter lab --notebook-dir=notebooks $(ROOT_FLAG) $(LAB_ARGS)

# Under CI the browser test must run, so Chromium (Debian's package) is installed if missing.
test: setup
	@if [ "$${CI:-}" = "true" ]; then bash scripts/ensure-chromium.sh; fi
	$(PY) -m pytest

test-fast: setup
	$(PY) -m pytest -m "not browser and not slow"

clean:
	rm -rf $(VENV) build *.egg-info
