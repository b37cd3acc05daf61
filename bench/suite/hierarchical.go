package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"time"

	"github.com/pipetrain/pipetrain/collective"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/netns"
	"github.com/pipetrain/pipetrain/internal/stats"
	"github.com/pipetrain/pipetrain/transport"
)

// The hierarchical section: the ring streams between processes of one host
// over their Unix stream sockets against TCP, and the ring against the
// hierarchical all-reduce on two hosts of two replicas each, the hosts
// being network namespaces on one private switch (internal/netns).

// hierarchicalSizes are the all-reduce sizes measured, in bytes.
var hierarchicalSizes = []int{1 << 20, 4 << 20, 16 << 20}

func runHierarchical(o *options, b *bytes.Buffer) error {
	if err := unixAgainstTCP(o, b); err != nil {
		return err
	}
	fmt.Fprintf(b, "\n### Ring against hierarchical on 2 hosts × 2 replicas\n\n")
	if why := netns.Available(); why != "" {
		fmt.Fprintf(b, "Not measured here: %s (it needs %s).\n", why, netns.Needs)
		logf("ring against hierarchical across hosts skipped: %s", why)
		return nil
	}
	nw, err := netns.New(2)
	if err != nil {
		return err
	}
	defer nw.Close()
	fmt.Fprintf(b, "Two hosts, network namespaces cabled to one bridge by veth pairs (internal/netns), each running two replicas: replicas 0-1 on host 0, 2-3 on host 1, so the ring's links 0→1 and 2→3 stay within a host (their ring streams on Unix stream sockets) and 1→2 and 3→0 cross the bridge (TCP). ")
	fmt.Fprintf(b, "Both algorithms run over the same links in one run, in alternating rounds (%d), each round starting with the next; the four processes share this machine's %d cores, and the bridge is the kernel's, so a host link costs TCP's stack and a veth hop, not a wire's bandwidth. ", o.reps, runtime.NumCPU())
	fmt.Fprintf(b, "Bus bandwidth is 2(R−1)/R · S / t for both, R = 4 (nccl-tests' figure, the same formula for either algorithm, so the columns compare times).\n\n")
	if err := busAcrossHosts(o, b, nw); err != nil {
		return err
	}
	return trainAcrossHosts(o, b, nw)
}

// unixAgainstTCP times the ring of two ranks in this process over ring
// streams on Unix stream sockets and over TCP, alternating.
func unixAgainstTCP(o *options, b *bytes.Buffer) error {
	const R = 2
	fmt.Fprintf(b, "The ring all-reduce of %d ranks in this process, over ring streams (all_reduce.transport: stream) on the listeners' Unix stream sockets, which replicas of one host now use, and on TCP loopback (transport.Options.StreamsOverTCP), in alternating rounds (%d), S bytes of float32 gradients in 1 MiB buckets; bus bandwidth as above, each figure the median of its rounds ± half its spread, the ratio the median of the rounds' own ratios.\n\n", R, o.reps)
	fmt.Fprintf(b, "| size S | Unix socket MB/s | TCP MB/s | Unix / TCP |\n|---|---|---|---|\n")
	loadStart := loadAvg()
	perRep := int64(256 << 20)
	if o.quick {
		perRep = 64 << 20
	}
	for _, size := range hierarchicalSizes {
		reps := max(2, int(max(4, perRep/int64(size)))/(2*R))
		unix, tcp, err := compareStreamSockets(o, size, R, reps)
		if err != nil {
			return fmt.Errorf("%d MiB: %w", size>>20, err)
		}
		fmt.Fprintf(b, "| %d MiB | %.0f ± %s | %.0f ± %s | %s |\n", size>>20, stats.Median(unix), pct(spread(unix)/2),
			stats.Median(tcp), pct(spread(tcp)/2), ratio(pairedRatio(unix, tcp)))
		logf("ring R=2 %d MiB: Unix sockets %.0f MB/s, TCP %.0f MB/s", size>>20, stats.Median(unix), stats.Median(tcp))
	}
	fmt.Fprintf(b, "\nLoad average (1 min) %.2f when these rounds began and %.2f when they ended.\n", loadStart, loadAvg())
	return nil
}

