package profile

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/pipetrain/pipetrain/internal/stats"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/schedule"
)

// StageReport is where one stage's time went over the analysed steps.
type StageReport struct {
	Stage int
	Steps int // analysed steps in which the stage executed any action
	// Sums over the analysed steps.
	// Backward counts full backwards and input-gradient passes; Weight the
	// weight-gradient passes of a split backward; Recompute the forwards run
	// again before their backwards (stages[i].recompute: full). Wait is the
	// time spent waiting for an input before an action started.
	Forward, Backward, Weight, Recompute, Optimizer, Wait time.Duration
	// SendBlocked is the time actions spent blocked in Send because the
	// link's queue was full (send_ns); it is part of Forward and Backward.
	SendBlocked time.Duration
	// Data is the time the stage's dataset source took to read its
	// forwards' data (data_ns): the inputs on the model's first stage, the
	// targets on its last. The stage reads them ahead, while it computes,
	// and DataWait is the part its forwards waited for (data_wait_ns), which
	// is part of Forward. Both 0 on stages that read no data and in logs
	// written before the fields existed.
	Data, DataWait time.Duration
	// Clip is the time the stage spent clipping its gradients (runlog
	// ClipNorm): agreeing with every stage on the norm, waiting for the
	// slowest, and scaling. Like the optimizer's, it is not busy time.
	Clip time.Duration
	// Busy = Forward+Backward+Weight+Recompute; Idle = Window - Busy: the stage's share of
	// the pipeline window spent not computing.
	Busy, Idle time.Duration
	Bubble     float64 // Idle / Window
	// PredictedBubble is the stage's bubble in Report.Replayed: what the
	// schedule gives with this run's own action times, step by step, and
	// its mean link delay and hand-off. SteadyBubble is its bubble in
	// Report.Predicted, each action taking exactly its mean cost. Both are
	// 0 when Report.Predicted is nil.
	PredictedBubble, SteadyBubble float64
	// TheoryBubble is the stage's bubble in Report.Theory; 0 when that is nil.
	TheoryBubble float64
	PeakStashed  int
	// PeakStashBytes is the most activation memory the stage held after an
	// action (the events' stash_bytes), PredictedStashBytes the run's
	// prediction of it (run.json; 0 without one), PeakHeapBytes the most live
	// heap its process had after an action.
	PeakStashBytes, PredictedStashBytes, PeakHeapBytes int64
	BytesSent                                          int64
	// Chunks is, for a stage that ran several chunks, each chunk's mean
	// duration of each pass per micro-batch over the analysed steps; nil
	// for a stage of one chunk. Chunks need not hold equal shares of their
	// stage's work (under a V, stage 0's are the model's first and last).
	Chunks []ActionCosts
	// Throughput is BytesSent per second of the pipeline window (Window), in
	// bytes per second: the stage's mean outgoing rate over the time the
	// pipeline ran. The logs time blocked sends only, not whole transfers, so a
	// rate per second of sending is not known.
	Throughput float64

	// With data-parallel replicas the stage's replicas sum each chunk's
	// gradients with an all-reduce. AllReduce sums, over the analysed steps,
	// the time during which one of the stage's all-reduces was in progress:
	// from the schedule's reduction op handing the gradients over until the
	// sum was in. It runs beside the stage's actions, so it is not part of
	// Busy, Wait or Idle, nor its bytes of BytesSent. AllReduceExposed is the
	// part the stage spent blocked on it before its optimizer step (the
	// events' wait_ns), AllReduceBytes what the stage's process sent for it,
	// AllReduceSteps the analysed steps that logged one.
	AllReduce, AllReduceExposed time.Duration
	AllReduceBytes              int64
	AllReduceSteps              int
	// BusBandwidth is the all-reduce's bus bandwidth in bytes per second, as
	// nccl-tests define it: 2(R-1)/R · S / t for S bytes of gradients summed
	// over R replicas in time t. A ring rank sends 2(R-1)/R · S, so it is
	// AllReduceBytes / AllReduce. 0 without all-reduces.
	BusBandwidth float64
}

// StepReport is one analysed step.
type StepReport struct {
	Step int // numbered as the training log numbers it (Event.StepNumber)
	// Start is the step's earliest forward start (ns, stage 0's clock) and
	// Window its pipeline window, as Report.Window.
	Start  int64
	Window time.Duration
	Bubble float64 // mean over the stages of their idle share of the step's window
	// Slowest is the stage with the most busy time in the step (the lowest on a
	// tie), and SlowestBusy that time.
	Slowest     int
	SlowestBusy time.Duration
	// Straggler marks a step whose window exceeds the median step's by more
	// than 3 median absolute deviations and is at least 1.5 times the median.
	Straggler bool
}

