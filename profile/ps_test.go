package profile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/runlog"
)

// TestReadServersNamesTheFile: a server's missing log, or a bad line in
// one, is an error naming the file (and the line).
func TestReadServersNamesTheFile(t *testing.T) {
	dir := t.TempDir()
	info := RunInfo{Stages: 1, ParameterServers: 2}
	if err := os.MkdirAll(filepath.Join(dir, "events"), 0o755); err != nil {
		t.Fatal(err)
	}
	good := `{"server":0,"stage":0,"kind":"update","step":0,"workers":[0,1],"staleness":[0,0],"start_ns":10,"end_ns":20,"bytes_in":80}` + "\n"
	if err := os.WriteFile(runlog.PSEventsFile(dir, 0), []byte(good), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := ReadServers(dir, info)
	if err == nil || !strings.Contains(err.Error(), "no events for parameter server 1: "+runlog.PSEventsFile(dir, 1)+" does not exist") {
		t.Errorf("missing log: %v", err)
	}
	bad := `{"server":1,"stage":0,"kind":"pull","step":1,"worker":1,"start_ns":30,"end_ns":40}` + "\n" +
		`{"server":1,"stage":0,"kind":"update","step":1,"workers":[0,1],"staleness":[0],"start_ns":30,"end_ns":40}` + "\n"
	if err := os.WriteFile(runlog.PSEventsFile(dir, 1), []byte(bad), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = ReadServers(dir, info)
	if err == nil || !strings.Contains(err.Error(), runlog.PSEventsFile(dir, 1)+":2: 1 staleness values for 2 workers") {
		t.Errorf("bad line: %v", err)
	}
	if _, err := ReadServers(dir, RunInfo{Stages: 1, ParameterServers: 1}); err != nil {
		t.Errorf("good log: %v", err)
	}
}

// TestServerStagesSumTheLog: a server's updates, drops, pulls and
// departures are summed per stage, stages in order.
func TestServerStagesSumTheLog(t *testing.T) {
	events := []PSEvent{
		{Stage: 1, Kind: runlog.PSUpdate, Workers: []int{0}, Staleness: []int64{2}, StartNS: 0, EndNS: int64(3 * time.Millisecond), BytesIn: 100},
		{Stage: 0, Kind: runlog.PSUpdate, Workers: []int{0, 1}, Staleness: []int64{0, 0}, StartNS: 0, EndNS: int64(time.Millisecond), BytesIn: 200},
		{Stage: 1, Kind: runlog.PSUpdate, Workers: []int{1}, Staleness: []int64{0}, StartNS: 0, EndNS: int64(time.Millisecond), BytesIn: 100},
		{Stage: 0, Kind: runlog.PSDrop, Worker: 2, BytesIn: 100},
		{Stage: 1, Kind: runlog.PSPull, Worker: 1, WaitNS: int64(5 * time.Millisecond), BytesOut: 70},
		{Stage: 1, Kind: runlog.PSDepart, Worker: 2},
	}
	got := serverStages(3, events)
	if len(got) != 2 || got[0].Stage != 0 || got[1].Stage != 1 {
		t.Fatalf("stages %+v", got)
	}
	s0, s1 := got[0], got[1]
	if s0.Server != 3 || s0.Updates != 1 || s0.Pushes != 2 || s0.Dropped != 1 || s0.BytesIn != 300 || s0.Busy != time.Millisecond {
		t.Errorf("stage 0: %+v", s0)
	}
	if s1.Updates != 2 || s1.Pushes != 2 || s1.Pulls != 1 || s1.Departed != 1 || s1.BytesOut != 70 || s1.PullWait != 5*time.Millisecond || s1.Busy != 4*time.Millisecond {
		t.Errorf("stage 1: %+v", s1)
	}
	if h := histogramText(s1.Staleness); h != "0: 1, 2: 1" {
		t.Errorf("stage 1's staleness %q", h)
	}
}
