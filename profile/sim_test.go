package profile

import (
	"testing"

	"github.com/pipetrain/pipetrain/schedule"
)

// play describes a synthetic run: a schedule executed step after step as the
// runtime would, with known action costs, message delays and clocks. Times
// are ns.
type play struct {
	sched *schedule.Schedule
	steps int
	// cost is how long one action (one chunk's) of a kind takes on stage in
	// step; nil means F 1 ms, B 2 ms, I and W 1 ms.
	cost func(step, stage int, k schedule.Kind) int64
	// spread scales one action's cost (micro-batch mb's); nil means 1.
	spread func(step, stage, mb int, k schedule.Kind) float64
	// delay is a message's latency from the sender's end to the receiver's
	// availability; nil means none.
	delay func(step int, grad bool, from, to, mb int) int64
	// sendNS is the blocked-send time an action logs; nil means none.
	sendNS func(step, stage int, k schedule.Kind) int64
	opt    int64   // optimizer duration
	gap    int64   // idle time between one step's last optimizer end and the next step
	clock  []int64 // per-stage clock offset added to every logged time; nil means none
	act    int64   // bytes of one activation
	grad   int64   // bytes of one gradient
}

const wall0 = int64(1_700_000_000_000_000_000) // a plausible wall clock

// events plays the run. Every step starts on all stages at once (after the
// previous step's slowest optimizer and the gap), so that with free transfers
// each step's timeline is exactly schedule.Simulate's.
func (c play) events(t *testing.T) [][]Event {
	t.Helper()
	s := c.sched
	p, v := s.Stages, s.Chunks
	last := p*v - 1
	cost := c.cost
	if cost == nil {
		cost = func(_, _ int, k schedule.Kind) int64 {
			if k == schedule.Backward {
				return 2 * ms
			}
			return ms
		}
	}
	delay := c.delay
	if delay == nil {
		delay = func(int, bool, int, int, int) int64 { return 0 }
	}
	out := make([][]Event, p)
	start := wall0
	type key struct {
		kind   schedule.Kind
		ms, mb int
	}
	for step := range c.steps {
		done := map[key]int64{} // true end times; B and I both under Backward
		free := make([]int64, p)
		next := make([]int, p)
		stashed := make([]int, p)
		for st := range p {
			free[st] = start
		}
		for moved := true; moved; {
			moved = false
			for st := range p {
				for next[st] < len(s.Actions[st]) {
					a := s.Actions[st][next[st]]
					k := a.Chunk*p + st
					ready, ok := free[st], true
					dep := func(d key, lat int64) {
						e, found := done[d]
						if !found {
							ok = false
						}
						ready = max(ready, e+lat)
					}
					switch a.Kind {
					case schedule.Forward:
						if k > 0 {
							dep(key{schedule.Forward, k - 1, a.MicroBatch}, delay(step, false, (k-1)%p, st, a.MicroBatch))
						}
					case schedule.Backward, schedule.Input:
						dep(key{schedule.Forward, k, a.MicroBatch}, 0)
						if k < last {
							dep(key{schedule.Backward, k + 1, a.MicroBatch}, delay(step, true, (k+1)%p, st, a.MicroBatch))
						}
					case schedule.Weight:
						dep(key{schedule.Input, k, a.MicroBatch}, 0)
					}
					if !ok {
						break
					}
					d := cost(step, st, a.Kind)
					if c.spread != nil {
						d = int64(float64(d) * c.spread(step, st, a.MicroBatch, a.Kind))
					}
					e := Event{Stage: st, Step: step, MB: a.MicroBatch, Chunk: a.Chunk, StartNS: ready,
						EndNS: ready + d, WaitNS: ready - free[st]}
					switch a.Kind {
					case schedule.Forward:
						e.Kind = Forward
						stashed[st]++
						if k < last {
							e.BytesSent = c.act
						}
						done[key{schedule.Forward, k, a.MicroBatch}] = e.EndNS
					case schedule.Backward, schedule.Input:
						e.Kind = Backward
						if a.Kind == schedule.Input {
							e.Kind = Input
							done[key{schedule.Input, k, a.MicroBatch}] = e.EndNS
						} else {
							stashed[st]--
						}
						if k > 0 {
							e.BytesSent = c.grad
						}
						done[key{schedule.Backward, k, a.MicroBatch}] = e.EndNS
					case schedule.Weight:
						e.Kind = Weight
						e.WaitNS = 0
						stashed[st]--
					}
					if c.sendNS != nil {
						e.SendNS = c.sendNS(step, st, a.Kind)
					}
					e.Stashed = stashed[st]
					out[st] = append(out[st], e)
					free[st] = e.EndNS
					next[st]++
					moved = true
				}
			}
		}
		end := start
		for st := range p {
			if next[st] < len(s.Actions[st]) {
				t.Fatalf("play: step %d deadlocks on stage %d", step, st)
			}
			out[st] = append(out[st], Event{Stage: st, Step: step, Kind: Optimizer, StartNS: free[st], EndNS: free[st] + c.opt})
			end = max(end, free[st]+c.opt)
		}
		start = end + c.gap
	}
	for st := range c.clock {
		for i := range out[st] {
			out[st][i].StartNS += c.clock[st]
			out[st][i].EndNS += c.clock[st]
		}
	}
	return out
}

func build(t *testing.T, name string, p, m, v int) *schedule.Schedule {
	t.Helper()
	s, err := schedule.Build(name, p, m, v)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func runInfo(s *schedule.Schedule, steps int) RunInfo {
	info := RunInfo{Schedule: s.Name, Stages: s.Stages, MicroBatches: s.MicroBatches, Steps: steps}
	if s.Chunks > 1 {
		info.Chunks = s.Chunks
	}
	info.TheoreticalBubble, _ = schedule.TheoreticalBubble(s.Name, s.Stages, s.MicroBatches, s.Chunks)
	return info
}
