package predict

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/stages"
)

// TestReplicationChargesEachChunksGradients: each stage's gradient bytes are
// its parameters' (float32), the ring charged at the link's figures in
// buckets of whole elements; a schedule with other chunks than the config's
// has each stage's gradients spread over its chunks, the remainder on the
// first.
func TestReplicationChargesEachChunksGradients(t *testing.T) {
	grid := strings.Replace(mlp2, "schedule: 1f1b", "schedule: 1f1b\ndata_parallel: 2\nall_reduce: {bucket_bytes: 30}", 1)
	grid = strings.Replace(grid, `address: 127.0.0.1:7001}`, `addresses: [127.0.0.1:7001, 127.0.0.1:7011]}`, 1)
	grid = strings.Replace(grid, `address: 127.0.0.1:7002}`, `addresses: [127.0.0.1:7002, 127.0.0.1:7012]}`, 1)
	cfg, model := load(t, grid)
	link := schedule.Link{BytesPerSecond: 1e9, Latency: 50 * time.Microsecond}
	r, err := NewReplication(cfg, model, Links{Across: link})
	if err != nil {
		t.Fatal(err)
	}
	// Layer 0: 8x6 + 6; layers 1-2: 6x5 + 5 and 5x3 + 3.
	if want := [][]int64{{54 * 4}, {53 * 4}}; !reflect.DeepEqual(r.Grads, want) {
		t.Errorf("gradient bytes %v, want %v", r.Grads, want)
	}
	if want := (schedule.RingAllReduce{Replicas: 2, Bandwidth: 1e6, Latency: 0.05, BucketBytes: 28}); !reflect.DeepEqual(r.Ring, want) || r.Algorithm != "ring" {
		t.Errorf("ring %+v, want %+v", r.Ring, want)
	}
	one := r.Costs(schedule.Costs{}, 1)
	if want := [][]float64{{r.Ring.Time(216)}, {r.Ring.Time(212)}}; !reflect.DeepEqual(one.AllReduce, want) {
		t.Errorf("the config's chunks: %v, want %v", one.AllReduce, want)
	}
	two := r.Costs(schedule.Costs{}, 2)
	if want := [][]float64{{r.Ring.Time(108), r.Ring.Time(108)}, {r.Ring.Time(106), r.Ring.Time(106)}}; !reflect.DeepEqual(two.AllReduce, want) {
		t.Errorf("two chunks a stage: %v, want %v", two.AllReduce, want)
	}
	three := r.Costs(schedule.Costs{}, 3)
	if want := []float64{r.Ring.Time(72), r.Ring.Time(72), r.Ring.Time(72)}; !reflect.DeepEqual(three.AllReduce[0], want) {
		t.Errorf("three chunks of stage 0: %v, want %v", three.AllReduce[0], want)
	}
	if want := []float64{r.Ring.Time(72), r.Ring.Time(70), r.Ring.Time(70)}; !reflect.DeepEqual(three.AllReduce[1], want) {
		t.Errorf("three chunks of stage 1: %v, want %v", three.AllReduce[1], want)
	}
}

// TestOneReplicaReducesNothing: with one replica the costs are left as they
// are.
func TestOneReplicaReducesNothing(t *testing.T) {
	cfg, model := load(t, mlp2)
	r, err := NewReplication(cfg, model, Links{Across: schedule.Loopback})
	if err != nil {
		t.Fatal(err)
	}
	if r.Grads != nil || r.Costs(schedule.Costs{F: []float64{1}}, 1).AllReduce != nil {
		t.Errorf("one replica: %+v", r)
	}
}

// TestBucketBytesHoldsWholeElements: a bucket of 30 bytes holds 7 float32s
// or 3 float64s.
func TestBucketBytesHoldsWholeElements(t *testing.T) {
	cfg, model := load(t, strings.Replace(mlp2, "schedule: 1f1b", "schedule: 1f1b\nall_reduce: {bucket_bytes: 30}", 1))
	if got := BucketBytes(cfg, model); got != 28 {
		t.Errorf("float32: %d bytes, want 28", got)
	}
	cfg.Model.DType = "float64"
	model, err := models.Build(cfg.Model)
	if err != nil {
		t.Fatal(err)
	}
	if got := BucketBytes(cfg, model); got != 24 {
		t.Errorf("float64: %d bytes, want 24", got)
	}
}

// replicated is mlp2 with data_parallel replicas, the extra config lines
// added, and each stage's addresses on the hosts given (one per replica).
func replicated(t *testing.T, extra string, hosts ...string) (*configs.Config, *models.Model) {
	t.Helper()
	text := strings.Replace(mlp2, "schedule: 1f1b", fmt.Sprintf("data_parallel: %d\n%s", len(hosts), extra), 1)
	text = strings.Replace(text, "batch_size: 8,", fmt.Sprintf("batch_size: %d,", 4*len(hosts)), 1)
	for s, old := range []string{`address: 127.0.0.1:7001}`, `address: 127.0.0.1:7002}`} {
		var addrs []string
		for r, h := range hosts {
			addrs = append(addrs, fmt.Sprintf("%s:%d", h, 7001+s+10*r))
		}
		text = strings.Replace(text, old, "addresses: ["+strings.Join(addrs, ", ")+"]}", 1)
	}
	return load(t, text)
}

