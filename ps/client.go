package ps

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/transport"
)

// Client is one worker stage's stream to one server. Its requests are
// answered in turn; a Client is used by one goroutine.
type Client struct {
	addr          string
	worker, stage int
	reqs          chan request
	done          chan struct{}
	err           error // why the stream ended, once done is closed
	version       int64 // the server's version when it answered the hello
	cancel        context.CancelFunc
	closeOnce     sync.Once
	half          transport.DType // the pushes' and pulls' wire dtype; 0: as they are
	// pulled is the server's version when the worker last pulled (or said
	// hello), and stale the last push's staleness (Staleness).
	pulled, stale int64
}

// Compress sends the pushes' float32 gradients and has the pulls' float32
// weights sent as half (transport.Float16 or BFloat16), as
// transport.compression does a link's: half the bytes, rounded. The
// hello's initial weights always travel whole.
func (c *Client) Compress(half transport.DType) { c.half = half }

type request struct {
	h     header
	reply chan result
}

type result struct {
	h   header
	err error
}

// Dial opens worker's stage's stream to the server at addr with o's
// security and says hello with the stage's initial weights, the tensors
// of the stage that server holds. ctx bounds the wait for the hello's
// answer; the stream lasts until Close.
func Dial(ctx context.Context, addr string, o transport.Options, worker, stage int, version int64, init []engine.Weight) (*Client, error) {
	return dial(ctx, addr, o, header{op: opHello, worker: worker, stage: stage, step: version, tensors: init})
}

// Rejoin is Dial for a worker stage restarted after its worker left an
// async run: it computes from step on, and its weights (init) are checked
// by name and shape only, the servers' having moved on; it pulls theirs
// before its first step. An error wrapping ErrOver says every worker had
// left: the run's training is over, and the worker has nothing to do.
func Rejoin(ctx context.Context, addr string, o transport.Options, worker, stage int, step int64, init []engine.Weight) (*Client, error) {
	return dial(ctx, addr, o, header{op: opHello, rejoin: true, worker: worker, stage: stage, step: step, tensors: init})
}

// dial opens the stream and says hello.
func dial(ctx context.Context, addr string, o transport.Options, hello header) (*Client, error) {
	worker, stage := hello.worker, hello.stage
	c := &Client{addr: addr, worker: worker, stage: stage, reqs: make(chan request), done: make(chan struct{})}
	streamCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.cancel = cancel
	started := make(chan error, 1)
	go func() {
		defer close(c.done)
		first := true
		c.err = Service.Call(streamCtx, addr, o, func(s *transport.ServiceStream) error {
			if err := send(s, hello); err != nil {
				return err
			}
			h, err := recv(s)
			if err != nil {
				return err
			}
			if h.op != opOK {
				return fmt.Errorf("hello answered with %d", h.op)
			}
			if h.final {
				return fmt.Errorf("parameter server at %s: %w", addr, ErrOver)
			}
			if first {
				c.version, c.pulled = h.step, h.step
				first = false
				started <- nil
			}
			err = c.serve(s)
			if err != nil {
				// A session that broke is not dialed again: the server
				// lost this worker's place (or died), and the worker's
				// request already has the error.
				cancel()
			}
			return err
		})
		if first {
			started <- c.err
		}
	}()
	select {
	case err := <-started:
		if err != nil {
			cancel()
			return nil, fmt.Errorf("worker %d stage %d: %w", worker, stage, err)
		}
	case <-ctx.Done():
		cancel()
		<-c.done
		return nil, fmt.Errorf("worker %d stage %d: %w", worker, stage, c.ended())
	}
	return c, nil
}

// Version is the updates the server had made when it answered the hello:
// more than the worker started from when it rejoins a run under way.
func (c *Client) Version() int64 { return c.version }

// serve runs the requests on s until a bye.
func (c *Client) serve(s *transport.ServiceStream) error {
	for r := range c.reqs {
		err := send(s, r.h)
		var h header
		if err == nil {
			h, err = recv(s)
		}
		r.reply <- result{h, err}
		if err != nil {
			return err
		}
		if r.h.op == opBye {
			return nil
		}
	}
	return nil
}

