package netns

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/internal/testenv"
)

// helperEnv makes the test binary, started on a host, act as a tiny server
// or client instead of running the tests: "serve ADDR" accepts connections
// on ADDR and writes the host name to each; "dial ADDR TIMEOUT" connects and
// prints what it reads, exiting 1 if it cannot.
const helperEnv = "NETNS_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "serve":
		l, err := net.Listen("tcp", os.Args[1])
		if err != nil {
			fmt.Println("listen:", err)
			os.Exit(1)
		}
		fmt.Println("listening")
		name, _ := os.Hostname()
		for {
			c, err := l.Accept()
			if err != nil {
				os.Exit(1)
			}
			io.WriteString(c, name+"\n")
			c.Close()
		}
	case "dial":
		timeout, _ := time.ParseDuration(os.Args[2])
		c, err := net.DialTimeout("tcp", os.Args[1], timeout)
		if err != nil {
			fmt.Println("dial:", err)
			os.Exit(1)
		}
		c.SetDeadline(time.Now().Add(timeout))
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			fmt.Println("read:", err)
			os.Exit(1)
		}
		fmt.Print(line)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// network makes n hosts, skipping where it cannot, and closes them (and
// checks that nothing is left) when the test ends.
func network(t *testing.T, n int) *Network {
	t.Helper()
	if why := Available(); why != "" {
		testenv.RequireOrSkip(t, Needs, why)
	}
	nw, err := New(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := nw.Close(); err != nil {
			t.Error(err)
		}
		if left := leftovers(t, nw.name); len(left) > 0 {
			t.Errorf("namespaces left after Close: %v", left)
		}
	})
	return nw
}

// leftovers lists the namespaces whose names start with name.
func leftovers(t *testing.T, name string) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").Output()
	if err != nil {
		t.Fatal(err)
	}
	var left []string
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], name+"-") {
			left = append(left, f[0])
		}
	}
	return left
}

// serve starts the helper server on h at port and waits until it listens.
func serve(t *testing.T, h *Host, port int) {
	t.Helper()
	cmd := h.Command(nil, os.Args[0], fmt.Sprintf("%s:%d", h.Addr, port))
	cmd.Env = append(os.Environ(), helperEnv+"=serve")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, _ := bufio.NewReader(out).ReadString('\n')
	if line != "listening\n" {
		t.Fatalf("server on %s: %q", h.Name, line)
	}
}

// dial runs the helper client on h against addr: what it printed and
// whether it connected.
func dial(t *testing.T, h *Host, mounts []Mount, addr string, timeout time.Duration) (string, bool) {
	t.Helper()
	cmd := h.Command(mounts, os.Args[0], addr, timeout.String())
	cmd.Env = append(os.Environ(), helperEnv+"=dial")
	out, err := cmd.CombinedOutput()
	if _, exit := err.(*exec.ExitError); err != nil && !exit {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(out)), err == nil
}

func TestHostsReachEachOther(t *testing.T) {
	nw := network(t, 3)
	hs := nw.Hosts()
	if len(hs) != 3 || hs[0].Addr == hs[1].Addr || hs[0].Name == hs[1].Name {
		t.Fatalf("hosts: %+v %+v", hs[0], hs[1])
	}
	hs[1].Hostname = "node-b"
	serve(t, hs[1], 7000)
	for _, from := range []*Host{hs[0], hs[2], hs[1]} {
		got, ok := dial(t, from, nil, hs[1].Addr+":7000", 5*time.Second)
		if !ok || got != "node-b" {
			t.Errorf("%s -> %s: %q (connected: %v), want node-b", from.Hostname, hs[1].Addr, got, ok)
		}
	}
	// Each host has its own loopback: host 1's server is not on host 0's.
	if got, ok := dial(t, hs[0], nil, "127.0.0.1:7000", time.Second); ok {
		t.Errorf("host 0 reached host 1's port on its own loopback: %q", got)
	}
	// And the host's name, and its single address beyond loopback.
	out, err := hs[2].Command(nil, "sh", "-c", "hostname; ip -4 -o addr show dev eth0").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "host2\n") || !strings.Contains(string(out), " "+hs[2].Addr+"/24 ") {
		t.Errorf("host 2: %v\n%s", err, out)
	}
}

