package predict

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/schedule"
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
	r, err := NewReplication(cfg, model, link)
	if err != nil {
		t.Fatal(err)
	}
	// Layer 0: 8x6 + 6; layers 1-2: 6x5 + 5 and 5x3 + 3.
	if want := [][]int64{{54 * 4}, {53 * 4}}; !reflect.DeepEqual(r.Grads, want) {
		t.Errorf("gradient bytes %v, want %v", r.Grads, want)
	}
	if want := (schedule.RingAllReduce{Replicas: 2, Bandwidth: 1e6, Latency: 0.05, BucketBytes: 28}); r.Ring != want {
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
	r, err := NewReplication(cfg, model, schedule.Loopback)
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
