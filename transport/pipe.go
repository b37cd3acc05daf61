package transport

import (
	"context"
	"fmt"
	"sync"
)

// Pipe returns two connected in-memory Links (a is upstream, b downstream)
// for unit tests of other packages. They behave like a gRPC link: bounded
// queues of depth (min 1), the same Send and Recv checks (kind, chunk in
// range, dtype and a.Shapes[chunk] / b.Shapes[chunk]), tensors copied so the ends share no
// memory, and Recv on one end fails with ErrPeerClosed (after
// draining what was sent) once the other end is closed. No goroutines.
func Pipe(a, b Hello, depth int) (Link, Link) {
	depth = max(depth, 1)
	down, up := make(chan *Tensor, depth), make(chan *Tensor, depth)
	ac, bc := make(chan struct{}), make(chan struct{})
	a, b = a.clone(), b.clone()
	pa := &pipeEnd{self: a, peer: b, out: Activation, in: up, send: down, closed: ac, peerClosed: bc}
	pb := &pipeEnd{self: b, peer: a, out: Gradient, in: down, send: up, closed: bc, peerClosed: ac}
	return pa, pb
}

type pipeEnd struct {
	self, peer Hello
	out        Kind
	in         <-chan *Tensor
	send       chan<- *Tensor
	closed     chan struct{}
	peerClosed <-chan struct{}
	once       sync.Once
}

func (p *pipeEnd) Peer() Hello { return p.peer.clone() }

func (p *pipeEnd) Send(ctx context.Context, t *Tensor) error {
	if err := checkOutgoing(p.self, p.peer, p.out, t); err != nil {
		return err
	}
	select {
	case <-p.closed:
		return fmt.Errorf("%s: %w", p.peer.name(), ErrClosed)
	case <-p.peerClosed:
		return fmt.Errorf("%s: stream closed: %w", p.peer.name(), ErrPeerClosed)
	default:
	}
	select {
	case p.send <- t.clone():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-p.closed:
		return fmt.Errorf("%s: %w", p.peer.name(), ErrClosed)
	case <-p.peerClosed:
		return fmt.Errorf("%s: stream closed: %w", p.peer.name(), ErrPeerClosed)
	}
}

func (p *pipeEnd) Recv(ctx context.Context) (*Tensor, error) {
	t, err := p.recv(ctx)
	if err != nil {
		return nil, err
	}
	if err := checkIncoming(p.self, p.peer, opposite(p.out), t); err != nil {
		return nil, err
	}
	return t, nil
}

func (p *pipeEnd) recv(ctx context.Context) (*Tensor, error) {
	select {
	case <-p.closed:
		return nil, fmt.Errorf("%s: %w", p.peer.name(), ErrClosed)
	default:
	}
	select {
	case t := <-p.in:
		return t, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-p.closed:
		return nil, fmt.Errorf("%s: %w", p.peer.name(), ErrClosed)
	case <-p.peerClosed:
		select { // what the peer sent before closing is still delivered
		case t := <-p.in:
			return t, nil
		default:
			return nil, fmt.Errorf("%s: stream closed: %w", p.peer.name(), ErrPeerClosed)
		}
	}
}

func (p *pipeEnd) Close() error {
	p.once.Do(func() { close(p.closed) })
	return nil
}

// Queues reports the tensors queued towards the peer and waiting to be received.
func (p *pipeEnd) Queues() (send, recv int) { return len(p.send), len(p.in) }
