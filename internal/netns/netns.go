// Package netns makes hosts for tests out of Linux network namespaces: n
// hosts on one private switch, each with its own IPv4 address, its own host
// name and, for every program started on it, a mount namespace of its own in
// which folders and files of the caller are bound over paths (a private run
// directory, a hosts file over /etc/hosts). A test can then start the ranks
// of a job "on different machines" on one machine, pull a host's cable, and
// read what each host wrote.
//
// Nothing in the root network namespace is touched: the switch is a bridge in
// a namespace of its own, the hosts' cables are veth pairs between it and
// them, and the addresses (10.231.X.1, 10.231.X.2, ...) are reachable only
// from the hosts, never from the test process itself, which talks to the
// hosts through the files it binds into them and the programs' output.
//
// It needs root, iproute2 (ip), util-linux (unshare, mount) and a kernel with
// network namespaces, veth and bridges; Available says what is missing.
//
// Ownership: New's caller owns the Network and must Close it (t.Cleanup).
// Command returns an unstarted *exec.Cmd that its caller starts and waits for,
// in whatever goroutine it likes; Close kills every process still on a host
// (those started by Command and anything they started) but waits for none of
// them: a goroutine blocked in cmd.Wait returns with the kill. The package
// starts no goroutines of its own. Network and Host methods may be called
// from several goroutines at once (Host.Hostname is a plain field: set it
// before starting commands on the host).
package netns

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// prefix starts the name of every namespace the package makes, followed by
// the process id and a counter: "ptns1234-1-h0".
const prefix = "ptns"

// counter numbers the networks of this process.
var counter atomic.Int64

var (
	availableOnce   sync.Once
	availableReason string
)

// Needs names what making hosts takes, for a test that says what it lacks.
const Needs = "network namespaces (root, Debian packages iproute2 and util-linux)"

// Available reports why hosts cannot be made here, "" when they can: not
// root, a tool missing, or the kernel refusing a namespace, a bridge or a
// veth pair. It tries once per process (making and deleting one namespace).
func Available() string {
	availableOnce.Do(func() { availableReason = probe() })
	return availableReason
}

func probe() string {
	if os.Geteuid() != 0 {
		return "network namespaces need root"
	}
	for _, tool := range []string{"ip", "unshare", "mount", "sh"} {
		if _, err := exec.LookPath(tool); err != nil {
			return fmt.Sprintf("%s not found (iproute2, util-linux)", tool)
		}
	}
	name := fmt.Sprintf("%s%d-probe", prefix, os.Getpid())
	if err := ip("netns", "add", name); err != nil {
		return "cannot make a network namespace: " + err.Error()
	}
	defer ip("netns", "del", name)
	if err := ip("-n", name, "link", "add", "name", "br0", "type", "bridge"); err != nil {
		return "cannot make a bridge in a network namespace: " + err.Error()
	}
	if err := ip("-n", name, "link", "add", "name", "a", "type", "veth", "peer", "name", "b"); err != nil {
		return "cannot make a veth pair in a network namespace: " + err.Error()
	}
	return ""
}

// Network is a switch and the hosts cabled to it.
type Network struct {
	name   string // prefix, pid and counter: "ptns1234-1"
	sw     string // the switch's namespace
	hosts  []*Host
	dir    string // holds scratch, where a program's overlays are mounted
	closed sync.Once
	err    error
}

// Host is one machine of a Network.
type Host struct {
	// Name is the host's network namespace (ip netns list shows it).
	Name string
	// Addr is its IPv4 address, "10.231.X.k" (k = index + 1), in a /24
	// that only the Network's hosts share.
	Addr string
	// Hostname is the host name programs started on the host see (uname,
	// os.Hostname): "host0", "host1", ... unless changed before Command.
	// $HOSTNAME is not set: put it in cmd.Env if the program needs it.
	Hostname string

	nw   *Network
	port string // the switch's end of the cable, in nw.sw
}

