package profile

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/pipetrain/pipetrain/runlog"
)

// PSEvent is one line of a parameter server's event log.
type PSEvent = runlog.PSEvent

// ReadServers reads the event log of each of the run's parameter servers
// (info.ParameterServers; nil for a run without). Every server's log is
// required; errors name the file, and the line for a bad event.
func ReadServers(dir string, info RunInfo) ([][]PSEvent, error) {
	out := make([][]PSEvent, info.ParameterServers)
	for i := range out {
		path := runlog.PSEventsFile(dir, i)
		b, err := os.ReadFile(path)
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("profile: no events for parameter server %d: %s does not exist", i, path)
		}
		if err != nil {
			return nil, fmt.Errorf("profile: %w", err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		sc.Buffer(nil, 1<<20)
		for line := 1; sc.Scan(); line++ {
			text := bytes.TrimSpace(sc.Bytes())
			if len(text) == 0 {
				continue
			}
			var e PSEvent
			if err := json.Unmarshal(text, &e); err != nil {
				return nil, fmt.Errorf("profile: %s:%d: %w", path, line, err)
			}
			if err := e.Check(i); err != nil {
				return nil, fmt.Errorf("profile: %s:%d: %w", path, line, err)
			}
			out[i] = append(out[i], e)
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("profile: %s: %w", path, err)
		}
	}
	return out, nil
}

// WorkerStage is one stage of one worker of a run with parameter servers,
// over the report's analysed steps, as its process logged it: means per
// step, each on the process's own clock.
type WorkerStage struct {
	Worker, Stage int
	Steps         int // analysed steps with a push and pull logged
	// Pushed and Pulled are the bytes its push and pull moved; Push and
	// Pull their times: the worker computes nothing meanwhile, so both are
	// exposed. Step is its step (ReplicaStage.Step), which they are part of.
	Pushed, Pulled   int64
	Push, Pull, Step time.Duration
	// Staleness counts the steps by their push's staleness (runlog.Event).
	Staleness map[int64]int
	// Dropped is how many of its pushes servers dropped (backup workers).
	Dropped int
}

// Exposed is the share of the worker stage's step its push and pull took.
func (w WorkerStage) Exposed() float64 {
	if w.Step <= 0 {
		return 0
	}
	return float64(w.Push+w.Pull) / float64(w.Step)
}

// ServerStage is one parameter server's work on one stage's tensors over
// the whole run, from its event log.
type ServerStage struct {
	Server, Stage int
	// Updates made; pushes applied and dropped; pulls answered; worker
	// stages that left without a goodbye.
	Updates, Pushes, Dropped, Pulls, Departed int
	// BytesIn is what the pushes carried (dropped ones included), BytesOut
	// what the pulls sent.
	BytesIn, BytesOut int64
	// Busy is the time its updates took (sums and optimizer steps);
	// PullWait the time its pulls waited for updates, summed.
	Busy, PullWait time.Duration
	// Staleness counts the applied pushes by staleness.
	Staleness map[int64]int
}

// AddParameterServers fills in r.Workers from every worker's logs
// (replicas as ReadReplicas returns them, or replica 0's alone for a run
// of one worker) over the steps r analysed, and r.Servers from every
// server's log (ReadServers) over the whole run.
func (r *Report) AddParameterServers(replicas []Replica, servers [][]PSEvent) {
	analysed := map[int]bool{}
	for _, s := range r.Steps {
		analysed[s.Step-1] = true
	}
	r.Workers = nil
	for wk, rep := range replicas {
		for s, events := range rep.Events {
			r.Workers = append(r.Workers, workerStage(wk, s, events, analysed))
		}
	}
	r.Servers = nil
	for i, events := range servers {
		r.Servers = append(r.Servers, serverStages(i, events)...)
	}
}

// workerStage measures one worker stage's pushes and pulls.
func workerStage(worker, stage int, events []Event, analysed map[int]bool) WorkerStage {
	w := WorkerStage{Worker: worker, Stage: stage, Staleness: map[int64]int{}, Step: replicaStage(worker, stage, events, analysed).Step}
	for _, e := range events {
		if e.Kind != Optimizer || e.Servers == 0 || !analysed[e.Step] {
			continue
		}
		w.Steps++
		w.Pushed += e.BytesSent
		w.Pulled += e.BytesPulled
		w.Push += time.Duration(e.PushNS)
		w.Pull += time.Duration(e.WaitNS)
		w.Staleness[e.Staleness]++
		w.Dropped += e.Dropped
	}
	if w.Steps > 0 {
		n := int64(w.Steps)
		w.Pushed, w.Pulled = w.Pushed/n, w.Pulled/n
		w.Push, w.Pull = w.Push/time.Duration(n), w.Pull/time.Duration(n)
	}
	return w
}

// serverStages sums server i's log per stage, stages in order.
func serverStages(i int, events []PSEvent) []ServerStage {
	by := map[int]*ServerStage{}
	for _, e := range events {
		st := by[e.Stage]
		if st == nil {
			st = &ServerStage{Server: i, Stage: e.Stage, Staleness: map[int64]int{}}
			by[e.Stage] = st
		}
		switch e.Kind {
		case runlog.PSUpdate:
			st.Updates++
			st.Pushes += len(e.Workers)
			st.BytesIn += e.BytesIn
			st.Busy += time.Duration(e.EndNS - e.StartNS)
			for _, s := range e.Staleness {
				st.Staleness[s]++
			}
		case runlog.PSDrop:
			st.Dropped++
			st.BytesIn += e.BytesIn
		case runlog.PSPull:
			st.Pulls++
			st.BytesOut += e.BytesOut
			st.PullWait += time.Duration(e.WaitNS)
		case runlog.PSDepart:
			st.Departed++
		}
	}
	var out []ServerStage
	for _, s := range slices.Sorted(maps.Keys(by)) {
		out = append(out, *by[s])
	}
	return out
}

// histogramText writes counts by value as "0: 57, 1: 3", values in order.
func histogramText(h map[int64]int) string {
	if len(h) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(h)) {
		parts = append(parts, fmt.Sprintf("%d: %d", k, h[k]))
	}
	return strings.Join(parts, ", ")
}

