// Package configs loads and validates pipetrain run configs. The YAML examples in
// this folder are configs a user can run as they are; config_test.go validates all of
// them. A Config that passed Validate is trusted by every later step.
package configs

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/internal/blas/cores"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/optim"
	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/schedule"
)

// Config is one training run's description.
type Config struct {
	Name     string      `mapstructure:"name" json:"name"`
	Model    models.Spec `mapstructure:"model" json:"model"`
	Data     Data        `mapstructure:"data" json:"data"`
	Train    Train       `mapstructure:"train" json:"train"`
	Schedule string      `mapstructure:"schedule" json:"schedule"`
	// ScheduleFile holds a user's schedule (with schedule: custom): CSV, YAML or
	// the grid the simulator prints; a relative path is relative to the config.
	ScheduleFile string `mapstructure:"schedule_file" json:"schedule_file,omitempty"`
	// ScheduleText is the loaded custom schedule (see readScheduleFile), so
	// the digest covers its contents, not just its path.
	ScheduleText string `mapstructure:"-" json:"schedule_text,omitempty"`
	// VirtualStages is the number of model chunks each stage holds (2 or more
	// with interleaved and interleaved-zb, 2 with zb-v and dualpipev); 1 otherwise.
	VirtualStages int       `mapstructure:"virtual_stages" json:"virtual_stages"`
	Compute       Compute   `mapstructure:"compute" json:"compute"`
	Transport     Transport `mapstructure:"transport" json:"transport"`
	Stages        []Stage   `mapstructure:"stages" json:"stages"`
	// DataParallel is the number of replicas of the pipeline: the run has
	// stages × replicas processes, laid out as Grid says, and each replica
	// trains on its own share of every batch.
	DataParallel int `mapstructure:"data_parallel" json:"data_parallel"`
	// Rendezvous is where rank 0 serves the table of addresses when stages
	// have address auto (see cluster.ResolveRendezvous for the defaults).
	// Where, not what: it is left out of the digest.
	Rendezvous string    `mapstructure:"rendezvous" json:"-"`
	AllReduce  AllReduce `mapstructure:"all_reduce" json:"all_reduce"`
	// ParameterServers, when Count > 0, makes the replicas workers of
	// parameter servers instead of an all-reduce ring (configs/ps.go).
	ParameterServers ParameterServers `mapstructure:"parameter_servers" json:"parameter_servers"`
	// Checkpoint and Recovery change how a run survives faults, never what it
	// computes, so they are left out of the digest: a run may be resumed with
	// other settings.
	Checkpoint Checkpoint `mapstructure:"checkpoint" json:"-"`
	Recovery   Recovery   `mapstructure:"recovery" json:"-"`
	// RunDirMode is who may read what the run writes: private (its owner)
	// or shared (every user); see runlog.DirMode. Not part of the digest.
	RunDirMode string `mapstructure:"run_dir_mode" json:"-"`

	// Path is the file the config was read from; it is not part of the digest.
	Path string `mapstructure:"-" json:"-"`
	// addressesGiven records that the rendezvous replaced auto addresses.
	addressesGiven bool
	// psAddressesGiven records that the rendezvous gave the parameter
	// servers' addresses, the servers being ranks of the job.
	psAddressesGiven bool

	// env maps each key a PIPETRAIN_* variable set to that variable, so that
	// problems with the key name it; keyProblems are the unknown keys and
	// variables LoadUnchecked found, which Validate reports.
	env         map[string]string
	keyProblems []string
}

// Data says where examples come from and how a step's batch is cut.
type Data struct {
	Dataset      string `mapstructure:"dataset" json:"dataset"`
	Dir          string `mapstructure:"dir" json:"dir"`
	BatchSize    int    `mapstructure:"batch_size" json:"batch_size"`
	MicroBatches int    `mapstructure:"micro_batches" json:"micro_batches"`

	// Text datasets (dataset: text) read Corpus: a file, a directory (files
	// matching Glob, in path order), or "go:PKG", the Go standard library's
	// sources of package PKG on this machine. At most MaxBytes are read.
	Corpus    string `mapstructure:"corpus" json:"corpus,omitempty"`
	Glob      string `mapstructure:"glob" json:"glob,omitempty"`
	MaxBytes  int64  `mapstructure:"max_bytes" json:"max_bytes,omitempty"`
	Tokenizer string `mapstructure:"tokenizer" json:"tokenizer,omitempty"` // byte or char
	// ValFraction of the tokens, taken from the end, are held out for validation.
	ValFraction float64 `mapstructure:"val_fraction" json:"val_fraction,omitempty"`

	// Own holds the keys of the section that are none of the fields above:
	// those of the dataset kind's own (data.OwnKeys), which it decodes
	// itself. A config refuses every other key.
	Own map[string]any `mapstructure:",remain" json:"own,omitempty"`
}

// Train holds the optimisation settings.
type Train struct {
	Steps     int       `mapstructure:"steps" json:"steps"`
	Seed      uint64    `mapstructure:"seed" json:"seed"`
	Optimizer Optimizer `mapstructure:"optimizer" json:"optimizer"`
	// LRSchedule sets the optimizer's learning rate at every step.
	LRSchedule LRSchedule `mapstructure:"lr_schedule" json:"lr_schedule"`
	LogEvery   int        `mapstructure:"log_every" json:"log_every"`
	// Evaluate runs the test split through the pipeline after the last step.
	Evaluate bool `mapstructure:"evaluate" json:"evaluate"`
	// EvalEvery also evaluates every so many steps (0: only after the last).
	EvalEvery int `mapstructure:"eval_every" json:"eval_every,omitempty"`
	// InitFrom starts the run from the weights in a safetensors file (from
	// PyTorch, Hugging Face or pipetrain export) instead of the seed's.
	InitFrom string `mapstructure:"init_from" json:"init_from,omitempty"`
	// ClipGradNorm scales the step's gradients down so that their global
	// norm, over every parameter of the model on every stage, is at most
	// this; 0 does not clip.
	ClipGradNorm float64 `mapstructure:"clip_grad_norm" json:"clip_grad_norm,omitempty"`
	// EarlyStop ends the run once the evaluations stop improving.
	EarlyStop EarlyStop `mapstructure:"early_stop" json:"early_stop"`
}

