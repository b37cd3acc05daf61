package stages

import (
	"fmt"
	"os"
	"strconv"
)

// SlowReplicaEnv names a replica whose stages run at half speed: before
// each push to the parameter servers, each of its stages sleeps as long as
// its forward and backward passes of the step took, so its compute takes
// twice as long. It is for benchmarks (bench/suite's ps section: what one
// slow worker costs sync, backup workers and async), not for training.
const SlowReplicaEnv = "PIPETRAIN_BENCH_SLOW_REPLICA"

// slowReplica reports whether SlowReplicaEnv names replica.
func slowReplica(replica int) (bool, error) {
	v, ok := os.LookupEnv(SlowReplicaEnv)
	if !ok || v == "" {
		return false, nil
	}
	r, err := strconv.Atoi(v)
	if err != nil || r < 0 {
		return false, fmt.Errorf("%s=%q: want a replica's index", SlowReplicaEnv, v)
	}
	return r == replica, nil
}
