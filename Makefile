# ffdl: `make demo` runs the platform's main job on the embedded default; `make test` runs the suite.
# Both set up everything they need on a fresh machine (Debian packages, a virtual environment).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
APT_PACKAGES := etcd-server mosquitto mosquitto-clients tini chromium
PYTEST_ARGS ?=

.PHONY: demo test lint typecheck services schemas clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev,examples]'
	touch $(STAMP)

services:
	@missing=""; \
	command -v etcd >/dev/null || missing="$$missing etcd-server"; \
	[ -x /usr/sbin/mosquitto ] || missing="$$missing mosquitto"; \
	command -v mosquitto_sub >/dev/null || missing="$$missing mosquitto-clients"; \
	command -v tini >/dev/null || missing="$$missing tini"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

demo: $(STAMP)
	$(BIN)/pip install --quiet --no-deps -e .
	$(BIN)/ffdl demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy -p ffdl

test: $(STAMP) services
	$(BIN)/pip install --quiet -e '.[dev,examples,test]'
	$(BIN)/ruff check .
	$(BIN)/mypy -p ffdl
	$(BIN)/pytest -q $(PYTEST_ARGS)

schemas: $(STAMP)
	$(BIN)/python -m ffdl.events.schema_export

clean:
	rm -rf $(VENV) build .ffdl .pytest_cache .mypy_cache .ruff_cache .hypothesis