// LinkReport is the traffic on one link between neighbouring stages over the
// analysed steps.
type LinkReport struct {
	// Activations go From -> To and gradients To -> From: To = From+1, or on
	// the ring (chunks > 1) From is the last stage and To = 0, carrying model
	// stage k's output to model stage k+1 on the first stage's next chunk.
	// Under a V placement chunk 1's activations go To -> From and its
	// gradients From -> To, on the same link as chunk 0's.
	From, To int
	Ring     bool
	Down, Up LinkTraffic // tensors From -> To (activations under Loop), and To -> From
}

// LinkTraffic is one direction of a link.
type LinkTraffic struct {
	Messages int   // sends the logs show (as the schedule routes them)
	Bytes    int64 // their bytes_sent
	// Timed counts the messages whose receiver was already waiting for them
	// when they were sent (on the aligned clocks): their receiver started as
	// soon as they arrived, so receive start - send end is the transfer's
	// delay. A message that arrived while its receiver was busy waited there
	// for an unknown time, so it does not count.
	Timed     int
	MeanDelay time.Duration // mean delay of the Timed messages; 0 when none
}

// Report summarises a run.
type Report struct {
	Info          RunInfo
	StepsAnalysed int
	// Window sums, over the analysed steps, the pipeline phase of the step:
	// from the earliest F start to the latest F/B end across all stages. The
	// optimizer step comes after the flush and is left out, since the
	// theoretical bubble describes only the pipelined phase.
	Window     time.Duration
	Stages     []StageReport
	MeanBubble float64 // mean of the stages' Bubble
	Bottleneck int     // stage with the largest Busy (the lowest on a tie)

	// Clock is the clock alignment found by Align; the analysis used times
	// shifted to stage 0's clock when Clock.Shifted.
	Clock Alignment
	// Steps holds the analysed steps in order. MedianStep is the median of
	// their windows and StepMAD the median absolute deviation from it.
	Steps               []StepReport
	MedianStep, StepMAD time.Duration
	// Links holds each link between neighbouring stages (s -> s+1), then the
	// ring when chunks > 1; none for a single stage without chunks.
	Links []LinkReport
	// Predicted is one step of the run's schedule played by schedule.Simulate
	// with the run's mean action costs over the analysed steps (MeanCosts,
	// ScheduleCosts) and the run's measured mean link delay as the transfer
	// time (MeanTransfer); times in ms. Replayed is the same schedule and
	// costs played by schedule.Replay once for each analysed step, each
	// action scaled to the time it took in that step (Variation): the bubble
	// the schedule gives with the run's own action times, so that what the
	// run measured beyond it is the runtime's. Both are nil when the
	// schedule could not be rebuilt or simulated, and PredictErr says why.
	Predicted       *schedule.Timeline
	Replayed        *schedule.Replayed
	PredictErr      error
	PredictedBubble float64 // mean of Replayed.Bubble
	SteadyBubble    float64 // mean of Predicted.Bubble

	// Theory is each stage's bubble with equal stages and free transfers:
	// the schedule's closed form (schedule.TheoreticalBubble) where it has
	// one. A custom schedule has none, and neither has a named one at sizes the
	// closed forms do not cover; then Theory is the schedule simulated with
	// unit costs (F 1, B 2, I and W 1 each), the costs the closed forms assume
	// and under which the simulator reproduces every one of them, and
	// TheorySimulated is set. Theory is nil when the schedule cannot be
	// rebuilt or simulated, and TheoryErr says why.
	Theory          []float64
	TheorySimulated bool
	TheoryErr       error
	TheoryMean      float64 // mean of Theory

	// Replica is the replica whose pipeline the report describes (0 unless
	// the caller says otherwise; with data-parallel replicas the tables are
	// one replica's). Replicas[r][s] is stage s of replica r over the same
	// steps (AddReplicas); nil when not added. ReplicasErr, when set, says
	// why the caller could not add them.
	Replica     int
	Replicas    [][]ReplicaStage
	ReplicasErr error

	// Workers and Servers are, in a run with parameter servers, each
	// worker stage's pushes and pulls over the analysed steps and each
	// server's work on each stage (AddParameterServers); nil when not
	// added. ServersErr, when set, says why the caller could not add them.
	Workers    []WorkerStage
	Servers    []ServerStage
	ServersErr error
}

// Stragglers returns the analysed steps marked Straggler, in step order.
func (r *Report) Stragglers() []StepReport {
	var out []StepReport
	for _, s := range r.Steps {
		if s.Straggler {
			out = append(out, s)
		}
	}
	return out
}

