package stages

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/pipetrain/pipetrain/collective"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/certs"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/transport"
)

// Links are a stage's connections to its neighbours; Prev or Next is nil at an end.
type Links struct {
	Prev, Next transport.Link
	// ReplicaPrev and ReplicaNext join the stage's replicas in a ring
	// (data_parallel > 1): from replica r-1 and to replica r+1.
	ReplicaPrev, ReplicaNext transport.Link
	// ReplicaIn and ReplicaOut are the ring streams beside ReplicaPrev and
	// ReplicaNext (all_reduce.transport: stream), which then carry the
	// all-reduces; nil otherwise.
	ReplicaIn  *transport.StreamIn
	ReplicaOut *transport.StreamOut
	server     *transport.Server
}

// Close closes every link (flushing queued sends) and releases the listening port.
func (l *Links) Close() error {
	var errs []error
	if l.ReplicaOut != nil {
		errs = append(errs, l.ReplicaOut.Close())
	}
	if l.ReplicaIn != nil {
		errs = append(errs, l.ReplicaIn.Close())
	}
	for _, c := range []transport.Link{l.Next, l.Prev, l.ReplicaNext, l.ReplicaPrev} {
		if c != nil {
			errs = append(errs, c.Close())
		}
	}
	if l.server != nil {
		errs = append(errs, l.server.Close())
	}
	return errors.Join(errs...)
}

// Connect opens the links of the layout's stage i: it listens on its address for the previous stage
// and dials the next one at the same time, each bounded by
// transport.connect_timeout, and runs the handshake that checks both sides agree on
// the config digest and the shapes and dtype of the tensors between them. With
// virtual stages placed in a loop the last stage also feeds stage 0 (the
// ring), so every stage listens and dials; a V links neighbours only.
//
// With replicas, the stage also joins its replicas' ring: it dials replica
// r+1 of the same stage and accepts replica r-1 on the same address.
func Connect(ctx context.Context, l *Layout) (*Links, error) {
	c, i, r, up, down := l.Config, l.Stage, l.Replica, l.Up, l.Down
	p, ring := len(c.Stages), up.Ring
	name := c.ProcessName(i, r)
	opts, err := LinkOptions(c, i)
	if err != nil {
		return nil, err
	}
	opts.Listener = l.Listener
	links := &Links{}
	listen, dial := p > 1 && (i > 0 || ring), p > 1 && (i+1 < p || ring)
	replicated := l.Replicas > 1 && !c.PSEnabled() // workers of parameter servers have no ring
	opts.Streams = replicated && c.RingStreams()
	var roles []transport.Hello
	if listen {
		roles = append(roles, up)
	}
	if replicated {
		roles = append(roles, l.Reduce)
	}
	if len(roles) > 0 {
		if links.server, err = transport.Listen(c.Address(i, r), roles[0], opts, roles[1:]...); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	} else if l.Listener != nil {
		l.Listener.Close() // bound for the rendezvous, but nobody dials this stage
	}
	// A refused handshake ends the other wait: the run cannot start, so the other
	// side need not sit out its timeout. Timeouts do not: both are reported.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cancelOnRefusal := func(err error) {
		var refused *transport.HandshakeError
		if errors.As(err, &refused) || errors.Is(err, transport.ErrUnauthenticated) {
			cancel()
		}
	}
	var wg sync.WaitGroup
	var acceptErr, dialErr, ringAcceptErr, ringDialErr error
	if listen {
		wg.Go(func() {
			links.Prev, acceptErr = links.server.AcceptGroup(ctx, transport.PipelineGroup)
			cancelOnRefusal(acceptErr)
		})
	}
	if dial {
		wg.Go(func() {
			links.Next, dialErr = transport.Dial(ctx, c.Address((i+1)%p, r), down, opts)
			cancelOnRefusal(dialErr)
		})
	}
	if replicated {
		wg.Go(func() {
			links.ReplicaPrev, ringAcceptErr = links.server.AcceptGroup(ctx, transport.ReplicaGroup)
			cancelOnRefusal(ringAcceptErr)
		})
		wg.Go(func() {
			links.ReplicaNext, ringDialErr = transport.Dial(ctx, c.Address(i, (r+1)%l.Replicas), l.Reduce, opts)
			cancelOnRefusal(ringDialErr)
		})
	}
	wg.Wait()
	// The pipeline's errors come first; the ring's are reported when the
	// pipeline connected.
	if acceptErr == nil && dialErr == nil {
		acceptErr, dialErr = ringAcceptErr, ringDialErr
	} else if ringAcceptErr != nil || ringDialErr != nil {
		links.Close()
		return nil, firstCause(acceptErr, dialErr)
	}
	if acceptErr != nil || dialErr != nil {
		links.Close()
		// Report the cause, not the cancellation it caused on the other side.
		if acceptErr != nil && (dialErr == nil || errors.Is(dialErr, context.Canceled)) {
			return nil, acceptErr
		}
		if dialErr != nil && (acceptErr == nil || errors.Is(acceptErr, context.Canceled)) {
			return nil, dialErr
		}
		return nil, errors.Join(acceptErr, dialErr)
	}
	if opts.Streams {
		if err := openRingStreams(ctx, l, links, opts); err != nil {
			links.Close()
			return nil, err
		}
	}
	return links, nil
}

