package main

import (
	"os"
	"slices"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestRunConfigSetsKeysAndServerPorts: a derived config sets the keys
// asked for, deletes a section set to nil, and gives the parameter servers
// ports of their own, none a stage's.
func TestRunConfigSetsKeysAndServerPorts(t *testing.T) {
	read := func(rc runConfig) map[string]any {
		t.Helper()
		path, err := rc.write(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		raw, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		var doc map[string]any
		if err := yaml.Unmarshal(raw, &doc); err != nil {
			t.Fatal(err)
		}
		return doc
	}
	base := runConfig{base: "../../configs/fmnist-mlp-ps.yaml", steps: 7, evaluate: true}
	rc := base
	rc.set = psModes[5].settings(map[string]map[string]any{"model": {"tie_embeddings": false}})
	doc := read(rc)
	ps := doc["parameter_servers"].(map[string]any)
	if ps["mode"] != "async" || ps["max_staleness"] != 4 || doc["model"].(map[string]any)["tie_embeddings"] != false {
		t.Errorf("keys not set: %v, model %v", ps, doc["model"])
	}
	if doc["train"].(map[string]any)["evaluate"] != true {
		t.Errorf("train %v: evaluate not set", doc["train"])
	}
	var ports []any
	for _, s := range doc["stages"].([]any) {
		ports = append(ports, s.(map[string]any)["addresses"].([]any)...)
	}
	servers := ps["addresses"].([]any)
	if len(servers) != 2 || len(ports) != 6 {
		t.Fatalf("%d server and %d stage addresses", len(servers), len(ports))
	}
	all := append(ports, servers...)
	for i, a := range all {
		if a == "127.0.0.1:7650" || slices.Contains(all[i+1:], a) {
			t.Errorf("address %v is the base's or given twice: %v", a, all)
		}
	}
	rc = base
	rc.set = psModes[0].settings(nil)
	if doc := read(rc); doc["parameter_servers"] != nil {
		t.Errorf("parameter_servers not deleted: %v", doc["parameter_servers"])
	}
}