// Analyse builds a report from the events of every stage (events[i] is stage
// i's log). It skips the first skip steps the logs hold, which include
// one-off warm-up costs such as allocation; skip must leave at least one step,
// and it is an error when it does not (or is negative).
//
// The stages' clocks are aligned first (Align, with info.Clocks), so the logs
// of stages on different hosts can be analysed together. With data-parallel
// replicas events are one replica's pipeline, whose all-reduces are measured
// beside its actions (StageReport.AllReduce); AddReplicas adds the others.
func Analyse(info RunInfo, events [][]Event, skip int) (*Report, error) {
	if len(events) == 0 {
		return nil, errors.New("profile: no stages")
	}
	if info.Stages != 0 && info.Stages != len(events) {
		return nil, fmt.Errorf("profile: run has %d stages but events for %d", info.Stages, len(events))
	}
	clock, aligned := AlignPlaced(events, info.Clocks, RunPlacement(info))

	// Each step's pipeline window across all stages.
	type span struct{ start, end int64 }
	spans := map[int]span{}
	var steps []int
	for _, stage := range aligned {
		for _, e := range stage {
			sp, seen := spans[e.Step]
			if !seen {
				steps = append(steps, e.Step)
				sp = span{math.MaxInt64, math.MinInt64}
			}
			if compute(e.Kind) {
				sp.start, sp.end = min(sp.start, e.StartNS), max(sp.end, e.EndNS)
			}
			spans[e.Step] = sp
		}
	}
	if len(steps) == 0 {
		return nil, errors.New("profile: no events")
	}
	slices.Sort(steps)
	if skip < 0 || skip >= len(steps) {
		return nil, fmt.Errorf("profile: skipping %d steps leaves none to analyse: the logs hold %d (steps %d to %d)",
			skip, len(steps), steps[0]+1, steps[len(steps)-1]+1)
	}
	steps = steps[skip:]
	p := len(events)
	analysed := map[int]int{} // step -> index in r.Steps
	r := &Report{Info: info, StepsAnalysed: len(steps), Stages: make([]StageReport, p), Clock: clock,
		Steps: make([]StepReport, len(steps))}
	busy := make([][]time.Duration, len(steps)) // per analysed step, per stage
	for i, s := range steps {
		analysed[s] = i
		r.Steps[i].Step = s + 1
		if sp := spans[s]; sp.end > sp.start {
			r.Steps[i].Start, r.Steps[i].Window = sp.start, time.Duration(sp.end-sp.start)
			r.Window += r.Steps[i].Window
		}
		busy[i] = make([]time.Duration, p)
	}

	for i, stage := range aligned {
		sr := &r.Stages[i]
		sr.Stage = i
		if i < len(info.PredictedStashBytes) {
			sr.PredictedStashBytes = info.PredictedStashBytes[i]
		}
		stepsSeen := map[int]bool{}
		reduced := map[int][][2]int64{} // step -> the stage's all-reduces
		for _, e := range stage {
			step, ok := analysed[e.Step]
			if !ok {
				continue
			}
			stepsSeen[e.Step] = true
			if e.Kind == AllReduce {
				reduced[e.Step] = append(reduced[e.Step], [2]int64{e.StartNS, e.EndNS})
				sr.AllReduceExposed += time.Duration(e.WaitNS)
				sr.AllReduceBytes += e.BytesSent
				continue
			}
			d := time.Duration(e.EndNS - e.StartNS)
			switch e.Kind {
			case Forward:
				sr.Forward += d
			case Backward, Input:
				sr.Backward += d
			case Weight:
				sr.Weight += d
			case Recompute:
				sr.Recompute += d
			case Optimizer:
				sr.Optimizer += d
			case ClipNorm:
				sr.Clip += d
			}
			if compute(e.Kind) {
				busy[step][i] += d
			}
			sr.Wait += time.Duration(e.WaitNS)
			sr.SendBlocked += time.Duration(e.SendNS)
			sr.Data += time.Duration(e.DataNS)
			sr.DataWait += time.Duration(e.DataWaitNS)
			sr.PeakStashed = max(sr.PeakStashed, e.Stashed)
			sr.PeakStashBytes = max(sr.PeakStashBytes, e.StashBytes)
			sr.PeakHeapBytes = max(sr.PeakHeapBytes, e.HeapBytes)
			sr.BytesSent += e.BytesSent
		}
		sr.Steps = len(stepsSeen)
		for _, spans := range reduced {
			sr.AllReduce += covered(spans)
		}
		sr.AllReduceSteps = len(reduced)
		if sr.AllReduce > 0 {
			sr.BusBandwidth = float64(sr.AllReduceBytes) / sr.AllReduce.Seconds()
		}
		sr.Busy = sr.Forward + sr.Backward + sr.Weight + sr.Recompute
		sr.Idle = r.Window - sr.Busy
		if r.Window > 0 {
			sr.Bubble = float64(sr.Idle) / float64(r.Window)
			sr.Throughput = float64(sr.BytesSent) / r.Window.Seconds()
		}
		r.MeanBubble += sr.Bubble / float64(p)
		if sr.Busy > r.Stages[r.Bottleneck].Busy {
			r.Bottleneck = i
		}
	}

	r.analyseSteps(busy)
	r.Links = links(aligned, analysed, RunPlacement(info))
	if r.Theory, r.TheorySimulated, r.TheoryErr = theory(info, events); r.Theory != nil {
		for i := range r.Stages {
			r.Stages[i].TheoryBubble = r.Theory[i]
			r.TheoryMean += r.Theory[i] / float64(p)
		}
	}

	kept := analysedEvents(events, analysed)
	means := MeanCosts(kept, 0)
	for i, m := range means {
		if i < len(r.Stages) {
			r.Stages[i].Chunks = m.Chunks
		}
	}
	transfer, _ := r.MeanTransfer()
	if r.Predicted, r.Replayed, r.PredictErr = predict(info, kept, means, float64(transfer)/1e6); r.Predicted != nil {
		for i := range r.Stages {
			r.Stages[i].PredictedBubble = r.Replayed.Bubble[i]
			r.Stages[i].SteadyBubble = r.Predicted.Bubble[i]
			r.PredictedBubble += r.Replayed.Bubble[i] / float64(p)
			r.SteadyBubble += r.Predicted.Bubble[i] / float64(p)
		}
	}
	return r, nil
}

