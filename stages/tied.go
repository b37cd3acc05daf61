package stages

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/transport"
)

// Tied weights are one matrix used by two layers (a language model's token
// embedding and its output head), which a pipeline places on its first and last
// stages. Each of those stages holds its own copy; both start bit-identical, and
// before every optimizer step each sends the other its gradient over the ring
// link, so both apply the same summed gradient and stay identical: the pipeline
// trains exactly the model that holds the matrix once. In one process (the
// reference) the two copies sit in one stage and the sum is taken locally.
// Where and with whom is the lowered schedule's to say (schedule.AddTiedSync).

// layerOf is the layer a parameter belongs to: "embed" for "embed.tok".
func layerOf(param string) string {
	name, _, _ := strings.Cut(param, ".")
	return name
}

// tiedGrad is one half of a tied weight's summed gradient, in host memory,
// and the chunk to hand it back to once changed.
type tiedGrad struct {
	chunk compute.Stage
	all   []compute.Weight // the chunk's gradients, as it handed them out
	value *tensor.Dense    // the half's, one of all
}

// store hands the changed gradient back to its chunk.
func (g *tiedGrad) store() error { return g.chunk.LoadGradients(g.all) }

// gradOf finds a parameter's summed gradient among the stage's chunks; nil
// when the stage holds no such parameter.
func (r *Runtime) gradOf(name string) (*tiedGrad, error) {
	for _, c := range r.chunks {
		ws := c.Weights()
		i := slices.IndexFunc(ws, func(w compute.Weight) bool { return w.Name == name })
		if i < 0 {
			continue
		}
		grads, err := c.Gradients()
		if err != nil {
			return nil, err
		}
		return &tiedGrad{chunk: c, all: grads, value: grads[i].Value}, nil
	}
	return nil, nil
}

// SyncTied runs a SyncTied op (Computer): it makes tied weight o.Index's two gradients
// their sum, locally when this stage holds both halves (the reference, or a
// one-stage pipeline), else by exchanging this stage's half with o.Peer's over
// the ring link, tagged as the lowered schedule says.
func (r *Runtime) SyncTied(ctx context.Context, step int, o schedule.Op) error {
	if o.Index < 0 || o.Index >= len(r.tied) {
		return fmt.Errorf("the model has %d tied weights", len(r.tied))
	}
	// The halves are summed once each is summed over the replicas.
	if err := r.awaitReductions(ctx, step); err != nil {
		return err
	}
	names := r.tied[o.Index]
	a, err := r.gradOf(names[0])
	if err != nil {
		return err
	}
	b, err := r.gradOf(names[1])
	if err != nil {
		return err
	}
	switch {
	case a != nil && b != nil:
		sum, err := addGrads(a.value, b.value)
		if err != nil {
			return err
		}
		copy2(a.value, sum)
		if err := a.store(); err != nil {
			return err
		}
		// b's chunk may be a's: its gradients are read again after a's store.
		if b, err = r.gradOf(names[1]); err != nil {
			return err
		}
		copy2(b.value, sum)
		return b.store()
	case a == nil && b == nil:
		return fmt.Errorf("stage %d holds neither %s nor %s", r.stage, names[0], names[1])
	}
	mine := a
	if mine == nil {
		mine = b
	}
	other, err := r.exchangeTied(ctx, step, o.TiedTag(len(r.chunks)), mine.value)
	if err != nil {
		return fmt.Errorf("tied weights %s and %s: %w", names[0], names[1], err)
	}
	// a + b in the same order on both stages (addition commutes in IEEE
	// arithmetic anyway, so the two sums are equal bit for bit).
	var sum *tensor.Dense
	if a != nil {
		sum, err = addGrads(a.value, other)
	} else {
		sum, err = addGrads(other, b.value)
	}
	if err != nil {
		return err
	}
	copy2(mine.value, sum)
	return mine.store()
}

// exchangeTied sends this stage's gradient of a tied weight over the ring link,
// tagged tag, and returns the other stage's.
func (r *Runtime) exchangeTied(ctx context.Context, step, tag int, mine *tensor.Dense) (*tensor.Dense, error) {
	var link *peer
	kind := transport.Activation // the ring's dialer (last stage) sends activations
	switch {
	case r.stage == 0:
		link, kind = r.prev, transport.Gradient
	case r.stage == r.stages-1:
		link = r.next
	}
	if link == nil {
		return nil, fmt.Errorf("stage %d holds one of them but has no ring link to the stage holding the other", r.stage)
	}
	if _, _, err := link.send(ctx, kind, int64(step), 0, tag, mine); err != nil {
		return nil, err
	}
	return link.recv(ctx, int64(step), 0, tag)
}

func addGrads(a, b *tensor.Dense) (*tensor.Dense, error) {
	v, err := a.Add(b)
	if err != nil {
		return nil, err
	}
	return v, nil
}

func copy2(dst, src *tensor.Dense) {
	switch d := dst.Data().(type) {
	case []float32:
		copy(d, src.Data().([]float32))
	case []float64:
		copy(d, src.Data().([]float64))
	}
}
