//go:build unix

package checkpoint

import (
	"fmt"
	"os"
	"syscall"
)

// mapFile maps size bytes of f read-only: pages are read from the page
// cache as they are touched, so a checkpoint costs a process the tensors
// it decodes, not its size.
func mapFile(f *os.File, size int64) ([]byte, error) {
	if int64(int(size)) != size {
		return nil, fmt.Errorf("%d bytes do not fit this machine's address space", size)
	}
	return syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
}

func unmapFile(b []byte) error { return syscall.Munmap(b) }
