package schedule

import "fmt"

// dualPipeVMinMicroBatches is the fewest micro-batches dualpipev accepts on
// p stages: DualPipeV's own rule (num_chunks >= num_ranks * 2), below which
// stage 0's steady state would run a negative number of times.
func dualPipeVMinMicroBatches(p int) int { return 2 * p }

func dualPipeVSizes(p, m, v int) error {
	switch {
	case v != 2:
		return fmt.Errorf("chunks == 2 (one model stage on the way down the V and one on the way up), got %d", v)
	case m < dualPipeVMinMicroBatches(p):
		return fmt.Errorf("micro_batches >= %d for %d stages (2*stages, DualPipeV's rule: every stage's steady state must run at least once), got %d",
			dualPipeVMinMicroBatches(p), p, m)
	}
	return nil
}

// dualPipeVStage is stage s's list in DeepSeek's DualPipeV (the DualPipe
// repository's dualpipev.py, which torch.distributed.pipelining's
// ScheduleDualPipeV follows): chunk 0 is model stage s, chunk 1 model stage
// 2p-1-s, and each chunk's forwards and backwards run in micro-batch order.
// A backward is whole (B) or, where DualPipeV enables zero bubble, an
// input-gradient pass (I) whose weight pass (W) joins a queue that W steps
// empty oldest first, whichever chunk it belongs to. In order:
//
//  1. 2(p-s-1) forwards of chunk 0;
//  2. s+1 pairs: a forward of chunk 0, then one of chunk 1;
//  3. p-s-1 triples on chunk 1: input gradient, its weight pass, forward;
//  4. the steady state, m-2p+s+1 times: a forward of chunk 0 with a
//     backward of chunk 1, then a forward of chunk 1 with a backward of
//     chunk 0;
//  5. p-s-1 times: a backward of chunk 1, then a forward of chunk 1 with a
//     backward of chunk 0;
//  6. s+1 pairs of backwards, chunk 1 then chunk 0; from the middle pair on
//     (on odd stages from its chunk 1, on even stages from its chunk 0) they
//     are input-gradient passes, s+1 of them;
//  7. p-s-1 times: a queued weight pass, then an input-gradient pass of
//     chunk 0;
//  8. the s+1 weight passes left in the queue.
//
// DualPipeV runs each "forward with a backward" pair overlapped (the
// computation of one hides the other's communication); here the pair is the
// two actions back to back, forward first, and the runtime's asynchronous
// sends do the hiding. On the last stage DualPipeV does not overlap the first
// pair of step 4, which changes nothing here.
//
// At the end of step 2 the stage has run 2p-s-1 forwards of chunk 0 and s+1
// of chunk 1 and released nothing: it holds 2p micro-batch chunks; step 3
// releases one (W) before each forward; step 4's first forward takes it to
// 2p+1 before its paired backward releases one, and nothing goes higher. So
// every stage holds at most 2p+1 micro-batch chunks for every m >= 2p,
// DualPipe's "PP+1" activations per device with PP = 2p model stages: one
// chunk more than zb-v.
func dualPipeVStage(s, p, m, v int) []Action {
	out := make([]Action, 0, 6*m)
	var f, b [2]int // the next forward and backward (B or I) of each chunk
	var queue []Action
	fwd := func(c int) {
		out = append(out, Action{Stage: s, Kind: Forward, MicroBatch: f[c], Chunk: c})
		f[c]++
	}
	back := func(c int, split bool) {
		a := Action{Stage: s, Kind: Backward, MicroBatch: b[c], Chunk: c}
		if split {
			a.Kind = Input
			queue = append(queue, Action{Stage: s, Kind: Weight, MicroBatch: b[c], Chunk: c})
		}
		out = append(out, a)
		b[c]++
	}
	weight := func() {
		out = append(out, queue[0])
		queue = queue[1:]
	}
	for range 2 * (p - s - 1) {
		fwd(0)
	}
	for range s + 1 {
		fwd(0)
		fwd(1)
	}
	for range p - s - 1 {
		back(1, true)
		weight()
		fwd(1)
	}
	for range m - 2*p + s + 1 {
		fwd(0)
		back(1, false)
		fwd(1)
		back(0, false)
	}
	for range p - s - 1 {
		back(1, false)
		fwd(1)
		back(0, false)
	}
	split := false
	for i := range s + 1 {
		if i == (s+1)/2 && s%2 == 1 {
			split = true
		}
		back(1, split)
		if i == (s+1)/2 && s%2 == 0 {
			split = true
		}
		back(0, split)
	}
	for range p - s - 1 {
		weight()
		back(0, true)
	}
	for range s + 1 {
		weight()
	}
	return out
}

// dualPipeVBubble: with F = I = W = 1 per stage (B = 2), each of
// dualpipev's chunk actions costs half of that (F = I = W = 1/2, B = 1) and
// each stage works 3m units. As for zb-v, stage p-1 cannot start before the
// first micro-batch has come down to it, (p-1)/2, so the makespan is at
// least 3m + (p-1)/2; DualPipeV's order meets that bound for every m >= 2p:
// stage s idles s/2 before its first forward and half a unit in each of
// step 5's p-1-s pairs, where chunk 0's backward waits for its gradient from
// stage s+1. That is zb-v's bubble, (p-1)/(6m+p-1), and the simulator charges
// the start-up skew to every step as it does for zb-v.
//
// DualPipe's README puts DualPipeV's bubble at (PP/2-1)(F&B + B - 3W) per
// device, PP = 2p model stages, with F, B and W a chunk's passes and F&B an
// overlapped pair of a forward and a backward. With no overlap speed-up,
// F&B = F + B, that is (p-1)(F + 2B - 3W) = p-1 units here: twice the
// above. The formula counts an overlapped pair as one block, which starts
// once both its inputs are in and whose outputs leave at its end; played so,
// this order idles exactly p-1 units on every stage (the tests check it).
// pipetrain runs the pair as two actions: the forward starts as soon as its
// activation is in and sends at its own end, while the backward's gradient
// is still on its way, which saves half of that.
func dualPipeVBubble(p, m, v int) float64 {
	return float64(p-1) / float64(6*m+p-1)
}