// compareStreamSockets returns the bus bandwidths, round by round, of
// reps all-reduces of size bytes among R ranks over Unix stream sockets
// and over TCP.
func compareStreamSockets(o *options, size, R, reps int) (unix, tcp []float64, err error) {
	p, err := collective.NewPlan(size/4, configs.DefaultBucketBytes/4, R)
	if err != nil {
		return nil, nil, err
	}
	var trials [2]*collective.Trial
	for i, join := range []func(context.Context, int, collective.Plan) ([]*collective.Ring, func(), error){
		func(ctx context.Context, R int, p collective.Plan) ([]*collective.Ring, func(), error) {
			return collective.Loopback(ctx, R, p, true)
		},
		collective.LoopbackOverTCP,
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		rings, cleanup, err := join(ctx, R, p)
		cancel()
		if err != nil {
			return nil, nil, err
		}
		defer cleanup()
		if want := []string{"unix", "tcp"}[i]; rings[0].Out.Network() != want {
			return nil, nil, fmt.Errorf("the ring streams run on %s, want %s", rings[0].Out.Network(), want)
		}
		trials[i] = collective.NewTrial(rings, p)
		if _, err := busMBs(trials[i], R, p, max(1, reps/4)); err != nil {
			return nil, nil, err
		}
	}
	dst := []*[]float64{&unix, &tcp}
	for k := range o.reps {
		for i := range trials {
			j := (i + k) % len(trials)
			runtime.GC()
			mb, err := busMBs(trials[j], R, p, reps)
			if err != nil {
				return nil, nil, err
			}
			*dst[j] = append(*dst[j], mb)
		}
	}
	return unix, tcp, nil
}

// ringRankEnv makes this program one rank of the across-hosts ring
// (ringRankChild), its value the rank's ringRankSpec in JSON.
const ringRankEnv = "PIPETRAIN_BENCH_RING_RANK"

// ringRankSpec is what one rank of the across-hosts ring is told.
type ringRankSpec struct {
	Rank   int
	Addrs  []string // every rank's address, in rank order
	Groups []int    // replicas per host, in rank order
	Token  string
	Sizes  []int // all-reduce sizes in bytes
	Reps   []int // all-reduces per timing, per size
	Rounds int
}

// ringRankResult is one timing of a rank: seconds per all-reduce.
type ringRankResult struct {
	Size      int
	Algorithm string
	Round     int
	Seconds   float64
}

// ringRankReport is what a rank prints when it is done.
type ringRankReport struct {
	Out, In string // what its ring streams run on (tcp, unix)
	Results []ringRankResult
}

// runRingRankChild runs the rank the environment describes and prints its
// report as JSON on standard output.
func runRingRankChild(raw string) {
	var s ringRankSpec
	if err := json.Unmarshal([]byte(raw), &s); err != nil {
		fatalf("%s: %v", ringRankEnv, err)
	}
	rep, err := ringRank(s)
	if err != nil {
		fatalf("rank %d: %v", s.Rank, err)
	}
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		fatalf("rank %d: %v", s.Rank, err)
	}
}

// rankArm is one plan the ranks time: a size reduced by one algorithm,
// its messages tagged from base.
type rankArm struct {
	size, reps int
	plan       collective.Plan
	base       int
	bufs       [2][]float32
}

// rankArms are s's plans, a ring and a hierarchical one per size, and the
// shapes of all their messages, which the ring's handshake lists.
func rankArms(s ringRankSpec) ([]*rankArm, [][]int, error) {
	var arms []*rankArm
	var shapes [][]int
	for i, size := range s.Sizes {
		for _, alg := range []collective.Algorithm{collective.RingAlgorithm, collective.Hierarchical} {
			p, err := collective.NewPlan(size/4, configs.DefaultBucketBytes/4, len(s.Addrs))
			if err != nil {
				return nil, nil, err
			}
			if p, err = p.WithAlgorithm(alg); err != nil {
				return nil, nil, err
			}
			if alg == collective.Hierarchical {
				if p, err = p.WithGroups(s.Groups); err != nil {
					return nil, nil, err
				}
			}
			a := &rankArm{size: size, reps: s.Reps[i], plan: p, base: len(shapes)}
			a.bufs = [2][]float32{make([]float32, p.N), make([]float32, p.N)}
			arms = append(arms, a)
			shapes = append(shapes, p.Shapes()...)
		}
	}
	return arms, shapes, nil
}

