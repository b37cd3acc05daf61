// Package cluster says where a stage process sits in a job that a cluster
// engine started: its rank and the world size, read from the environment
// the engine sets (torchrun and Kubeflow, Slurm, a Kubernetes Indexed Job,
// Open MPI), and the hosts of a Slurm allocation. It reads only what it is
// given (a getenv function), so every engine's environment can be tested
// without the engine.
package cluster

import (
	"fmt"
	"strconv"
)

// Rank is a process's place in the job.
type Rank struct {
	Rank, World int
	// Source names the variables the rank came from, for messages:
	// "RANK/WORLD_SIZE (torchrun)".
	Source string
}

// source is one engine's pair of variables; an empty world variable means
// the engine sets none and the config's process count is the world.
type source struct {
	rank, world, engine string
}

// sources are read in this order; the first whose rank variable is set wins.
var sources = []source{
	{"RANK", "WORLD_SIZE", "torchrun"},
	{"SLURM_PROCID", "SLURM_NTASKS", "Slurm"},
	{"JOB_COMPLETION_INDEX", "", "Kubernetes Indexed Job"},
	{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "Open MPI"},
}

// Variables lists the rank variables FromEnv reads, in order.
func Variables() []string {
	var out []string
	for _, s := range sources {
		out = append(out, s.rank)
	}
	return out
}

// FromEnv reads the process's rank from the first engine whose rank
// variable getenv reports set, and checks it against processes, the
// config's process count (configs.Config.World: stages × replicas, and the
// parameter servers when they are ranks), which must equal the engine's
// world size. ok is false when no engine's variable is set.
func FromEnv(getenv func(string) string, processes int) (r Rank, ok bool, err error) {
	for _, s := range sources {
		v := getenv(s.rank)
		if v == "" {
			continue
		}
		r.Source = s.rank
		if s.world != "" {
			r.Source += "/" + s.world
		}
		r.Source += " (" + s.engine + ")"
		if r.Rank, err = strconv.Atoi(v); err != nil || r.Rank < 0 {
			return r, true, fmt.Errorf("%s=%q is not a rank (0, 1, ...)", s.rank, v)
		}
		r.World = processes
		if s.world != "" {
			w := getenv(s.world)
			if w == "" {
				return r, true, fmt.Errorf("%s is set but %s is not: %s sets both", s.rank, s.world, s.engine)
			}
			if r.World, err = strconv.Atoi(w); err != nil || r.World < 1 {
				return r, true, fmt.Errorf("%s=%q is not a world size (1, 2, ...)", s.world, w)
			}
			if r.World != processes {
				return r, true, fmt.Errorf("%s=%d, but the config has %d processes: the job must start one process per stage and replica (and per parameter server, when the rendezvous places them)", s.world, r.World, processes)
			}
		}
		if r.Rank >= r.World {
			return r, true, fmt.Errorf("%s=%d is beyond the job's %d processes (ranks 0-%d)", s.rank, r.Rank, r.World, r.World-1)
		}
		return r, true, nil
	}
	return Rank{}, false, nil
}
