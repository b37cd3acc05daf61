package configs

import (
	"fmt"
	"maps"
	"strings"

	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/models"
)

// datasets are the values of data.dataset the schema lists: the kinds
// registered when the package starts (a kind registered later validates
// too), and tokenizers those of data.tokenizer (read with dataset text).
var (
	datasets   = data.Kinds()
	tokenizers = data.Tokenizers()
)

// validateData checks the data section against the model: its dataset's kind
// checks the fields it reads.
func (c *Config) validateData(p *Problems, model *models.Model) {
	if kind, ok := data.Lookup(c.Data.Dataset); ok {
		kind.Validate(c.DataSection(), c.DataModel(model), p.add)
	} else {
		p.add("data.dataset", "unknown dataset %q (known: %s)", c.Data.Dataset, strings.Join(data.Kinds(), ", "))
	}
	if c.Train.EvalEvery < 0 {
		p.add("train.eval_every", "must be 0 (only after the last step) or a number of steps, got %d", c.Train.EvalEvery)
	}
}

// CheckData checks the data the config names against its model, before any
// stage starts, as its dataset's kind does: the Fashion-MNIST files'
// features against model.input and every label of the splits the run reads
// against model.classes; a text corpus's symbols against model.vocab. It
// reads headers and labels, never a whole dataset. Errors name the file,
// and for a label the index of the first bad example. Data not found on this
// machine is an error that wraps fs.ErrNotExist, which validate tells apart.
func (c *Config) CheckData() error {
	kind, ok := data.Lookup(c.Data.Dataset)
	if !ok {
		return fmt.Errorf("%s: data.dataset: unknown dataset %q (known: %s)", c.Path, c.Data.Dataset, strings.Join(data.Kinds(), ", "))
	}
	model, err := models.Build(c.Model)
	if err != nil {
		return fmt.Errorf("%s: %w", c.Path, err)
	}
	return kind.Check(c.DataSection(), c.DataModel(model))
}

// DataSection is the data section as its dataset's kind reads it, paths
// taken from the config's folder.
func (c *Config) DataSection() *data.Section {
	d := c.Data
	return &data.Section{
		Config: c.Path, Dataset: d.Dataset, Dir: c.DataDir(),
		Corpus: d.Corpus, Glob: d.Glob, Tokenizer: d.Tokenizer, MaxBytes: d.MaxBytes, ValFraction: d.ValFraction,
		BatchSize: d.BatchSize, MicroBatch: c.microBatchOrZero(), Seed: c.Train.Seed,
		Evaluate: c.Train.Evaluate || c.Train.EvalEvery > 0,
		Resolve:  c.resolve,
		Own:      d.Own,
	}
}

// microBatchOrZero is MicroBatchSize, or 0 while data.micro_batches or
// data_parallel is invalid (validation reports those).
func (c *Config) microBatchOrZero() int {
	if c.Data.MicroBatches < 1 || c.Replicas() < 1 {
		return 0
	}
	return c.MicroBatchSize()
}

// DataModel is what a dataset kind checks its data against, of model built
// from the config's model section; nil when model is.
func (c *Config) DataModel(model *models.Model) *data.Model {
	if model == nil {
		return nil
	}
	return &data.Model{Name: c.Model.Name, Example: []int(model.Example), Classes: model.Classes,
		Vocab: c.Model.Vocab, Targets: model.Targets()}
}

// DataDir is data.dir, a relative path taken from the config's folder, as
// data.corpus and the other paths of a config are, whether it came from the
// file or from PIPETRAIN_DATA_DIR: the stages of a run, and a resumed run,
// then find the same files wherever they are started from.
func (c *Config) DataDir() string { return c.resolve(c.Data.Dir) }

// LoadText reads and tokenizes the text corpus, split into training and
// validation tokens, and checks the model's vocabulary fits the tokenizer.
func (c *Config) LoadText() (*data.Text, error) {
	return data.LoadText(c.DataSection(), c.Model.Vocab)
}

// withDatasetKeys is root with the data section extended by the own keys of
// dataset kind name (data.OwnKeys): the keys a config naming that kind may
// give besides Data's. A key of another kind's own stays unknown.
func withDatasetKeys(root *keyTree, name string) *keyTree {
	own := data.KeysOf(name)
	if len(own) == 0 {
		return root
	}
	section := &keyTree{keys: maps.Clone(root.keys["data"].keys)}
	for _, k := range own {
		section.keys[k.Key] = &keyTree{}
	}
	out := &keyTree{keys: maps.Clone(root.keys), entry: root.entry}
	out.keys["data"] = section
	return out
}

// addDatasetKeys adds every registered kind's own keys to the data section
// of the schema root: a config may give each when it names that kind, which
// the schema leaves to validation.
func (b *schemaBuilder) addDatasetKeys(root map[string]any) {
	owners := map[string][]ownKey{}
	docs := map[string]string{}
	for _, name := range data.Kinds() {
		for _, k := range data.KeysOf(name) {
			owners[name] = append(owners[name], ownKey{k.Key, k.Type})
			docs["data."+k.Key] = k.Doc // the last kind's, as the schema always took
		}
	}
	b.addOwnKeys(root, "data", "dataset kind", "configs.Data", data.Kinds(), owners, func(key string, k ownKey) map[string]any {
		return map[string]any{"type": k.Type, "description": docs[key]}
	})
}
