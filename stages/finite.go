package stages

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"

	"gorgonia.org/tensor"
)

// ErrNonFinite is wrapped by the error of a run stopped because its loss or a
// gradient became NaN or infinite: a restart from a checkpoint would diverge
// the same way. Test for it with errors.Is.
var ErrNonFinite = errors.New("a value became NaN or infinite")

// nonFiniteError says which value became NaN or infinite, at which step
// (1-based, as the log counts) and on which stage.
type nonFiniteError struct {
	what  string // "loss", "gradient of fc0.weight"
	value float64
	step  int
	stage string // "stage 1", "stage 1 replica 0"
}

func (e *nonFiniteError) Error() string {
	return fmt.Sprintf("%s became %s at step %d (%s)", e.what, nonFiniteName(e.value), e.step, e.stage)
}

func (e *nonFiniteError) Is(target error) bool { return target == ErrNonFinite }

// asNonFinite is the nonFiniteError err wraps, nil if none.
func asNonFinite(err error) *nonFiniteError {
	var nf *nonFiniteError
	if errors.As(err, &nf) {
		return nf
	}
	return nil
}

// nonFiniteName spells v as the messages do: NaN, +Inf or -Inf.
func nonFiniteName(v float64) string {
	switch {
	case math.IsInf(v, 1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	}
	return "NaN"
}

func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// checkLoss stops the step at a micro-batch loss that is not finite, on the
// stage that computes it, before its backward sends a gradient made of it:
// the neighbours then stop at this step too, on the closed link.
func (r *Runtime) checkLoss(step int, loss float64) error {
	if finite(loss) {
		return nil
	}
	return &nonFiniteError{what: "loss", value: loss, step: step + 1, stage: r.name()}
}

// checkGradients stops the step before the optimizer when a summed gradient
// of the stage holds a NaN or an infinity, naming the first such parameter.
// It only reads the gradients.
func (r *Runtime) checkGradients(step int) error {
	for _, e := range r.chunks {
		grads, err := e.Gradients()
		if err != nil {
			return err
		}
		for _, g := range grads {
			if v, ok := firstNonFinite(g.Value); ok {
				return &nonFiniteError{what: "gradient of " + g.Name, value: v, step: step + 1, stage: r.name()}
			}
		}
	}
	return nil
}

// firstNonFinite returns t's first NaN or infinite element, if it has one.
// A sum in float64 finds out whether there is one in one cheap pass (float32
// elements cannot overflow it); only then are the elements searched.
func firstNonFinite(t *tensor.Dense) (float64, bool) {
	var s float64
	switch d := t.Data().(type) {
	case []float32:
		for _, x := range d {
			s += float64(x)
		}
		if finite(s) {
			return 0, false
		}
		for _, x := range d {
			if !finite(float64(x)) {
				return float64(x), true
			}
		}
	case []float64:
		for _, x := range d {
			s += x
		}
		if finite(s) {
			return 0, false
		}
		for _, x := range d {
			if !finite(x) {
				return x, true
			}
		}
	}
	// float64 elements all finite may still overflow the sum.
	return 0, false
}

// jsonFloat is a float64 that JSON carries even when it is NaN or infinite,
// as the string "NaN", "+Inf" or "-Inf" (a JSON number cannot be either), so
// that writing a step's metrics or an evaluation never fails on its values.
type jsonFloat float64

func (f jsonFloat) MarshalJSON() ([]byte, error) {
	if v := float64(f); !finite(v) {
		return []byte(`"` + nonFiniteName(v) + `"`), nil
	}
	return json.Marshal(float64(f))
}

func (f *jsonFloat) UnmarshalJSON(b []byte) error {
	var s string
	if len(b) == 0 || b[0] != '"' || json.Unmarshal(b, &s) != nil {
		return json.Unmarshal(b, (*float64)(f))
	}
	switch s {
	case "NaN":
		*f = jsonFloat(math.NaN())
	case "+Inf":
		*f = jsonFloat(math.Inf(1))
	case "-Inf":
		*f = jsonFloat(math.Inf(-1))
	default:
		return fmt.Errorf("%q is not a number, NaN, +Inf or -Inf", s)
	}
	return nil
}

// metricJSON is Metric as metrics.jsonl holds it; its fields are Metric's.
type metricJSON struct {
	Step          int         `json:"step"`
	Loss          jsonFloat   `json:"loss"`
	SamplesPerSec jsonFloat   `json:"samples_per_sec"`
	ElapsedSec    jsonFloat   `json:"elapsed_s"`
	Eval          *EvalResult `json:"eval,omitempty"`
	GradNorm      *float64    `json:"grad_norm,omitempty"`
	LR            *float64    `json:"lr,omitempty"`
}

func (m Metric) MarshalJSON() ([]byte, error) {
	return json.Marshal(metricJSON{Step: m.Step, Loss: jsonFloat(m.Loss), SamplesPerSec: jsonFloat(m.SamplesPerSec), ElapsedSec: jsonFloat(m.ElapsedSec), Eval: m.Eval, GradNorm: m.GradNorm, LR: m.LR})
}

func (m *Metric) UnmarshalJSON(b []byte) error {
	var j metricJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*m = Metric{Step: j.Step, Loss: float64(j.Loss), SamplesPerSec: float64(j.SamplesPerSec), ElapsedSec: float64(j.ElapsedSec), Eval: j.Eval, GradNorm: j.GradNorm, LR: j.LR}
	return nil
}

// evalJSON is EvalResult as eval.json and metrics.jsonl hold it; its fields
// are EvalResult's.
type evalJSON struct {
	Examples   int       `json:"examples"`
	Correct    int       `json:"correct"`
	Accuracy   jsonFloat `json:"accuracy"`
	Loss       jsonFloat `json:"loss"`
	Perplexity jsonFloat `json:"perplexity,omitempty"`
}

func (e EvalResult) MarshalJSON() ([]byte, error) {
	return json.Marshal(evalJSON{Examples: e.Examples, Correct: e.Correct, Accuracy: jsonFloat(e.Accuracy), Loss: jsonFloat(e.Loss), Perplexity: jsonFloat(e.Perplexity)})
}

func (e *EvalResult) UnmarshalJSON(b []byte) error {
	var j evalJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*e = EvalResult{Examples: j.Examples, Correct: j.Correct, Accuracy: float64(j.Accuracy), Loss: float64(j.Loss), Perplexity: float64(j.Perplexity)}
	return nil
}
