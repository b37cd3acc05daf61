//go:build pipetrain_cuda

package cuda

// #include <cuda.h>
import "C"

import (
	_ "embed"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync/atomic"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/compute/gpu"
)

//go:embed kernels/kernels.ptx
var ptx string

// kernelNames are kernels.cu's entry points.
var kernelNames = []string{"fill", "bias_add", "sum_rows", "act", "act_grad", "xent", "xent_grad", "norm", "norm_grad", "norm_param_grad", "rope", "softmax", "softmax_grad", "embed", "embed_grad", "sgd", "momentum", "adam", "scale", "add_scaled"}

func init() { compute.Register(gpu.NewDevice("cuda", Open)) }

// Backend is one GPU: its primary context, made current on one OS thread
// that runs every call (the driver's contexts are per thread, and several
// stages' goroutines may share the GPU), a compute stream for kernels and
// products, and a transfer stream for copies through a pinned buffer.
type Backend struct {
	index int
	name  string
	calls chan func()

	ctx               cu.CUContext
	compute, transfer cu.Stream
	computed, copied  cu.Event // ordering between the two streams
	module            cu.Module
	fns               map[string]cu.Function
	blas              *cublas
	staging           unsafe.Pointer // pinned host memory
	stagingBytes      int
	live              atomic.Int64
}

type buffer struct {
	ptr cu.DevicePtr
	n   int
}

func (b *buffer) Len() int { return b.n }

func ptr(b gpu.Buffer) cu.DevicePtr { return b.(*buffer).ptr }

// Open opens GPU index: its context, streams, the embedded kernels and
// cuBLAS. Without a driver or a GPU the error starts "no CUDA device".
func Open(index int) (gpu.Backend, error) {
	if err := driverErr(); err != nil {
		return nil, err
	}
	n, err := cu.NumDevices()
	if err != nil || n == 0 {
		return nil, fmt.Errorf("no CUDA device (cuDeviceGetCount: %d, %v)", n, err)
	}
	if index >= n {
		return nil, fmt.Errorf("device %d: this machine has %d CUDA devices", index, n)
	}
	b := &Backend{index: index, calls: make(chan func()), fns: map[string]cu.Function{}}
	go b.serve()
	if err := b.do(b.open); err != nil {
		return nil, fmt.Errorf("cuda:%d: %w", index, err)
	}
	return b, nil
}

// serve runs the backend's calls on one locked OS thread.
func (b *Backend) serve() {
	runtime.LockOSThread()
	for f := range b.calls {
		f()
	}
}

// do runs f on the backend's thread and returns its error.
func (b *Backend) do(f func() error) error {
	done := make(chan error)
	b.calls <- func() { done <- f() }
	return <-done
}

func (b *Backend) open() error {
	dev, err := cu.GetDevice(b.index)
	if err != nil {
		return err
	}
	name, _ := dev.Name()
	b.name = fmt.Sprintf("cuda:%d %s", b.index, name)
	if b.ctx, err = dev.RetainPrimaryCtx(); err != nil {
		return fmt.Errorf("primary context: %w", err)
	}
	if err := cu.SetCurrentContext(b.ctx); err != nil {
		return err
	}
	if b.compute, err = cu.MakeStream(cu.NonBlocking); err != nil {
		return err
	}
	if b.transfer, err = cu.MakeStream(cu.NonBlocking); err != nil {
		return err
	}
	if b.computed, err = cu.MakeEvent(cu.DisableTiming); err != nil {
		return err
	}
	if b.copied, err = cu.MakeEvent(cu.DisableTiming); err != nil {
		return err
	}
	if b.module, err = cu.LoadData(ptx); err != nil {
		return fmt.Errorf("loading the kernels' PTX: %w", err)
	}
	for _, k := range kernelNames {
		if b.fns[k], err = b.module.Function(k); err != nil {
			return fmt.Errorf("kernel %s: %w", k, err)
		}
	}
	b.blas, err = openCublas(*(*C.CUstream)(unsafe.Pointer(&b.compute)))
	return err
}

