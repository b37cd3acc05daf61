package main

import (
	"encoding/binary"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDataInspect: inspect names each file's format, dtype, header version,
// token count, Megatron documents and token id range, a NumPy array's dtype
// and shape, and refuses a shard whose header disagrees with its length.
func TestDataInspect(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	u16 := func(b []byte, vs ...uint16) []byte {
		for _, v := range vs {
			b = binary.LittleEndian.AppendUint16(b, v)
		}
		return b
	}
	header := make([]byte, 1024)
	binary.LittleEndian.PutUint32(header[0:], 20240520)
	binary.LittleEndian.PutUint32(header[4:], 1)
	binary.LittleEndian.PutUint32(header[8:], 5)
	shard := write("shard.bin", u16(header, 50256, 7, 300, 12, 50256))
	short := write("short.bin", u16(header, 1, 2))

	idx := []byte("MMIDIDX\x00\x00")
	for _, v := range []uint64{1} {
		idx = binary.LittleEndian.AppendUint64(idx, v)
	}
	idx = append(idx, 8) // uint16
	for _, v := range []uint64{3, 3} {
		idx = binary.LittleEndian.AppendUint64(idx, v) // 3 sequences, 2 documents and the leading 0
	}
	for _, v := range []uint32{2, 1, 3} {
		idx = binary.LittleEndian.AppendUint32(idx, v)
	}
	for _, v := range []uint64{0, 4, 6, 0, 2, 3} {
		idx = binary.LittleEndian.AppendUint64(idx, v)
	}
	write("doc.idx", idx)
	pair := write("doc.bin", u16(nil, 9, 8, 7, 6, 5, 4))

	head := "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }"
	head += strings.Repeat(" ", 64-(10+len(head)+1)%64) + "\n"
	npy := binary.LittleEndian.AppendUint16([]byte("\x93NUMPY\x01\x00"), uint16(len(head)))
	features := write("x.npy", append(append(npy, head...), make([]byte, 24)...))

	out, err := runCommand(t, newRoot(), "data", "inspect", shard, filepath.Join(dir, "doc.idx"), features)
	if err != nil {
		t.Fatal(err)
	}
	want := shard + ": llm.c version 1, uint16, 5 tokens, token ids 7 to 50256\n" +
		pair + ": megatron version 1, uint16, 6 tokens, 2 documents in 3 sequences, token ids 4 to 9\n" +
		features + ": npy, dtype <f4, shape [2 3]\n"
	if out != want {
		t.Errorf("inspect printed\n%s\nwant\n%s", out, want)
	}
	if _, err := runCommand(t, newRoot(), "data", "inspect", short); err == nil || !strings.Contains(err.Error(), short+": file too short: the header says 5 tokens") {
		t.Errorf("short shard: err = %v", err)
	}
}

// TestDataInspectArrays: with --array, inspect reads each argument as
// data.dataset arrays does: a labels array's dtype, shape and examples per
// label, a features array's dtype and shape.
func TestDataInspectArrays(t *testing.T) {
	dir := t.TempDir()
	npy := func(name, descr, shape string, payload []byte) string {
		head := "{'descr': '" + descr + "', 'fortran_order': False, 'shape': (" + shape + "), }"
		head += strings.Repeat(" ", 64-(10+len(head)+1)%64) + "\n"
		b := binary.LittleEndian.AppendUint16([]byte("\x93NUMPY\x01\x00"), uint16(len(head)))
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, append(append(b, head...), payload...), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	var labels []byte
	for _, l := range []int64{2, 0, 2, 7, 2} {
		labels = binary.LittleEndian.AppendUint64(labels, uint64(l))
	}
	y := npy("y.npy", "<i8", "5,", labels)
	x := npy("x.npy", "|u1", "5, 4", make([]byte, 20))
	out, err := runCommand(t, newRoot(), "data", "inspect", "--array", y, x)
	if err != nil {
		t.Fatal(err)
	}
	want := y + ": int64, shape [5], 3 labels (0: 1, 2: 3, 7: 1)\n" + x + ": uint8, shape [5 4]\n"
	if out != want {
		t.Errorf("inspect --array printed\n%s\nwant\n%s", out, want)
	}
}
