package data

import (
	"fmt"
	"strings"
)

// arraysKind is dataset arrays: features and labels of a classifier from
// NumPy files, tensors of safetensors files or IDX files, mapped into memory
// and read in place, with the training and test splits in separate arrays.
type arraysKind struct{}

func init() { Register(arraysKind{}) }

func (arraysKind) Name() string { return "arrays" }

// arraysKeys are the kind's own keys of the data section: each names an
// array as "file.npy", "file.safetensors:tensor" or an IDX file.
type arraysKeys struct {
	TrainFeatures string `json:"train_features"`
	TrainLabels   string `json:"train_labels"`
	TestFeatures  string `json:"test_features"`
	TestLabels    string `json:"test_labels"`
}

const arraySpecDoc = " (dataset arrays): a NumPy file (x.npy), a tensor of a safetensors file (data.safetensors:NAME) or an IDX file, from the config's folder."

func (arraysKind) Keys() []KeyDoc {
	return []KeyDoc{
		{Key: "train_features", Type: "string", Doc: "The training examples' features, examples first, of dtype uint8 (scaled to [0, 1]), float16 or float32" + arraySpecDoc},
		{Key: "train_labels", Type: "string", Doc: "The training examples' labels, one integer (int64, int32 or uint8) per example below model.classes" + arraySpecDoc},
		{Key: "test_features", Type: "string", Doc: "The test examples' features, which train.evaluate and train.eval_every score" + arraySpecDoc},
		{Key: "test_labels", Type: "string", Doc: "The test examples' labels" + arraySpecDoc},
	}
}

// keys decodes s's own keys; Validate has reported their problems.
func (arraysKind) keys(s *Section) arraysKeys {
	var k arraysKeys
	s.DecodeOwn(&k, func(string, string, ...any) {})
	return k
}

func (arraysKind) Validate(s *Section, m *Model, problem func(key, format string, args ...any)) {
	var k arraysKeys
	s.DecodeOwn(&k, problem)
	specs := []struct{ key, value string }{{"train_features", k.TrainFeatures}, {"train_labels", k.TrainLabels}, {"test_features", k.TestFeatures}, {"test_labels", k.TestLabels}}
	for i, sp := range specs {
		switch {
		case sp.value == "" && i < 2:
			problem("data."+sp.key, "missing; give a NumPy file (x.npy) or a tensor of a safetensors file (data.safetensors:NAME)")
		case sp.value == "" && s.Evaluate:
			problem("data."+sp.key, "missing; the run evaluates (train.evaluate or train.eval_every), on test arrays: give a NumPy file or a safetensors tensor")
		case strings.HasSuffix(sp.value, ".safetensors"):
			problem("data."+sp.key, "%s: name the tensor, as %s:NAME", sp.value, sp.value)
		}
	}
	if m != nil && m.Targets > 1 {
		problem("data.dataset", "arrays holds labelled examples; model %s predicts tokens (use dataset: tokens)", m.Name)
	}
}

// Check opens the arrays of the splits the run reads, which reads their
// headers, and checks them against the model: dtypes, shapes, the features
// against model.input, every label against model.classes. It reads no
// feature.
func (k arraysKind) Check(s *Section, m *Model) error {
	splits, err := k.open(s, m)
	for _, a := range splits {
		a.Close()
	}
	return err
}

func (k arraysKind) Open(s *Section, m *Model, o OpenOptions) (Source, error) {
	splits, err := k.open(s, m)
	if err != nil {
		for _, a := range splits {
			a.Close()
		}
		return nil, err
	}
	var test split
	if len(splits) > 1 {
		test = splits[1]
	}
	return openSource(s, splits[0], test)
}

// open opens and checks the training split and, when the run evaluates, the
// test split; on an error it returns the splits it opened, to close.
func (k arraysKind) open(s *Section, m *Model) ([]*arraySplit, error) {
	keys := k.keys(s)
	var out []*arraySplit
	train, err := openArraySplit(s, m, "train", keys.TrainFeatures, keys.TrainLabels)
	if err != nil {
		return out, err
	}
	out = append(out, train)
	if !s.Evaluate {
		return out, nil
	}
	test, err := openArraySplit(s, m, "test", keys.TestFeatures, keys.TestLabels)
	if err != nil {
		return out, err
	}
	return append(out, test), nil
}

// openArraySplit opens the arrays of split name, features and labels as the
// config gives them, and checks them against m.
func openArraySplit(s *Section, m *Model, name, features, labels string) (*arraySplit, error) {
	fKey, lKey := "data."+name+"_features", "data."+name+"_labels"
	f, err := OpenArray(resolveArraySpec(s, features))
	if err != nil {
		return nil, fmt.Errorf("%s: %s: %w", s.Config, fKey, err)
	}
	l, err := OpenArray(resolveArraySpec(s, labels))
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("%s: %s: %w", s.Config, lKey, err)
	}
	a := &arraySplit{features: f, labelArr: l, featuresKey: fKey, labelsKey: lKey}
	if err := a.check(s.Config, m); err != nil {
		a.Close()
		return nil, err
	}
	return a, nil
}

// resolveArraySpec takes an array's file from the config's folder, keeping
// a safetensors tensor's name.
func resolveArraySpec(s *Section, spec string) string {
	path, tensor := splitArraySpec(spec)
	if tensor == "" {
		return s.resolve(path)
	}
	return s.resolve(path) + ":" + tensor
}
