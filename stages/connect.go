package stages

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/transport"
)

// Links are a stage's connections to its neighbours; Prev or Next is nil at an end.
type Links struct {
	Prev, Next transport.Link
	server     *transport.Server
}

// Close closes both links (flushing queued sends) and releases the listening port.
func (l *Links) Close() error {
	var errs []error
	for _, c := range []transport.Link{l.Next, l.Prev} {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	if l.server != nil {
		errs = append(errs, l.server.Close())
	}
	return errors.Join(errs...)
}

// Connect opens stage i's links: it listens on its address for the upstream stage
// and dials the downstream one at the same time, each bounded by
// transport.connect_timeout, and runs the handshake that checks both sides agree on
// the config digest and the shape and dtype of the tensors between them.
func Connect(ctx context.Context, c *configs.Config, i int) (*Links, error) {
	model, err := models.Build(c.Model)
	if err != nil {
		return nil, err
	}
	dt, err := transport.ParseDType(model.DType.String())
	if err != nil {
		return nil, err
	}
	first, last := c.StageLayers(i)
	hello := func(layer int) transport.Hello {
		return transport.Hello{Stage: i, Stages: len(c.Stages), ConfigDigest: c.Digest(), Address: c.Stages[i].Address,
			DType: dt, Shape: []int(model.ShapeAt(layer, c.MicroBatchSize()))}
	}
	opts := transport.Options{ConnectTimeout: c.Transport.ConnectTimeout, QueueDepth: c.Transport.QueueDepth}
	links := &Links{}
	if i > 0 {
		if links.server, err = transport.Listen(c.Stages[i].Address, hello(first), opts); err != nil {
			return nil, fmt.Errorf("stage %d: %w", i, err)
		}
	}
	var wg sync.WaitGroup
	var acceptErr, dialErr error
	if i > 0 {
		wg.Go(func() { links.Prev, acceptErr = links.server.Accept(ctx) })
	}
	if i+1 < len(c.Stages) {
		wg.Go(func() { links.Next, dialErr = transport.Dial(ctx, c.Stages[i+1].Address, hello(last), opts) })
	}
	wg.Wait()
	if err := errors.Join(acceptErr, dialErr); err != nil {
		links.Close()
		return nil, err
	}
	return links, nil
}