func (b *Backend) Name() string { return b.name }

// LiveBuffers counts the buffers allocated and not freed.
func (b *Backend) LiveBuffers() int64 { return b.live.Load() }

// CublasPath is the cuBLAS library loaded.
func (b *Backend) CublasPath() string { return b.blas.path }

func (b *Backend) Alloc(n int) (gpu.Buffer, error) {
	var p cu.DevicePtr
	err := b.do(func() (err error) {
		p, err = cu.MemAlloc(int64(max(n, 1)) * 4)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("%s: allocating %d float32s: %w", b.name, n, err)
	}
	b.live.Add(1)
	return &buffer{p, n}, nil
}

func (b *Backend) Free(buf gpu.Buffer) {
	b.live.Add(-1)
	b.do(func() error { return cu.MemFree(ptr(buf)) })
}

// stage makes the pinned buffer hold n bytes, once the transfer stream is
// done with it.
func (b *Backend) stage(n int) error {
	if err := b.transfer.Synchronize(); err != nil {
		return err
	}
	if n <= b.stagingBytes {
		return nil
	}
	if b.staging != nil {
		hostFree(b.staging)
		b.staging, b.stagingBytes = nil, 0
	}
	p, err := hostAlloc(n)
	if err != nil {
		return err
	}
	b.staging, b.stagingBytes = p, n
	return nil
}

// afterCompute makes the transfer stream wait for what the compute stream
// has queued (a copy must not overtake the kernels that read or write its
// buffer).
func (b *Backend) afterCompute() error {
	if err := b.computed.Record(b.compute); err != nil {
		return err
	}
	return b.transfer.Wait(b.computed, 0)
}

// Upload copies src into pinned memory and from there to dst on the
// transfer stream; the compute stream waits for it, the caller does not.
func (b *Backend) Upload(dst gpu.Buffer, src []float32) error {
	if len(src) != dst.Len() {
		return fmt.Errorf("upload of %d values into a buffer of %d", len(src), dst.Len())
	}
	return b.do(func() error {
		n := len(src) * 4
		if err := b.stage(n); err != nil {
			return err
		}
		copy(unsafe.Slice((*float32)(b.staging), len(src)), src)
		if err := b.afterCompute(); err != nil {
			return err
		}
		if err := cu.MemcpyHtoDAsync(ptr(dst), b.staging, int64(n), b.transfer); err != nil {
			return err
		}
		if err := b.copied.Record(b.transfer); err != nil {
			return err
		}
		return b.compute.Wait(b.copied, 0)
	})
}

// Download waits for the compute stream's work on src, copies it to pinned
// memory on the transfer stream and from there to dst.
func (b *Backend) Download(dst []float32, src gpu.Buffer) error {
	if len(dst) != src.Len() {
		return fmt.Errorf("download of a buffer of %d values into %d", src.Len(), len(dst))
	}
	return b.do(func() error {
		n := len(dst) * 4
		if err := b.stage(n); err != nil {
			return err
		}
		if err := b.afterCompute(); err != nil {
			return err
		}
		if err := cu.MemcpyDtoHAsync(b.staging, ptr(src), int64(n), b.transfer); err != nil {
			return err
		}
		if err := b.transfer.Synchronize(); err != nil {
			return err
		}
		copy(dst, unsafe.Slice((*float32)(b.staging), len(dst)))
		return nil
	})
}

func (b *Backend) Copy(dst, src gpu.Buffer) error {
	if dst.Len() != src.Len() {
		return fmt.Errorf("copy of %d values into a buffer of %d", src.Len(), dst.Len())
	}
	return b.do(func() error { return cu.MemcpyDtoDAsync(ptr(dst), ptr(src), int64(src.Len())*4, b.compute) })
}

func (b *Backend) Fill(dst gpu.Buffer, v float32) error {
	return b.launch("fill", dst.Len(), dst, v, dst.Len())
}

func (b *Backend) Gemm(transA, transB bool, m, n, k int, alpha float32, a, bb gpu.Buffer, beta float32, c gpu.Buffer) error {
	if a.Len() < m*k || bb.Len() < k*n || c.Len() < m*n {
		return fmt.Errorf("gemm %dx%dx%d on buffers of %d, %d and %d", m, n, k, a.Len(), bb.Len(), c.Len())
	}
	return b.do(func() error {
		return b.blas.sgemm(transA, transB, m, n, k, alpha, uintptr(ptr(a)), uintptr(ptr(bb)), beta, uintptr(ptr(c)))
	})
}

func (b *Backend) AddBias(y, bias gpu.Buffer, rows, cols int) error {
	return b.launch("bias_add", rows*cols, y, bias, rows, cols)
}

func (b *Backend) SumRows(dst, src gpu.Buffer, rows, cols int, beta float32) error {
	return b.launch("sum_rows", cols, dst, src, rows, cols, beta)
}

// actCodes are kernels.cu's ACT_ numbers.
var actCodes = map[gpu.Act]int{"": 0, "relu": 1, "tanh": 2, "sigmoid": 3, "gelu": 4, "silu": 5}

func actCode(f gpu.Act) (int, error) {
	c, ok := actCodes[f]
	if !ok {
		return 0, fmt.Errorf("no kernel for activation %q", f)
	}
	return c, nil
}

func (b *Backend) Activate(f gpu.Act, y, x gpu.Buffer) error {
	c, err := actCode(f)
	if err != nil {
		return err
	}
	return b.launch("act", x.Len(), c, y, x, x.Len())
}

func (b *Backend) ActivateGrad(f gpu.Act, dx, dy, x, y gpu.Buffer) error {
	c, err := actCode(f)
	if err != nil {
		return err
	}
	return b.launch("act_grad", x.Len(), c, dx, dy, x, y, x.Len())
}

// xentThreads is kernels.cu's XENT_THREADS: one block of them per row.
const xentThreads = 256

func (b *Backend) Xent(rowLoss, probs, logits, targets gpu.Buffer, rows, cols int) error {
	return b.launchGrid("xent", rows, xentThreads, rowLoss, probs, logits, targets, rows, cols)
}

func (b *Backend) XentGrad(dlogits, probs, targets gpu.Buffer, rows, cols int, scale float32) error {
	return b.launch("xent_grad", rows*cols, dlogits, probs, targets, rows, cols, scale)
}

// normThreads is kernels.cu's NORM_THREADS: one block of them per row.
const normThreads = 256

func (b *Backend) LayerNorm(y, mean, rstd, x, gain, bias gpu.Buffer, rows, cols int, eps float32) error {
	return b.launchGrid("norm", rows, normThreads, y, mean, rstd, x, gain, bias, rows, cols, eps)
}

func (b *Backend) RMSNorm(y, rstd, x, gain gpu.Buffer, rows, cols int, eps float32) error {
	return b.launchGrid("norm", rows, normThreads, y, null{}, rstd, x, gain, null{}, rows, cols, eps)
}

func (b *Backend) LayerNormGrad(dx, dgain, dbias, dy, x, mean, rstd, gain gpu.Buffer, rows, cols int) error {
	if err := b.launchGrid("norm_grad", rows, normThreads, dx, dy, x, mean, rstd, gain, rows, cols); err != nil {
		return err
	}
	return b.launch("norm_param_grad", cols, dgain, dbias, dy, x, mean, rstd, rows, cols)
}

func (b *Backend) RMSNormGrad(dx, dgain, dy, x, rstd, gain gpu.Buffer, rows, cols int) error {
	if err := b.launchGrid("norm_grad", rows, normThreads, dx, dy, x, null{}, rstd, gain, rows, cols); err != nil {
		return err
	}
	return b.launch("norm_param_grad", cols, dgain, null{}, dy, x, null{}, rstd, rows, cols)
}

func (b *Backend) Rope(y, x, cos, sin gpu.Buffer, rows, width, context, headDim int, inverse bool) error {
	if width%headDim != 0 || headDim%2 != 0 || cos.Len() < context*headDim/2 {
		return fmt.Errorf("rotary embedding of width %d in heads of %d over %d positions, tables of %d", width, headDim, context, cos.Len())
	}
	sign := float32(1)
	if inverse {
		sign = -1
	}
	return b.launch("rope", rows*width/2, y, x, cos, sin, rows, width, context, headDim, sign)
}

func (b *Backend) Softmax(p, s gpu.Buffer, rows, cols int, scale float32, causal bool) error {
	c := 0
	if causal {
		c = 1
	}
	return b.launchGrid("softmax", rows, normThreads, p, s, rows, cols, scale, c)
}

func (b *Backend) SoftmaxGrad(ds, p, dp gpu.Buffer, rows, cols int, scale float32) error {
	return b.launchGrid("softmax_grad", rows, normThreads, ds, p, dp, rows, cols, scale)
}

func (b *Backend) Embed(y, table, tokens gpu.Buffer, rows, width int) error {
	return b.launch("embed", rows*width, y, table, tokens, rows, width)
}

func (b *Backend) EmbedGrad(dtable, dy, tokens gpu.Buffer, rows, width int) error {
	return b.launch("embed_grad", rows*width, dtable, dy, tokens, rows, width)
}

// null is a kernel's NULL pointer argument (RMSNorm has no mean or bias).
type null struct{}

func (b *Backend) SGD(p, g gpu.Buffer, lr float32) error {
	return b.launch("sgd", p.Len(), p, g, lr, p.Len())
}

func (b *Backend) Momentum(p, g, buf gpu.Buffer, lr, mu float32) error {
	return b.launch("momentum", p.Len(), p, g, buf, lr, mu, p.Len())
}

func (b *Backend) Adam(p, g, m, v gpu.Buffer, b1, b2, step, eps float32) error {
	return b.launch("adam", p.Len(), p, g, m, v, b1, b2, step, eps, p.Len())
}

func (b *Backend) Scale(x gpu.Buffer, a float32) error {
	return b.launch("scale", x.Len(), x, a, x.Len())
}

func (b *Backend) AddScaled(y, x gpu.Buffer, a float32) error {
	return b.launch("add_scaled", y.Len(), y, x, a, y.Len())
}

// threads per block of the elementwise kernels, and the most blocks
// launched (they loop over the rest).
const (
	threads   = 256
	maxBlocks = 4096
)

// launch runs an elementwise kernel over n elements on the compute stream.
func (b *Backend) launch(name string, n int, args ...any) error {
	blocks := min(max((n+threads-1)/threads, 1), maxBlocks)
	return b.launchGrid(name, blocks, threads, args...)
}

// launchGrid runs kernel name on blocks × perBlock threads. Each argument
// goes in an 8-byte slot, as cu's Launch copies them: a buffer's device
// pointer, an int or a float32 in the slot's low 4 bytes.
func (b *Backend) launchGrid(name string, blocks, perBlock int, args ...any) error {
	slots := make([]uint64, len(args))
	for i, a := range args {
		switch v := a.(type) {
		case gpu.Buffer:
			slots[i] = uint64(ptr(v))
		case null:
			slots[i] = 0
		case int:
			if v > math.MaxInt32 {
				return fmt.Errorf("kernel %s: argument %d: %d does not fit an int", name, i, v)
			}
			slots[i] = uint64(uint32(int32(v)))
		case float32:
			slots[i] = uint64(math.Float32bits(v))
		default:
			return fmt.Errorf("kernel %s: argument %d of type %T", name, i, a)
		}
	}
	params := make([]unsafe.Pointer, len(slots))
	for i := range slots {
		params[i] = unsafe.Pointer(&slots[i])
	}
	fn, ok := b.fns[name]
	if !ok {
		return errors.New("no kernel " + name)
	}
	return b.do(func() error {
		if err := fn.Launch(blocks, 1, 1, perBlock, 1, 1, 0, b.compute, params); err != nil {
			return fmt.Errorf("%s: kernel %s: %w", b.name, name, err)
		}
		return nil
	})
}
