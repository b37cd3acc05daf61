package stages

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// SlowReplicaEnv names a replica whose stages run at about half speed:
// before each push to the parameter servers, each of its stages sleeps as
// long as went by since its previous push began (its compute, push and
// pull), so its steps take about twice as long. It is for benchmarks
// (bench/suite's ps section: what one slow worker costs sync, backup
// workers and async), not for training.
const SlowReplicaEnv = "PIPETRAIN_BENCH_SLOW_REPLICA"

// slowReplica returns the hook that slows replica down when SlowReplicaEnv
// names it, nil otherwise.
func slowReplica(replica int) (func(step int), error) {
	v, ok := os.LookupEnv(SlowReplicaEnv)
	if !ok || v == "" {
		return nil, nil
	}
	r, err := strconv.Atoi(v)
	if err != nil || r < 0 {
		return nil, fmt.Errorf("%s=%q: want a replica's index", SlowReplicaEnv, v)
	}
	if r != replica {
		return nil, nil
	}
	return halfSpeed(time.Now()), nil
}

// halfSpeed sleeps, at each call, as long as went by since the last call
// returned (since start for the first), doubling the time between pushes.
func halfSpeed(start time.Time) func(int) {
	last := start
	return func(int) {
		time.Sleep(time.Since(last))
		last = time.Now()
	}
}