// covered is how long at least one of spans ([start, end] ns) lasted: a
// stage's all-reduces run one after another on one ring, and one handed
// over while another is in progress waits for it, so their union is the
// time the stage had an all-reduce in hand.
func covered(spans [][2]int64) time.Duration {
	slices.SortFunc(spans, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	var total int64
	end := int64(math.MinInt64)
	for _, s := range spans {
		start := max(s[0], end)
		if s[1] > start {
			total += s[1] - start
		}
		end = max(end, s[1])
	}
	return time.Duration(total)
}

// analyseSteps fills in each step's bubble and slowest stage from busy (per
// step, per stage), the median window and the stragglers.
func (r *Report) analyseSteps(busy [][]time.Duration) {
	windows := make([]time.Duration, len(r.Steps))
	for i := range r.Steps {
		st := &r.Steps[i]
		for s, b := range busy[i] {
			if b > busy[i][st.Slowest] {
				st.Slowest = s
			}
			if st.Window > 0 {
				st.Bubble += float64(st.Window-b) / float64(st.Window) / float64(len(busy[i]))
			}
		}
		st.SlowestBusy = busy[i][st.Slowest]
		windows[i] = st.Window
	}
	r.MedianStep = stats.Median(windows)
	devs := make([]time.Duration, len(windows))
	for i, w := range windows {
		devs[i] = max(w-r.MedianStep, r.MedianStep-w)
	}
	r.StepMAD = stats.Median(devs)
	for i := range r.Steps {
		w := r.Steps[i].Window
		r.Steps[i].Straggler = r.MedianStep > 0 && w > r.MedianStep+3*r.StepMAD && float64(w) >= 1.5*float64(r.MedianStep)
	}
}

// links sums the traffic of each link over the analysed steps from aligned
// events.
func links(events [][]Event, analysed map[int]int, pl schedule.Placement) []LinkReport {
	p := len(events)
	out := make([]LinkReport, numLinks(placed(events, pl)))
	for i := range out {
		out[i] = LinkReport{From: i, To: i + 1}
		if i == p-1 {
			out[i] = LinkReport{From: p - 1, To: 0, Ring: true}
		}
	}
	delays := make([][2]time.Duration, len(out)) // summed delays of timed messages, down and up
	for _, m := range messages(events, pl) {
		send := &events[m.send[0]][m.send[1]]
		if _, ok := analysed[send.Step]; !ok || m.from == m.to { // a hand-off within a stage uses no link
			continue
		}
		t, dir := &out[m.link].Down, 0
		if !m.down() {
			t, dir = &out[m.link].Up, 1
		}
		t.Messages++
		t.Bytes += send.BytesSent
		if m.recv[0] < 0 {
			continue
		}
		recv := &events[m.recv[0]][m.recv[1]]
		if recv.StartNS-recv.WaitNS <= send.EndNS {
			t.Timed++
			// A receiver can start before the sender's action ends: the
			// action's end is stamped after Send returns, and Send yields to
			// the link's writer, so on a busy stage the tensor may be
			// delivered during that yield. Nothing was left to wait for after
			// the action then, which is what the delay is (and what the
			// simulator adds after an action): zero, not negative.
			delays[m.link][dir] += time.Duration(max(0, recv.StartNS-send.EndNS))
		}
	}
	for i := range out {
		if n := out[i].Down.Timed; n > 0 {
			out[i].Down.MeanDelay = delays[i][0] / time.Duration(n)
		}
		if n := out[i].Up.Timed; n > 0 {
			out[i].Up.MeanDelay = delays[i][1] / time.Duration(n)
		}
	}
	return out
}

// RunSchedule rebuilds the schedule a run executed: from info.ScheduleCSV when
// the run has one (a custom schedule), else schedule.Build with info's name and
// sizes (Chunks < 1 meaning 1).
func RunSchedule(info RunInfo) (*schedule.Schedule, error) {
	if info.ScheduleCSV != "" {
		s, err := schedule.Load(strings.NewReader(info.ScheduleCSV), "csv")
		if err != nil {
			return nil, fmt.Errorf("schedule_csv: %w", err)
		}
		return s, nil
	}
	if info.Schedule == "custom" {
		return nil, errors.New(`custom schedule without "schedule_csv" in run.json`)
	}
	return schedule.Build(info.Schedule, info.Stages, info.MicroBatches, max(info.Chunks, 1))
}

// theory returns each stage's bubble with equal stages and free transfers
// (see Report.Theory), and whether it was simulated for want of a closed form.
func theory(info RunInfo, events [][]Event) ([]float64, bool, error) {
	p, v := topology(events)
	if info.Stages == 0 {
		info.Stages = p
	}
	if info.Chunks < 1 {
		info.Chunks = v
	}
	if info.ScheduleCSV == "" && info.Stages == p {
		if b, ok := schedule.TheoreticalBubble(info.Schedule, info.Stages, info.MicroBatches, info.Chunks); ok {
			out := make([]float64, p)
			for i := range out {
				out[i] = b
			}
			return out, false, nil
		}
	}
	s, err := RunSchedule(info)
	if err != nil {
		return nil, false, err
	}
	if s.Stages != p {
		return nil, false, fmt.Errorf("schedule has %d stages, the run %d", s.Stages, p)
	}
	tl, err := schedule.Simulate(s, schedule.UniformCosts(s.Stages, 1, 2, 0))
	if err != nil {
		return nil, false, err
	}
	return tl.Bubble, true, nil
}

// predict simulates the run's schedule with its mean action costs over the
// analysed steps (means, from kept, the analysed steps' events): one step at
// exactly those costs, and each analysed step with its actions' own times
// (schedule.Replay).
func predict(info RunInfo, kept [][]Event, means []ActionCosts, transferMS float64) (*schedule.Timeline, *schedule.Replayed, error) {
	if info.Stages == 0 {
		info.Stages = len(kept)
	}
	if _, v := topology(kept); info.Chunks < 1 {
		info.Chunks = v
	}
	s, err := RunSchedule(info)
	if err != nil {
		return nil, nil, err
	}
	if s.Stages != len(kept) {
		return nil, nil, fmt.Errorf("schedule has %d stages, the run %d", s.Stages, len(kept))
	}
	costs := ScheduleCosts(means, s.Chunks, transferMS)
	tl, err := schedule.Simulate(s, costs)
	if err != nil {
		return nil, nil, err
	}
	r, err := schedule.Replay(s, costs, whole(Variation(kept, 0), s))
	if err != nil {
		return nil, nil, err
	}
	return tl, r, nil
}

// analysedEvents keeps of each stage's events those of the analysed steps.
func analysedEvents(events [][]Event, analysed map[int]int) [][]Event {
	kept := make([][]Event, len(events))
	for i, stage := range events {
		for _, e := range stage {
			if _, ok := analysed[e.Step]; ok {
				kept[i] = append(kept[i], e)
			}
		}
	}
	return kept
}

// whole keeps of steps those in which every stage ran its whole list in s
// (a run stopped mid-step leaves a partial one), and when none is left one
// step at the mean costs.
func whole(steps []schedule.StepVariation, s *schedule.Schedule) []schedule.StepVariation {
	steps = slices.DeleteFunc(steps, func(v schedule.StepVariation) bool {
		for st, f := range v {
			if len(f) != len(s.Actions[st]) {
				return true
			}
		}
		return false
	})
	if len(steps) == 0 {
		return []schedule.StepVariation{nil}
	}
	return steps
}

// Options select what Write prints beyond its default.
type Options struct {
	// Steps adds one row per analysed step (WriteSteps).
	Steps bool
}

// timeUnit picks the unit of a report's time columns: ms, or s once the
// window reaches 100 s so that long runs keep the table narrow.
func timeUnit(window time.Duration) (string, func(time.Duration) string) {
	if window >= 100*time.Second {
		return "s", func(d time.Duration) string { return fmt.Sprintf("%.2f", d.Seconds()) }
	}
	return "ms", fmtMS
}

func fmtMS(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e6) }