// New makes n hosts (1 to 253) on one private switch: a namespace holding a
// bridge and, per host, a namespace with a veth pair to the bridge (eth0 on
// the host's side), one address each and loopback up. Names are unique per
// process and call. On error nothing is left behind.
func New(n int) (*Network, error) {
	if n < 1 || n > 253 {
		return nil, fmt.Errorf("netns: %d hosts; a network has 1 to 253", n)
	}
	if why := Available(); why != "" {
		return nil, errors.New("netns: " + why)
	}
	id := counter.Add(1)
	pid := os.Getpid()
	nw := &Network{name: fmt.Sprintf("%s%d-%d", prefix, pid, id)}
	nw.sw = nw.name + "-sw"
	// The hosts' namespaces are isolated from every other network, so
	// addresses never clash; X only varies so that logs of networks made
	// side by side tell them apart.
	subnet := fmt.Sprintf("10.231.%d.", int(pid+int(id))%256)
	var err error
	if nw.dir, err = os.MkdirTemp("", nw.name+"-"); err != nil {
		return nil, fmt.Errorf("netns: %w", err)
	}
	if err := os.Mkdir(filepath.Join(nw.dir, "scratch"), 0o700); err != nil {
		os.RemoveAll(nw.dir)
		return nil, fmt.Errorf("netns: %w", err)
	}
	fail := func(err error) (*Network, error) {
		nw.Close()
		return nil, fmt.Errorf("netns: %w", err)
	}
	steps := [][]string{
		{"netns", "add", nw.sw},
		{"-n", nw.sw, "link", "set", "lo", "up"},
		{"-n", nw.sw, "link", "add", "name", "br0", "type", "bridge"},
		{"-n", nw.sw, "link", "set", "br0", "up"},
	}
	for _, s := range steps {
		if err := ip(s...); err != nil {
			return fail(err)
		}
	}
	for k := range n {
		h := &Host{Name: fmt.Sprintf("%s-h%d", nw.name, k), Addr: subnet + strconv.Itoa(k+1), Hostname: fmt.Sprintf("host%d", k),
			nw: nw, port: fmt.Sprintf("port%d", k)}
		nw.hosts = append(nw.hosts, h)
		steps := [][]string{
			{"netns", "add", h.Name},
			{"-n", h.Name, "link", "set", "lo", "up"},
			// Made in the switch's namespace with its peer put straight into
			// the host's: never in the root namespace, even for a moment.
			{"-n", nw.sw, "link", "add", "name", h.port, "type", "veth", "peer", "name", "eth0", "netns", h.Name},
			{"-n", nw.sw, "link", "set", h.port, "master", "br0"},
			{"-n", nw.sw, "link", "set", h.port, "up"},
			{"-n", h.Name, "addr", "add", h.Addr + "/24", "dev", "eth0"},
			{"-n", h.Name, "link", "set", "eth0", "up"},
		}
		for _, s := range steps {
			if err := ip(s...); err != nil {
				return fail(err)
			}
		}
	}
	return nw, nil
}

// Hosts are the network's hosts, in order.
func (nw *Network) Hosts() []*Host { return nw.hosts }

// Close kills every process on the hosts (SIGKILL, until none is left, for
// at most 10 seconds), deletes the hosts' and the switch's namespaces (and so
// the cables) and the network's scratch folder. It waits for no exec.Cmd:
// their owners do. Calling it again does nothing and returns the first
// call's error.
func (nw *Network) Close() error {
	nw.closed.Do(func() {
		var errs []error
		names := []string{}
		for _, h := range nw.hosts {
			names = append(names, h.Name)
		}
		names = append(names, nw.sw)
		for _, name := range names {
			if !exists(name) {
				continue
			}
			if err := killAll(name); err != nil {
				errs = append(errs, err)
			}
			if err := ip("netns", "del", name); err != nil {
				errs = append(errs, err)
			}
		}
		if nw.dir != "" {
			if err := os.RemoveAll(nw.dir); err != nil {
				errs = append(errs, err)
			}
		}
		if err := errors.Join(errs...); err != nil {
			nw.err = fmt.Errorf("netns: closing %s: %w", nw.name, err)
		}
	})
	return nw.err
}

// exists reports whether a namespace of that name is in ip netns list.
func exists(name string) bool {
	_, err := os.Stat(filepath.Join("/run/netns", name))
	return err == nil
}

