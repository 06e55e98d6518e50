# The two commands a new user needs: `make demo` and `make test`. Each sets itself up.
.PHONY: setup demo test clean
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/demo.yaml
DATA ?=
QUICK ?=

setup:
	bash scripts/setup.sh

demo: setup
	$(PY) scripts/demo.py --config $(CONFIG) $(if $(DATA),--data $(DATA)) $(if $(QUICK),--quick)

test: setup
	$(PY) -m pytest -q --durations=30 $(PYTEST_ARGS)

clean:
	rm -rf runs .pytest_cache