// Optimizer is sgd (with optional momentum), adam or adamw, with optional
// weight decay: optim's own spec.
type Optimizer = optim.Spec

// LRSchedule is the learning rate's schedule: optim's own Schedule.
type LRSchedule = optim.Schedule

// Compute sets how each process computes.
type Compute struct {
	// BLASThreads is OpenBLAS's thread count in every stage process and in the
	// reference; 0 gives each stage a fair share of its machine (see Threads)
	// and the reference the whole machine (ReferenceThreads).
	// Results differ in the last bits between thread counts, so a fixed count
	// is what makes runs on different machines bit-identical.
	BLASThreads int `mapstructure:"blas_threads" json:"blas_threads"`
	// BLASKernels is OpenBLAS's kernel set: "auto" (the library's unless it
	// fell below the CPU and a better set passes a self-test), "library"
	// (the library's own choice, or OPENBLAS_CORETYPE's), or a core type
	// (Haswell, SkylakeX, ...) fixed for every host. "" means auto.
	BLASKernels string `mapstructure:"blas_kernels" json:"blas_kernels"`
}

// Transport tunes the links between neighbouring stages.
type Transport struct {
	ConnectTimeout time.Duration `mapstructure:"connect_timeout" json:"connect_timeout"`
	QueueDepth     int           `mapstructure:"queue_depth" json:"queue_depth"`
	// RecvTimeout bounds each wait for a neighbour's tensor during training, so a
	// stalled neighbour stops the run with an error instead of hanging it.
	RecvTimeout time.Duration `mapstructure:"recv_timeout" json:"recv_timeout"`
	// Heartbeat is the interval of keep-alive pings on an idle link and
	// PeerTimeout how long a ping may go unanswered before the link is declared
	// dead: they catch a hung peer or a dead host between actions.
	// Compression casts float32 activations and gradients to 16 bits on the
	// wire: none, fp16 or bf16. It changes the numbers, so it is in the digest.
	Compression string        `mapstructure:"compression" json:"compression,omitempty"`
	Heartbeat   time.Duration `mapstructure:"heartbeat" json:"-"`
	PeerTimeout time.Duration `mapstructure:"peer_timeout" json:"-"`
	// Token, or the first line of TokenFile, is a shared secret every link must
	// present on connect. Secrets never enter the digest.
	Token     string `mapstructure:"token" json:"-"`
	TokenFile string `mapstructure:"token_file" json:"-"`
	// TLS turns on mutual TLS between stages.
	TLS TLS `mapstructure:"tls" json:"-"`
}

// TLS names PEM files; "{stage}" in Cert and Key is replaced by the stage index, so
// one config serves every stage. Relative paths are relative to the config file.
type TLS struct {
	CA   string `mapstructure:"ca" json:"-"`
	Cert string `mapstructure:"cert" json:"-"`
	Key  string `mapstructure:"key" json:"-"`
}

// Enabled reports whether mutual TLS is configured.
func (t TLS) Enabled() bool { return t.CA != "" || t.Cert != "" || t.Key != "" }

// Checkpoint says how often each stage saves its weights and optimizer state.
type Checkpoint struct {
	// Every is the step interval; 0 turns checkpoints off.
	Every int `mapstructure:"every"`
	// Keep is how many complete checkpoints are kept; older ones are deleted.
	Keep int `mapstructure:"keep"`
	// KeepBest also keeps this many of the checkpoints with the best
	// evaluation (train.early_stop.metric), besides the newest Keep.
	KeepBest int `mapstructure:"keep_best"`
}

// Recovery bounds what launch does when a stage fails.
type Recovery struct {
	// MaxRestarts is how many times launch restarts a failed job from its last
	// complete checkpoint; 0 stops at the first failure.
	MaxRestarts int `mapstructure:"max_restarts"`
}

// AllReduce tunes how the replicas of a stage sum their gradients.
type AllReduce struct {
	// BucketBytes cuts a stage's gradients into buckets of at most this many
	// bytes, each reduced in turn. The cut decides the order in which each
	// element is summed, so it is a training setting.
	BucketBytes int `mapstructure:"bucket_bytes" json:"bucket_bytes"`
	// CheckEvery compares a digest of every replica's weights every so many
	// steps, stopping the run if they differ (0: never).
	CheckEvery int `mapstructure:"check_every" json:"check_every"`
	// ShardOptimizer makes each replica keep the optimizer state of, and
	// update, only the elements it holds the whole sum of after the
	// reduce-scatter, then share the updated weights (ZeRO stage 1). The
	// bits are the unsharded run's, so it is no training setting.
	ShardOptimizer bool `mapstructure:"shard_optimizer" json:"shard_optimizer,omitempty"`
	// Transport is how the all-reduces' chunks travel between replicas
	// (AllReduceTransports): stream, framed byte streams beside the ring's
	// gRPC links, or grpc, the links themselves. Both sum the same values
	// in the same order, so it changes speed, not results.
	Transport string `mapstructure:"transport" json:"transport"`
	// Algorithm is how the replicas sum (AllReduceAlgorithms): ring, the
	// reduce-scatter and all-gather ring; reduce-to-one, each bucket
	// carried whole down the replicas in order and back round; or
	// hierarchical, each host's replicas (ReplicaHosts) first, then a ring
	// of one replica per host. They fold in different orders, so it is a
	// training setting.
	Algorithm string `mapstructure:"algorithm" json:"algorithm,omitempty"`
	// Overlap is when a chunk's buckets start (AllReduceOverlaps): chunk,
	// all at its ReduceGrad op, once its last backward or weight pass is
	// done; layer, each as soon as that pass has finished the layers it
	// lies in (split engines: zero-bubble schedules). The buckets and their
	// sums are the same, so it changes timing, not results.
	Overlap string `mapstructure:"overlap" json:"overlap,omitempty"`
}

