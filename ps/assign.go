// Package ps holds pipetrain's parameter servers (docs/parameter-servers.md):
// processes that keep the model's weights and optimizer state, sharded by
// tensor, while the workers (whole pipelines) push their step's gradients
// and pull the updated weights.
//
// The aggregation logic is a pure state machine (Machine): pushes go in,
// updates and drops come out, with no I/O or clock, so its rules are
// tested directly; Server wraps it with the tensors, the optimizer and the
// gRPC stream service (transport.Service, guarded like every link).
package ps

import (
	"cmp"
	"slices"
)

// Tensor is one of the model's parameters as the assignment sees it.
type Tensor struct {
	Name  string
	Bytes int64
}

// Assign places each tensor on one of servers servers, balancing the bytes:
// largest first (ties in the given order), each to the server holding the
// fewest bytes so far (ties to the lowest index). Every process computes
// the same assignment from the same list.
func Assign(ts []Tensor, servers int) []int {
	order := make([]int, len(ts))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(ts[b].Bytes, ts[a].Bytes) })
	load := make([]int64, servers)
	out := make([]int, len(ts))
	for _, i := range order {
		s := 0
		for k := 1; k < servers; k++ {
			if load[k] < load[s] {
				s = k
			}
		}
		out[i] = s
		load[s] += ts[i].Bytes
	}
	return out
}
