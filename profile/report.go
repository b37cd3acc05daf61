package profile

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
	"time"
)

// StageReport is where one stage's time went over the analysed steps.
type StageReport struct {
	Stage int
	Steps int // analysed steps in which the stage executed any action
	// Sums over the analysed steps.
	// Backward counts full backwards and input-gradient passes; Weight the
	// weight-gradient passes of a split backward.
	Forward, Backward, Weight, Optimizer, Wait time.Duration
	// Busy = Forward+Backward+Weight; Idle = Window - Busy: the stage's share of
	// the pipeline window spent not computing.
	Busy, Idle  time.Duration
	Bubble      float64 // Idle / Window
	PeakStashed int
	BytesSent   int64
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
}

// Analyse builds a report from the events of every stage (events[i] is stage
// i's log). It skips the first skip steps, which include one-off warm-up
// costs such as allocation, when there are more steps than that; with fewer
// it analyses them all rather than nothing.
func Analyse(info RunInfo, events [][]Event, skip int) (*Report, error) {
	if len(events) == 0 {
		return nil, errors.New("profile: no stages")
	}
	if info.Stages != 0 && info.Stages != len(events) {
		return nil, fmt.Errorf("profile: run has %d stages but events for %d", info.Stages, len(events))
	}

	// Each step's pipeline window across all stages.
	type span struct{ start, end int64 }
	spans := map[int]span{}
	var steps []int
	for _, stage := range events {
		for _, e := range stage {
			sp, seen := spans[e.Step]
			if !seen {
				steps = append(steps, e.Step)
				sp = span{math.MaxInt64, math.MinInt64}
			}
			if e.Kind != Optimizer {
				sp.start, sp.end = min(sp.start, e.StartNS), max(sp.end, e.EndNS)
			}
			spans[e.Step] = sp
		}
	}
	if len(steps) == 0 {
		return nil, errors.New("profile: no events")
	}
	slices.Sort(steps)
	if len(steps) > skip && skip > 0 {
		steps = steps[skip:]
	}
	analysed := map[int]bool{}
	r := &Report{Info: info, StepsAnalysed: len(steps), Stages: make([]StageReport, len(events))}
	for _, s := range steps {
		analysed[s] = true
		if sp := spans[s]; sp.end > sp.start {
			r.Window += time.Duration(sp.end - sp.start)
		}
	}

	for i, stage := range events {
		sr := &r.Stages[i]
		sr.Stage = i
		stepsSeen := map[int]bool{}
		for _, e := range stage {
			if !analysed[e.Step] {
				continue
			}
			stepsSeen[e.Step] = true
			d := time.Duration(e.EndNS - e.StartNS)
			switch e.Kind {
			case Forward:
				sr.Forward += d
			case Backward, Input:
				sr.Backward += d
			case Weight:
				sr.Weight += d
			case Optimizer:
				sr.Optimizer += d
			}
			sr.Wait += time.Duration(e.WaitNS)
			sr.PeakStashed = max(sr.PeakStashed, e.Stashed)
			sr.BytesSent += e.BytesSent
		}
		sr.Steps = len(stepsSeen)
		sr.Busy = sr.Forward + sr.Backward + sr.Weight
		sr.Idle = r.Window - sr.Busy
		if r.Window > 0 {
			sr.Bubble = float64(sr.Idle) / float64(r.Window)
		}
		r.MeanBubble += sr.Bubble / float64(len(events))
		if sr.Busy > r.Stages[r.Bottleneck].Busy {
			r.Bottleneck = i
		}
	}
	return r, nil
}

// Write prints one aligned row per stage, then the mean bubble against the
// schedule's theoretical one and the bottleneck stage.
func (r *Report) Write(w io.Writer) error {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e6) }
	theory := fmt.Sprintf("%.1f", 100*r.Info.TheoreticalBubble)

	// Right-aligned numbers read best; padding 0 plus two spaces before all
	// but the first cell keeps the table from starting indented.
	tw := tabwriter.NewWriter(w, 0, 0, 0, ' ', tabwriter.AlignRight)
	row := func(cells ...string) {
		fmt.Fprint(tw, cells[0], "\t")
		for _, c := range cells[1:] {
			fmt.Fprint(tw, "  ", c, "\t")
		}
		fmt.Fprint(tw, "\n")
	}
	row("stage", "F ms", "B ms", "W ms", "opt ms", "wait ms", "busy ms", "idle ms", "bubble %", "theory %", "peak stash", "MiB sent")
	for _, s := range r.Stages {
		row(fmt.Sprint(s.Stage), ms(s.Forward), ms(s.Backward), ms(s.Weight), ms(s.Optimizer), ms(s.Wait), ms(s.Busy), ms(s.Idle),
			fmt.Sprintf("%.1f", 100*s.Bubble), theory, fmt.Sprint(s.PeakStashed), fmt.Sprintf("%.2f", float64(s.BytesSent)/(1<<20)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	b := r.Stages[r.Bottleneck]
	_, err := fmt.Fprintf(w, "mean bubble %.1f%% vs theory %s%% (schedule %s, %d stages, %d micro-batches, %d steps analysed, window %s ms)\nbottleneck: stage %d (busy %s ms)\n",
		100*r.MeanBubble, theory, r.Info.Schedule, len(r.Stages), r.Info.MicroBatches, r.StepsAnalysed, ms(r.Window),
		b.Stage, ms(b.Busy))
	return err
}