// ringRank joins the ring as rank s.Rank (its gRPC links, then its ring
// streams, as a stage's replica does) and times every arm, round after
// round, each round starting with the next arm.
func ringRank(s ringRankSpec) (ringRankReport, error) {
	arms, shapes, err := rankArms(s)
	if err != nil {
		return ringRankReport{}, err
	}
	ring, closeRing, err := joinRing(s, shapes)
	if err != nil {
		return ringRankReport{}, err
	}
	defer closeRing()
	rep := ringRankReport{Out: ring.Out.Network(), In: ring.In.Network()}
	ctx := context.Background()
	var step int64
	run := func(a *rankArm, n int) (time.Duration, error) {
		t0 := time.Now()
		for range n {
			if err := collective.AllReduce(ctx, ring, step, a.base, a.plan, a.bufs[step%2]); err != nil {
				return 0, err
			}
			step++
		}
		return time.Since(t0) / time.Duration(n), nil
	}
	for _, a := range arms {
		if _, err := run(a, max(1, a.reps/4)); err != nil {
			return rep, err
		}
	}
	for k := range s.Rounds {
		for i := range arms {
			a := arms[(i+k)%len(arms)]
			runtime.GC()
			d, err := run(a, a.reps)
			if err != nil {
				return rep, err
			}
			rep.Results = append(rep.Results, ringRankResult{Size: a.size, Algorithm: string(a.plan.Algorithm), Round: k, Seconds: d.Seconds()})
		}
	}
	return rep, nil
}

// joinRing makes rank s.Rank's place in the ring: it listens on its
// address, dials the next rank and takes the previous one's link, then the
// ring streams beside them.
func joinRing(s ringRankSpec, shapes [][]int) (*collective.Ring, func(), error) {
	R, r := len(s.Addrs), s.Rank
	hello := transport.Hello{Group: transport.ReplicaGroup, Stage: 0, Stages: 1, Replica: r, Replicas: R,
		ConfigDigest: "bench-hierarchical", Address: s.Addrs[r], DType: transport.Float32, Shapes: shapes}
	opts := transport.Options{Token: s.Token, Streams: true, ConnectTimeout: time.Minute}
	srv, err := transport.Listen(s.Addrs[r], hello, opts)
	if err != nil {
		return nil, nil, err
	}
	ring := &collective.Ring{Rank: r, Size: R, DType: transport.Float32}
	closeRing := func() {
		if ring.Out != nil {
			ring.Out.Close()
		}
		if ring.In != nil {
			ring.In.Close()
		}
		if ring.Next != nil {
			ring.Next.Close()
		}
		if ring.Prev != nil {
			ring.Prev.Close()
		}
		srv.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	next := s.Addrs[(r+1)%R]
	var errs [2]error
	var wg sync.WaitGroup
	wg.Go(func() { ring.Prev, errs[0] = srv.AcceptGroup(ctx, transport.ReplicaGroup) })
	wg.Go(func() { ring.Next, errs[1] = transport.Dial(ctx, next, hello, opts) })
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		closeRing()
		return nil, nil, err
	}
	wg.Go(func() { ring.In, errs[0] = srv.AcceptStream(ctx, transport.ReplicaGroup) })
	wg.Go(func() { ring.Out, errs[1] = transport.DialStream(ctx, next, hello, ring.Next.Peer(), opts) })
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		closeRing()
		return nil, nil, err
	}
	return ring, closeRing, nil
}

// benchToken authenticates the across-hosts rings and runs: their
// addresses are not loopback, so the listeners demand one.
const benchToken = "bench-hierarchical-token"

// hostAddrs are the four replicas' addresses, two per host.
func hostAddrs(nw *netns.Network) []string {
	var out []string
	for _, h := range nw.Hosts() {
		for _, port := range []int{7601, 7602} {
			out = append(out, h.Addr+":"+strconv.Itoa(port))
		}
	}
	return out
}

