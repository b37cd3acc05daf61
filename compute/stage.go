package compute

import (
	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/optim"
)

// Weight is one of a chunk's weights in host memory, named as checkpoints
// and exports name it.
type Weight = engine.Weight

// Stage is one chunk's compute as the stage's executor drives it: the
// passes of each micro-batch, keyed by its index, and the optimizer step.
// Tensors cross it in host memory. A Stage is used by one goroutine.
type Stage interface {
	// IsFirst and IsLast report whether the chunk holds the model's first
	// layer (it reads the data) or its last (it computes the loss).
	IsFirst() bool
	IsLast() bool
	// Layers are the model stages [first, last) the chunk computes.
	Layers() (first, last int)
	// InShape is the shape of a micro-batch's input.
	InShape() tensor.Shape

	// Forward runs micro-batch mb on in and keeps what its backward needs;
	// on the last chunk targets are its labels and the result is its loss,
	// elsewhere the activation to send.
	Forward(mb int, in *tensor.Dense, targets []int) (*tensor.Dense, error)
	// Recomputation runs mb's forward again where the stage recomputes,
	// before its backward or input-gradient pass.
	Recomputation(mb int) error
	// Logits are a copy of the last forward's logits, on the last chunk:
	// what an evaluation scores.
	Logits() (*tensor.Dense, error)
	// LossScale is the output gradient of one micro-batch's loss when the
	// step's loss is the mean over microBatches: a tensor of no dimensions.
	LossScale(microBatches int) *tensor.Dense
	// Backward runs mb's whole backward from its output gradient (the
	// LossScale on the last chunk), adds its weight gradients to the step's
	// and returns its input gradient.
	Backward(mb int, grad *tensor.Dense) (*tensor.Dense, error)
	// Input and Weight are Backward in two parts (zero-bubble schedules):
	// the input gradient first, the weight gradients later.
	Input(mb int, grad *tensor.Dense) (*tensor.Dense, error)
	Weight(mb int) error
	// Discard drops what mb kept without a backward.
	Discard(mb int)

	// NewOptimizer builds an optimizer over the chunk's weights; Step
	// applies it to the step's summed gradients and zeroes them.
	NewOptimizer(spec optim.Spec) (*optim.Optimizer, error)
	Step(o *optim.Optimizer) error

	// Weights are the chunk's weights in host memory, in the order its
	// optimizer holds them, named as checkpoints name them; the caller only
	// reads them. A device computing elsewhere copies them out.
	Weights() []Weight
	// LoadWeights copies ws, in Weights' order, names and shapes, into the
	// chunk's weights (a checkpoint's, when a run resumes).
	LoadWeights(ws []Weight) error
	// Gradients are the step's summed gradients so far in host memory, in
	// Weights' order and names: what the replicas' all-reduce, the tied
	// weights' exchange and the finiteness check work on. The caller may
	// change them in place and then hands them back with LoadGradients,
	// before Step; a device computing elsewhere copies them out and in.
	Gradients() ([]Weight, error)
	LoadGradients(gs []Weight) error

	// Unshare reports whether the chunk no longer refers to mem, the bytes
	// of a tensor handed to it (a received message, a data input), so
	// their owner may reuse them once the micro-batch is finished.
	Unshare(mem []byte) bool
	// InFlight and PeakInFlight count the micro-batches whose activations
	// the chunk holds, now and at most.
	InFlight() int
	PeakInFlight() int
	// HeldBytes is the memory the chunk's in-flight micro-batches hold.
	HeldBytes() int64
}

// Drawing is a Stage whose training forwards may draw random numbers (a
// model's dropout). Before each training forward the runtime calls
// TrainNext with the step and the micro-batch's index in the step's global
// batch as the one-process reference numbers it (replica r's micro-batch
// j is r·micro_batches + j), so that every stage, replica and schedule
// draws the same numbers for it; the Stage draws them again for that
// micro-batch's recomputation and backward. A forward not announced, an
// evaluation's, draws nothing. The cpu engine is one; a stage refuses to
// open a chunk holding a dropout on a device whose Stage is not.
type Drawing interface {
	TrainNext(step, microBatch int)
}

// GradientWatcher is a Stage that reports, while a weight pass runs
// (Weight, or a Backward that runs one), how far its micro-batch's weight
// gradients are summed: each call f(first) says that every weight from
// index first on (Weights' order) holds the micro-batch's contribution in
// its Gradients. first falls through the pass, layer by layer in backward
// order. After the step's last such pass of a chunk those weights'
// gradients are final, and the replicas' all-reduce may start on them
// while the pass computes the earlier layers'. The cpu engine is one in
// split mode (zero-bubble schedules); nil stops the reports.
type GradientWatcher interface {
	WatchGradients(f func(first int))
}

// OptimizerOnDevice is a Stage whose optimizer state lives on its device,
// not in the optim.Optimizer's slots in host memory: the checkpointer asks
// it to copy the state into the slots before writing them, and back after
// filling them from a checkpoint.
type OptimizerOnDevice interface {
	Stage
	StoreOptimizer(o *optim.Optimizer) error
	LoadOptimizer(o *optim.Optimizer) error
}
