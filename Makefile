# The two commands a new user needs: `make demo` and `make test`. Each sets itself up.
.PHONY: setup demo test clean
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/demo.yaml
DATA ?=
QUICK ?=
# Two pytest-xdist workers: the suite waits on model loads and servers much of the time, so two
# share this 2-core machine well; more would need more RAM than 24 GB for their vLLM engines.
TEST_WORKERS ?= 2

setup:
	bash scripts/setup.sh

demo: setup
	$(PY) scripts/demo.py --config $(CONFIG) $(if $(DATA),--data $(DATA)) $(if $(QUICK),--quick)

test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=30 $(PYTEST_ARGS)

clean:
	rm -rf runs .pytest_cache
