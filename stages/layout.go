package stages

import (
	"fmt"

	"github.com/pipetrain/pipetrain/configs"
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
	Config   *configs.Config
	Stage    int
	Stages   int // 1 for the reference
	Model    *models.Model
	Schedule *schedule.Lowered
	Ranges   [][2]int // per chunk, the half-open range of layers
	// Up and Down are the handshakes of the links from the previous stage and
	// to the next; their Shapes are the link's tensors by chunk tag.
	Up, Down transport.Hello
}

// NewLayout lays out stage i of a validated config.
func NewLayout(c *configs.Config, i int) (*Layout, error) {
	if i < 0 || i >= len(c.Stages) {
		return nil, fmt.Errorf("stage %d: the config has stages 0-%d", i, len(c.Stages)-1)
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
	l := &Layout{Config: c, Stage: i, Stages: len(c.Stages), Model: model, Schedule: lowered}
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
		return transport.Hello{Stage: i, Stages: p, ConfigDigest: c.Digest(), Address: c.Stages[i].Address,
			DType: dt, Shapes: LinkShapes(c, model, from), Ring: NeedsRing(c, model)}
	}
	l.Up, l.Down = hello((i+p-1)%p), hello(i)
	return l, nil
}

// ReferenceLayout lays out the one-process reference: every layer in one
// chunk of one stage, trained with 1F1B, which computes the same bits as any
// schedule over any split.
func ReferenceLayout(c *configs.Config) (*Layout, error) {
	model, err := models.Build(c.Model)
	if err != nil {
		return nil, err
	}
	sched, err := schedule.Build("1f1b", 1, c.Data.MicroBatches, 1)
	if err != nil {
		return nil, err
	}
	lowered, err := schedule.Lower(sched, schedule.AddSendRecv, schedule.AddReduceGrad, schedule.AddTiedSync(len(model.Tied)))
	if err != nil {
		return nil, err
	}
	return &Layout{Config: c, Stages: 1, Model: model, Schedule: lowered, Ranges: [][2]int{{0, len(model.Layers)}}}, nil
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
