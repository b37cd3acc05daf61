package checkpoint

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// A weights file is followed on disk by its checksum file, "HEX BYTES" (the
// SHA-256 and size of the whole file), written after it: a checkpoint part
// (stage-0.safetensors, stage-0.sha256) as a run's final weights and an
// export. Whatever reads the weights back checks them against it, so a file
// changed since it was written (a flipped bit, a value edited in) is refused
// by name rather than trained from, sampled or exported.

// ErrNoChecksum is VerifyFile's error for a file without a checksum file
// beside it: one written by something else (PyTorch), or by pipetrain before
// final weights had checksums.
var ErrNoChecksum = errors.New("no checksum file")

// SumPath is the checksum file of the weights file path:
// stage-0.safetensors's is stage-0.sha256.
func SumPath(path string) string {
	return strings.TrimSuffix(path, ".safetensors") + ".sha256"
}

// WriteChecked writes tensors and meta to path as Write does, then its
// checksum file, both atomically, and returns the file's SHA-256 and size.
func WriteChecked(path string, tensors []Tensor, meta map[string]string) (sum string, size int64, err error) {
	sum, err = WriteSum(path, tensors, meta)
	if err != nil {
		return "", 0, err
	}
	st, err := os.Stat(path)
	if err != nil {
		return "", 0, err
	}
	err = WriteAtomic(SumPath(path), func(w io.Writer) error {
		_, err := fmt.Fprintf(w, "%s %d\n", sum, st.Size())
		return err
	})
	return sum, st.Size(), err
}

// readSumFile reads the checksum file of the weights file path.
func readSumFile(path string) (sum string, size int64, err error) {
	b, err := os.ReadFile(SumPath(path))
	if err != nil {
		return "", 0, err
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return "", 0, fmt.Errorf("%s: malformed checksum file", SumPath(path))
	}
	size, err = strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return "", 0, fmt.Errorf("%s: malformed checksum file: %w", SumPath(path), err)
	}
	return f[0], size, nil
}

// VerifyFile checks the weights file path against its checksum file. A
// file without one gives an error wrapping ErrNoChecksum; one that does not
// match, an error naming both files.
func VerifyFile(path string) error {
	want, wantSize, err := readSumFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%s: %w (%s)", path, ErrNoChecksum, SumPath(path))
	}
	if err != nil {
		return err
	}
	got, size, err := fileSum(path)
	if err != nil {
		return err
	}
	if got != want || size != wantSize {
		return fmt.Errorf("%s: checksum mismatch (%d bytes, sha256 %.12s; %s says %d bytes, %.12s): the file changed since it was written", path, size, got, SumPath(path), wantSize, want)
	}
	return nil
}

// VerifyFiles checks each of files against its checksum file and returns
// those that have none, for the caller to say they went unchecked; a
// mismatch is an error.
func VerifyFiles(files []string) (unchecked []string, err error) {
	for _, f := range files {
		err := VerifyFile(f)
		switch {
		case errors.Is(err, ErrNoChecksum):
			unchecked = append(unchecked, f)
		case err != nil:
			return nil, err
		}
	}
	return unchecked, nil
}

// MissingSums lists those of files that have no checksum file beside them.
func MissingSums(files []string) []string {
	var out []string
	for _, f := range files {
		if _, err := os.Stat(SumPath(f)); errors.Is(err, os.ErrNotExist) {
			out = append(out, f)
		}
	}
	return out
}
