package stages

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/profile"
)

func readClock(t *testing.T, dir string, stage int) profile.Clock {
	t.Helper()
	b, err := os.ReadFile(profile.ClockFile(dir, stage))
	if err != nil {
		t.Fatal(err)
	}
	var c profile.Clock
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatalf("%s: %v", profile.ClockFile(dir, stage), err)
	}
	return c
}

// TestEventLogClockRecordPerStage: every stage of a run records, beside its
// event log, its host and the kernel's boot id, and the profile of the run
// says the stages share one clock.
func TestEventLogClockRecordPerStage(t *testing.T) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		t.Fatal(err)
	}
	boot := strings.TrimSpace(string(b))
	host, _ := os.Hostname()
	dir := runInProcess(t, testConfig("1f1b", plain("0", "1-2", "3"), 4, "float32", "adam"), false)
	for s := range 3 {
		if c := readClock(t, dir, s); c.BootID == "" || c.BootID != boot || c.Host != host || c.Earlier != nil {
			t.Errorf("stage %d recorded %+v, want boot id %s, host %s", s, c, boot, host)
		}
	}
	if _, err := os.Stat(profile.ClockFile(dir, 3)); !os.IsNotExist(err) {
		t.Errorf("a record for a stage the run does not have: %v", err)
	}
	info, events, err := profile.ReadRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	r, err := profile.Analyse(info, events, 1)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	r.Write(&out)
	want := "clocks: not shifted: stages 0-2 share one clock (boot id " + boot[:8] + "…, host " + host + ")\n"
	if !strings.Contains(out.String(), want) {
		t.Errorf("profile lacks %q:\n%s", want, out.String())
	}
}

// TestEventLogClockResumed: a resumed run keeps its earlier events, so each
// stage's record keeps the clocks they were timed on; here the host rebooted
// between the runs, and the stages still share a clock throughout.
func TestEventLogClockResumed(t *testing.T) {
	cfg := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "sgd")
	cfg.Train.Steps = 4
	cfg.Checkpoint.Every = 2
	dir := t.TempDir()
	runStagesIn(t, cfg, false, dir, false)
	before := readClock(t, dir, 0)

	rebooted := filepath.Join(t.TempDir(), "boot_id")
	os.WriteFile(rebooted, []byte("9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a\n"), 0o644)
	defer func(old string) { bootIDFile = old }(bootIDFile)
	bootIDFile = rebooted
	cfg.Train.Steps = 6
	runStagesIn(t, cfg, false, dir, true)
	info, _, err := profile.ReadRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := profile.Clock{Host: before.Host, BootID: "9f8e7d6c-5b4a-4392-8170-6f5e4d3c2b1a", Earlier: []profile.Clock{before}}
	if !reflect.DeepEqual(info.Clocks, []profile.Clock{want, want}) || !info.Clocks[0].Shares(&info.Clocks[1]) {
		t.Errorf("records after the resume %+v, want %+v each", info.Clocks, want)
	}
}

// TestEventLogClockWrite: what writeClock records when a run starts, or
// resumes a log that holds events of earlier processes.
func TestEventLogClockWrite(t *testing.T) {
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "events"), 0o755)
	now := localClock()
	old := profile.Clock{Host: "old", BootID: "b0", Earlier: []profile.Clock{{Host: "older", BootID: "b1"}}}
	for _, tc := range []struct {
		name   string
		record *profile.Clock // the record before the start; nil for none
		log    string         // the event log before the start
		resume bool
		want   []profile.Clock
	}{
		{"fresh run", &old, "{}\n", false, nil},
		{"resumed", &old, "{}\n", true, []profile.Clock{{Host: "older", BootID: "b1"}, {Host: "old", BootID: "b0"}}},
		{"resumed, nothing logged before", &old, "", true, nil},
		{"resumed, logged before records existed", nil, "{}\n", true, []profile.Clock{{}}},
	} {
		os.Remove(profile.ClockFile(dir, 0))
		if tc.record != nil {
			b, _ := json.Marshal(tc.record)
			os.WriteFile(profile.ClockFile(dir, 0), b, 0o644)
		}
		os.WriteFile(profile.EventsFile(dir, 0), []byte(tc.log), 0o644)
		if err := writeClock(dir, 0, 0, tc.resume); err != nil {
			t.Fatal(err)
		}
		want := now
		want.Earlier = tc.want
		if got := readClock(t, dir, 0); !reflect.DeepEqual(got, want) {
			t.Errorf("%s: recorded %+v, want %+v", tc.name, got, want)
		}
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "events")); len(entries) != 2 {
		t.Errorf("events/ holds %d files, want the log and the record", len(entries))
	}
}
