package schedule

import (
	"testing"
	"time"
)

func TestLoopbackLinkTimesAMessage(t *testing.T) {
	// 1 MB at 2 GB/s is 500 us, plus the 100 us latency.
	if got, want := Loopback.Time(1_000_000), 600*time.Microsecond; got != want {
		t.Errorf("Loopback.Time(1 MB) = %v, want %v", got, want)
	}
	if got := Loopback.Time(0); got != 100*time.Microsecond {
		t.Errorf("Loopback.Time(0) = %v, want the latency alone", got)
	}
	if Loopback.BytesPerMS() != 2e6 || Loopback.LatencyMS() != 0.1 {
		t.Errorf("Loopback in ms units: %g bytes/ms, %g ms; want 2e6 and 0.1", Loopback.BytesPerMS(), Loopback.LatencyMS())
	}
}
