# The two commands a new user needs: `make demo` and `make test`. Each sets itself up.
.PHONY: setup demo test clean
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= configs/demo.yaml
DATA ?=
QUICK ?=
# Two pytest-xdist workers keep this 2-core machine's cores busy (docs/testing.md: 50 -> 30 minutes);
# more would not run faster, and their vLLM engines would need more than its 24 GB.
TEST_WORKERS ?= 2

setup:
	bash scripts/setup.sh

demo: setup
	$(PY) scripts/demo.py --config $(CONFIG) $(if $(DATA),--data $(DATA)) $(if $(QUICK),--quick)

test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=30 $(PYTEST_ARGS)

clean:
	rm -rf runs .pytest_cache
