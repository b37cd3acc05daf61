//go:build pipetrain_cuda

package main

// The cuda:N device kind (docs/gpu.md).
import _ "github.com/pipetrain/pipetrain/compute/gpu/cuda"
