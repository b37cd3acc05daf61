package stages

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/internal/blas"
)

// TestStagesShareTheScheduler: stages on one host get Go's scheduler sized to
// their share of its cores, a pinned stage to its CPUs, a stage alone on its
// host the whole machine; GOMAXPROCS in the environment wins.
func TestStagesShareTheScheduler(t *testing.T) {
	cfg, err := configs.Load("../configs/fmnist-mlp-4stage.yaml")
	if err != nil {
		t.Fatal(err)
	}
	n := runtime.NumCPU()
	if got, want := schedulerProcs(cfg, 1, "", n), max(1, n/len(cfg.Stages)); got != want {
		t.Errorf("stage 1 of %d on one host, %d cores: %d procs, want %d", len(cfg.Stages), n, got, want)
	}
	if got := schedulerProcs(cfg, 1, "", 1); got != 1 {
		t.Errorf("a process with 1 proc got %d", got)
	}
	if got := schedulerProcs(cfg, 1, "3", 3); got != 3 {
		t.Errorf("GOMAXPROCS=3 in the environment gave %d procs", got)
	}
	alone := *cfg
	alone.Stages = append([]configs.Stage(nil), cfg.Stages...)
	alone.Stages[2].Address = "10.0.0.9:7000"
	if got := schedulerProcs(&alone, 2, "", n); got != n {
		t.Errorf("stage alone on its host: %d procs, want all %d", got, n)
	}
	alone.Stages[3].CPUs = "0"
	if got := schedulerProcs(&alone, 3, "", n); got != 1 {
		t.Errorf("stage pinned to CPU 0: %d procs, want 1", got)
	}
}

// TestRunProcessEqualsReference: two stage processes run by RunProcess in
// this one, over gRPC links on loopback, train what the one-process
// reference trains, bit for bit; each hands its runtime to Started before it
// runs, and Failed is not called.
func TestRunProcessEqualsReference(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0)) // RunProcess lowers it for the process
	var src strings.Builder
	for i := 0; src.Len() < 6000; i++ {
		fmt.Fprintf(&src, "func f%d(x int) int { return x * %d }\n", i%37, i%11)
	}
	corpus := filepath.Join(t.TempDir(), "corpus.txt")
	if err := os.WriteFile(corpus, []byte(src.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	text, err := data.NewText([]byte(src.String()), data.ByteTokenizer{}, 0.2)
	if err != nil {
		t.Fatal(err)
	}
	cfg := gptConfig("1f1b", plain("0-1", "2-4"), false)
	cfg.Data.Corpus = corpus
	for i := range cfg.Stages {
		cfg.Stages[i].Address = freeAddress(t)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}

	ref := t.TempDir()
	rt, err := New(Options{Config: cfg, Reference: true, RunDir: ref, Text: text})
	if err != nil {
		t.Fatal(err)
	}
	if err := rt.Run(context.Background()); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	errs := make([]error, len(cfg.Stages))
	logs := make([]bytes.Buffer, len(cfg.Stages))
	started := make([]*Runtime, len(cfg.Stages))
	var wg sync.WaitGroup
	for i := range cfg.Stages {
		wg.Go(func() {
			errs[i] = RunProcess(ctx, ProcessOptions{Config: cfg, Stage: i, RunDir: dir, Log: &logs[i],
				Started: func(rt *Runtime) { started[i] = rt },
				Failed:  func(*Runtime) { errs[i] = errors.New("Failed was called") },
			})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("stage %d: %v\n%s", i, err, logs[i].String())
		}
		if started[i] == nil || started[i].Activity().Stage != i {
			t.Errorf("stage %d: Started had %v", i, started[i])
		}
	}
	if !strings.Contains(logs[1].String(), "loss") {
		t.Errorf("stage 1 logged no loss to its Log:\n%s", logs[1].String())
	}
	sameRun(t, ref, dir)
}

// TestRunProcessNamesAStageOffTheGrid: a stage or replica the config does
// not have is refused before anything is bound.
func TestRunProcessNamesAStageOffTheGrid(t *testing.T) {
	cfg := gptConfig("1f1b", plain("0-1", "2-4"), false)
	cfg.Path = "run.yaml"
	for _, o := range []ProcessOptions{{Config: cfg, Stage: 2}, {Config: cfg, Stage: -1}, {Config: cfg, Replica: 1}} {
		err := RunProcess(context.Background(), o)
		if err == nil || !strings.Contains(err.Error(), "run.yaml has ") {
			t.Errorf("stage %d replica %d: %v", o.Stage, o.Replica, err)
		}
	}
}

// freeAddress is a loopback address with a port free a moment ago.
func freeAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestNewLeavesProcessThreads: building Runtimes, a reference's among them,
// keeps the BLAS and kernel threads the process was given, whatever their
// configs say: only SetProcessThreads sets them.
func TestNewLeavesProcessThreads(t *testing.T) {
	defer SetProcessThreads(max(1, blas.Threads()))
	SetProcessThreads(3)
	want := blas.Threads() // 0 with gonum's kernels, which have no threads
	c := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "sgd")
	c.Compute.BLASThreads = 1
	silent, _ := secondStage(t, c, t.TempDir())
	defer silent.Close()
	if _, err := New(Options{Config: c, Reference: true, RunDir: t.TempDir(), Threads: 2, Train: synthetic(96, 8, 3, 1), Test: synthetic(30, 8, 3, 2)}); err != nil {
		t.Fatal(err)
	}
	if got := engine.Workers(); got != 3 {
		t.Errorf("engine workers %d after New, want the process's 3", got)
	}
	if got := blas.Threads(); got != want {
		t.Errorf("BLAS threads %d after New, want the process's %d", got, want)
	}
}
