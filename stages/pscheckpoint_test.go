package stages

import (
	"context"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
)

// serveFor runs c's parameter servers as ServePS does, on free loopback
// ports written into c, checkpointing into dir (and resuming from it with
// resume); the returned wait gives each server's error once it ends.
func serveFor(t *testing.T, c *configs.Config, dir string, resume bool, log io.Writer) (wait func() []error) {
	t.Helper()
	c.ParameterServers.Addresses = nil
	for range c.ParameterServers.Count {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		c.ParameterServers.Addresses = append(c.ParameterServers.Addresses, l.Addr().String())
		l.Close()
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	errs := make([]error, c.ParameterServers.Count)
	var wg sync.WaitGroup
	for i := range errs {
		wg.Go(func() { errs[i] = ServePS(ctx, c, i, dir, resume, log) })
	}
	return func() []error {
		wg.Wait()
		cancel()
		return errs
	}
}

// trainWithServers runs c's workers and servers in dir to the end.
func trainWithServers(t *testing.T, c *configs.Config, dir string, resume bool) string {
	t.Helper()
	var log syncLog
	wait := serveFor(t, c, dir, resume, &log)
	_, errs := runPSGridIn(t, c, dir, resume, func(int, int, *Runtime, func()) {})
	for w := range errs {
		for i, err := range errs[w] {
			if err != nil {
				t.Errorf("worker %d stage %d: %v", w, i, err)
			}
		}
	}
	for i, err := range wait() {
		if err != nil {
			t.Errorf("server %d: %v", i, err)
		}
	}
	if t.Failed() {
		t.Fatalf("servers' log:\n%s", log.String())
	}
	return log.String()
}

// syncLog is a log several servers write at once.
type syncLog struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestServersResumeFromTheirCheckpoint: 2 servers and 3 workers of a
// 2-stage pipeline (Adam; sync, and async with max_staleness 0) checkpoint
// every 2 steps; a run stopped after step 4 and resumed to step 6, servers
// from their parts and stages from theirs, ends with the losses and
// weights of the run never stopped, bit for bit. Each checkpoint lists
// both servers' parts.
func TestServersResumeFromTheirCheckpoint(t *testing.T) {
	for _, mode := range []string{"sync", "async"} {
		t.Run(mode, func(t *testing.T) {
			c := psConfig(3, 2, "adam")
			c.ParameterServers.Mode = mode
			c.Checkpoint.Every = 2
			full := t.TempDir()
			trainWithServers(t, c, full, false)
			m, _, err := checkpoint.Latest(CheckpointDir(full), c.TrainingDigest())
			if err != nil || m == nil || m.Step != 6 || m.Servers != 2 || len(m.ServerParts) != 2 {
				t.Fatalf("the full run's newest checkpoint: %+v, %v; want step 6 with both servers' parts", m, err)
			}

			dir := t.TempDir()
			first := *c
			first.Train.Steps = 4
			trainWithServers(t, &first, dir, false)
			if _, err := os.Stat(checkpoint.StepDir(CheckpointDir(dir), 6)); !os.IsNotExist(err) {
				t.Fatalf("a run of 4 steps wrote a checkpoint of step 6: %v", err)
			}
			log := trainWithServers(t, c, dir, true)
			for _, want := range []string{"parameter server 0: resumed from the checkpoint of step 4", "parameter server 1: resumed from the checkpoint of step 4", "stage 1: 6 updates"} {
				if !strings.Contains(log, want) {
					t.Errorf("the servers' log lacks %q:\n%s", want, log)
				}
			}
			sameLosses(t, full, dir)
			sameWeights(t, full, dir)
		})
	}
}