func (c *Client) do(ctx context.Context, h header) (header, error) {
	h.worker, h.stage = c.worker, c.stage
	r := request{h: h, reply: make(chan result, 1)}
	if err := ctx.Err(); err != nil {
		return header{}, context.Cause(ctx) // sends nothing once the worker is stopped
	}
	select {
	case c.reqs <- r:
	case <-c.done:
		return header{}, c.ended()
	case <-ctx.Done():
		return header{}, context.Cause(ctx)
	}
	select {
	case res := <-r.reply:
		if res.err != nil {
			return header{}, fmt.Errorf("parameter server at %s: %w", c.addr, res.err)
		}
		return res.h, nil
	case <-ctx.Done():
		return header{}, context.Cause(ctx)
	}
}

func (c *Client) ended() error {
	if c.err != nil {
		return c.err
	}
	return errors.New("the stream to the parameter server at " + c.addr + " ended")
}

// Push sends the gradients of step, with the step's micro-batch losses
// from the stage that computes them (nil elsewhere); dropped says the
// server had made the step's update without them (backup workers).
func (c *Client) Push(ctx context.Context, step int64, grads []engine.Weight, losses []float64) (dropped bool, err error) {
	h, err := c.do(ctx, header{op: opPush, step: step, tensors: grads, losses: losses, half: c.half})
	// The answer's version is the server's after the push: one past its
	// own update when the push made one on arrival (async), where the
	// updates since the pull are its staleness; a push that waits for the
	// others' (sync) is never stale.
	c.stale = 0
	if err == nil && !h.dropped {
		c.stale = max(0, h.step-1-c.pulled)
	}
	return h.dropped, err
}

// Staleness is how many updates the server made between the weights the
// worker last pulled and the update its last push made: 0 in sync mode
// and for a dropped push.
func (c *Client) Staleness() int64 { return c.stale }

// Pulled is a pull's answer.
type Pulled struct {
	Weights []engine.Weight
	Version int64 // the updates made
	// Losses are the micro-batch losses the last update's workers pushed,
	// in worker order.
	Losses []float64
}

// Pull waits until the worker may compute step and returns the server's
// weights then.
func (c *Client) Pull(ctx context.Context, step int64) (Pulled, error) {
	h, err := c.do(ctx, header{op: opPull, step: step, half: c.half})
	if err == nil && h.op != opWeights {
		err = fmt.Errorf("parameter server at %s answered a pull with %d", c.addr, h.op)
	}
	if err == nil {
		c.pulled = h.step
	}
	return Pulled{h.tensors, h.step, h.losses}, err
}

// Leave tells the server the worker pushed its last gradients.
func (c *Client) Leave(ctx context.Context) error {
	_, err := c.do(ctx, header{op: opLeave})
	return err
}

// PullFinal waits until every worker has left and returns the final
// weights.
func (c *Client) PullFinal(ctx context.Context) (Pulled, error) {
	h, err := c.do(ctx, header{op: opPull, final: true, half: c.half})
	if err == nil && h.op != opWeights {
		err = fmt.Errorf("parameter server at %s answered a pull with %d", c.addr, h.op)
	}
	return Pulled{h.tensors, h.step, h.losses}, err
}

// Abort ends the stream without a bye, as a process that failed: the
// server notes the worker's departure.
func (c *Client) Abort() {
	c.closeOnce.Do(func() {
		close(c.reqs)
		c.cancel()
		<-c.done
	})
}

// closeGrace bounds the goodbye of Close.
const closeGrace = 5 * time.Second

// Close says bye (waiting at most closeGrace for the answer) and ends the
// stream.
func (c *Client) Close(ctx context.Context) error {
	var err error
	c.closeOnce.Do(func() {
		ctx, cancel := context.WithTimeout(ctx, closeGrace)
		defer cancel()
		_, err = c.do(ctx, header{op: opBye})
		close(c.reqs)
		c.cancel()
		<-c.done
	})
	return err
}
