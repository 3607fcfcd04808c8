# ffdl: `make demo` runs the platform's main job on the embedded default; `make test` runs the suite.
# Both set up everything they need on a fresh machine (Debian packages, a virtual environment).

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
APT_PACKAGES := etcd-server mosquitto mosquitto-clients tini chromium iproute2 bubblewrap libseccomp2
PYTEST_ARGS ?=
# Test processes (pytest-xdist), each taking whole files: the end-to-end and integration tests mostly
# wait on learner processes and services, so two cut the suite's time by over a third even on two CPUs
# (986 s serially, 560 to 634 s in two, on a 2-CPU machine).
TEST_WORKERS ?= 2
# The extras the venv gets (the project itself always, editable): the suite needs the tools (dev),
# the frameworks it runs real jobs of (test) and the example learners (examples); `make demo` needs
# only the examples.
EXTRAS ?= dev,test,examples
# Every package of the project and all its extras, pinned: what the venv and the image install
# (as constraints: each installs only what it needs, at the locked version). `make lock` writes it.
LOCK := requirements.lock
# The planner's modules compiled with mypyc (src/ffdl/native.py): built again whenever a source they
# rest on changes; until then, and where no build is, the sources run.
NATIVE := src/ffdl/compiled/manifest.json

.PHONY: demo test lint typecheck services schemas lock clean native

$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[$(EXTRAS)]'
	touch $(STAMP)

# Pin again after changing pyproject.toml's dependencies (needs only a Python and the package index).
lock:
	[ -x $(BIN)/uv ] || { $(PYTHON) -m venv $(VENV) && $(BIN)/pip install --quiet uv; }
	$(BIN)/uv pip compile pyproject.toml --all-extras --universal --python-version 3.11 --no-header --quiet -o $(LOCK)

$(NATIVE): $(STAMP) src/ffdl/native.py $(shell find src/ffdl/core src/ffdl/events -name '*.py')
	$(BIN)/python -c 'from ffdl import native; print("compiled the planner into", native.build())'

native: $(NATIVE)

services:
	@missing=""; \
	command -v etcd >/dev/null || missing="$$missing etcd-server"; \
	[ -x /usr/sbin/mosquitto ] || missing="$$missing mosquitto"; \
	command -v mosquitto_sub >/dev/null || missing="$$missing mosquitto-clients"; \
	command -v tini >/dev/null || missing="$$missing tini"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	/sbin/ldconfig -p 2>/dev/null | grep -q 'libseccomp\.so\.2' || missing="$$missing libseccomp2"; \
	command -v ip >/dev/null || missing="$$missing iproute2"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	fi

demo: EXTRAS = examples
demo: $(STAMP)
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[$(EXTRAS)]'
	$(BIN)/ffdl demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy -p ffdl

test: $(STAMP) services
	$(BIN)/pip install --quiet -c $(LOCK) -e '.[$(EXTRAS)]'
	$(MAKE) native
	$(BIN)/ruff check .
	$(BIN)/mypy -p ffdl
	$(BIN)/pytest -q -n $(TEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

schemas: $(STAMP)
	$(BIN)/python -m ffdl.events.schema_export

clean:
	rm -rf $(VENV) build .ffdl .pytest_cache .mypy_cache .ruff_cache .hypothesis src/ffdl/compiled
