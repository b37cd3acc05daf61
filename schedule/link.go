package schedule

import "time"

// Link is the cost model of a message between two processes: a fixed
// latency plus its bytes at a bandwidth.
type Link struct {
	BytesPerSecond float64
	Latency        time.Duration // per message
}

// Loopback is a message over gRPC links on loopback, as measured on the
// machines pipetrain was developed on: 2 GB/s plus 100 us. It is the one
// link model every estimate that has no measurement takes: the transfer
// between stages (engine.EstimateTransfer), the planner's links and the
// all-reduce ring's default figures.
var Loopback = Link{BytesPerSecond: 2e9, Latency: 100 * time.Microsecond}

// Time is how long a message of bytes takes.
func (l Link) Time(bytes int64) time.Duration {
	return l.Latency + time.Duration(float64(bytes)/l.BytesPerSecond*float64(time.Second))
}

// BytesPerMS is the bandwidth in the simulator's units.
func (l Link) BytesPerMS() float64 { return l.BytesPerSecond / 1000 }

// LatencyMS is the latency in the simulator's units.
func (l Link) LatencyMS() float64 { return float64(l.Latency) / 1e6 }

// Figures is the link in the simulator's units.
func (l Link) Figures() LinkFigures {
	return LinkFigures{Bandwidth: l.BytesPerMS(), Latency: l.LatencyMS()}
}