func pct(x float64) string { return fmt.Sprintf("%.1f", 100*x) }

// table returns a row writer for an aligned table of right-aligned cells and
// the function that writes the table to w.
func table(w io.Writer) (row func(cells ...string), flush func() error) {
	// Right-aligned numbers read best; padding 0 plus two spaces before all
	// but the first cell keeps the table from starting indented.
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 0, 0, 0, ' ', tabwriter.AlignRight)
	return func(cells ...string) {
			fmt.Fprint(tw, cells[0], "\t")
			for _, c := range cells[1:] {
				fmt.Fprint(tw, "  ", c, "\t")
			}
			fmt.Fprint(tw, "\n")
		}, func() error {
			if err := tw.Flush(); err != nil {
				return err
			}
			// An empty last cell leaves padding behind.
			var out []byte
			for line := range bytes.Lines(buf.Bytes()) {
				out = append(append(out, bytes.TrimRight(line, " \n")...), '\n')
			}
			_, err := w.Write(out)
			return err
		}
}

// Write prints the report for a person, within 100 columns for runs of
// ordinary size: one table of where each stage's time went (time blocked in
// Send included, as part of F and B), one of each stage's measured, simulated
// and theoretical bubble, memory, traffic and clock offset, one of the links'
// traffic; then the mean bubbles, the clock alignment, the step windows with
// their stragglers, and the bottleneck stage. A run with data-parallel
// replicas adds, after the second table, one of each stage's all-reduce
// (writeAllReduce), and after the bottleneck every replica's stages with the
// straggler replicas (AddReplicas). With Options.Steps it ends with the
// per-step table (WriteSteps).
func (r *Report) Write(w io.Writer, opts ...Options) error {
	var opt Options
	for _, o := range opts {
		opt.Steps = opt.Steps || o.Steps
	}
	unit, tf := timeUnit(r.Window)

	row, flush := table(w)
	h := func(s string) string { return s + " " + unit }
	// The recomputation column appears only in runs that recompute.
	recomputed := slices.ContainsFunc(r.Stages, func(s StageReport) bool { return s.Recompute > 0 })
	head := []string{"stage", h("F"), h("B"), h("W")}
	if recomputed {
		head = append(head, h("RF"))
	}
	row(append(head, h("opt"), h("wait"), h("send wait"), h("busy"), h("idle"))...)
	for _, s := range r.Stages {
		cells := []string{fmt.Sprint(s.Stage), tf(s.Forward), tf(s.Backward), tf(s.Weight)}
		if recomputed {
			cells = append(cells, tf(s.Recompute))
		}
		row(append(cells, tf(s.Optimizer), tf(s.Wait), tf(s.SendBlocked), tf(s.Busy), tf(s.Idle))...)
	}
	if err := flush(); err != nil {
		return err
	}
	if err := r.writeChunks(w); err != nil {
		return err
	}

	row, flush = table(w)
	row("stage", "bubble %", "sim %", "theory %", "data ms", "peak stash", "MiB sent", "MiB/s of window", "clock offset ms")
	for _, s := range r.Stages {
		sim := "-"
		if r.Predicted != nil {
			sim = pct(s.PredictedBubble)
		}
		off := time.Duration(0)
		if s.Stage < len(r.Clock.Offsets) {
			off = r.Clock.Offsets[s.Stage]
		}
		theory := "-"
		if r.Theory != nil {
			theory = pct(s.TheoryBubble)
		}
		data := "-"
		if s.Data > 0 {
			data = fmtMS(s.Data)
		}
		row(fmt.Sprint(s.Stage), pct(s.Bubble), sim, theory, data, fmt.Sprint(s.PeakStashed),
			fmt.Sprintf("%.2f", float64(s.BytesSent)/(1<<20)), fmt.Sprintf("%.1f", s.Throughput/(1<<20)),
			fmt.Sprintf("%+.3f", float64(off)/1e6))
	}
	if err := flush(); err != nil {
		return err
	}
	if err := r.writeMemory(w); err != nil {
		return err
	}
	if r.hasAllReduce() {
		if err := r.writeAllReduce(w); err != nil {
			return err
		}
	}

	if len(r.Links) > 0 {
		row, flush = table(w)
		if RunPlacement(r.Info) == schedule.V {
			// Each way carries one chunk's activations and the other's gradients.
			row("link", "down MiB", "msgs", "delay ms", "up MiB", "msgs", "delay ms")
		} else {
			row("link", "act MiB", "msgs", "delay ms", "grad MiB", "msgs", "delay ms")
		}
		traffic := func(t LinkTraffic) (string, string, string) {
			delay := "-"
			if t.Timed > 0 {
				delay = fmt.Sprintf("%.3f", float64(t.MeanDelay)/1e6)
			}
			return fmt.Sprintf("%.2f", float64(t.Bytes)/(1<<20)), fmt.Sprint(t.Messages), delay
		}
		for _, l := range r.Links {
			name := fmt.Sprintf("%d -> %d", l.From, l.To)
			if l.Ring {
				name = "ring " + name
			}
			db, dm, dd := traffic(l.Down)
			ub, um, ud := traffic(l.Up)
			row(name, db, dm, dd, ub, um, ud)
		}
		if err := flush(); err != nil {
			return err
		}
	}

	var b strings.Builder
	sim := "-"
	if r.Predicted != nil {
		sim = pct(r.PredictedBubble) + "%"
		if steady := pct(r.SteadyBubble); steady != pct(r.PredictedBubble) {
			// Say how much of the prediction the actions' spread adds.
			sim += fmt.Sprintf(" (%s%% with every action at its mean)", steady)
		}
	}
	theory := "-"
	if r.Theory != nil {
		theory = pct(r.TheoryMean) + "%"
	}
	fmt.Fprintf(&b, "mean bubble %s%% vs simulated %s vs theory %s\n", pct(r.MeanBubble), sim, theory)
	analysed := fmt.Sprintf("%d steps analysed", r.StepsAnalysed)
	switch n := len(r.Steps); {
	case n == 1:
		analysed = fmt.Sprintf("1 step analysed (step %d)", r.Steps[0].Step)
	case n > 1:
		analysed += fmt.Sprintf(" (%d-%d)", r.Steps[0].Step, r.Steps[n-1].Step)
	}
	replica := ""
	if r.Info.Replicas > 1 {
		replica = fmt.Sprintf(", replica %d of %d", r.Replica, r.Info.Replicas)
	}
	fmt.Fprintf(&b, "(schedule %s, %s, %s%s, %s, window %s %s)\n",
		r.Info.Schedule, words.Count(len(r.Stages), "stage"), words.Count(r.Info.MicroBatches, "micro-batch"), replica, analysed, tf(r.Window), unit)
	if r.PredictErr != nil {
		fmt.Fprintf(&b, "simulation: %v\n", r.PredictErr)
	}
	switch {
	case r.TheoryErr != nil:
		fmt.Fprintf(&b, "theory: %v\n", r.TheoryErr)
	case r.TheorySimulated && r.Info.Schedule == "custom":
		b.WriteString("theory: a custom schedule has no closed form: its order simulated with equal stages, free transfers\n")
	case r.TheorySimulated:
		fmt.Fprintf(&b, "theory: %s has no closed form for this run: simulated with equal stages, free transfers\n", r.Info.Schedule)
	}
	r.writeData(&b)
	r.writeClip(&b)
	r.writeClock(&b)
	r.writeStragglers(&b)
	bn := r.Stages[r.Bottleneck]
	fmt.Fprintf(&b, "bottleneck: stage %d (busy %s %s)\n", bn.Stage, tf(bn.Busy), unit)
	if _, err := io.WriteString(w, b.String()); err != nil {
		return err
	}
	if err := r.writeReplicas(w); err != nil {
		return err
	}
	if err := r.writeParameterServers(w); err != nil {
		return err
	}
	if opt.Steps {
		return r.WriteSteps(w)
	}
	return nil
}

