package stages

import (
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/transport"
)

// route is how one op's tensor travels between this stage and another.
type route uint8

const (
	routeNone  route = iota // the op moves no tensor
	routeLocal              // from one of the stage's chunks to another (the turn of a V): no link
	routePrev               // over the link the stage accepts, from its previous stage
	routeNext               // over the link the stage dials, to its next stage
)

// routeOf says how op o of stage travels under the schedule's topology. A
// link's dialing end sends every tensor as an activation and its listening
// end as a gradient (the transport checks each direction's kind), so under
// a V chunk 1's activations go up a link as gradients do: the route follows
// the direction the tensor crosses its link, not what it carries.
func routeOf(top schedule.Topology, stage int, o schedule.Op) route {
	switch o.Kind {
	case schedule.SendAct, schedule.SendGrad, schedule.RecvAct, schedule.RecvGrad:
	case schedule.ClipNorm:
		// Both links, but never the ring's: see clipRoutes.
		return routeNone
	case schedule.SyncTied:
		// Over the ring: stage 0 hears the last stage on its previous link,
		// the last stage talks to stage 0 on its next.
		switch {
		case o.Peer < 0:
			return routeNone
		case stage == 0:
			return routePrev
		}
		return routeNext
	default:
		return routeNone
	}
	if o.Peer == stage {
		return routeLocal
	}
	send := o.Kind == schedule.SendAct || o.Kind == schedule.SendGrad
	if send == top.Downstream(o) {
		return routeNext
	}
	return routePrev
}

// sendKind is the kind a tensor is sent as on a route's link.
func sendKind(r route) transport.Kind {
	if r == routeNext {
		return transport.Activation
	}
	return transport.Gradient
}

// handoff names a tensor one chunk of a stage hands to another within a
// step: activation or gradient, micro-batch, and the wire tag it would carry.
type handoff struct {
	grad    bool
	mb, tag int
}

func handoffOf(top schedule.Topology, o schedule.Op) handoff {
	return handoff{grad: o.Kind == schedule.SendGrad || o.Kind == schedule.RecvGrad, mb: o.Action.MicroBatch, tag: top.Tag(o)}
}

// link returns the stage's peer at the end of route rt (nil for none, or
// local); New checks that every op's link is there.
func (r *Runtime) link(rt route) *peer {
	switch rt {
	case routePrev:
		return r.prev
	case routeNext:
		return r.next
	}
	return nil
}
