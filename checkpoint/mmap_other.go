//go:build !unix

package checkpoint

import (
	"io"
	"os"
)

// mapFile reads f whole where the system offers no mmap through package
// syscall: a checkpoint then costs its size in memory.
func mapFile(f *os.File, size int64) ([]byte, error) {
	b := make([]byte, size)
	_, err := io.ReadFull(f, b)
	return b, err
}

func unmapFile([]byte) error { return nil }
