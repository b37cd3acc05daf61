# pipetrain: two commands do everything on a fresh Debian machine with Go:
#   make demo   installs what is missing, builds, trains the default 4-stage config
#   make test   installs what is missing, runs every test
SHELL := /bin/bash
BIN := bin/pipetrain
# pipetrain version prints it: the source revision, marked when it has changes.
VERSION := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
CONFIG ?= configs/fmnist-mlp-4stage.yaml
RUN_DIR ?= runs/demo
APT_PACKAGES := libopenblas0 dataset-fashion-mnist

.PHONY: all deps build demo reference test test-blas vet race fuzz bench bench-schedules release clean cuda-deps ptx vet-cuda gpu-check

all: build

# Debian packages: OpenBLAS for the matrix kernels (loaded at run time; the
# build needs no C library), Fashion-MNIST for the data.
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
	$(BIN) launch --force --config $(CONFIG) --run-dir $(RUN_DIR)
	$(BIN) profile $(RUN_DIR)

reference: build
	$(BIN) reference --force --pipeline-threads --config $(CONFIG) --run-dir runs/reference

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
	$(call fuzz_target,FuzzRingStreamFrame,transport) || $(call fuzz_target,FuzzRingStreamFrame,transport)
	$(call fuzz_target,FuzzConfigLoad,configs) || $(call fuzz_target,FuzzConfigLoad,configs)
	$(call fuzz_target,FuzzRendezvousMessage,cluster) || $(call fuzz_target,FuzzRendezvousMessage,cluster)

# The interop tests (stages/torch_test.go) hold pipetrain's weights against PyTorch.
# data/bpe_test.go holds the BPE tokenizer to GPT-2's encoder, which needs Python's regex.
test: APT_PACKAGES += python3-torch python3-regex
test: deps vet race fuzz test-blas
	go test -count=1 -timeout 20m ./...
	# The kernels' Go loops, which machines without AVX2 run, give the same bits.
	go test -count=1 -tags nosimd ./models/ ./engine/ ./optim/ ./transport/

# The binary go install builds (no cgo) trains bit-identically to its own
# reference with OpenBLAS loaded at run time, and with gonum's kernels forced.
EQUIVALENCE := 'EqualsReference|TrainsLikeReference|LaunchEqualReference|WithoutOpenBLAS'
test-blas:
	CGO_ENABLED=0 go build -o /dev/null ./cmd/pipetrain
	CGO_ENABLED=0 go test -count=1 ./internal/blas/
	CGO_ENABLED=0 PIPETRAIN_BLAS=openblas go test -count=1 -run $(EQUIVALENCE) ./stages/ ./e2e/
	CGO_ENABLED=0 PIPETRAIN_BLAS=gonum go test -count=1 -run $(EQUIVALENCE) ./stages/ ./e2e/

# Go benchmarks with allocation counts, then the measured report docs/benchmarks.md
# (compute, transport, schedules, end to end, where a step goes, against PyTorch; about 12 minutes on 2 cores). BENCH_FLAGS=-quick for a smoke run;
# BENCH_FLAGS='-sections compute,pytorch -out /tmp/b.md' runs some sections alone (the file written has only those: merge by hand).
# The compute section times sgemm under each OpenBLAS kernel set the CPU runs, in child processes; PyTorch runs as installed and with pipetrain's kernel set.
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

# Measured against simulated bubble and throughput per schedule: docs/schedules-benchmark.md
# (about 9 minutes on 2 cores; the 4-stage pinned setup runs only with 4 cores or more).
bench-schedules: build
	go run ./bench/schedules -bin $(BIN) -out docs/schedules-benchmark.md

# CUDA (docs/gpu.md): the cuda:N device kind is built with -tags pipetrain_cuda
# (not gorgonia's own cuda tag, which would put the cpu engine on its CUDA
# machine), with cgo against Debian's CUDA 11.8 headers and libcuda, which
# scripts/cuda-deps.sh installs; gorgonia/cu's own flags look in /usr/local/cuda.
CUDA_TAGS := pipetrain_cuda
CUDA_ENV := CGO_ENABLED=1 CGO_CFLAGS=-I/usr/include CGO_LDFLAGS=-L/usr/lib/x86_64-linux-gnu

cuda-deps:
	scripts/cuda-deps.sh

# The kernels' PTX, embedded by the cuda build: commit it with kernels.cu.
ptx: cuda-deps
	go generate ./compute/gpu/cuda/

# The tagged build compiles and vets here; its tests skip ("no CUDA device")
# but for the PTX check, which nvcc runs here.
vet-cuda: cuda-deps
	$(CUDA_ENV) go vet -tags $(CUDA_TAGS) ./compute/... ./cmd/pipetrain/
	$(CUDA_ENV) go build -tags $(CUDA_TAGS) -o /dev/null ./cmd/pipetrain
	$(CUDA_ENV) go test -count=1 -tags $(CUDA_TAGS) ./compute/gpu/cuda/

# Everything the GPU machine (no Go there) needs, in GPU_CHECK_DIR, under
# 64 MiB: the tagged binary and test binary, the check script and the
# training run's config and data. There: ./run.sh OUT.
GPU_CHECK_DIR ?= bin/gpu-check
gpu-check: cuda-deps deps
	rm -rf $(GPU_CHECK_DIR) && mkdir -p $(GPU_CHECK_DIR)
	$(CUDA_ENV) go build -tags $(CUDA_TAGS) -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $(GPU_CHECK_DIR)/pipetrain ./cmd/pipetrain
	$(CUDA_ENV) go test -c -tags $(CUDA_TAGS) -trimpath -ldflags "-s -w" -o $(GPU_CHECK_DIR)/cuda.test ./compute/gpu/cuda/
	cp scripts/gpu-check/run.sh scripts/gpu-check/mlp.yaml /usr/share/datasets/fashion-mnist/t10k-* $(GPU_CHECK_DIR)/
	@size=$$(du -sm $(GPU_CHECK_DIR) | cut -f1); echo "$(GPU_CHECK_DIR): $$size MiB"; [ $$size -lt 64 ] || { echo "over 64 MiB"; exit 1; }

# Binaries for Linux on amd64 and arm64, without cgo: each loads OpenBLAS at
# run time where the system has it. -tags nodlopen gives a fully static one.
RELEASE_PLATFORMS := linux/amd64 linux/arm64
release:
	@for p in $(RELEASE_PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; out=dist/pipetrain-$(VERSION)-$$os-$$arch; \
		echo "building $$out"; \
		CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch go build -trimpath -ldflags "-s -w -X main.version=$(VERSION)" -o $$out ./cmd/pipetrain || exit 1; \
	done
	cd dist && sha256sum pipetrain-$(VERSION)-* > SHA256SUMS-$(VERSION)

clean:
	rm -rf bin runs dist