// AllReduceOverlaps are all_reduce.overlap's values, the default ("")
// first.
var AllReduceOverlaps = []string{"chunk", "layer"}

// AllReduceTransports are all_reduce.transport's values, the default ("")
// first.
var AllReduceTransports = []string{"stream", "grpc"}

// AllReduceAlgorithms are all_reduce.algorithm's values, the default ("")
// first: collective.Algorithms.
var AllReduceAlgorithms = []string{"ring", "reduce-to-one", "hierarchical"}

// ReduceAlgorithm is all_reduce.algorithm, "ring" where it is unset.
func (c *Config) ReduceAlgorithm() string {
	if c.AllReduce.Algorithm == "" {
		return AllReduceAlgorithms[0]
	}
	return c.AllReduce.Algorithm
}

// RingStreams reports whether the replicas' all-reduces travel on ring
// streams (all_reduce.transport: stream, the default).
func (c *Config) RingStreams() bool {
	return c.AllReduce.Transport == "" || c.AllReduce.Transport == "stream"
}

// Stage places contiguous ranges of layers on one process: one range, or with
// virtual_stages v, one per chunk. Chunk c of stage s is model stage c*p + s (p
// stages), as in Megatron-LM's interleaved placement, or with schedule zb-v
// or dualpipev (a V placement) chunk 0 is model stage s and chunk 1 model stage 2p-1-s; the
// model stages cover the layers in order.
type Stage struct {
	// Layers holds inclusive ranges "first-last" or single layers "n", one per chunk.
	// YAML may give a single range as a plain string.
	Layers  []string `mapstructure:"layers" json:"layers"`
	Address string   `mapstructure:"address" json:"address"`
	// Addresses lists one address per replica (data_parallel > 1), replica 0
	// first; Address is then replica 0's.
	Addresses []string `mapstructure:"addresses" json:"addresses,omitempty"`
	Device    string   `mapstructure:"device" json:"device"`
	// CPUs optionally pins the stage process to CPUs ("0", "2-3", "0,4"), so that
	// a stage owns its cores as it would own a device.
	CPUs string `mapstructure:"cpus" json:"cpus,omitempty"`
	// MetricsAddress optionally serves the stage's Prometheus metrics at
	// http://ADDRESS/metrics while it trains.
	MetricsAddress string `mapstructure:"metrics_address" json:"metrics_address,omitempty"`
	// Recompute trades compute for activation memory (RecomputeModes).
	Recompute string `mapstructure:"recompute" json:"recompute,omitempty"`
}

// RecomputeModes are stages[i].recompute's values ("" is none): none keeps
// every activation from the forward to the backward; full keeps only each
// micro-batch's input and runs the forward again (RF) right before the
// backward; selective keeps everything but attention's probabilities, which
// attention's backward computes again.
var RecomputeModes = []string{"none", "full", "selective"}

// RecomputesFull reports whether stage runs its forwards again before its
// backwards (stages[i].recompute: full).
func (c *Config) RecomputesFull(stage int) bool {
	return stage >= 0 && stage < len(c.Stages) && c.Stages[stage].Recompute == "full"
}

// RecomputesSelective reports whether stage's layers recompute their
// internals in their backward (stages[i].recompute: selective).
func (c *Config) RecomputesSelective(stage int) bool {
	return stage >= 0 && stage < len(c.Stages) && c.Stages[stage].Recompute == "selective"
}

