package stages

import (
	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/transport"
)

// held is what a micro-batch received: its input activation and, later, its
// output gradient.
type held []*transport.Tensor

// releaseHeld hands a finished micro-batch's received tensors back to the
// transport where e no longer refers to their memory (compute.Stage.Unshare).
func releaseHeld(e compute.Stage, h held) {
	for _, t := range h {
		if e.Unshare(t.Data) {
			t.Release()
		}
	}
}
