package runlog

import (
	"testing"

	"github.com/pipetrain/pipetrain/schedule"
)

// TestKindsAreTheSchedules: an event's kind is its action's, spelled as the
// schedule spells it, so logs, profiles and schedules name work alike.
func TestKindsAreTheSchedules(t *testing.T) {
	for k, want := range map[schedule.Kind]string{schedule.Forward: Forward, schedule.Backward: Backward, schedule.Input: Input, schedule.Weight: Weight} {
		if k.String() != want {
			t.Errorf("schedule kind %v is logged as %q", k, want)
		}
	}
	e := Event{Stage: 1, Kind: Optimizer, StartNS: 2, EndNS: 1}
	if err := e.Check(1); err == nil {
		t.Error("an event ending before it starts was accepted")
	}
	if e.EndNS = 3; e.Check(1) != nil || e.Check(0) == nil {
		t.Error("Check does not tie an event to its stage's log")
	}
}
