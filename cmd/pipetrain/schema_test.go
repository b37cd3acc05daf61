package main

import (
	"os"
	"testing"
)

// TestSchemaPrintsTheCommittedSchema: pipetrain schema prints exactly
// configs/pipetrain.schema.json, so the command the docs give to regenerate
// it writes nothing else into the file.
func TestSchemaPrintsTheCommittedSchema(t *testing.T) {
	out, err := runCommand(t, newRoot(), "schema")
	if err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile("../../configs/pipetrain.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	if out != string(want) {
		t.Errorf("pipetrain schema differs from configs/pipetrain.schema.json; run `go run ./cmd/pipetrain schema > configs/pipetrain.schema.json`")
	}
}
