//go:build unix

package data

import (
	"fmt"
	"os"
	"syscall"
)

// mapFile maps the file name read-only into memory: its bytes are read from
// the page cache as they are touched, so a token file of any size costs the
// process only the pages a run reads, and those the kernel may drop again.
// The mapping lives until unmap; an empty file maps to no bytes.
func mapFile(name string) ([]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := info.Size()
	if size == 0 {
		return nil, nil
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("%s: %d bytes do not fit this machine's address space", name, size)
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("%s: mapping into memory: %w", name, err)
	}
	return b, nil
}

// unmap releases a mapping of mapFile.
func unmap(b []byte) error {
	if b == nil {
		return nil
	}
	return syscall.Munmap(b)
}
