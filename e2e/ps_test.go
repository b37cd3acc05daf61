package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

// TestParameterServersEqualReference launches 2 parameter servers and 3
// workers of a 2-stage pipeline as 8 processes over gRPC, in sync mode and
// in async mode with max_staleness 0, and requires every step's loss, the
// final weights and the test evaluation to equal the one-process
// reference's bit for bit.
func TestParameterServersEqualReference(t *testing.T) {
	needData(t)
	for _, mode := range []string{"sync", "async"} {
		t.Run(mode, func(t *testing.T) {
			ports := freePorts(t, 2)
			body := `model: {name: mlp, dtype: float32, input: 784, hidden: [256, 128, 64], classes: 10}
data: {batch_size: 192, micro_batches: 2}
train: {steps: 20, evaluate: true, optimizer: {name: adam, lr: 0.001}}
schedule: 1f1b
checkpoint: {every: 0}
` + fmt.Sprintf("parameter_servers: {count: 2, mode: %s, addresses: [%s]}", mode, strings.Join(ports, ", "))
			cfg := gridConfig(t, body, []string{`"0-1"`, `"2-3"`}, 3)
			ref := reference(t, cfg)
			dir := t.TempDir()
			res := run(t, 3*time.Minute, nil, "launch", "--config", cfg, "--run-dir", dir)
			if res.err != nil {
				t.Fatalf("launch: %v\n%s", res.err, res.out)
			}
			for i := range 2 {
				if !strings.Contains(res.out, fmt.Sprintf("[ps %d] parameter server %d: done", i, i)) {
					t.Errorf("server %d did not finish:\n%s", i, res.out)
				}
			}
			if !strings.Contains(res.out, "stage 1: 20 updates, 0 pushes dropped") {
				t.Errorf("no server made stage 1's 20 updates:\n%s", res.out)
			}
			sameRun(t, ref, dir, 20)
			sameEval(t, ref, dir)
			if t.Failed() {
				os.WriteFile(dir+"/launch.out", []byte(res.out), 0o644)
			}
		})
	}
}