// defaults apply where the file is silent. Keys without a default (the GPT
// and CNN sizes, model.hidden) are zero unless set; every key outside stages
// may also be set by its PIPETRAIN_* variable (see LoadUnchecked).
var defaults = map[string]any{
	"name":                       "",
	"rendezvous":                 "",
	"model.name":                 "mlp",
	"model.dtype":                "float32",
	"model.input":                784,
	"model.classes":              10,
	"model.activation":           "relu",
	"data.dataset":               "fashion-mnist",
	"data.dir":                   "/usr/share/datasets/fashion-mnist",
	"data.corpus":                "",
	"data.glob":                  "*",
	"data.max_bytes":             8 << 20,
	"data.tokenizer":             "byte",
	"data.val_fraction":          0.1,
	"train.eval_every":           0,
	"train.clip_grad_norm":       0.0,
	"data.batch_size":            256,
	"data.micro_batches":         8,
	"train.steps":                200,
	"train.seed":                 1,
	"train.log_every":            10,
	"train.evaluate":             true,
	"train.optimizer.name":       "adam",
	"train.optimizer.lr":         0.001,
	"train.optimizer.momentum":   0.0,
	"train.optimizer.beta1":      0.9,
	"train.optimizer.beta2":      0.999,
	"train.optimizer.eps":        1e-8,
	"schedule":                   "1f1b",
	"schedule_file":              "",
	"virtual_stages":             1,
	"data_parallel":              1,
	"all_reduce.bucket_bytes":    DefaultBucketBytes,
	"all_reduce.check_every":     10,
	"all_reduce.shard_optimizer": false,
	"all_reduce.transport":       "stream",
	"all_reduce.algorithm":       "ring",
	"all_reduce.overlap":         "chunk",
	"compute.blas_threads":       0,
	"compute.blas_kernels":       "auto",
	"transport.connect_timeout":  "30s",
	"transport.queue_depth":      4,
	"transport.recv_timeout":     "2m",
	"transport.heartbeat":        "10s",
	"transport.compression":      "none",
	"transport.peer_timeout":     "5s",
	"transport.token":            "",
	"transport.token_file":       "",
	"transport.tls.ca":           "",
	"transport.tls.cert":         "",
	"transport.tls.key":          "",
	"checkpoint.every":           50,
	"checkpoint.keep":            3,
	"checkpoint.keep_best":       0,
	"train.early_stop.metric":    "val_loss",
	"train.early_stop.patience":  0,
	"train.early_stop.min_delta": 0.0,
	"recovery.max_restarts":      3,
	"run_dir_mode":               runlog.ModePrivate,

	// Weight decay and the learning-rate schedule: none unless set.
	"train.optimizer.weight_decay":   0.0,
	"train.lr_schedule.kind":         "constant",
	"train.lr_schedule.warmup_steps": 0,
}

