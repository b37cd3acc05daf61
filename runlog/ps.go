package runlog

import "fmt"

// Parameter-server event kinds: what a server logs (PSEvent.Kind).
const (
	// PSUpdate is an optimizer step of one stage's tensors: the pushes it
	// summed, their bytes and staleness, and the time the sum and the step
	// took (the server's busy time).
	PSUpdate = "update"
	// PSDrop is a push that came after its step's update (backup workers).
	PSDrop = "drop"
	// PSPull is a pull answered: how long it waited for the updates the
	// worker needs, and the weights' bytes sent.
	PSPull = "pull"
	// PSDepart is a worker stage whose stream ended without its goodbye.
	PSDepart = "depart"
	// PSRejoin is a worker stage restarted after it departed, back in an
	// async run from Step on.
	PSRejoin = "rejoin"
)

// PSEvent is one line of a parameter server's event log (PSEventsFile).
// Times are wall-clock ns, as a stage's events are.
type PSEvent struct {
	Server int    `json:"server"`
	Stage  int    `json:"stage"` // the pipeline stage whose tensors
	Kind   string `json:"kind"`  // PSUpdate, PSDrop, PSPull, PSDepart or PSRejoin
	// Step is an update's step (the newest of its pushes), a drop's, the
	// step a pull's worker is about to compute (-1 for its final weights),
	// or the step a rejoining worker trains from.
	Step int64 `json:"step"`
	// Workers are an update's pushes, in worker order, and Staleness each
	// one's: how many updates were made between the weights it was
	// computed from and this one.
	Workers   []int   `json:"workers,omitempty"`
	Staleness []int64 `json:"staleness,omitempty"`
	// Worker is a drop's, pull's, departure's or rejoin's.
	Worker int `json:"worker,omitempty"`
	// StartNS and EndNS bound an update's sum and optimizer step, and a
	// pull from its request to its answer; WaitNS is the part of a pull
	// spent waiting for updates.
	StartNS int64 `json:"start_ns"`
	EndNS   int64 `json:"end_ns"`
	WaitNS  int64 `json:"wait_ns,omitempty"`
	// BytesIn is what an update's (or a drop's) pushes carried on the
	// wire; BytesOut what a pull's answer did.
	BytesIn  int64 `json:"bytes_in,omitempty"`
	BytesOut int64 `json:"bytes_out,omitempty"`
}

// Check rejects an event of server i's log that would skew a report.
func (e *PSEvent) Check(i int) error {
	switch {
	case e.Server != i:
		return fmt.Errorf("event of server %d in server %d's log", e.Server, i)
	case e.Kind != PSUpdate && e.Kind != PSDrop && e.Kind != PSPull && e.Kind != PSDepart && e.Kind != PSRejoin:
		return fmt.Errorf("unknown kind %q: want update, drop, pull, depart or rejoin", e.Kind)
	case e.EndNS < e.StartNS:
		return fmt.Errorf("end_ns %d before start_ns %d", e.EndNS, e.StartNS)
	case len(e.Staleness) != len(e.Workers):
		return fmt.Errorf("%d staleness values for %d workers", len(e.Staleness), len(e.Workers))
	}
	return nil
}
