package configs

import (
	"slices"
	"strings"
	"testing"
)

func hostsConfig(addrs ...string) *Config {
	return &Config{DataParallel: len(addrs), Stages: []Stage{{Address: addrs[0], Addresses: addrs}}}
}

// Replicas are grouped into runs by the host part of their addresses.
func TestReplicaHostsGroupsConsecutiveReplicas(t *testing.T) {
	cases := []struct {
		addrs []string
		want  []int
	}{
		{[]string{"127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.2:7100", "127.0.0.2:7101"}, []int{2, 2}},
		{[]string{"127.0.0.1:7100", "127.0.0.2:7101", "127.0.0.2:7102"}, []int{1, 2}},
		{[]string{"unix:/tmp/a", "unix:/tmp/b"}, []int{2}},
		{[]string{"[::1]:7100", "127.0.0.1:7100"}, []int{1, 1}},
	}
	for _, tc := range cases {
		got, err := hostsConfig(tc.addrs...).ReplicaHosts(0)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("%v: got %v, %v; want %v", tc.addrs, got, err, tc.want)
		}
	}
}

// A host whose replicas are not next to one another, or an auto address,
// is refused by name.
func TestReplicaHostsRefusesScatteredHosts(t *testing.T) {
	_, err := hostsConfig("127.0.0.1:7100", "127.0.0.2:7100", "127.0.0.1:7101").ReplicaHosts(0)
	if err == nil || !strings.Contains(err.Error(), "stages[0].addresses[2]") || !strings.Contains(err.Error(), `host "127.0.0.1" with replicas 0-0`) {
		t.Errorf("scattered host: %v", err)
	}
	_, err = hostsConfig("auto", "auto").ReplicaHosts(0)
	if err == nil || !strings.Contains(err.Error(), "auto") {
		t.Errorf("auto addresses: %v", err)
	}
}

// Validation refuses all_reduce.algorithm hierarchical where a stage's
// replicas on one host are not consecutive, naming the field.
func TestValidateRefusesHierarchicalOverScatteredHosts(t *testing.T) {
	c := hostsConfig("127.0.0.1:7100", "127.0.0.2:7100", "127.0.0.1:7101")
	c.AllReduce.Algorithm = "hierarchical"
	err := c.Validate()
	if err == nil || !strings.Contains(err.Error(), "all_reduce.algorithm: hierarchical: stages[0].addresses[2]") {
		t.Errorf("got %v", err)
	}
	c.AllReduce.Algorithm = "ring"
	if err := c.Validate(); err != nil && strings.Contains(err.Error(), "all_reduce.algorithm") {
		t.Errorf("the ring refused scattered hosts: %v", err)
	}
}

// The hosts' runs of replicas order a hierarchical run's sums, so they
// enter its training digest; which hosts they are does not.
func TestHierarchicalDigestFollowsHostRuns(t *testing.T) {
	digest := func(addrs ...string) string {
		c := hostsConfig(addrs...)
		c.Stages[0].Layers = []string{"0-2"}
		c.AllReduce.Algorithm = "hierarchical"
		return c.TrainingDigest()
	}
	a := digest("127.0.0.1:7100", "127.0.0.1:7101", "127.0.0.2:7100")
	b := digest("127.0.0.1:7100", "127.0.0.2:7101", "127.0.0.2:7100")
	moved := digest("10.0.0.1:7100", "10.0.0.1:7101", "10.0.0.2:7100")
	if a == b {
		t.Error("hosts of 2+1 and 1+2 replicas gave one digest")
	}
	if a != moved {
		t.Error("the same runs on other hosts changed the digest")
	}
}
