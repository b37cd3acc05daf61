# pipetrain: two commands do everything on a fresh Debian machine with Go:
#   make demo   installs what is missing, builds, trains the default 4-stage config
#   make test   installs what is missing, runs every test
SHELL := /bin/bash
BIN := bin/pipetrain
CONFIG ?= configs/fmnist-mlp-4stage.yaml
RUN_DIR ?= runs/demo
APT_PACKAGES := libopenblas-dev dataset-fashion-mnist

.PHONY: all deps build demo reference test vet race bench bench-schedules clean

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
	go build -o $(BIN) ./cmd/pipetrain

demo: build
	$(BIN) launch --config $(CONFIG) --run-dir $(RUN_DIR)
	$(BIN) profile $(RUN_DIR)

reference: build
	$(BIN) reference --config $(CONFIG) --run-dir runs/reference

vet:
	go vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

# The race detector covers the packages with goroutines of their own.
race:
	go test -race -count=1 ./transport/ ./launcher/

test: deps vet race
	go test -count=1 -timeout 20m ./...

bench: deps
	go test -run '^$$' -bench . -benchtime 2s ./transport/ ./stages/

# Measured against simulated bubble and throughput per schedule: docs/schedules-benchmark.md.
bench-schedules: build
	go run ./bench/schedules -bin $(BIN) -out docs/schedules-benchmark.md

clean:
	rm -rf bin runs