// writeData says, for each stage that read data, how long its reads took
// and how much of that its forwards waited for: a slow disk shows there
// first, and hurts only where the waits grow.
func (r *Report) writeData(b *strings.Builder) {
	var read []string
	for _, s := range r.Stages {
		if s.Data > 0 {
			read = append(read, fmt.Sprintf("stage %d read for %s ms, its forwards waited %s ms of it", s.Stage, fmtMS(s.Data), fmtMS(s.DataWait)))
		}
	}
	if len(read) > 0 {
		fmt.Fprintf(b, "data: %s\n", strings.Join(read, "; "))
	}
}

// writeClip says, for a run that clipped its gradients by their global
// norm, how long each stage's clipping took a step: the stages agree on the
// norm along the pipeline, so a stage that finishes its backward early
// waits there for the slowest.
func (r *Report) writeClip(b *strings.Builder) {
	var clip []string
	for _, s := range r.Stages {
		if s.Clip > 0 && s.Steps > 0 {
			clip = append(clip, fmt.Sprintf("stage %d %s ms", s.Stage, fmtMS3(s.Clip/time.Duration(s.Steps))))
		}
	}
	if len(clip) > 0 {
		fmt.Fprintf(b, "gradient clipping a step (agreeing on the norm, waiting for the slowest stage): %s\n", strings.Join(clip, "; "))
	}
}