// startOnHosts starts one command per replica, replica r on host r/2, and
// returns their standard outputs once all have ended, or the first
// failure with its standard error. A run past timeout is killed.
func startOnHosts(nw *netns.Network, timeout time.Duration, cmdFor func(r int, h *netns.Host) *exec.Cmd) ([]*bytes.Buffer, error) {
	hosts := nw.Hosts()
	n := 2 * len(hosts)
	outs, stderrs := make([]*bytes.Buffer, n), make([]*bytes.Buffer, n)
	var cmds []*exec.Cmd
	kill := func() {
		for _, c := range cmds {
			c.Process.Kill()
		}
	}
	for r := range n {
		outs[r], stderrs[r] = &bytes.Buffer{}, &bytes.Buffer{}
		c := cmdFor(r, hosts[r/2])
		c.Stdout, c.Stderr = outs[r], stderrs[r]
		if err := c.Start(); err != nil {
			kill()
			for _, c := range cmds {
				c.Wait()
			}
			return nil, fmt.Errorf("replica %d on %s: %w", r, hosts[r/2].Name, err)
		}
		cmds = append(cmds, c)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, c := range cmds {
		wg.Go(func() { errs[r] = c.Wait() })
	}
	timer := time.AfterFunc(timeout, kill)
	wg.Wait()
	if !timer.Stop() {
		return nil, fmt.Errorf("the replicas did not finish within %v", timeout)
	}
	for r, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("replica %d on %s: %w\n%s", r, hosts[r/2].Name, err, tail(stderrs[r].Bytes(), 2000))
		}
	}
	return outs, nil
}

// busAcrossHosts times ring and hierarchical all-reduces among four rank
// processes on the network's two hosts.
func busAcrossHosts(o *options, b *bytes.Buffer, nw *netns.Network) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	perRep := int64(128 << 20)
	if o.quick {
		perRep = 32 << 20
	}
	spec := ringRankSpec{Addrs: hostAddrs(nw), Groups: []int{2, 2}, Token: benchToken, Sizes: hierarchicalSizes, Rounds: o.reps}
	for _, size := range spec.Sizes {
		spec.Reps = append(spec.Reps, int(max(2, perRep/int64(size)/4)))
	}
	loadStart := loadAvg()
	outs, err := startOnHosts(nw, 10*time.Minute, func(r int, h *netns.Host) *exec.Cmd {
		s := spec
		s.Rank = r
		raw, _ := json.Marshal(s)
		cmd := h.Command(nil, exe)
		cmd.Env = []string{"PATH=/usr/bin:/bin", ringRankEnv + "=" + string(raw)}
		return cmd
	})
	if err != nil {
		return err
	}
	reports := make([]ringRankReport, len(outs))
	for r, out := range outs {
		if err := json.Unmarshal(out.Bytes(), &reports[r]); err != nil {
			return fmt.Errorf("replica %d's report: %v: %q", r, err, tail(out.Bytes(), 500))
		}
	}
	for r, rep := range reports {
		// Replicas 0 and 2 lead into their host's second replica.
		want := "tcp"
		if r%2 == 0 {
			want = "unix"
		}
		if rep.Out != want {
			return fmt.Errorf("replica %d's ring stream to replica %d runs on %s, want %s", r, (r+1)%len(reports), rep.Out, want)
		}
	}
	// Rank 0's timings: every rank waits for the others' messages, so each
	// all-reduce ends on every rank within one message of the others.
	times := map[string][]float64{}
	for _, res := range reports[0].Results {
		k := fmt.Sprintf("%d/%s", res.Size, res.Algorithm)
		R := float64(len(spec.Addrs))
		times[k] = append(times[k], 2*(R-1)/R*float64(res.Size)/res.Seconds/1e6)
	}
	fmt.Fprintf(b, "| size S | ring MB/s | hierarchical MB/s | hierarchical / ring |\n|---|---|---|---|\n")
	for _, size := range spec.Sizes {
		ring, hier := times[fmt.Sprintf("%d/ring", size)], times[fmt.Sprintf("%d/hierarchical", size)]
		fmt.Fprintf(b, "| %d MiB | %.0f ± %s | %.0f ± %s | %s |\n", size>>20, stats.Median(ring), pct(spread(ring)/2),
			stats.Median(hier), pct(spread(hier)/2), ratio(pairedRatio(hier, ring)))
		logf("2 hosts × 2 replicas, %d MiB: ring %.0f MB/s, hierarchical %.0f MB/s", size>>20, stats.Median(ring), stats.Median(hier))
	}
	fmt.Fprintf(b, "\nLoad average (1 min) %.2f when these rounds began and %.2f when they ended.\n", loadStart, loadAvg())
	return nil
}