// openRingStreams opens the ring streams beside the replica ring's links,
// whose handshakes have agreed on the peers: the one to replica r+1 beside
// ReplicaNext, and the one from replica r-1 beside ReplicaPrev.
func openRingStreams(ctx context.Context, l *Layout, links *Links, opts transport.Options) error {
	c, i, r := l.Config, l.Stage, l.Replica
	var inErr, outErr error
	var wg sync.WaitGroup
	wg.Go(func() { links.ReplicaIn, inErr = links.server.AcceptStream(ctx, transport.ReplicaGroup) })
	wg.Go(func() {
		links.ReplicaOut, outErr = transport.DialStream(ctx, c.Address(i, (r+1)%l.Replicas), l.Reduce, links.ReplicaNext.Peer(), opts)
	})
	wg.Wait()
	if err := firstCause(inErr, outErr); err != nil {
		return fmt.Errorf("%s (all_reduce.transport: stream): %w", c.ProcessName(i, r), err)
	}
	return nil
}

// firstCause picks the error that caused the others among a's and b's.
func firstCause(a, b error) error {
	switch {
	case a != nil && (b == nil || errors.Is(b, context.Canceled)):
		return a
	case b != nil && (a == nil || errors.Is(a, context.Canceled)):
		return b
	}
	return errors.Join(a, b)
}

// linkOptions are stage i's transport settings from the config: timeouts,
// keep-alives, and the token and TLS identity that authenticate its links.
func LinkOptions(c *configs.Config, i int) (transport.Options, error) {
	token, err := c.AuthToken()
	if err != nil {
		return transport.Options{}, fmt.Errorf("stage %d: %w", i, err)
	}
	opts := transport.Options{
		ConnectTimeout: c.Transport.ConnectTimeout,
		QueueDepth:     c.Transport.QueueDepth,
		Heartbeat:      c.Transport.Heartbeat,
		PeerTimeout:    c.Transport.PeerTimeout,
		Token:          token,
	}
	if c.Transport.TLS.Enabled() {
		if opts.TLS, err = transport.LoadTLS(c.TLSFiles(i)); err != nil {
			return transport.Options{}, fmt.Errorf("stage %d: transport.tls: %w", i, err)
		}
		if c.AutoAddresses() {
			opts.TLS.ServerName = certs.JobName
		}
	}
	return opts, nil
}

// LinkShapes lists, by chunk tag, the activation shapes on the link stage
// `from` dials, to its next stage: tag c is the boundary whose upstream model
// stage is a chunk c the link carries. Under Loop placement that is the
// boundary after model stage c*p + from, for as long as that is not the
// model's last stage; under V the link from stage s to s+1 carries chunk 0's
// boundary down (tag 0) and chunk 1's back up (tag 1). Gradients have the
// same shapes.
func LinkShapes(c *configs.Config, model *models.Model, from int) [][]int {
	top := c.Topology()
	byTag := map[int][]int{}
	for k := 0; k+1 < c.ModelStages(); k++ {
		sa, ca := top.Locate(k)
		sb, _ := top.Locate(k + 1)
		if dialer, ok := linkDialer(top, sa, sb); ok && dialer == from {
			stage, chunk := top.Locate(k + 1)
			first, _ := c.ChunkLayers(stage, chunk)
			byTag[ca] = []int(model.ShapeAt(first, c.MicroBatchSize()))
		}
	}
	var out [][]int
	for tag := 0; byTag[tag] != nil; tag++ {
		out = append(out, byTag[tag])
	}
	// The ring link also carries the gradients of weights tied between the
	// first and the last stage, tagged after the activation chunks.
	if p := len(c.Stages); from == p-1 && top.Ring(len(model.Tied) > 0) {
		out = append(out, model.TiedShapes...)
	}
	// The link to the next stage also carries control messages as raw
	// bytes, tagged after the activations: the gradient norm's parts down
	// and its total back, and the evaluations' losses the stages judge.
	if from < len(c.Stages)-1 && (c.Train.ClipGradNorm > 0 || c.JudgesEvaluations()) {
		dt, err := WireDType(c, model)
		if err == nil {
			out = append(out, collective.BytesShape(dt, normBytes))
		}
	}
	return out
}

// linkDialer returns the stage that dials the link an activation from stage
// a to stage b travels on; ok is false when a and b are one stage (a
// hand-off between its chunks). Under Loop placement activations go from the
// dialer (the ring's last stage dials stage 0); under V both ways share the
// link the upper stage dials.
func linkDialer(top schedule.Topology, a, b int) (dialer int, ok bool) {
	switch {
	case a == b:
		return 0, false
	case top.Placement == schedule.V:
		return min(a, b), true
	}
	return a, true
}

// NeedsRing reports whether the last stage also links to stage 0: interleaved
// schedules send activations that way, and tied weights their gradients
// when two stages hold them (not under a V, whose stage 0 holds both ends).
func NeedsRing(c *configs.Config, model *models.Model) bool {
	return c.Topology().Ring(len(model.Tied) > 0)
}

// WireDType is the dtype tensors have on the links: the model's, or 16 bits with
// transport.compression.
func WireDType(c *configs.Config, model *models.Model) (transport.DType, error) {
	dt, err := transport.ParseDType(model.DType.String())
	if err != nil {
		return 0, err
	}
	return transport.WireDType(dt, c.Transport.Compression)
}
