package stages

import (
	"crypto/sha256"
	"fmt"
	"net"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/collective"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/transport"
)

// Layout is what a validated config fixes about one stage, computed once and
// taken by Connect and New alike: the model, the run's lowered schedule, the
// layer range of each of the stage's chunks, and the handshakes of its links
// (the wire dtype and the shapes of every tensor that crosses them). Nothing
// later derives these again.
type Layout struct {
	Config *configs.Config
	Stage  int
	Stages int // 1 for the reference
	// Replica is this process's copy of the pipeline among Replicas
	// (data_parallel); the reference is replica 0 of Replicas and holds
	// every replica's share of the batch.
	Replica, Replicas int
	Reference         bool // the one-process reference
	Model             *models.Model
	Schedule          *schedule.Lowered
	Ranges            [][2]int // per chunk, the half-open range of layers
	// Up and Down are the handshakes of the links from the previous stage and
	// to the next; their Shapes are the link's tensors by chunk tag.
	Up, Down transport.Hello
	// Reduce is the handshake of the links among the stage's replicas
	// (Replicas > 1): its Shapes list each chunk's all-reduce tags (Plans,
	// in chunk order) and then the control tags (controlTags).
	Reduce transport.Hello
	// Plans say, per chunk, how its gradients are all-reduced among the
	// replicas; set when Replicas > 1 and in the reference of a config
	// with replicas, which sums its shares as the replicas would.
	Plans []collective.Plan
	// Listener, if set, is the stage's socket, bound before the rendezvous
	// published its address; Connect serves it instead of binding.
	Listener net.Listener
	// PSKept, if set, says in the reference of a config with parameter
	// servers whose shares each step's update sums (backup workers drop
	// the others); nil: every worker's.
	PSKept func(step int) []int
}

// NewLayout lays out stage i of a validated config.
func NewLayout(c *configs.Config, i int) (*Layout, error) {
	return NewReplicaLayout(c, i, 0)
}

// NewReplicaLayout lays out stage i of replica r.
func NewReplicaLayout(c *configs.Config, i, r int) (*Layout, error) {
	if i < 0 || i >= len(c.Stages) {
		return nil, fmt.Errorf("stage %d: the config has stages 0-%d", i, len(c.Stages)-1)
	}
	if r < 0 || r >= c.Replicas() {
		return nil, fmt.Errorf("replica %d: data_parallel is %d, so replicas are 0-%d", r, c.Replicas(), c.Replicas()-1)
	}
	model, err := models.Build(c.Model)
	if err != nil {
		return nil, err
	}
	lowered, err := c.BuildLowered()
	if err != nil {
		return nil, fmt.Errorf("schedule %s: %w", c.Schedule, err)
	}
	schedule.AddTiedSync(len(model.Tied))(lowered)
	if c.Train.ClipGradNorm > 0 {
		schedule.AddClipNorm(lowered)
	}
	l := &Layout{Config: c, Stage: i, Stages: len(c.Stages), Replica: r, Replicas: c.Replicas(), Model: model, Schedule: lowered}
	for chunk := 0; chunk < c.VirtualStages; chunk++ {
		first, last := c.ChunkLayers(i, chunk)
		l.Ranges = append(l.Ranges, [2]int{first, last})
	}
	dt, err := WireDType(c, model)
	if err != nil {
		return nil, err
	}
	p := len(c.Stages)
	hello := func(from int) transport.Hello {
		return transport.Hello{Stage: i, Stages: p, ConfigDigest: c.Digest(), Address: c.Address(i, r),
			DType: dt, Shapes: LinkShapes(c, model, from), Ring: NeedsRing(c, model), Replica: r, Replicas: l.Replicas,
			Kernels: blas.KernelSet()}
	}
	l.Up, l.Down = hello((i+p-1)%p), hello(i)
	if l.Replicas > 1 {
		if err := l.planReduction(); err != nil {
			return nil, err
		}
		l.Reduce = transport.Hello{Group: transport.ReplicaGroup, Stage: i, Stages: p, Replica: r, Replicas: l.Replicas,
			ConfigDigest: c.Digest(), Address: c.Address(i, r), DType: dt, Shapes: l.reduceShapes(dt), Kernels: blas.KernelSet()}
	}
	return l, nil
}

// planReduction plans each chunk's all-reduce over its gradients: all of
// the chunk's parameters, flattened in order.
func (l *Layout) planReduction() error {
	bucket := collective.BucketElems(l.Config.BucketBytes(), dtypeSize(l.Model))
	l.Plans = nil
	for _, lr := range l.Ranges {
		n, err := models.ParamCount(l.Model, lr[0], lr[1])
		if err != nil {
			return err
		}
		p, err := newPlan(l.Config, l.Stage, n, bucket, l.Replicas)
		if err != nil {
			return err
		}
		l.Plans = append(l.Plans, p)
	}
	return nil
}