// writeClock says whether and how far the clocks were shifted, why, which
// stages recorded one clock, and which offsets could not be measured.
func (r *Report) writeClock(b *strings.Builder) {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/1e6) }
	groups := clockGroups(r.Clock.Clocks)
	var described []string
	for _, g := range groups {
		described = append(described, g.describe(r.Clock.Clocks))
	}
	switch {
	case r.Clock.Shifted:
		bound, conflict := r.Clock.MaxError()
		how := "at most"
		if conflict {
			how = "about"
		}
		fmt.Fprintf(b, "clocks: shifted to stage 0's (largest offset %s, error %s %s)\n", ms(r.Clock.MaxOffset()), how, ms(bound))
		if groups != nil {
			fmt.Fprintf(b, "clocks: %s\n", strings.Join(described, "; "))
		}
		for _, l := range r.Clock.Links {
			if l.Shifted {
				fmt.Fprintf(b, "clocks: stage %d vs %d: %+.3f ms ±%s (as logged, messages arrived up to %s early)\n",
					l.To, l.From, float64(l.Offset)/1e6, ms(l.Uncertainty), ms(l.Violation))
			}
			if l.Shifted && l.Conflict {
				fmt.Fprintf(b, "clocks: no one offset fits every message between stages %d and %d (they disagree by %s): timing noise, or clocks that drifted\n",
					l.From, l.To, ms(2*l.Uncertainty))
			}
		}
	case len(groups) == 1 && groups[0].known:
		fmt.Fprintf(b, "clocks: not shifted: %s\n", described[0])
	case groups != nil:
		fmt.Fprintf(b, "clocks: not shifted: no message between stages not known to share a clock arrived more than %s before it was sent\n", ms(AlignThreshold))
		fmt.Fprintf(b, "clocks: %s\n", strings.Join(described, "; "))
	default:
		fmt.Fprintf(b, "clocks: not shifted: no message arrived more than %s before it was sent, as on one clock\n", ms(AlignThreshold))
	}
	for _, l := range r.Clock.Links {
		if !l.OffsetKnown && !l.SharedClock {
			fmt.Fprintf(b, "clocks: no messages both ways between stages %d and %d: offset taken as 0\n", l.From, l.To)
		}
	}
}