func TestMountIsPrivateToItsHost(t *testing.T) {
	nw := network(t, 2)
	hs := nw.Hosts()
	dir := t.TempDir()
	// The same path on both hosts, missing on the machine: each host sees
	// its own backing folder there and nothing is made on the machine.
	target := filepath.Join(dir, "shared", "run")
	// A file over /etc/hosts, so the name "peer" resolves on host 0 only.
	hosts := filepath.Join(dir, "hosts")
	if err := os.WriteFile(hosts, []byte("127.0.0.1 localhost\n"+hs[1].Addr+" peer\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A target in a folder of the machine (/etc) that must not be made there.
	etc := fmt.Sprintf("/etc/netns-test-%d/conf", os.Getpid())
	conf := filepath.Join(dir, "conf")
	os.WriteFile(conf, []byte("setting\n"), 0o644)
	// And one through a symbolic link (/var/run is /run on Debian).
	secret := fmt.Sprintf("/var/run/netns-test-%d/secret/token", os.Getpid())
	token := filepath.Join(dir, "token")
	os.WriteFile(token, []byte("t0ken\n"), 0o600)
	var backing []string
	for i, h := range hs {
		b := filepath.Join(dir, fmt.Sprint("backing", i))
		if err := os.Mkdir(b, 0o755); err != nil {
			t.Fatal(err)
		}
		backing = append(backing, b)
		mounts := []Mount{{Source: b, Target: target}, {Source: conf, Target: etc, ReadOnly: true}, {Source: token, Target: secret}}
		if i == 0 {
			mounts = append(mounts, Mount{Source: hosts, Target: "/etc/hosts", ReadOnly: true})
		}
		script := fmt.Sprintf(`echo %d > %s/written && ls %s && cat %s %s && ! (echo x > %s) 2>/dev/null && getent hosts peer || true`, i, target, target, etc, secret, etc)
		out, err := h.Command(mounts, "sh", "-c", script).CombinedOutput()
		if err != nil {
			t.Fatalf("host %d: %v\n%s", i, err, out)
		}
		want := "written\nsetting\nt0ken\n"
		if i == 0 {
			want += hs[1].Addr + " peer\n"
		}
		if got := strings.Join(strings.Fields(string(out)), " "); got != strings.Join(strings.Fields(want), " ") {
			t.Errorf("host %d saw %q, want %q", i, out, want)
		}
	}
	for i, b := range backing {
		got, err := os.ReadFile(filepath.Join(b, "written"))
		if err != nil || string(got) != fmt.Sprintf("%d\n", i) {
			t.Errorf("backing folder of host %d holds %q (%v)", i, got, err)
		}
	}
	for _, p := range []string{filepath.Join(dir, "shared"), filepath.Dir(etc), filepath.Dir(filepath.Dir(secret))} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s was made on the machine (%v)", p, err)
			os.RemoveAll(p)
		}
	}
	if b, _ := os.ReadFile("/etc/hosts"); bytes.Contains(b, []byte(" peer\n")) {
		t.Error("the machine's /etc/hosts changed")
	}
	// A target with nothing of it below / is refused at Start.
	if err := hs[0].Command([]Mount{{Source: dir, Target: "/no-such-netns-test-dir/x"}}, "true").Run(); err == nil || !strings.Contains(err.Error(), "below /") {
		t.Errorf("a target under a missing top folder: %v", err)
	}
}

func TestCutAndRestore(t *testing.T) {
	nw := network(t, 2)
	hs := nw.Hosts()
	serve(t, hs[1], 7001)
	addr := hs[1].Addr + ":7001"
	if got, ok := dial(t, hs[0], nil, addr, 5*time.Second); !ok {
		t.Fatalf("before Cut: %s", got)
	}
	if err := hs[1].Cut(); err != nil {
		t.Fatal(err)
	}
	if got, ok := dial(t, hs[0], nil, addr, time.Second); ok {
		t.Errorf("connected to a host whose cable is cut: %q", got)
	}
	if err := hs[1].Restore(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, ok := dial(t, hs[0], nil, addr, 2*time.Second)
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connection 10s after Restore: %s", got)
		}
	}
}

func TestKillingTheCommandKillsTheProgram(t *testing.T) {
	nw := network(t, 1)
	cmd := nw.Hosts()[0].Command(nil, "sleep", "1000")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// ip, unshare and sh exec in turn, so the process becomes sleep.
	deadline := time.Now().Add(10 * time.Second)
	for comm(cmd.Process.Pid) != "sleep" {
		if time.Now().After(deadline) {
			t.Fatalf("pid %d is %q, never sleep", cmd.Process.Pid, comm(cmd.Process.Pid))
		}
		time.Sleep(5 * time.Millisecond)
	}
	cmd.Process.Kill()
	if err := cmd.Wait(); err == nil || !strings.Contains(err.Error(), "killed") {
		t.Errorf("sleep ended with %v, want killed", err)
	}
}

func comm(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
	return strings.TrimSpace(string(b))
}

func TestCloseKillsEverythingAndLeavesNothing(t *testing.T) {
	if why := Available(); why != "" {
		testenv.RequireOrSkip(t, Needs, why)
	}
	nw, err := New(2)
	if err != nil {
		t.Fatal(err)
	}
	var cmds []*exec.Cmd
	for _, h := range nw.Hosts() {
		// A program that started one of its own in the background.
		cmd := h.Command(nil, "sh", "-c", "sleep 1000 & echo $!; exec sleep 1000")
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, _ := bufio.NewReader(out).ReadString('\n')
		var child int
		fmt.Sscan(line, &child)
		if child == 0 {
			t.Fatalf("no background pid: %q", line)
		}
		cmds = append(cmds, cmd)
		t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
		defer func() {
			// The background sleep is not the test's child: once killed,
			// init reaps it.
			for range 200 {
				if st := procState(child); st == "" || st == "Z" {
					return
				}
				time.Sleep(10 * time.Millisecond)
			}
			t.Errorf("background process %d survived Close (state %s)", child, procState(child))
		}()
	}
	start := time.Now()
	if err := nw.Close(); err != nil {
		t.Fatal(err)
	}
	for i, cmd := range cmds {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("host %d's program exited cleanly; want killed", i)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("host %d's program still running after Close", i)
		}
	}
	t.Logf("Close took %v", time.Since(start))
	if left := leftovers(t, nw.name); len(left) > 0 {
		t.Errorf("namespaces left: %v", left)
	}
	if _, err := os.Stat(nw.dir); !os.IsNotExist(err) {
		t.Errorf("scratch folder %s left (%v)", nw.dir, err)
	}
	if err := nw.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := nw.Hosts()[0].Command(nil, "true").Run(); err == nil {
		t.Error("a command ran on a closed network")
	}
}

// procState is the state letter of pid ("R", "S", "Z", ...), "" if gone.
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	if i := strings.LastIndex(s, ")"); i >= 0 && i+2 < len(s) {
		return s[i+2 : i+3]
	}
	return "?"
}

func TestNewRefusesBadSizes(t *testing.T) {
	for _, n := range []int{0, -1, 254} {
		if _, err := New(n); err == nil {
			t.Errorf("New(%d) succeeded", n)
		}
	}
}
