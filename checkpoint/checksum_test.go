package checkpoint

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestReadAllChecksWeights: ReadAll, which sample reads a run's weights
// with, refuses a file that no longer matches its checksum file, naming it,
// and reads one without a checksum file, which MissingSums names.
func TestReadAllChecksWeights(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "stage-0.safetensors"), filepath.Join(dir, "stage-1.safetensors")
	if _, _, err := WriteChecked(a, []Tensor{{Name: "w", Shape: []int{2}, F32: []float32{1, 2}}}, map[string]string{"stage": "0"}); err != nil {
		t.Fatal(err)
	}
	if err := Write(b, []Tensor{{Name: "v", Shape: []int{1}, F32: []float32{3}}}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadAll(dir); err != nil {
		t.Fatalf("weights matching their checksums: %v", err)
	}
	if got := MissingSums([]string{a, b}); !slices.Equal(got, []string{b}) {
		t.Errorf("MissingSums = %v, want %v", got, []string{b})
	}
	if err := VerifyFile(b); !errors.Is(err, ErrNoChecksum) {
		t.Errorf("VerifyFile of a file without a checksum file: %v", err)
	}
	data, _ := os.ReadFile(a)
	data[len(data)-1] ^= 0x40
	if err := os.WriteFile(a, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadAll(dir); err == nil || !strings.Contains(err.Error(), a+": checksum mismatch") || !strings.Contains(err.Error(), "stage-0.sha256") {
		t.Errorf("ReadAll of a changed file: %v", err)
	}
}
