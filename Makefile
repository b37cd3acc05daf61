# pipetrain: two commands do everything on a fresh Debian machine with Go:
#   make demo   installs what is missing, builds, trains the default 4-stage config
#   make test   installs what is missing, runs every test
SHELL := /bin/bash
BIN := bin/pipetrain
# pipetrain version prints it: the source revision, marked when it has changes.
VERSION := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
CONFIG ?= configs/fmnist-mlp-4stage.yaml
RUN_DIR ?= runs/demo
APT_PACKAGES := libopenblas-dev dataset-fashion-mnist

.PHONY: all deps build demo reference test vet race fuzz bench bench-schedules clean

all: build

# Debian packages: OpenBLAS for the matrix kernels, Fashion-MNIST for the data.
deps:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing" $$missing; \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
	go mod download

build: deps
	go build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/pipetrain

demo: build
	$(BIN) launch --config $(CONFIG) --run-dir $(RUN_DIR)
	$(BIN) profile $(RUN_DIR)

reference: build
	$(BIN) reference --pipeline-threads --config $(CONFIG) --run-dir runs/reference

vet:
	go vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# The race detector covers the packages with goroutines of their own.
race:
	go test -race -count=1 ./transport/ ./launcher/

# Each fuzz target runs for FUZZTIME (go test fuzzes one target per run). Seeds
# are in <package>/testdata/fuzz/<target>/, where go test also writes a failing
# input. A failed run is run once more: go test -fuzz can fail without a failing
# input ("context deadline exceeded") when -fuzztime ends while a worker is busy,
# while a real failing input, now in testdata, fails the second run at once.
FUZZTIME ?= 10s
fuzz_target = go test -run '^$$' -fuzz '^$(1)$$' -fuzztime $(FUZZTIME) ./$(2)/
fuzz:
	$(call fuzz_target,FuzzTensorUnmarshal,transport) || $(call fuzz_target,FuzzTensorUnmarshal,transport)
	$(call fuzz_target,FuzzHandshake,transport) || $(call fuzz_target,FuzzHandshake,transport)
	$(call fuzz_target,FuzzConfigLoad,configs) || $(call fuzz_target,FuzzConfigLoad,configs)

test: deps vet race fuzz
	go test -count=1 -timeout 20m ./...
	# The kernels' Go loops, which machines without AVX2 run, give the same bits.
	go test -count=1 -tags nosimd ./models/ ./engine/

# Go benchmarks with allocation counts, then the measured report docs/benchmarks.md
# (compute, transport, schedules, end to end, where a step goes, against PyTorch; about 20 minutes on 2 cores). BENCH_FLAGS=-quick for a smoke run.
# PyTorch, measured beside pipetrain in the suite's pytorch section.
BENCH_APT_PACKAGES := python3-torch

bench: build
	@missing=$$(for p in $(BENCH_APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing" $$missing; \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi
	go test -run '^$$' -bench . -benchmem -benchtime 2s ./transport/ ./engine/
	go run ./bench/suite -bin $(BIN) -out docs/benchmarks.md $(BENCH_FLAGS)

# Measured against simulated bubble and throughput per schedule: docs/schedules-benchmark.md.
bench-schedules: build
	go run ./bench/schedules -bin $(BIN) -out docs/schedules-benchmark.md

clean:
	rm -rf bin runs
