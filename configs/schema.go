package configs

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/optim"
	"github.com/pipetrain/pipetrain/schedule"
)

// Schema returns the JSON Schema (draft 7) of config files, which
// pipetrain.schema.json in this folder holds for editors. It is made from
// what Load and Validate read, so that an editor and pipetrain agree on a
// file: the keys and types of the mapstructure tags Load decodes (named as
// the unknown-key check names them), the defaults Load applies and the lists
// validation accepts values from. Its own tables are the descriptions
// (keyDocs), which every key must have, and the bounds and patterns of
// values, which the tests hold against Validate. Draft 7 is the one
// yaml-language-server, behind most editors' YAML support, implements in full.
func Schema() ([]byte, error) {
	b := schemaBuilder{keys: map[string]bool{}, enums: enums(), docs: allKeyDocs()}
	root := b.value(reflect.TypeFor[Config](), "")
	b.addFamilyKeys(root)
	b.addDatasetKeys(root)
	// A table entry that names no key is a key that was renamed or removed.
	for table, keys := range map[string][]string{
		"defaults": slices.Collect(maps.Keys(defaults)), "keyDocs": slices.Collect(maps.Keys(b.docs)),
		"enums": slices.Collect(maps.Keys(b.enums)), "minimums": slices.Collect(maps.Keys(minimums)),
		"positive": slices.Collect(maps.Keys(positive)), "commaLists": slices.Collect(maps.Keys(commaLists)),
		"patterns": slices.Collect(maps.Keys(patterns)),
	} {
		for _, k := range keys {
			if !b.keys[k] {
				b.errs = append(b.errs, fmt.Sprintf("%s in configs names %s, which is no config key", table, k))
			}
		}
	}
	if len(b.errs) > 0 {
		slices.Sort(b.errs)
		return nil, fmt.Errorf("configs: %s", strings.Join(b.errs, "; "))
	}
	root["$schema"] = "http://json-schema.org/draft-07/schema#"
	root["title"] = "pipetrain config"
	root["description"] = "A pipetrain run config; `pipetrain validate --config FILE` checks one, and `pipetrain schema` prints this schema."
	var out bytes.Buffer
	enc := json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(root); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// enums are the keys whose values validation takes from a fixed list, with
// that list. Validation also accepts "" for model.dtype, model.activation,
// transport.compression, run_dir_mode, stages[i].device and
// stages[i].recompute, meaning the first value; the schema leaves "" out, as
// nobody means to write it.
func enums() map[string][]string {
	e := map[string][]string{
		"model.name":            models.Names(),
		"model.dtype":           models.DTypes(),
		"data.dataset":          datasets,
		"data.tokenizer":        tokenizers,
		"train.optimizer.name":  optim.Names(),
		"schedule":              append(schedule.Names(), "custom"),
		"transport.compression": compressions,
		"run_dir_mode":          runDirModes,
		"compute.blas_kernels":  blasKernels(),
		"stages[i].device":      compute.Kinds(),
		"stages[i].recompute":   RecomputeModes,
		"all_reduce.transport":  AllReduceTransports,
		"all_reduce.algorithm":  AllReduceAlgorithms,
		"all_reduce.overlap":    AllReduceOverlaps,

		"train.lr_schedule.kind": optim.ScheduleKinds(),
		"parameter_servers.mode": psModes,
	}
	maps.Copy(e, modelEnums())
	return e
}

// minimums are the least values validation accepts for numeric keys whatever
// the rest of the config says, and positive the keys it wants above 0; a
// duration's bound is in nanoseconds, the unit of a duration given as an
// integer. Keys checked only in some configs (the model's sizes, which only
// some models read) have none.
var (
	minimums = map[string]int{
		"data.batch_size":           1,
		"data.micro_batches":        1,
		"train.steps":               1,
		"train.log_every":           1,
		"train.eval_every":          0,
		"virtual_stages":            1,
		"data_parallel":             0,
		"compute.blas_threads":      0,
		"transport.queue_depth":     1,
		"transport.connect_timeout": 1,
		"transport.recv_timeout":    1,
		"transport.heartbeat":       1,
		"transport.peer_timeout":    1,
		"all_reduce.bucket_bytes":   0,
		"all_reduce.check_every":    0,
		"checkpoint.every":          0,
		"checkpoint.keep":           1,
		"checkpoint.keep_best":      0,
		"train.early_stop.patience": 0,
		"recovery.max_restarts":     0,

		"train.optimizer.weight_decay":   0,
		"train.lr_schedule.warmup_steps": 0,
		"train.lr_schedule.decay_steps":  0,
	}
	positive = map[string]bool{"train.optimizer.lr": true}
)

// commaLists are list keys a config may also give as one string: the loader
// splits a string at commas where it expects a list. The configs write a
// stage's single layer range so (layers: "0-1").
var commaLists = map[string]bool{"stages[i].layers": true, "train.optimizer.decay_exclude": true}

// Patterns of the strings that validation parses: ParseLayers' ranges and
// time.ParseDuration's durations (without a sign: durations must be positive).
const (
	layerRange      = `\s*[0-9]+\s*(-\s*[0-9]+\s*)?`
	durationPart    = `([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)`
	durationPattern = `^(` + durationPart + `)+$`
)

// patterns are the patterns of the string keys validation parses; a list
// key's pattern is its entries'.
var patterns = map[string]string{"stages[i].layers": `^` + layerRange + `$`}

const durationDoc = " A Go duration such as 30s, 1m30s or 500ms (an integer counts nanoseconds)."

// keyDocs describe every config key, as editors show them. Lists of values
// (schedules, models) are left to the schema's enumerations, which follow
// the code; the model families describe their own keys (modelKeyDocs).
var keyDocs = map[string]string{
	"name":        "The run's name: a run directory defaults to runs/NAME-TIME (the config file's name when empty).",
	"model":       "The model: a registered name and its sizes; each model reads the keys it needs.",
	"model.dtype": "The floating-point type of weights, activations and gradients.",
	"model.from":  "A Hugging Face checkpoint directory (config.json of model_type llama or gpt2) that sets the model: name and sizes come from its config.json; keys given beside it must agree, except dtype and a Llama's context (at most max_position_embeddings). train.init_from: DIR loads its weights.",

	"data":               "Where examples come from and how a step's batch is cut.",
	"data.dataset":       "fashion-mnist: the images in data.dir; text: data.corpus, tokenized, for a language model (model gpt).",
	"data.dir":           "Folder of the Fashion-MNIST files (Debian package dataset-fashion-mnist), or of IDX files named like them; relative to the config's folder, also when PIPETRAIN_DATA_DIR gives it.",
	"data.batch_size":    "Examples per optimizer step (the global batch); divisible by data_parallel × data.micro_batches.",
	"data.micro_batches": "Micro-batches each replica's share of the batch is cut into.",
	"data.corpus":        "The text to train on (dataset text): a file, a directory (its files matching data.glob, in path order), or go:PKG, the Go standard library's sources of package PKG; relative to the config's folder, also when PIPETRAIN_DATA_CORPUS gives it.",
	"data.glob":          "Which files of a data.corpus directory are read.",
	"data.max_bytes":     "At most this many bytes of data.corpus are read (0: no limit).",
	"data.tokenizer":     "byte (256 symbols) or char (the symbols the corpus uses).",
	"data.val_fraction":  "Fraction of the tokens, taken from the end, held out for validation; between 0 and 1.",

	"train":                    "The optimisation settings.",
	"train.steps":              "Optimizer steps to train.",
	"train.seed":               "Seed of the initial weights and of the data order.",
	"train.optimizer":          "The optimizer: sgd (lr, momentum), adam or adamw (lr, beta1, beta2, eps), each with optional weight_decay.",
	"train.optimizer.name":     "sgd, with optional momentum; adam; or adamw, Adam with decoupled weight decay (torch.optim.AdamW).",
	"train.optimizer.lr":       "Learning rate; positive.",
	"train.optimizer.momentum": "Momentum of sgd, in [0, 1); 0 is plain SGD.",
	"train.optimizer.beta1":    "Adam's (and AdamW's) decay rate of the gradient mean, in [0, 1).",
	"train.optimizer.beta2":    "Adam's (and AdamW's) decay rate of the squared gradient mean, in [0, 1).",
	"train.optimizer.eps":      "Adam's (and AdamW's) term added to the denominator; positive.",
	"train.log_every":          "Log the loss and samples/s every so many steps.",
	"train.evaluate":           "Evaluate after the last step: test accuracy, or validation loss and perplexity for text.",
	"train.eval_every":         "Also evaluate every so many steps (0: only after the last).",
	"train.clip_grad_norm":     "Scale each step's gradients down so that their global norm, over every parameter of the model on every stage (tied weights and replicas counted once), is at most this, as torch.nn.utils.clip_grad_norm_ does in one process; 0: no clipping.",
	"train.init_from":          "Start from the weights in this safetensors file (from PyTorch, Hugging Face or pipetrain export) instead of the seed's; relative to the config's folder.",

	"train.optimizer.weight_decay":  "Weight decay, 0 or more (0: none): adamw scales each decayed parameter by 1 − lr·weight_decay before its update, sgd and adam add weight_decay·p to its gradient (L2), as torch.optim does. By default only the weights of linear and convolution layers decay (parameters named *.weight of two dimensions or more), not biases, norms or embeddings.",
	"train.optimizer.decay_exclude": `Patterns (path.Match: *, ?, [...]) of the parameter names weight decay leaves out, replacing the default choice: "*.bias" excludes every bias, "embed.*" the embeddings; every parameter no pattern matches decays. Tied weights (embed.tok and head.tok) must be excluded both or neither. A comma-separated string is also accepted.`,

	"train.lr_schedule":              "The learning rate at every step, from the step alone: a linear warmup, lr·(s+1)/(warmup_steps+1) at step s (from 0), then the kind's rate (docs/training.md).",
	"train.lr_schedule.kind":         "constant: train.optimizer.lr; cosine: from lr down to min_lr at decay_steps along half a cosine; linear: from lr down to min_lr at decay_steps in a straight line; step: lr × gamma every step_size steps.",
	"train.lr_schedule.warmup_steps": "Steps of linear warmup before the kind's rate (0: none).",
	"train.lr_schedule.min_lr":       "cosine and linear: the rate they end at, between 0 and train.optimizer.lr.",
	"train.lr_schedule.decay_steps":  "cosine and linear: the step, counted from the first (warmup included), at which the rate reaches min_lr and stays (0: train.steps).",
	"train.lr_schedule.step_size":    "step: the rate is multiplied by gamma every step_size steps after the warmup; 1 or more.",
	"train.lr_schedule.gamma":        "step: the factor, in (0, 1].",

	"schedule":       "The pipeline schedule (docs/schedules.md): a built-in one, or custom to run schedule_file. interleaved and interleaved-zb need virtual_stages of 2 or more, zb-v and dualpipev exactly 2 (placed in a V).",
	"schedule_file":  "With schedule: custom, the schedule to run: CSV, YAML or the grid pipetrain simulate prints; relative to the config's folder.",
	"virtual_stages": "Model chunks each stage holds: 1, 2 or more with schedule: interleaved or interleaved-zb, or 2 with schedule: zb-v or dualpipev, each stage's layers then listing one range per chunk.",
	"data_parallel":  "Replicas of the pipeline: the run has stages × replicas processes, each replica trains on its share of every batch, and the replicas of a stage sum their gradients.",
	"rendezvous":     "host:port where rank 0 serves the table of addresses when stages have address auto; by default MASTER_ADDR:MASTER_PORT, else the first host of SLURM_JOB_NODELIST.",

	"compute":              "How each process computes.",
	"compute.blas_kernels": "OpenBLAS's kernel set (core type). auto: the library's own choice unless it is below what the CPU runs (Prescott's SSE3 kernels on an AVX2 or AVX-512 CPU the library does not know) and a better set of this build passes a self-test against the Go kernels and is faster; library: the library's own choice (or OPENBLAS_CORETYPE's); a core type (Haswell, Zen, SkylakeX, Cooperlake, ...): that set on every host, refused where the CPU cannot run it or it fails the self-test. Kernel sets differ in the last bits, so stages with different sets refuse to link. PIPETRAIN_COMPUTE_BLAS_KERNELS sets it before OpenBLAS loads; a config file's value restarts stage and reference once to load it.",
	"compute.blas_threads": "OpenBLAS threads in every stage process and in the reference. 0: each stage a fair share of its machine (or of the CPUs it is pinned to), the reference the whole machine. Results differ in the last bits between thread counts, so a fixed count makes runs on different machines bit-identical.",

	"transport":                 "The links between neighbouring stages.",
	"transport.connect_timeout": "How long a stage waits for its neighbours at start-up.",
	"transport.queue_depth":     "Tensors queued per link before a send blocks.",
	"transport.recv_timeout":    "A neighbour silent this long during training stops the run with an error instead of hanging it.",
	"transport.compression":     "Casts float32 activations and gradients to 16 bits on the wire (fp16, bf16): half the bytes, but lossy, so no longer bit-identical to the reference.",
	"transport.heartbeat":       "Interval of the keep-alive pings on an idle link.",
	"transport.peer_timeout":    "How long a ping may go unanswered before the link is declared dead.",
	"transport.token":           "A shared secret every link must present on connect (or give token_file). Listeners beyond loopback need a token or tls.",
	"transport.token_file":      "A file whose first line is the shared secret, instead of token; relative to the config's folder.",
	"transport.tls":             "Mutual TLS between stages (docs/security.md; pipetrain certs makes test files). Relative paths are relative to the config's folder.",
	"transport.tls.ca":          "PEM file of the CA that signed the stages' certificates.",
	"transport.tls.cert":        "PEM certificate of a stage; {stage} is replaced by the stage index, so one config serves every stage.",
	"transport.tls.key":         "PEM private key of a stage; {stage} is replaced by the stage index.",

	"stages":                    "The stage processes, in pipeline order; together their layers cover the model once, in order.",
	"stages[i].layers":          `The stage's layers: an inclusive range "first-last" or one layer "n"; with virtual_stages v, a list of v ranges, one per chunk (chunk c of stage s is model stage c·p+s of p stages; with zb-v or dualpipev, chunk 0 is model stage s and chunk 1 model stage 2p-1-s).`,
	"stages[i].address":         "Where the stage listens: host:port, unix:PATH for a socket file, or auto (auto:PORT) for the rendezvous to assign.",
	"stages[i].addresses":       "One address per replica when data_parallel > 1, replica 0 first, instead of address.",
	"stages[i].device":          "Where the stage computes.",
	"stages[i].cpus":            `CPUs the stage process is pinned to ("0", "2-3", "0,4"), so that it owns its cores as it would own a device.`,
	"stages[i].metrics_address": "host:port where the stage serves its Prometheus metrics (http://ADDRESS/metrics) while it trains.",
	"stages[i].recompute":       "Activation recomputation: none keeps every activation until the backward; full keeps only each micro-batch's input and runs the forward again (RF) right before the backward; selective keeps all but attention's probabilities, which attention's backward computes again (GPT and Llama blocks).",

	"all_reduce":                 "How the replicas of a stage sum their gradients.",
	"all_reduce.bucket_bytes":    "Gradients are summed in buckets of at most this many bytes, one after another (0: the default). The cut decides the order of the sums, so it is a training setting.",
	"all_reduce.check_every":     "Compare a digest of every replica's weights every so many steps, stopping the run if they differ (0: never).",
	"all_reduce.transport":       "How the all-reduces' chunks travel between replicas: stream, framed byte streams (TCP, or the Unix socket of a unix: address) opened beside the replicas' gRPC links after their handshake and authenticated as they are, written from and read into the gradient buffers; or grpc, the links themselves. Both sum the same values in the same order.",
	"all_reduce.algorithm":       "How the replicas sum their gradients: ring, a reduce-scatter and all-gather round the replicas, where chunk c of each bucket folds replicas c, c+1, ..., c-1; or reduce-to-one, each bucket carried whole from replica 0 down the replicas in order, every element folded 0 + 1 + ... + R-1, and the sum passed back round. The orders differ, so it is a training setting; all_reduce.shard_optimizer needs ring.",
	"all_reduce.overlap":         "When a chunk's gradient buckets start their all-reduce: chunk, all once the chunk's last backward or weight pass of the step is done; layer, each as soon as that pass has finished the layers the bucket lies in, while it computes the earlier layers' (zero-bubble schedules, whose weight pass runs layer by layer). The same buckets and sums either way.",
	"all_reduce.shard_optimizer": "Each replica keeps the optimizer state of, and updates, only its share of the stage's weights, then the replicas pass the updated weights round (ZeRO stage 1): optimizer memory falls to 1/data_parallel, the bits stay the unsharded run's.",

	"checkpoint":                 "How often each stage saves its weights and optimizer state.",
	"checkpoint.every":           "Steps between checkpoints (0: none).",
	"checkpoint.keep":            "Complete checkpoints kept; older ones are deleted.",
	"checkpoint.keep_best":       "Also keep this many of the checkpoints whose evaluation was best by train.early_stop.metric (0: none); checkpoint.every must be a multiple of train.eval_every, so that each checkpoint has one.",
	"train.early_stop":           "Stop the run once the evaluations (every train.eval_every steps) stop improving.",
	"train.early_stop.metric":    "What the evaluations are judged by: val_loss, the evaluation's loss (lower is better).",
	"train.early_stop.patience":  "Stop after this many evaluations in a row without an improvement (0: never stop early).",
	"train.early_stop.min_delta": "An evaluation improves when its metric is below the best so far by more than this; 0 or more.",
	"recovery":                   "What launch does when a stage fails.",
	"recovery.max_restarts":      "Times launch restarts a failed job from its newest complete checkpoint (0: stop at the first failure).",
	"run_dir_mode":               "Who may read the run directory: private (folders 0700, files 0600: its owner alone) or shared (0755 and 0644: every user of the host); --share-run-dir sets shared. See docs/security.md.",
}

// allKeyDocs are keyDocs and the descriptions the registered model
// families give of the model section's keys (modelKeyDocs).
func allKeyDocs() map[string]string {
	docs := maps.Clone(keyDocs)
	maps.Copy(docs, modelKeyDocs())
	return docs
}

// modelKeyDocs describes model.name by the registered families' summaries,
// and each key a family reads by what it means to each family that reads it
// ("cnn: ... mlp: ..."), families that give the same description grouped
// ("cnn, mlp: ...").
func modelKeyDocs() map[string]string {
	var families []string
	byKey := map[string][][2]string{} // key: (doc, families) in name order
	for _, name := range models.Names() {
		f, _ := models.Lookup(name)
		doc := f.Doc()
		families = append(families, fmt.Sprintf("%s (%s)", name, doc.Summary))
		for _, k := range doc.Keys {
			key := "model." + k.Key
			grouped := false
			for i, d := range byKey[key] {
				if d[0] == k.Doc {
					byKey[key][i][1] += ", " + name
					grouped = true
				}
			}
			if !grouped {
				byKey[key] = append(byKey[key], [2]string{k.Doc, name})
			}
		}
	}
	docs := map[string]string{"model.name": "The model: " + orList(families) + "."}
	for key, ds := range byKey {
		parts := make([]string, len(ds))
		for i, d := range ds {
			parts[i] = d[1] + ": " + d[0]
		}
		docs[key] = strings.Join(parts, " ")
	}
	return docs
}

// orList joins items as "a, b or c".
func orList(items []string) string {
	if len(items) < 2 {
		return strings.Join(items, "")
	}
	return strings.Join(items[:len(items)-1], ", ") + " or " + items[len(items)-1]
}

// modelEnums are the values of the model keys whose families list them, in
// the families' order, each value once.
func modelEnums() map[string][]string {
	e := map[string][]string{}
	for _, name := range models.Names() {
		f, _ := models.Lookup(name)
		for _, k := range f.Doc().Keys {
			key := "model." + k.Key
			for _, v := range k.Values {
				if !slices.Contains(e[key], v) {
					e[key] = append(e[key], v)
				}
			}
		}
	}
	return e
}

// schemaBuilder makes the schema of a type, recording the keys it met and
// what it could not describe.
type schemaBuilder struct {
	keys  map[string]bool
	enums map[string][]string
	docs  map[string]string // allKeyDocs
	errs  []string
}

// value is the schema of a value of type t at key (the dotted key, list
// entries written [i]; "" for the whole config).
func (b *schemaBuilder) value(t reflect.Type, key string) map[string]any {
	n := map[string]any{}
	switch {
	case t == reflect.TypeFor[time.Duration]():
		// viper decodes a string with time.ParseDuration, and an integer
		// as nanoseconds.
		n["type"] = []string{"string", "integer"}
		n["pattern"] = durationPattern
	case t.Kind() == reflect.Struct:
		props := map[string]any{}
		for i := range t.NumField() {
			f := t.Field(i)
			name, ok := keyName(f)
			if !ok {
				continue
			}
			k := name
			if key != "" {
				k = key + "." + name
			}
			props[name] = b.property(f.Type, k)
		}
		n["type"] = "object"
		n["properties"] = props
		n["additionalProperties"] = false // as unknownKeys reports them
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Struct:
		n["type"] = "array"
		n["items"] = b.value(t.Elem(), key+"[i]")
	case t.Kind() == reflect.Slice:
		n["type"] = "array"
		n["items"] = b.value(t.Elem(), key)
		if commaLists[key] {
			n["type"] = []string{"array", "string"}
			if p, ok := patterns[key]; ok {
				entry := strings.TrimSuffix(strings.TrimPrefix(p, "^"), "$")
				n["pattern"] = "^" + entry + "(," + entry + ")*$"
			}
		}
	case t.Kind() == reflect.String:
		n["type"] = "string"
		if p, ok := patterns[key]; ok {
			n["pattern"] = p
		}
	case t.Kind() == reflect.Bool:
		n["type"] = "boolean"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		// No minimum for unsigned keys: the loader's weak decoding takes a
		// negative number modulo 2⁶⁴.
		n["type"] = "integer"
	case t.Kind() == reflect.Float32 || t.Kind() == reflect.Float64:
		n["type"] = "number"
	default:
		b.errs = append(b.errs, fmt.Sprintf("%s: no schema for Go type %v", key, t))
	}
	return n
}

// property is the schema of the key key, of type t: its value's, with the
// key's description, default, values and bounds.
func (b *schemaBuilder) property(t reflect.Type, key string) map[string]any {
	b.keys[key] = true
	n := b.value(t, key)
	doc, ok := b.docs[key]
	if !ok {
		b.errs = append(b.errs, fmt.Sprintf("%s has no description; add one to keyDocs in configs/schema.go", key))
	}
	if t == reflect.TypeFor[time.Duration]() {
		doc += durationDoc
	}
	n["description"] = doc
	if d, ok := defaults[key]; ok {
		n["default"] = d
	}
	if e, ok := b.enums[key]; ok {
		n["enum"] = e
	}
	if m, ok := minimums[key]; ok {
		n["minimum"] = m
	}
	if positive[key] {
		n["exclusiveMinimum"] = 0
	}
	return n
}
