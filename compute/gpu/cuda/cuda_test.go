//go:build pipetrain_cuda

package cuda

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/compute/gpu"
	"github.com/pipetrain/pipetrain/compute/gpu/gputest"
	"github.com/pipetrain/pipetrain/models"
)

// device is GPU 0, or a skip where there is none.
func device(t testing.TB) *Backend {
	t.Helper()
	be, err := Open(0)
	if err != nil {
		if strings.HasPrefix(err.Error(), "no CUDA device") {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	t.Logf("%s, cuBLAS %s", be.Name(), be.(*Backend).CublasPath())
	return be.(*Backend)
}

// TestKernels: each CUDA kernel and cuBLAS's product against float64
// references (gputest.CheckKernels, which the fake device passes too).
func TestKernels(t *testing.T) { gputest.CheckKernels(t, device(t)) }

// TestTrainsLikeTheEngine: two MLP chunks on the GPU train as the cpu
// engine does within the float32 tolerances, for every activation,
// backward mode and optimizer.
func TestTrainsLikeTheEngine(t *testing.T) { gputest.CheckTraining(t, device(t)) }

// TestRegistered: the build registers the cuda kind, which opens stages.
func TestRegistered(t *testing.T) {
	d, n, err := compute.Lookup("cuda:0")
	if err != nil || d.Kind() != "cuda" || n != 0 {
		t.Fatalf("Lookup(cuda:0) = %v, %d, %v", d, n, err)
	}
}

// BenchmarkSgemm is cuBLAS's square sgemm alone, in GFLOP/s.
func BenchmarkSgemm(b *testing.B) {
	be := device(b)
	for _, n := range []int{1024, 2048, 4096, 8192} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			bufs := make([]gpu.Buffer, 3)
			for i := range bufs {
				var err error
				if bufs[i], err = be.Alloc(n * n); err != nil {
					b.Fatal(err)
				}
				defer be.Free(bufs[i])
				be.Fill(bufs[i], 0.5)
			}
			one := must(be.Alloc(1))
			defer be.Free(one)
			sync := func() { be.Download(make([]float32, 1), one) } // a copy to the host waits for the products
			sync()
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				if err := be.Gemm(false, false, n, n, n, 1, bufs[0], bufs[1], 0, bufs[2]); err != nil {
					b.Fatal(err)
				}
			}
			sync()
			b.ReportMetric(2*float64(n)*float64(n)*float64(n)*float64(b.N)/time.Since(start).Seconds()/1e9, "GFLOP/s")
		})
	}
}

func must(b gpu.Buffer, err error) gpu.Buffer {
	if err != nil {
		panic(err)
	}
	return b
}

// BenchmarkDenseStage is one Dense layer of width n (n×n weights) as a
// stage computes it: a micro-batch of n rows uploaded, its forward, loss
// and backward (three products of 2n³ flops), in GFLOP/s of those
// products, to hold against BenchmarkSgemm.
func BenchmarkDenseStage(b *testing.B) {
	be := device(b)
	for _, n := range []int{1024, 2048, 4096, 8192} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			m, err := models.Build(models.Spec{Name: "mlp", DType: "float32", Input: n, Classes: n})
			if err != nil {
				b.Fatal(err)
			}
			st, err := gpu.NewStage(be, compute.Spec{Model: m, First: 0, Last: 1, Batch: n, Seed: 1})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			x, y := gputest.Batch(n, n, n)
			step := func() {
				if _, err := st.Forward(0, x, y); err != nil {
					b.Fatal(err)
				}
				if _, err := st.Backward(0, st.LossScale(1)); err != nil {
					b.Fatal(err)
				}
			}
			step()
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				step()
			}
			b.ReportMetric(6*float64(n)*float64(n)*float64(n)*float64(b.N)/time.Since(start).Seconds()/1e9, "GFLOP/s")
		})
	}
}