// TestReplicationHierarchicalHosts: hierarchical takes each stage's hosts
// from its addresses, or --replicas-per-host's layout, and charges each
// stage's all-reduce with them at the links within and across hosts.
func TestReplicationHierarchicalHosts(t *testing.T) {
	cfg, model := replicated(t, "schedule: 1f1b\nall_reduce: {algorithm: hierarchical, bucket_bytes: 100}", "127.0.0.1", "127.0.0.1", "127.0.0.2", "127.0.0.2")
	links := Links{Across: schedule.Link{BytesPerSecond: 1e8, Latency: time.Millisecond}, Within: schedule.Link{BytesPerSecond: 1e9, Latency: 100 * time.Microsecond}}
	r, err := NewReplication(cfg, model, links)
	if err != nil {
		t.Fatal(err)
	}
	if want := [][]int{{2, 2}, {2, 2}}; !reflect.DeepEqual(r.Hosts, want) || r.Algorithm != "hierarchical" {
		t.Fatalf("hosts %v (%s), want %v", r.Hosts, r.Algorithm, want)
	}
	want := schedule.RingAllReduce{Replicas: 4, Bandwidth: 1e5, Latency: 1, BucketBytes: 100, Hosts: []int{2, 2},
		Within: schedule.LinkFigures{Bandwidth: 1e6, Latency: 0.1}}
	if got := r.StageRing(1); !reflect.DeepEqual(got, want) {
		t.Errorf("stage 1's all-reduce %+v, want %+v", got, want)
	}
	c := r.Costs(schedule.Costs{}, 1)
	if got := c.AllReduce[0][0]; got != want.Time(216) || got != r.StageTime(0) {
		t.Errorf("stage 0 charged %v (StageTime %v), want %v", got, r.StageTime(0), want.Time(216))
	}
	links.ReplicasPerHost = 3
	if r, err = NewReplication(cfg, model, links); err != nil || !reflect.DeepEqual(r.Hosts, [][]int{{3, 1}, {3, 1}}) {
		t.Errorf("3 replicas a host: %v (%v), want [[3 1] [3 1]]", r.Hosts, err)
	}
	cfg.DataParallel = 6 // as simulate --replicas 6 does
	_, err = NewReplication(cfg, model, Links{})
	if want := "stages[0].addresses: 4 addresses lay out 4 replicas on hosts, not 6: give the replicas per host (--replicas-per-host)"; err == nil || err.Error() != want {
		t.Errorf("6 replicas on 4 addresses: %v, want %q", err, want)
	}
}

// TestReplicationParameterServers: with parameter servers each stage is
// charged its push and pull of the bytes each server holds of it
// (stages.PSLayerBytes), all on chunk 0, from the stage's step end.
func TestReplicationParameterServers(t *testing.T) {
	cfg, model := replicated(t, "schedule: 1f1b\ncheckpoint: {every: 0}\nparameter_servers: {count: 2, addresses: [127.0.0.1:7650, 127.0.0.1:7651]}",
		"127.0.0.1", "127.0.0.1", "127.0.0.1")
	link := schedule.Link{BytesPerSecond: 1e6, Latency: 100 * time.Microsecond}
	r, err := NewReplication(cfg, model, Links{Across: link})
	if err != nil {
		t.Fatal(err)
	}
	layers, err := stages.PSLayerBytes(cfg, model)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]int64{layers[0], {layers[1][0] + layers[2][0], layers[1][1] + layers[2][1]}}
	if !reflect.DeepEqual(r.ServerBytes, want) || r.Algorithm != ParameterServersAlgorithm {
		t.Fatalf("server bytes %v (%s), want %v", r.ServerBytes, r.Algorithm, want)
	}
	for s, bytes := range want {
		if b := sum(bytes); b != r.Grads[s][0] {
			t.Errorf("stage %d: servers hold %d bytes of it, its gradients are %d", s, b, r.Grads[s][0])
		}
	}
	ps := schedule.ParameterServers{Workers: 3, Link: link.Figures()}
	c := r.Costs(schedule.Costs{}, 2)
	if !c.ReduceAtStepEnd || !reflect.DeepEqual(c.AllReduce, [][]float64{{ps.Time(want[0]), 0}, {ps.Time(want[1]), 0}}) {
		t.Errorf("costs %v (at step end %v), want each stage's push and pull on chunk 0", c.AllReduce, c.ReduceAtStepEnd)
	}
}

// TestReplicationLayerBuckets: under all_reduce.overlap layer a chunk's
// buckets of 100 bytes run last first, each ready once the last weight
// pass has finished its earliest layer. Stage 1 holds layers 1 (140
// bytes) and 2 (72): the bucket at bytes [200, 212) lies in layer 2, ready
// when the pass has done 72 of its 212 bytes' work; [100, 200) and
// [0, 100) touch layer 1 and wait for the pass's end.
func TestReplicationLayerBuckets(t *testing.T) {
	cfg, model := replicated(t, "schedule: 1f1b\nall_reduce: {overlap: layer, bucket_bytes: 100}", "127.0.0.1", "127.0.0.1")
	r, err := NewReplication(cfg, model, Links{Across: schedule.Link{BytesPerSecond: 1e6, Latency: 50 * time.Microsecond}})
	if err != nil {
		t.Fatal(err)
	}
	c := r.Costs(schedule.Costs{}, 1)
	ring := r.StageRing(1)
	want := []schedule.Bucket{{Ready: 72.0 / 212, Time: ring.Time(12)}, {Ready: 1, Time: ring.Time(100)}, {Ready: 1, Time: ring.Time(100)}}
	if !reflect.DeepEqual(c.Buckets[1][0], want) {
		t.Errorf("stage 1's buckets %v, want %v", c.Buckets[1][0], want)
	}
	if len(c.Buckets[0][0]) != 3 || c.Buckets[0][0][0].Ready != 1 {
		t.Errorf("stage 0's buckets %v: one layer, all ready at the pass's end", c.Buckets[0][0])
	}
	if two := r.Costs(schedule.Costs{}, 2); two.Buckets != nil {
		t.Errorf("two chunks a stage, not the config's: buckets %v, want none", two.Buckets)
	}
}