// killAll kills the processes whose network namespace is name until none is
// left: a process may start another while its siblings are being killed.
// Zombies are not listed (they hold no namespace), so a killed child of the
// test does not need to be waited for first.
func killAll(name string) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := exec.Command("ip", "netns", "pids", name).Output()
		if err != nil {
			return fmt.Errorf("ip netns pids %s: %w", name, err)
		}
		pids := strings.Fields(string(out))
		if len(pids) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %s still in %s after SIGKILL", strings.Join(pids, ", "), name)
		}
		for _, p := range pids {
			if pid, err := strconv.Atoi(p); err == nil && pid > 1 && pid != os.Getpid() {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Mount binds Source, a folder or file of the caller, over Target for one
// program on a host (Command): the program sees Source's content at Target,
// and so do its children; the real Target and every other host's are
// untouched. Give each host its own Source at the same Target for a private
// run directory per host, or a hosts file over /etc/hosts so that names
// resolve there.
//
// A Target that does not exist is made for the program only: its nearest
// existing folder gets an overlay in the program's mount namespace, with the
// missing folders and an empty folder or file to bind over in an upper layer
// held in memory (tmpfs) that goes with the program. So "/etc/pipetrain" can
// be a Target without /etc/pipetrain ever being made on the machine. That
// folder must not be "/"; what the program writes under it, outside the
// binds, is lost with the program. Sources are bound before any overlay is
// in place, so a Source may lie in a folder that gets one.
type Mount struct {
	Source, Target string
	// ReadOnly makes the bound view read-only, as Kubernetes mounts a
	// ConfigMap or Secret.
	ReadOnly bool
}

// Command is exec.Command run on the host: in its network namespace and a
// mount and UTS namespace of its own, where the mounts are applied (in
// order, after any overlays they need) and the host name is set before the
// program is exec'd. Every step execs the next (ip netns exec, unshare, sh,
// the program), so cmd.Process is the program itself once it runs and
// killing it kills the program. The shell exports PWD, as a shell does; the
// rest of the environment is cmd.Env's. cmd.Dir is entered before the mounts.
// The program gets SIGKILL if the calling process dies (Pdeathsig), and a
// name without a slash is looked up in this process's PATH, as exec.Command
// does. A Mount that cannot be prepared makes cmd.Start fail. Set
// h.Hostname before calling Command.
//
// Mount propagation is slave, not private: the mounts made for the program
// stay its own, while namespace files that ip netns del unmounts from
// /run/netns are unmounted in the program's view too, so a long-running
// program never keeps another network's namespace alive.
func (h *Host) Command(mounts []Mount, name string, args ...string) *exec.Cmd {
	var errs []error
	prog := name
	if !strings.Contains(name, "/") {
		p, err := exec.LookPath(name)
		if err != nil {
			errs = append(errs, err)
		} else {
			prog = p
		}
	}
	script, err := h.script(mounts)
	if err != nil {
		errs = append(errs, err)
	}
	argv := append([]string{"netns", "exec", h.Name,
		"unshare", "--mount", "--uts", "--propagation", "slave", "--",
		"/bin/sh", "-c", script, "sh", prog}, args...)
	cmd := exec.Command("ip", argv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := errors.Join(errs...); err != nil {
		cmd.Err = fmt.Errorf("netns: %s on %s: %w", name, h.Name, err)
	}
	return cmd
}

// script is the shell program that sets the host name, applies mounts and
// execs "$@". Every Source is bound while the filesystem is still the
// machine's, before any overlay hides what lies below it: a target in a
// folder that needs an overlay is bound inside the overlay's merged view,
// which is then bound over the folder (with those binds) last.
func (h *Host) script(mounts []Mount) (string, error) {
	var b strings.Builder
	b.WriteString("set -e\n")
	fmt.Fprintf(&b, "printf %%s %s > /proc/sys/kernel/hostname\n", quote(h.Hostname))
	type target struct {
		real    string // Target with symbolic links resolved
		missing bool
		dir     bool // Source is a folder
	}
	targets := make([]target, len(mounts))
	var bases []string // folders that need an overlay, shallowest first
	for i, m := range mounts {
		if !filepath.IsAbs(m.Target) || !filepath.IsAbs(m.Source) {
			return "", fmt.Errorf("mount %s over %s: both paths must be absolute", m.Source, m.Target)
		}
		src, err := os.Stat(m.Source)
		if err != nil {
			return "", fmt.Errorf("mount source: %w", err)
		}
		existing, rest := nearestExisting(m.Target)
		real, err := filepath.EvalSymlinks(existing)
		if err != nil {
			return "", fmt.Errorf("mount target %s: %w", m.Target, err)
		}
		targets[i] = target{real: filepath.Join(real, rest), missing: rest != ".", dir: src.IsDir()}
		if rest == "." {
			continue
		}
		if real == "/" {
			return "", fmt.Errorf("mount target %s: nothing of it exists below /; make its first folder", m.Target)
		}
		bases = append(bases, real)
	}
	// One overlay per folder, none inside another: a folder inside another's
	// overlay is made in that overlay's upper layer instead.
	slices.SortFunc(bases, func(a, b string) int { return len(a) - len(b) })
	var overlays []string
	for _, base := range bases {
		if baseOf(overlays, base) < 0 {
			overlays = append(overlays, base)
		}
	}
	scratch := filepath.Join(h.nw.dir, "scratch")
	if len(overlays) > 0 {
		// The overlays' layers live in memory of the program's own: they go
		// with its mount namespace, and lie on another filesystem than any
		// folder they cover.
		fmt.Fprintf(&b, "mount -t tmpfs -o mode=0700 netns %s\n", quote(scratch))
	}
	for i, dir := range overlays {
		o := fmt.Sprintf("%s/%d", scratch, i)
		if strings.ContainsAny(dir, ",:") {
			return "", fmt.Errorf("mount: cannot overlay %s (a comma or colon in its path)", dir)
		}
		fmt.Fprintf(&b, "mkdir %s %s %s %s\n", quote(o), quote(o+"/upper"), quote(o+"/work"), quote(o+"/merged"))
		fmt.Fprintf(&b, "mount -t overlay overlay -o %s %s\n",
			quote("lowerdir="+dir+",upperdir="+o+"/upper,workdir="+o+"/work"), quote(o+"/merged"))
	}
	for i, m := range mounts {
		t := targets[i]
		at := m.Target
		if j := baseOf(overlays, t.real); j >= 0 {
			rel, _ := filepath.Rel(overlays[j], t.real)
			at = fmt.Sprintf("%s/%d/merged/%s", scratch, j, rel)
		}
		if t.missing && t.dir {
			fmt.Fprintf(&b, "mkdir -p %s\n", quote(at))
		} else if t.missing {
			fmt.Fprintf(&b, "mkdir -p %s\n: > %s\n", quote(filepath.Dir(at)), quote(at))
		}
		fmt.Fprintf(&b, "mount --bind %s %s\n", quote(m.Source), quote(at))
		if m.ReadOnly {
			fmt.Fprintf(&b, "mount -o remount,bind,ro %s\n", quote(at))
		}
	}
	for i, dir := range overlays {
		fmt.Fprintf(&b, "mount --rbind %s %s\n", quote(fmt.Sprintf("%s/%d/merged", scratch, i)), quote(dir))
	}
	b.WriteString("exec \"$@\"\n")
	return b.String(), nil
}

// baseOf is the index of the folder of dirs that holds path (or is it), -1
// if none does.
func baseOf(dirs []string, path string) int {
	for i, d := range dirs {
		if path == d || strings.HasPrefix(path, d+"/") {
			return i
		}
	}
	return -1
}

// nearestExisting splits path into its longest existing prefix and the rest.
func nearestExisting(path string) (base, rest string) {
	base = filepath.Clean(path)
	for {
		if _, err := os.Stat(base); err == nil || base == "/" {
			r, _ := filepath.Rel(base, path)
			return base, r
		}
		base = filepath.Dir(base)
	}
}

// quote makes s one word for sh.
func quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// Cut takes the host's cable out of the switch: the switch's end of the veth
// pair goes down, so the host's eth0 loses its carrier and nothing passes
// either way. Connections are not reset, as with a pulled cable: they stall.
func (h *Host) Cut() error { return ip("-n", h.nw.sw, "link", "set", h.port, "down") }

// Restore plugs the cable back in.
func (h *Host) Restore() error { return ip("-n", h.nw.sw, "link", "set", h.port, "up") }

// ip runs ip with args; its error carries ip's message.
func ip(args ...string) error {
	var out bytes.Buffer
	cmd := exec.Command("ip", args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return nil
}
