package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/internal/netns"
	"github.com/pipetrain/pipetrain/internal/testenv"
)

// TestHierarchicalAcrossHostsEqualsReference launches a 1 × 4 grid in
// separate processes with all_reduce.algorithm hierarchical, replicas 0-1
// listening on 127.0.0.1 and 2-3 on 127.0.0.2 (two hosts by their
// addresses), over each all_reduce.transport, and requires every step's
// loss and the final weights to equal the one-process reference's bit for
// bit.
func TestHierarchicalAcrossHostsEqualsReference(t *testing.T) {
	needData(t)
	for _, tr := range []string{"stream", "grpc"} {
		t.Run(tr, func(t *testing.T) {
			body := strings.Replace(gridMLP, "check_every: 10}", "check_every: 10, algorithm: hierarchical, transport: "+tr+"}", 1) + "\nschedule: 1f1b"
			cfg := gridConfig(t, body, []string{`"0-3"`}, 4)
			text, err := os.ReadFile(cfg)
			if err != nil {
				t.Fatal(err)
			}
			// The last two addresses move to the second loopback host.
			line := string(text)[strings.Index(string(text), "addresses: [")+len("addresses: ["):]
			addrs := strings.Split(line[:strings.Index(line, "]")], ", ")
			moved := string(text)
			for _, a := range addrs[2:] {
				moved = strings.Replace(moved, a, strings.Replace(a, "127.0.0.1:", "127.0.0.2:", 1), 1)
			}
			if strings.Count(moved, "127.0.0.2:") != 2 {
				t.Fatalf("replicas 2-3 not moved to 127.0.0.2:\n%s", moved)
			}
			if err := os.WriteFile(cfg, []byte(moved), 0o644); err != nil {
				t.Fatal(err)
			}
			refDir, gridDir := t.TempDir(), t.TempDir()
			if r := run(t, 3*time.Minute, nil, "reference", "--pipeline-threads", "--config", cfg, "--run-dir", refDir); r.err != nil {
				t.Fatalf("reference: %v\n%s", r.err, r.out)
			}
			res := run(t, 3*time.Minute, nil, "launch", "--config", cfg, "--run-dir", gridDir)
			if res.err != nil {
				t.Fatalf("launch: %v\n%s", res.err, res.out)
			}
			for r := range 4 {
				if !strings.Contains(res.out, fmt.Sprintf("[stage 0 replica %d] stage 0", r)) {
					t.Errorf("replica %d did not run:\n%s", r, res.out)
				}
			}
			got := sameRun(t, refDir, gridDir, 30)
			if !(got[29].Loss < got[0].Loss) {
				t.Errorf("loss did not fall: %v -> %v", got[0].Loss, got[29].Loss)
			}
		})
	}
}

// TestHierarchicalOnNamespaceHostsEqualsReference runs the same 1 × 4 grid
// with all_reduce.algorithm hierarchical on two hosts (network namespaces
// on one switch, internal/netns), replicas 0-1 on host 0 and 2-3 on host 1,
// the token on, over ring streams: within a host on the listeners' Unix
// stream sockets, from host to host over TCP through the switch. Every
// step's loss and the final weights equal the reference's bit for bit.
func TestHierarchicalOnNamespaceHostsEqualsReference(t *testing.T) {
	needData(t)
	if why := netns.Available(); why != "" {
		testenv.RequireOrSkip(t, netns.Needs, why)
	}
	nw, err := netns.New(2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nw.Close() })
	hosts := nw.Hosts()
	var addrs []string
	for _, h := range hosts {
		for _, port := range []string{"7601", "7602"} {
			addrs = append(addrs, h.Addr+":"+port)
		}
	}
	body := strings.Replace(gridMLP, "check_every: 10}", "check_every: 10, algorithm: hierarchical}", 1) +
		"\nschedule: 1f1b\ncompute: {blas_threads: 1}\ntransport: {token: hierarchical-hosts-secret}\ndata_parallel: 4\nstages:\n" +
		"  - {layers: \"0-3\", addresses: [" + strings.Join(addrs, ", ") + "]}\n"
	tmp := t.TempDir()
	cfg := filepath.Join(tmp, "hosts.yaml")
	if err := os.WriteFile(cfg, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	refDir := reference(t, cfg)
	runDir := filepath.Join(tmp, "run") // one folder: the namespaces share the disk
	procs := make([]rankProc, len(addrs))
	for r := len(addrs) - 1; r >= 0; r-- {
		cmd := hosts[r/2].Command(nil, binary, "stage", "--config", cfg, "--stage", "0", "--replica", strconv.Itoa(r), "--run-dir", runDir)
		cmd.Env = append(hostBLASEnv(), "PATH=/usr/bin:/bin")
		out, done := startCmd(t, cmd)
		procs[r] = rankProc{rank: r, pid: cmd.Process.Pid, out: out, done: done}
	}
	for i, err := range awaitRanks(t, procs, 3*time.Minute) {
		if err != nil {
			t.Fatalf("replica %d: %v\n%s", i, err, procs[i].out.String())
		}
	}
	got := sameRun(t, refDir, runDir, 30)
	if !(got[29].Loss < got[0].Loss) {
		t.Errorf("loss did not fall: %v -> %v", got[0].Loss, got[29].Loss)
	}
}
