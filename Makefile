# gpubatch: `make demo` and `make test` do all set-up themselves (a .venv with the project installed).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed-stamp
OUT     := out/demo

.DEFAULT_GOAL := help
.PHONY: help demo test lint format gpu-test bench sample-data clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*##' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

# The GPU packages where nvidia-smi shows a GPU: the extra of the driver's CUDA (cu12 for 12.x, cu13 from 13)
COMMA      := ,
CUDA_MAJOR := $(shell nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -n 1)
GPU_EXTRA  := $(if $(CUDA_MAJOR),$(if $(filter 12,$(CUDA_MAJOR)),$(COMMA)cu12,$(COMMA)cu13))

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	PYTHONWARNINGS=ignore $(BIN)/python -m pip install -q -e '.[dev,ray,s3,http$(GPU_EXTRA)]'  # (setuptools' notes on editable installs)
	@touch $(STAMP)

demo: $(STAMP)  ## run the main job on sample_data/ (GPU when usable, else CPU)
	rm -rf $(OUT) && mkdir -p $(OUT)
	$(BIN)/gpubatch info sample_data/imagenet
	$(BIN)/gpubatch convert sample_data/imagenet $(OUT)/imagenet-webdataset --to webdataset --device auto
	$(BIN)/gpubatch convert sample_data/imagenet $(OUT)/imagenet-tfrecord --to tfrecord \
		--resize-shorter 256 --center-crop 224 --quality 90 --shard-size 32 --device auto
	$(BIN)/gpubatch convert sample_data/coco $(OUT)/coco-lmdb --to lmdb --device auto
	$(BIN)/gpubatch convert sample_data/coco $(OUT)/coco-tfrecord --to tfrecord --resize-shorter 128 --device auto
	$(BIN)/gpubatch convert sample_data/audio $(OUT)/audio-logmel --to webdataset --sample-rate 16000 --mono \
		--duration 1 --features "log-mel(n_mels=80)" --device auto
	$(BIN)/gpubatch info $(OUT)/imagenet-tfrecord --verify
	$(BIN)/gpubatch info $(OUT)/coco-tfrecord
	$(BIN)/gpubatch info sample_data/audio

test: $(STAMP)  ## run the test suite (GPU tests skip without a GPU)
	$(BIN)/python -m pytest -q

lint: $(STAMP)  ## ruff lint
	$(BIN)/ruff check gpubatch tests benchmarks sample_data

format: $(STAMP)  ## ruff format
	$(BIN)/ruff format gpubatch tests benchmarks sample_data

# On the lent GPU machine: its own python3 (no venv, no pip), packages from the carried .gpu-site.
gpu-test:  ## GPU tests + a GPU convert, with the system python3 (run on the GPU machine)
	python3 -m pytest -q -m gpu -p no:cacheprovider --durations=12 tests
	python3 -m pytest -q -p no:cacheprovider tests/engine/test_nvimgcodec_c.py
	rm -rf /tmp/gpubatch-gpu-demo
	python3 -m gpubatch convert sample_data/imagenet /tmp/gpubatch-gpu-demo --to webdataset \
		--resize-shorter 256 --center-crop 224 --quality 90 --device gpu
	rm -rf /tmp/gpubatch-gpu-augment
	python3 -m gpubatch augment sample_data/coco /tmp/gpubatch-gpu-augment --preset ssd --copies 2 --device gpu
	rm -rf /tmp/gpubatch-gpu-video
	python3 -m gpubatch convert sample_data/video /tmp/gpubatch-gpu-video --to webdataset --frames every:4 \
		--resize-shorter 64 --device gpu
	rm -rf /tmp/gpubatch-gpu-audio
	python3 -m gpubatch convert sample_data/audio /tmp/gpubatch-gpu-audio --to webdataset --sample-rate 16000 \
		--mono --duration 1 --features "log-mel(n_mels=80)" --device gpu
	rm -rf /tmp/gpubatch-gpu-gpus
	python3 -m gpubatch convert sample_data/imagenet /tmp/gpubatch-gpu-gpus --to tfrecord --resize-shorter 128 \
		--shard-size 16 --gpus all

bench:  ## engine + augment benchmarks: GPU chains, transcode, CPU path, DataLoader (GPU machine, system python3)
	python3 benchmarks/bench_engine.py --images 4096 --json benchmarks/last-run.json
	python3 benchmarks/bench_augment.py --images 4096 --preset resnet50-train --copies 2 --json benchmarks/last-augment.json

sample-data: $(STAMP)  ## regenerate sample_data/ (deterministic)
	$(BIN)/python sample_data/make_sample_data.py

clean:  ## remove the venv and outputs
	rm -rf $(VENV) out .pytest_cache .ruff_cache