// Load reads a YAML config, applies PIPETRAIN_* environment overrides (a key's dots
// become underscores: PIPETRAIN_TRAIN_STEPS=50 sets train.steps) and validates it.
// A key the schema lacks, in the file or as a PIPETRAIN_* variable, is a problem.
func Load(path string) (*Config, error) {
	c, err := LoadUnchecked(path)
	if err != nil {
		return nil, err
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// Problems is every problem Validate found, each naming its field. A problem
// with a value from the environment starts with the variable that set it
// (PIPETRAIN_SCHEDULE=bogus: schedule: ...), not the field alone.
type Problems struct {
	Path  string
	Items []string

	env map[string]string // see Config.env
}

func (p *Problems) Error() string {
	where := p.Path
	if where == "" {
		where = "config"
	}
	if len(p.Items) == 1 {
		if strings.HasPrefix(p.Items[0], envPrefix) {
			return p.Items[0] // the variable, not the file, is at fault
		}
		return where + ": " + p.Items[0]
	}
	return fmt.Sprintf("%s: %d problems:\n  %s", where, len(p.Items), strings.Join(p.Items, "\n  "))
}

func (p *Problems) add(field, format string, args ...any) {
	item := field + ": " + fmt.Sprintf(format, args...)
	if from, ok := p.env[settingOf(field)]; ok {
		item = from + ": " + item
	}
	p.Items = append(p.Items, item)
}

// settingOf is the key of a field, without indexes: model.hidden[1] is set
// by model.hidden.
func settingOf(field string) string {
	key, _, _ := strings.Cut(field, "[")
	return key
}

// Validate checks the whole config and reports every problem at once.
func (c *Config) Validate() error {
	p := &Problems{Path: c.Path, env: c.env}
	p.Items = append(p.Items, c.keyProblems...)
	model, err := models.Build(c.Model)
	var spec models.SpecErrors
	if errors.As(err, &spec) {
		for _, e := range spec {
			p.add("model."+e.Field, "%s", e.Msg)
		}
	} else if err != nil {
		p.add("model", "%v", err)
	}
	c.validateData(p, model)
	if c.Data.BatchSize < 1 {
		p.add("data.batch_size", "must be at least 1, got %d", c.Data.BatchSize)
	}
	if c.Data.MicroBatches < 1 {
		p.add("data.micro_batches", "must be at least 1, got %d", c.Data.MicroBatches)
	} else if r := c.Replicas(); c.Data.BatchSize >= 1 && c.DataParallel >= 0 && c.Data.BatchSize%(r*c.Data.MicroBatches) != 0 {
		if r == 1 {
			p.add("data.batch_size", "%d is not divisible by data.micro_batches %d", c.Data.BatchSize, c.Data.MicroBatches)
		} else {
			p.add("data.batch_size", "%d is not divisible by data_parallel %d × data.micro_batches %d = %d: each replica takes batch_size / data_parallel examples, cut into micro_batches",
				c.Data.BatchSize, r, c.Data.MicroBatches, r*c.Data.MicroBatches)
		}
	}
	if c.Train.Steps < 1 {
		p.add("train.steps", "must be at least 1, got %d", c.Train.Steps)
	}
	if c.Train.LogEvery < 1 {
		p.add("train.log_every", "must be at least 1, got %d", c.Train.LogEvery)
	}
	if n := c.Train.ClipGradNorm; !(n >= 0) || math.IsInf(n, 1) {
		p.add("train.clip_grad_norm", "must be 0 (no clipping) or a positive finite norm, got %v", n)
	}
	c.validateOptimizer(p, model)
	c.validateLRSchedule(p)
	c.validateEarlyStop(p)
	c.validateSchedule(p, model)
	if c.Compute.BLASThreads < 0 {
		p.add("compute.blas_threads", "must be 0 (a fair share of the machine) or a thread count, got %d", c.Compute.BLASThreads)
	}
	if k := strings.TrimSpace(c.Compute.BLASKernels); k != "" && !strings.EqualFold(k, "auto") && !strings.EqualFold(k, "library") {
		if _, ok := cores.Lookup(k); !ok {
			p.add("compute.blas_kernels", "unknown kernel set %q: auto, library or an OpenBLAS core type (%s)", k, strings.Join(cores.Names(), ", "))
		}
	}
	if c.Transport.ConnectTimeout <= 0 {
		p.add("transport.connect_timeout", "must be positive, got %v", c.Transport.ConnectTimeout)
	}
	if c.Transport.RecvTimeout <= 0 {
		p.add("transport.recv_timeout", "must be positive, got %v", c.Transport.RecvTimeout)
	}
	if c.Transport.QueueDepth < 1 {
		p.add("transport.queue_depth", "must be at least 1, got %d", c.Transport.QueueDepth)
	}
	switch comp := c.Transport.Compression; {
	case comp == "" || comp == compressions[0]:
	case slices.Contains(compressions, comp):
		if model != nil && c.Model.DType == "float64" {
			p.add("transport.compression", "%s casts float32 tensors; the model is float64", comp)
		}
	default:
		p.add("transport.compression", "unknown compression %q (known: %s)", comp, strings.Join(compressions, ", "))
	}
	if c.Transport.Heartbeat <= 0 {
		p.add("transport.heartbeat", "must be positive, got %v", c.Transport.Heartbeat)
	}
	if c.Transport.PeerTimeout <= 0 {
		p.add("transport.peer_timeout", "must be positive, got %v", c.Transport.PeerTimeout)
	}
	if c.Checkpoint.Every < 0 {
		p.add("checkpoint.every", "must be 0 (off) or a number of steps, got %d", c.Checkpoint.Every)
	}
	if c.Checkpoint.Keep < 1 {
		p.add("checkpoint.keep", "must be at least 1, got %d", c.Checkpoint.Keep)
	}
	if c.Recovery.MaxRestarts < 0 {
		p.add("recovery.max_restarts", "must be 0 or more, got %d", c.Recovery.MaxRestarts)
	}
	if c.RunDirMode != "" && !slices.Contains(runDirModes, c.RunDirMode) {
		p.add("run_dir_mode", "unknown mode %q (known: %s)", c.RunDirMode, strings.Join(runDirModes, ", "))
	}
	c.validateAuth(p)
	c.validateReplicas(p)
	c.validatePS(p, model != nil && len(model.Tied) > 0)
	c.validateStages(p, model)
	c.validateInitFrom(p, model)
	if len(p.Items) > 0 {
		return p
	}
	return nil
}

// blasKernels are the values of compute.blas_kernels: auto, library and
// OpenBLAS's core types (which validation takes in any case, as
// OPENBLAS_CORETYPE does).
func blasKernels() []string { return append([]string{"auto", "library"}, cores.Names()...) }

// runDirModes are the values of run_dir_mode; "" means the first, private.
var runDirModes = []string{runlog.ModePrivate, runlog.ModeShared}

// compressions are the values of transport.compression; "" means the first,
// none.
var compressions = []string{"none", "fp16", "bf16"}

// maxScheduleUnits bounds stages × micro-batches × chunks: a step's schedule
// has two or three actions per unit.
const maxScheduleUnits = 1 << 20

// validateSchedule builds the configured schedule, or loads the user's from
// schedule_file, and checks it by simulation: a schedule that is incomplete,
// duplicates an action or deadlocks never starts a run.
func (c *Config) validateSchedule(p *Problems, model *models.Model) {
	if c.VirtualStages < 1 {
		p.add("virtual_stages", "must be at least 1, got %d", c.VirtualStages)
		return
	}
	custom := c.Schedule == "custom"
	if !custom && !slices.Contains(schedule.Names(), c.Schedule) {
		p.add("schedule", "unknown schedule %q (known: %s, custom)", c.Schedule, strings.Join(schedule.Names(), ", "))
		return
	}
	if custom != (c.ScheduleFile != "") {
		if custom {
			p.add("schedule_file", "schedule: custom needs schedule_file, a CSV, YAML or grid file of actions per stage")
		} else {
			p.add("schedule_file", "is only read with schedule: custom (schedule is %s)", c.Schedule)
		}
		return
	}
	if !custom {
		if msg := chunkRule(c.Schedule, c.VirtualStages); msg != "" {
			p.add("virtual_stages", "%s", msg)
			return
		}
	}
	placement := c.Placement()
	if placement == schedule.V && c.VirtualStages != 2 {
		p.add("virtual_stages", "a V-shaped schedule needs 2 chunks per stage (chunk 0 down the stages, chunk 1 back up), got %d", c.VirtualStages)
		return
	}
	if c.VirtualStages > 1 && len(c.Stages) < 2 {
		if placement == schedule.V {
			p.add("virtual_stages", "a V-shaped schedule needs at least 2 stages (it turns on the last), got %d", len(c.Stages))
		} else {
			p.add("virtual_stages", "chunks need at least 2 stages (the last stage feeds the first), got %d", len(c.Stages))
		}
		return
	}
	// Validation builds the whole schedule in memory: bound its size, so that a
	// stray digit in micro_batches or virtual_stages is an error, not gigabytes.
	stages, m, v := max(len(c.Stages), 1), max(c.Data.MicroBatches, 1), c.VirtualStages
	if v > maxScheduleUnits || stages > maxScheduleUnits/v || m > maxScheduleUnits/(stages*v) {
		p.add("schedule", "%d stages × %d micro-batches × %d chunks per stage is more than %d units of work per step", stages, m, v, maxScheduleUnits)
		return
	}
	sched, err := c.BuildSchedule()
	if err != nil {
		field := "schedule"
		if custom {
			field = "schedule_file"
		}
		p.add(field, "%v", err)
		return
	}
	if err := c.CheckScheduleRuns(sched, model); err != nil {
		p.add("schedule", "%v", err)
	}
}

// chunkRule says what is wrong with v chunks per stage for the built-in
// schedule name, or "" when they fit.
func chunkRule(name string, v int) string {
	switch {
	case (name == "interleaved" || name == "interleaved-zb") && v < 2:
		return fmt.Sprintf("the %s schedule needs at least 2 chunks per stage, got %d", name, v)
	case (name == "zb-v" || name == "dualpipev") && v != 2:
		return fmt.Sprintf("the %s schedule needs exactly 2 chunks per stage (each stage's layers listed as [chunk 0, chunk 1]), got %d", name, v)
	case name != "interleaved" && name != "interleaved-zb" && name != "zb-v" && name != "dualpipev" && v > 1:
		return fmt.Sprintf("%d chunks per stage need schedule: interleaved, interleaved-zb, zb-v or dualpipev (schedule is %s)", v, name)
	}
	return ""
}

// Placement returns where the run's schedule puts the chunks: the built-in
// schedule's placement, or the one schedule_file names (Loop when it names
// none, or cannot be read: validation reports that).
func (c *Config) Placement() schedule.Placement {
	if c.Schedule != "custom" {
		pl, _ := schedule.PlacementOf(c.Schedule)
		return pl
	}
	if c.ScheduleText != "" {
		pl, _ := schedule.GridPlacement(c.ScheduleText)
		return pl
	}
	if c.ScheduleFile == "" {
		return schedule.Loop
	}
	if l, err := schedule.ReadLowered(c.resolve(c.ScheduleFile)); err == nil {
		return l.Placement
	}
	return schedule.Loop
}

// Topology returns the run's stages, chunks per stage and placement.
func (c *Config) Topology() schedule.Topology {
	return schedule.Topology{Stages: len(c.Stages), Chunks: c.VirtualStages, Placement: c.Placement()}
}

// BuildSchedule returns the run's schedule, checked: the named one, or for
// schedule: custom the compute of the one in schedule_file (see BuildLowered).
func (c *Config) BuildSchedule() (*schedule.Schedule, error) {
	if c.Schedule != "custom" {
		return c.buildNamed()
	}
	l, err := c.BuildLowered()
	if err != nil {
		return nil, err
	}
	return l.Compute(), nil
}

// buildNamed builds the named schedule with the recomputation the stages ask
// for (stages[i].recompute: full).
func (c *Config) buildNamed() (*schedule.Schedule, error) {
	s, err := schedule.Build(c.Schedule, max(len(c.Stages), 1), max(c.Data.MicroBatches, 1), c.VirtualStages)
	if err != nil {
		return nil, err
	}
	return s.WithRecompute(func(stage, _ int) bool { return c.RecomputesFull(stage) }), nil
}

// BuildLowered returns the run's schedule lowered, as its stages execute it
// (schedule.Lower), and checked: the named one, or for schedule: custom the
// one in schedule_file, compute-only (then lowered) or lowered by hand (then
// checked as written, for deadlocks with the configured queue depth too),
// which must fit the config's stages, micro-batches and virtual stages.
func (c *Config) BuildLowered() (*schedule.Lowered, error) {
	p, m := max(len(c.Stages), 1), max(c.Data.MicroBatches, 1)
	if c.Schedule != "custom" {
		s, err := c.buildNamed()
		if err != nil {
			return nil, err
		}
		return schedule.Lower(s)
	}
	path := c.resolve(c.ScheduleFile)
	var l *schedule.Lowered
	var err error
	if c.ScheduleText != "" {
		if l, err = schedule.ParseLoweredGrid(c.ScheduleText); err == nil {
			err = l.Check()
		}
	} else {
		l, err = schedule.ReadLowered(path)
	}
	if err != nil {
		return nil, err
	}
	if l.Stages != p || l.MicroBatches != m || l.Chunks != c.VirtualStages {
		return nil, fmt.Errorf("%s has %d stages, %d micro-batches and %d chunks; the config has %d, %d and %d (virtual_stages)",
			path, l.Stages, l.MicroBatches, l.Chunks, p, m, c.VirtualStages)
	}
	// Links hold transport.queue_depth messages in each of their queues: a
	// hand-placed receive may need more room than that.
	if err := l.CheckDepth(c.Transport.QueueDepth); err != nil {
		return nil, fmt.Errorf("%s, with transport.queue_depth %d: %w", path, c.Transport.QueueDepth, err)
	}
	l.Name = "custom"
	return l, nil
}

// readScheduleFile keeps a custom schedule's contents, lowered, in
// ScheduleText when the config is loaded: the digest then covers the
// schedule itself, and BuildLowered never reads the file again, so a file
// edited after loading cannot change a running job. A file that cannot be
// read is left to BuildLowered (and so Validate) to report.
func (c *Config) readScheduleFile() {
	if c.Schedule != "custom" || c.ScheduleFile == "" {
		return
	}
	if l, err := schedule.ReadLowered(c.resolve(c.ScheduleFile)); err == nil {
		c.ScheduleText = l.Grid()
	}
}

func (c *Config) validateOptimizer(p *Problems, model *models.Model) {
	o := c.Train.Optimizer
	if !slices.Contains(optim.Names(), o.Name) {
		p.add("train.optimizer.name", "unknown optimizer %q (known: %s)", o.Name, strings.Join(optim.Names(), ", "))
	}
	switch o.Name {
	case "sgd":
		if o.Momentum < 0 || o.Momentum >= 1 {
			p.add("train.optimizer.momentum", "must be in [0, 1), got %v", o.Momentum)
		}
	case "adam", "adamw":
		if o.Beta1 < 0 || o.Beta1 >= 1 {
			p.add("train.optimizer.beta1", "must be in [0, 1), got %v", o.Beta1)
		}
		if o.Beta2 < 0 || o.Beta2 >= 1 {
			p.add("train.optimizer.beta2", "must be in [0, 1), got %v", o.Beta2)
		}
		if o.Eps <= 0 {
			p.add("train.optimizer.eps", "must be positive, got %v", o.Eps)
		}
	}
	if o.LR <= 0 {
		p.add("train.optimizer.lr", "must be positive, got %v", o.LR)
	}
	c.validateWeightDecay(p, model)
}

func (c *Config) validateStages(p *Problems, model *models.Model) {
	if len(c.Stages) == 0 {
		p.add("stages", "at least one stage is needed")
		return
	}
	// addrs maps every listen address to the field that claimed it first, so a
	// clash names both fields. Stage addresses are claimed first: a metrics
	// address that takes another stage's port is the one reported.
	addrs := map[string]string{}
	for i := range c.Stages {
		for r := range c.stageReplicas(i) {
			a, field := c.Address(i, r), c.addressField(i, r)
			if err := checkAddress(a); err != nil {
				p.add(field, "%v", err)
			} else if _, auto := AutoPort(a); auto {
				continue // the rendezvous gives it: hosts tell ranks apart
			} else if o, dup := addrs[a]; dup {
				p.add(field, "%s is also used by %s", a, o)
			} else {
				addrs[a] = field
			}
		}
	}
	for i, s := range c.Stages {
		field := fmt.Sprintf("stages[%d]", i)
		if err := CheckDevice(s.Device); err != nil {
			p.add(field+".device", "%v", err)
		}
		if s.MetricsAddress != "" {
			if err := checkAddress(s.MetricsAddress); err != nil {
				p.add(field+".metrics_address", "%v", err)
			} else if strings.HasPrefix(s.MetricsAddress, "unix:") {
				p.add(field+".metrics_address", "%s: metrics are served over HTTP; give host:port", s.MetricsAddress)
			} else if o, dup := addrs[s.MetricsAddress]; dup {
				p.add(field+".metrics_address", "%s is also used by %s", s.MetricsAddress, o)
			} else {
				addrs[s.MetricsAddress] = field + ".metrics_address"
			}
		}
		if s.CPUs != "" {
			c.validateCPUs(p, i)
		}
		c.validateRecompute(p, i, model)
		if c.VirtualStages >= 1 && len(s.Layers) != c.VirtualStages {
			p.add(field+".layers", "lists %d layer ranges; virtual_stages is %d, so give one range per chunk", len(s.Layers), c.VirtualStages)
		}
	}
	if len(p.Items) > 0 && c.VirtualStages >= 1 && !c.rangesPerChunk() {
		return
	}
	c.validateCoverage(p, model)
}

// validateRecompute checks stages[i].recompute: a known mode; full only
// where the schedule is built (a custom schedule says where to recompute
// with its own RF actions); selective only where a layer has internals to
// recompute.
func (c *Config) validateRecompute(p *Problems, i int, model *models.Model) {
	field, mode := fmt.Sprintf("stages[%d].recompute", i), c.Stages[i].Recompute
	switch {
	case mode == "" || mode == "none":
	case !slices.Contains(RecomputeModes, mode):
		p.add(field, "unknown mode %q (known: %s)", mode, strings.Join(RecomputeModes, ", "))
	case mode == "full" && c.Schedule == "custom":
		p.add(field, "full recomputation is added to a named schedule; a custom schedule recomputes where its own RF actions say (remove the key, or add RF actions)")
	case mode == "selective" && model != nil && !c.hasInternals(i, model):
		p.add(field, "selective recomputes attention's probabilities, and none of this stage's layers has attention (use full, or none)")
	}
}

// ValidateRecompute checks every stage's recompute key alone, as Validate
// does, for callers that set it after loading (simulate --recompute).
func (c *Config) ValidateRecompute(model *models.Model) error {
	var p Problems
	for i := range c.Stages {
		c.validateRecompute(&p, i, model)
	}
	if len(p.Items) == 0 {
		return nil
	}
	return &p
}

// hasInternals reports whether any layer of stage i can recompute its
// internals (models.RecomputingInternals).
func (c *Config) hasInternals(i int, model *models.Model) bool {
	for _, r := range c.Stages[i].Layers {
		first, last, err := ParseLayers(r)
		if err != nil || first < 0 || last >= len(model.Layers) {
			continue
		}
		for _, l := range model.Layers[first : last+1] {
			if _, ok := l.(models.RecomputingInternals); ok {
				return true
			}
		}
	}
	return false
}

func (c *Config) rangesPerChunk() bool {
	for _, s := range c.Stages {
		if len(s.Layers) != c.VirtualStages {
			return false
		}
	}
	return true
}

// validateCoverage walks the model stages in order (chunk 0 of every stage, then
// chunk 1, ..., chunk 1 from the last stage back under V placement) and checks
// they cover the model's layers once, in order.
func (c *Config) validateCoverage(p *Problems, model *models.Model) {
	// placed holds disjoint layer ranges and who holds them: ranges, not one
	// entry per layer, so that a range like "0-4000000000" costs no memory.
	type span struct{ first, last, stage, chunk int }
	var placed []span
	next := 0 // the layer the next model stage should start at
	order, layerOrder := "in order", "layer order"
	if c.Placement() == schedule.V {
		order = "in V order: stage s's chunk 0 is model stage s and its chunk 1 model stage 2p-1-s"
		layerOrder = "layer order, in V order: stage s's chunk 0 is model stage s and its chunk 1 model stage 2p-1-s"
	}
	top := c.Topology()
	for k := 0; k < len(c.Stages)*c.VirtualStages; k++ {
		i, ch := top.Locate(k)
		field := c.layersField(i, ch)
		first, last, err := ParseLayers(c.Stages[i].Layers[ch])
		if err != nil {
			p.add(field, "%v", err)
			continue
		}
		text := c.Stages[i].Layers[ch]
		if model != nil && last >= len(model.Layers) {
			p.add(field, "%q reaches layer %d but model %s has layers 0-%d", text, last, c.Model.Name, len(model.Layers)-1)
		}
		// The first layer of first-last already placed, if any, is reported;
		// the layers before it are placed here.
		overlap := false
		var o span
		for _, s := range placed {
			if s.first <= last && s.last >= first && (!overlap || max(first, s.first) < max(first, o.first)) {
				o, overlap = s, true
			}
		}
		end := last
		if overlap {
			l := max(first, o.first)
			p.add(field, "layer %d is already placed on %s (%s)", l, c.placeName(o.stage, o.chunk), c.Stages[o.stage].Layers[o.chunk])
			end = l - 1
		}
		if end >= first {
			placed = append(placed, span{first, end, i, ch})
		}
		if first > next && (model == nil || first < len(model.Layers)) {
			p.add(field, "%s on no stage (stages must cover the model %s)", layersText(next, first-1), order)
		} else if first < next && !overlap {
			p.add(field, "%q starts before the previous model stage ends; stages must be in %s", text, layerOrder)
		}
		next = max(next, last+1)
	}
	if model != nil && next < len(model.Layers) {
		p.add("stages", "%s of model %s on no stage", layersText(next, len(model.Layers)-1), c.Model.Name)
	}
}

func (c *Config) layersField(stage, chunk int) string {
	if c.VirtualStages == 1 {
		return fmt.Sprintf("stages[%d].layers", stage)
	}
	return fmt.Sprintf("stages[%d].layers[%d]", stage, chunk)
}

func (c *Config) placeName(stage, chunk int) string {
	if c.VirtualStages == 1 {
		return fmt.Sprintf("stages[%d]", stage)
	}
	return fmt.Sprintf("stages[%d] chunk %d", stage, chunk)
}

// layersText names an inclusive layer range for messages: "layer 3", "layers 1-2".
func layersText(a, b int) string {
	if a == b {
		return "layer " + strconv.Itoa(a)
	}
	return fmt.Sprintf("layers %d-%d", a, b)
}

// ParseLayers parses "first-last" (inclusive) or "n" into an inclusive range.
func ParseLayers(s string) (first, last int, err error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, 0, errors.New(`missing; write a range like "0-2" or a single layer like "3"`)
	}
	a, b, isRange := strings.Cut(s, "-")
	if first, err = strconv.Atoi(strings.TrimSpace(a)); err != nil {
		return 0, 0, fmt.Errorf("%q is not a layer range like \"0-2\" or \"3\"", s)
	}
	last = first
	if isRange {
		if last, err = strconv.Atoi(strings.TrimSpace(b)); err != nil {
			return 0, 0, fmt.Errorf("%q is not a layer range like \"0-2\" or \"3\"", s)
		}
	}
	if first < 0 || last < first {
		return 0, 0, fmt.Errorf("%q is empty or negative; write first-last with first <= last", s)
	}
	return first, last, nil
}

func checkAddress(a string) error {
	if port, ok := AutoPort(a); ok {
		if port < 0 {
			return fmt.Errorf("%q: write auto, or auto:PORT with a port in 1-65535", a)
		}
		return nil
	}
	if a == "" {
		return errors.New("missing; write host:port such as 127.0.0.1:7101, or unix:PATH for a socket file")
	}
	if path, ok := strings.CutPrefix(a, "unix:"); ok {
		if path == "" {
			return fmt.Errorf("%q: give the socket file's path after unix:", a)
		}
		return nil
	}
	host, port, err := net.SplitHostPort(a)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %v", a, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%q: port %q is not in 1-65535", a, port)
	}
	if host == "" {
		return fmt.Errorf("%q: host is empty; name the interface to listen on, e.g. 127.0.0.1", a)
	}
	return nil
}

