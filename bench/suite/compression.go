package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/stats"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/profile"
	"github.com/pipetrain/pipetrain/stages"
	"github.com/pipetrain/pipetrain/transport"
)

// compressionTarget bounds what casting to 16 bits and back may cost, as a share
// of the uncompressed step time.
const compressionTarget = 0.05

type compressionRow struct {
	name          string
	bytesPerStep  float64
	stepMS        float64
	finalLoss     float64 // mean loss of the last 10 steps
	castMSPerStep float64 // encode + decode of every message of a step, minus the float32 path's
}

// runCompression trains the demo config with each wire format for the same
// steps and reports the bytes on the wire, the loss reached and the step time,
// and times the casts themselves in this process on the step's message shapes.
func runCompression(o *options, b *bytes.Buffer) error {
	const base = "configs/fmnist-mlp-4stage.yaml"
	steps := 200
	if o.quick {
		steps = 40
	}
	cfg, err := configs.Load(base)
	if err != nil {
		return err
	}
	model, err := models.Build(cfg.Model)
	if err != nil {
		return err
	}
	formats := []string{"none", "fp16", "bf16"}
	rows := make([]compressionRow, len(formats))
	stepMS := make([][]float64, len(formats))
	// The formats take turns, run after run, so a slow spell of the machine
	// falls on all of them alike.
	for rep := 0; rep < max(o.runReps, 1); rep++ {
		for i, comp := range formats {
			logf("compression: %s, %d steps, run %d", comp, steps, rep+1)
			rc := runConfig{base: base, steps: steps, env: []string{"PIPETRAIN_TRANSPORT_COMPRESSION=" + comp}}
			dir, _, err := pipetrain(o, "launch", rc)
			if err != nil {
				return err
			}
			row, err := compressionRun(filepath.Join(dir, "run"), cfg.Data.BatchSize, steps, min(10, steps/4))
			os.RemoveAll(dir)
			if err != nil {
				return err
			}
			stepMS[i] = append(stepMS[i], row.stepMS)
			if rep == 0 { // bytes and losses are the same in every run
				row.name = comp
				if row.castMSPerStep, err = castCost(cfg, model, comp, o.reps); err != nil {
					return err
				}
				rows[i] = row
			}
		}
	}
	for i := range rows {
		rows[i].stepMS = stats.Median(stepMS[i])
	}
	fmt.Fprintf(b, "`pipetrain launch` of `%s` (4 stage processes, 1F1B, 8 micro-batches of 32) for %d steps with `transport.compression` none, fp16 and bf16, the same seed and data. Bytes are the tensor payloads all stages sent per step (from the event logs); the loss is the mean of the last 10 steps; the step time is the median over a run's steps after the first 10, then the median of %d runs per format, the formats taking turns. The step-time change is what compression costs end to end here, the target's measure. The cast cost is timed in this process for the busiest stage: what one stage spends per step encoding the messages it sends and decoding those it receives, minus the same for float32 (stages cast in parallel, each its own messages, when each has its own core).\n\n", base, steps, max(o.runReps, 1))
	fmt.Fprintf(b, "| wire format | bytes sent per step | vs float32 | final loss | vs float32 | step time | step-time change | target | met? | cast cost per stage and step | of step time |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	ref := rows[0]
	worst, worstCast := math.Inf(-1), 0.0
	var changes []string
	for _, r := range rows {
		change := r.stepMS/ref.stepMS - 1
		share := r.castMSPerStep / ref.stepMS
		target, met := "", ""
		if r.name != "none" {
			target, met = "< "+pct(compressionTarget), yesNo(change < compressionTarget)
			worst, worstCast = max(worst, change), max(worstCast, share)
			changes = append(changes, fmt.Sprintf("%s %+.0f%%", r.name, 100*change))
		}
		fmt.Fprintf(b, "| %s | %s | %.2f× | %.4f | %+.4f | %.1f ms | %+.0f%% | %s | %s | %.3f ms | %s |\n",
			r.name, byteSize(r.bytesPerStep), r.bytesPerStep/ref.bytesPerStep, r.finalLoss, r.finalLoss-ref.finalLoss, r.stepMS, 100*change, target, met, r.castMSPerStep, pct(share))
	}
	targets = append(targets, targetResult{"wire compression cost / step time", "< " + pct(compressionTarget), "step time " + strings.Join(changes, ", "), worst < compressionTarget})
	fmt.Fprintf(b, "\nBoth 16-bit formats halve the bytes on the wire (%.2f× and %.2f×). After %d steps the loss differs from float32's by %+.4f (fp16) and %+.4f (bf16): the rounding of activations and gradients barely changes training here, although the runs are no longer bit-identical to the reference. "+
		"End to end the step time changes by %+.0f%% with fp16 and %+.0f%% with bf16. On this machine the 4 stages share 2 cores, so every stage's casts and every byte gRPC copies come out of the same CPU time: halving the bytes saves gRPC copies, and a cast adds its own cost (%s of a step on the busiest stage at most; casts: %s). Where each stage has its own cores and links are slow, between hosts, the bytes saved are what counts.\n",
		rows[1].bytesPerStep/ref.bytesPerStep, rows[2].bytesPerStep/ref.bytesPerStep, steps,
		rows[1].finalLoss-ref.finalLoss, rows[2].finalLoss-ref.finalLoss, 100*(rows[1].stepMS/ref.stepMS-1), 100*(rows[2].stepMS/ref.stepMS-1), pct(worstCast), castsText())
	return nil
}

func compressionRun(runDir string, batch, steps, skip int) (compressionRow, error) {
	var row compressionRow
	_, events, err := profile.ReadRun(runDir)
	if err != nil {
		return row, err
	}
	var sent int64
	for _, stage := range events {
		for _, e := range stage {
			sent += e.BytesSent
		}
	}
	row.bytesPerStep = float64(sent) / float64(steps)
	ms, _, err := stepTimes(runDir, batch, skip)
	if err != nil {
		return row, err
	}
	row.stepMS = stats.Median(ms)
	metrics, err := stages.ReadMetrics(filepath.Join(runDir, "metrics.jsonl"))
	if err != nil {
		return row, err
	}
	last := metrics[max(0, len(metrics)-10):]
	for _, m := range last {
		row.finalLoss += m.Loss / float64(len(last))
	}
	return row, nil
}

// castCost is the time the busiest stage spends per step encoding its outgoing
// messages to the wire format and decoding its incoming ones, minus the float32
// path's. A stage in the middle touches two links; on each, per micro-batch, it
// encodes one message and decodes one (the activation one way, the gradient the
// other), which together cost one encode-and-decode round.
func castCost(c *configs.Config, model *models.Model, comp string, reps int) (float64, error) {
	wire, err := transport.WireDType(transport.Float32, comp)
	if err != nil || wire == transport.Float32 {
		return 0, err
	}
	worst := 0.0
	for s := range c.Stages {
		var shapes [][]int
		if s > 0 {
			shapes = append(shapes, stages.LinkShapes(c, model, s-1)...)
		}
		if s+1 < len(c.Stages) {
			shapes = append(shapes, stages.LinkShapes(c, model, s)...)
		}
		perStep := func(dt transport.DType) (float64, error) {
			var ts []float64
			for range max(reps, 3) {
				start := time.Now()
				for range c.Data.MicroBatches {
					for _, shape := range shapes {
						vals := make([]float32, shape[0]*shape[1])
						t, err := transport.FromFloat32sAs(dt, transport.Activation, 0, 0, shape, vals)
						if err != nil {
							return 0, err
						}
						// What a stage does with what it receives: widen to
						// float32 (pooled memory), use, hand back.
						if err := t.Widen(); err != nil {
							return 0, err
						}
						t.Release()
					}
				}
				ts = append(ts, float64(time.Since(start).Microseconds())/1e3)
			}
			return stats.Median(ts), nil
		}
		base, err := perStep(transport.Float32)
		if err != nil {
			return 0, err
		}
		cast, err := perStep(wire)
		if err != nil {
			return 0, err
		}
		worst = max(worst, cast-base)
	}
	return worst, nil
}

// castsText says which casts the measured binary's build would use here.
func castsText() string {
	if c := transport.CastsUsed(); c != "go" {
		return c + " vector instructions, chosen at run time, the Go loops giving the same bits elsewhere"
	}
	return "the Go loops (-tags nosimd, not amd64, or a CPU without AVX2 and F16C)"
}