// maxStragglersListed bounds the stragglers Write lists one per line.
const maxStragglersListed = 20

func (r *Report) writeStragglers(b *strings.Builder) {
	fmt.Fprintf(b, "steps: median window %s ms, MAD %s ms\n", fmtMS(r.MedianStep), fmtMS(r.StepMAD))
	b.WriteString("stragglers (window > median + 3 MAD and >= 1.5x median): ")
	st := r.Stragglers()
	if len(st) == 0 {
		b.WriteString("none\n")
		return
	}
	fmt.Fprintf(b, "%d\n", len(st))
	for i, s := range st {
		if i == maxStragglersListed {
			fmt.Fprintf(b, "  ... and %d more (see the per-step table)\n", len(st)-i)
			break
		}
		fmt.Fprintf(b, "  step %d: window %s ms, +%s ms (%.2fx median), slowest stage %d (busy %s ms)\n",
			s.Step, fmtMS(s.Window), fmtMS(s.Window-r.MedianStep), float64(s.Window)/float64(r.MedianStep),
			s.Slowest, fmtMS(s.SlowestBusy))
	}
}

// WriteSteps prints one row per analysed step: its start (from the first
// analysed step's), window, bubble and slowest stage with that stage's busy
// time, and for a straggler how many times the median window it took.
func (r *Report) WriteSteps(w io.Writer) error {
	row, flush := table(w)
	row("step", "start ms", "window ms", "bubble %", "slowest", "busy ms", "straggler")
	var t0 int64
	if len(r.Steps) > 0 {
		t0 = r.Steps[0].Start
	}
	for _, s := range r.Steps {
		mark := ""
		if s.Straggler {
			mark = fmt.Sprintf("%.2fx", float64(s.Window)/float64(r.MedianStep))
		}
		row(fmt.Sprint(s.Step), fmtMS(time.Duration(s.Start-t0)), fmtMS(s.Window), pct(s.Bubble),
			fmt.Sprint(s.Slowest), fmtMS(s.SlowestBusy), mark)
	}
	return flush()
}

// writeChunks writes, for a run whose stages hold several chunks, each
// chunk's mean pass durations per micro-batch: what a stage's totals hide
// when its chunks are unequal. Passes a chunk never ran show as "-": B too
// where the chunk split every backward (MeanCosts then gives B as I + W).
func (r *Report) writeChunks(w io.Writer) error {
	if !slices.ContainsFunc(r.Stages, func(s StageReport) bool { return len(s.Chunks) > 1 }) {
		return nil
	}
	cell := func(d time.Duration) string {
		if d == 0 {
			return "-"
		}
		return fmt.Sprintf("%.3f", float64(d)/1e6)
	}
	row, flush := table(w)
	row("stage", "chunk", "F ms/mb", "B ms/mb", "I ms/mb", "W ms/mb")
	for _, s := range r.Stages {
		for c, m := range s.Chunks {
			b := m.B
			if m.I > 0 && b == m.I+m.W {
				b = 0
			}
			row(fmt.Sprint(s.Stage), fmt.Sprint(c), cell(m.F), cell(b), cell(m.I), cell(m.W))
		}
	}
	return flush()
}

// writeMemory writes what each stage held for activations, measured beside
// the prediction, when the logs recorded it.
func (r *Report) writeMemory(w io.Writer) error {
	recorded := false
	for _, s := range r.Stages {
		recorded = recorded || s.PeakStashBytes > 0
	}
	if !recorded {
		return nil
	}
	mib := func(n int64) string { return fmt.Sprintf("%.2f", float64(n)/(1<<20)) }
	row, flush := table(w)
	row("stage", "activations MiB", "predicted MiB", "of predicted", "heap MiB")
	for _, s := range r.Stages {
		pred, ratio := "-", "-"
		if s.PredictedStashBytes > 0 {
			pred, ratio = mib(s.PredictedStashBytes), fmt.Sprintf("%.0f%%", 100*float64(s.PeakStashBytes)/float64(s.PredictedStashBytes))
		}
		row(fmt.Sprint(s.Stage), mib(s.PeakStashBytes), pred, ratio, mib(s.PeakHeapBytes))
	}
	return flush()
}