// newPlan plans an all-reduce of n elements among the ranks replicas of
// stage with the config's bucket size and all_reduce.algorithm, and for a
// hierarchical one the stage's replicas' hosts: the replicas and the
// reference plan alike, so the reference folds as the replicas do.
func newPlan(c *configs.Config, stage, n, bucket, ranks int) (collective.Plan, error) {
	p, err := collective.NewPlan(n, bucket, ranks)
	if err != nil {
		return p, err
	}
	p, err = p.WithAlgorithm(collective.Algorithm(c.ReduceAlgorithm()))
	if err != nil {
		return p, fmt.Errorf("all_reduce.algorithm: %w", err)
	}
	if p.Algorithm != collective.Hierarchical {
		return p, nil
	}
	hosts, err := c.ReplicaHosts(stage)
	if err != nil {
		return p, fmt.Errorf("all_reduce.algorithm hierarchical: %w", err)
	}
	if p, err = p.WithGroups(hosts); err != nil {
		return p, fmt.Errorf("all_reduce.algorithm hierarchical: stage %d: %w", stage, err)
	}
	return p, nil
}

// Control messages on the replica ring, tagged after every plan's chunks:
// the last stage's micro-batch losses, a digest of the weights, and the
// verdict on a sharded replica's gradients (zero.go).
const (
	lossTag = iota
	digestTag
	finiteTag
	controlTags
)

// controlBase is the first control tag.
func (l *Layout) controlBase() int {
	n := 0
	for _, p := range l.Plans {
		n += p.Tags()
	}
	return n
}

// reduceShapes lists the replica ring's message shapes by tag, for a
// ring of wire dtype dt.
func (l *Layout) reduceShapes(dt transport.DType) [][]int {
	var out [][]int
	for _, p := range l.Plans {
		out = append(out, p.Shapes()...)
	}
	out = append(out, collective.BytesShape(dt, 8*l.Config.Data.MicroBatches), collective.BytesShape(dt, sha256.Size), collective.BytesShape(dt, verdictBytes))
	return out
}

func dtypeSize(m *models.Model) int {
	if m.DType == tensor.Float64 {
		return 8
	}
	return 4
}

// ReferenceLayout lays out the one-process reference: every layer in one
// chunk of one stage, trained with 1F1B, which computes the same bits as any
// schedule over any split. With replicas it runs every replica's
// micro-batches in turn and sums their gradients as the all-reduce does
// (see replicaSync.reduceShares).
func ReferenceLayout(c *configs.Config) (*Layout, error) {
	model, err := models.Build(c.Model)
	if err != nil {
		return nil, err
	}
	// Every replica's micro-batches, in replica order: the global batch.
	sched, err := schedule.Build("1f1b", 1, c.Replicas()*c.Data.MicroBatches, 1)
	if err != nil {
		return nil, err
	}
	passes := []schedule.Pass{schedule.AddSendRecv, schedule.AddReduceGrad, schedule.AddTiedSync(len(model.Tied))}
	if c.Train.ClipGradNorm > 0 {
		passes = append(passes, schedule.AddClipNorm)
	}
	lowered, err := schedule.Lower(sched, passes...)
	if err != nil {
		return nil, err
	}
	l := &Layout{Config: c, Stages: 1, Replicas: c.Replicas(), Reference: true, Model: model, Schedule: lowered, Ranges: [][2]int{{0, len(model.Layers)}}}
	if l.Replicas > 1 {
		// One plan per model stage, in model order: the pieces the
		// replicas' stages reduce, which follow one another in the
		// reference's parameter list.
		bucket := collective.BucketElems(c.BucketBytes(), dtypeSize(model))
		for k := range c.ModelStages() {
			first, last := c.ChunkLayers(c.Place(k))
			n, err := models.ParamCount(model, first, last)
			if err != nil {
				return nil, err
			}
			stage, _ := c.Place(k)
			p, err := newPlan(c, stage, n, bucket, l.Replicas)
			if err != nil {
				return nil, err
			}
			l.Plans = append(l.Plans, p)
		}
	}
	return l, nil
}

// Hellos are stage i's handshakes on its link from the previous stage and on its
// link to the next, each naming the activation shape of every chunk it carries.
func Hellos(c *configs.Config, i int) (up, down transport.Hello, err error) {
	l, err := NewLayout(c, i)
	if err != nil {
		return up, down, err
	}
	return l.Up, l.Down, nil
}