// CheckDevice accepts the devices this build can run on: "" (cpu) or a
// kind registered with package compute, with an optional ":N" index.
func CheckDevice(d string) error {
	_, _, err := compute.Lookup(d)
	return err
}

// ChunkLayers returns the layers of a stage's chunk as a half-open range [first, last).
func (c *Config) ChunkLayers(stage, chunk int) (first, last int) {
	f, l, _ := ParseLayers(c.Stages[stage].Layers[chunk])
	return f, l + 1
}

// ModelStages is the number of pieces the model is cut into: stages times chunks.
func (c *Config) ModelStages() int { return len(c.Stages) * c.VirtualStages }

// Place returns the stage and chunk that hold model stage k.
func (c *Config) Place(k int) (stage, chunk int) { return c.Topology().Locate(k) }

// LossStage returns the stage that holds the model's last layers and
// computes the loss: the last stage, or stage 0 under a V placement.
func (c *Config) LossStage() int { return c.Topology().LossStage() }

// MicroBatchSize is the number of examples in one micro-batch: a replica's
// share of the batch, cut into micro_batches.
func (c *Config) MicroBatchSize() int { return c.Data.BatchSize / c.Replicas() / c.Data.MicroBatches }

// Digest identifies everything that must agree between the stages of one run.
func (c *Config) Digest() string {
	b, err := json.Marshal(c)
	if err != nil {
		panic(err) // Config holds only plain values
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