func mib(n int64) string { return fmt.Sprintf("%.2f", float64(n)/(1<<20)) }

// writeParameterServers prints the workers' pushes and pulls and the
// servers' work, or why the servers' logs could not be read.
func (r *Report) writeParameterServers(w io.Writer) error {
	if r.ServersErr != nil {
		_, err := fmt.Fprintf(w, "parameter servers: %v\n", r.ServersErr)
		return err
	}
	if r.Workers == nil && r.Servers == nil {
		return nil
	}
	if _, err := io.WriteString(w, "parameter servers: each worker stage's push and pull, per analysed step:\n"); err != nil {
		return err
	}
	row, flush := table(w)
	row("worker", "stage", "pushed MiB", "pulled MiB", "push ms", "pull ms", "step ms", "exposed %", "dropped", "staleness (steps)")
	for _, s := range r.Workers {
		if s.Steps == 0 {
			row(fmt.Sprint(s.Worker), fmt.Sprint(s.Stage), "-", "-", "-", "-", "-", "-", "-", "-")
			continue
		}
		row(fmt.Sprint(s.Worker), fmt.Sprint(s.Stage), mib(s.Pushed), mib(s.Pulled), fmtMS(s.Push), fmtMS(s.Pull), fmtMS(s.Step),
			pct(s.Exposed()), fmt.Sprint(s.Dropped), histogramText(s.Staleness))
	}
	if err := flush(); err != nil {
		return err
	}
	if _, err := io.WriteString(w, "each server's work on each stage's tensors, over the whole run:\n"); err != nil {
		return err
	}
	row, flush = table(w)
	row("server", "stage", "updates", "pushes", "dropped", "pulls", "MiB in", "MiB out", "busy ms", "pull wait ms", "departed", "staleness (pushes)")
	for _, s := range r.Servers {
		row(fmt.Sprint(s.Server), fmt.Sprint(s.Stage), fmt.Sprint(s.Updates), fmt.Sprint(s.Pushes), fmt.Sprint(s.Dropped), fmt.Sprint(s.Pulls),
			mib(s.BytesIn), mib(s.BytesOut), fmtMS(s.Busy), fmtMS(s.PullWait), fmt.Sprint(s.Departed), histogramText(s.Staleness))
	}
	return flush()
}
