package cluster

import (
	"slices"
	"strings"
	"testing"
)

func env(kv ...string) func(string) string {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) string { return m[k] }
}

func TestFromEnvReadsEachEngine(t *testing.T) {
	cases := []struct {
		env    func(string) string
		rank   int
		source string
	}{
		{env("RANK", "2", "WORLD_SIZE", "4", "LOCAL_RANK", "0"), 2, "RANK/WORLD_SIZE (torchrun)"},
		{env("SLURM_PROCID", "3", "SLURM_NTASKS", "4"), 3, "SLURM_PROCID/SLURM_NTASKS (Slurm)"},
		{env("JOB_COMPLETION_INDEX", "1"), 1, "JOB_COMPLETION_INDEX (Kubernetes Indexed Job)"},
		{env("OMPI_COMM_WORLD_RANK", "0", "OMPI_COMM_WORLD_SIZE", "4"), 0, "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE (Open MPI)"},
		// torchrun inside a Slurm allocation: RANK comes first.
		{env("RANK", "1", "WORLD_SIZE", "4", "SLURM_PROCID", "0", "SLURM_NTASKS", "1"), 1, "RANK/WORLD_SIZE (torchrun)"},
	}
	for _, c := range cases {
		r, ok, err := FromEnv(c.env, 4)
		if err != nil || !ok || r.Rank != c.rank || r.World != 4 || r.Source != c.source {
			t.Errorf("%s: got %+v, %v, %v; want rank %d of 4", c.source, r, ok, err, c.rank)
		}
	}
	if _, ok, err := FromEnv(env(), 4); ok || err != nil {
		t.Errorf("no variables: ok %v, err %v", ok, err)
	}
}

func TestFromEnvRefusesWhatCannotBeRight(t *testing.T) {
	cases := []struct {
		env  func(string) string
		want string
	}{
		{env("RANK", "x", "WORLD_SIZE", "4"), `RANK="x" is not a rank`},
		{env("RANK", "-1", "WORLD_SIZE", "4"), `RANK="-1" is not a rank`},
		{env("RANK", "1"), "RANK is set but WORLD_SIZE is not"},
		{env("SLURM_PROCID", "0", "SLURM_NTASKS", "3"), "SLURM_NTASKS=3, but the config has 4 processes"},
		{env("RANK", "0", "WORLD_SIZE", "zero"), `WORLD_SIZE="zero" is not a world size`},
		{env("JOB_COMPLETION_INDEX", "4"), "JOB_COMPLETION_INDEX=4 is beyond the job's 4 processes (ranks 0-3)"},
	}
	for _, c := range cases {
		_, ok, err := FromEnv(c.env, 4)
		if !ok || err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("got ok %v, %v; want an error containing %q", ok, err, c.want)
		}
	}
}

func TestExpandHostlist(t *testing.T) {
	cases := map[string][]string{
		"node1":                  {"node1"},
		"node[10,20-21],gpu01":   {"node10", "node20", "node21", "gpu01"},
		"n[08-10]":               {"n08", "n09", "n10"},
		"r[1-2]n[1-2]":           {"r1n1", "r1n2", "r2n1", "r2n2"},
		"a,b[1-3],c":             {"a", "b1", "b2", "b3", "c"},
		"tux[0-1].cluster.local": {"tux0.cluster.local", "tux1.cluster.local"},
	}
	for in, want := range cases {
		got, err := ExpandHostlist(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("ExpandHostlist(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "n[1-", "n]1", "n[3-1]", "n[a-b]", "n[1-99999999]"} {
		if got, err := ExpandHostlist(bad); err == nil {
			t.Errorf("ExpandHostlist(%q) = %v, want an error", bad, got)
		}
	}
}

func TestResolveRendezvous(t *testing.T) {
	cases := []struct {
		configured string
		env        func(string) string
		want       string
	}{
		{"10.0.0.1:5000", env("MASTER_ADDR", "x", "MASTER_PORT", "1"), "10.0.0.1:5000"},
		{"", env("MASTER_ADDR", "10.0.0.2", "MASTER_PORT", "29500"), "10.0.0.2:29500"},
		{"", env("MASTER_ADDR", "head"), "head:29400"},
		{"", env("SLURM_JOB_NODELIST", "node[07-09]"), "node07:29400"},
	}
	for _, c := range cases {
		got, _, err := ResolveRendezvous(c.configured, c.env)
		if err != nil || got != c.want {
			t.Errorf("ResolveRendezvous(%q) = %q, %v; want %q", c.configured, got, err, c.want)
		}
	}
	if _, _, err := ResolveRendezvous("", env()); err == nil || !strings.Contains(err.Error(), "MASTER_ADDR") {
		t.Errorf("nothing known: %v", err)
	}
	if _, _, err := ResolveRendezvous("nohost", env()); err == nil {
		t.Error("a rendezvous without a port was taken")
	}
}

func TestLocalAddressForLoopback(t *testing.T) {
	if a, err := LocalAddressFor("127.0.0.1"); err != nil || a != "127.0.0.1" {
		t.Errorf("LocalAddressFor(127.0.0.1) = %q, %v", a, err)
	}
}