// trainAcrossHosts trains one model 1 × 4 on the two hosts, two replicas
// each, under each algorithm in alternating runs, and reports the step
// time.
func trainAcrossHosts(o *options, b *bytes.Buffer, nw *netns.Network) error {
	const base = "configs/bench-mlp-4stage.yaml"
	bin, err := filepath.Abs(o.bin)
	if err != nil {
		return err
	}
	algs := []string{"ring", "hierarchical"}
	ms := make([][]float64, len(algs))
	var batch int
	for rep := range o.runReps {
		for i := range algs {
			alg := algs[(i+rep)%len(algs)]
			rc := runConfig{base: base, steps: o.pipeSteps, layers: []string{"0-7"}, replicas: 4, micro: 4,
				env: []string{"PIPETRAIN_COMPUTE_BLAS_THREADS=1"}, addrs: hostAddrs(nw),
				set: map[string]map[string]any{"all_reduce": {"algorithm": alg}, "transport": {"token": benchToken}}}
			step, bs, err := trainOnHosts(o, nw, bin, rc)
			if err != nil {
				return fmt.Errorf("%s: %w", alg, err)
			}
			batch = bs
			j := (i + rep) % len(algs)
			ms[j] = append(ms[j], step)
			logf("2 hosts × 2 replicas, run %d: %s %.1f ms per step", rep+1, alg, step)
		}
	}
	fmt.Fprintf(b, "\n`%s` trained 1 × 4 (the whole 8-layer MLP on every replica, batch %d, %d per replica in 4 micro-batches, Adam, one BLAS thread per process) on the same two hosts, replicas 0-1 on host 0 and 2-3 on host 1, %d steps per run, the first %d left out, ring and hierarchical runs alternating (%d each): the median step time of each run (from metrics.jsonl), then the median over runs ± half their spread.\n\n",
		base, batch, batch/4, o.pipeSteps, o.skip, o.runReps)
	fmt.Fprintf(b, "| all_reduce.algorithm | ms per step | step time against ring |\n|---|---|---|\n")
	for i, alg := range algs {
		fmt.Fprintf(b, "| %s | %.1f ± %s | %s |\n", alg, stats.Median(ms[i]), pct(spread(ms[i])/2), ratio(pairedRatio(ms[i], ms[0])))
	}
	return nil
}

// trainOnHosts runs rc's four replicas, replica r on host r/2, and returns
// the median step time in ms after o.skip and the batch size.
func trainOnHosts(o *options, nw *netns.Network, bin string, rc runConfig) (float64, int, error) {
	dir, err := os.MkdirTemp("", "pipetrain-suite-")
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(dir)
	cfgPath, err := rc.write(dir)
	if err != nil {
		return 0, 0, err
	}
	runDir := filepath.Join(dir, "run")
	wd, err := os.Getwd()
	if err != nil {
		return 0, 0, err
	}
	_, err = startOnHosts(nw, 10*time.Minute, func(r int, h *netns.Host) *exec.Cmd {
		cmd := h.Command(nil, bin, "stage", "--config", cfgPath, "--stage", "0", "--replica", strconv.Itoa(r), "--run-dir", runDir)
		cmd.Dir = wd // the config's data paths are relative to the repository
		cmd.Env = append([]string{"PATH=/usr/bin:/bin", "HOME=" + os.Getenv("HOME")}, runEnv(rc)...)
		return cmd
	})
	if err != nil {
		return 0, 0, err
	}
	cfg, err := configs.Load(cfgPath)
	if err != nil {
		return 0, 0, err
	}
	ms, _, err := stepTimes(runDir, cfg.Data.BatchSize, o.skip)
	if err != nil {
		return 0, 0, err
	}
	return stats.Median(ms), cfg.Data.BatchSize, nil
}
