//go:build !unix

package data

import "os"

// mapFile reads the file whole where the system offers no mmap through
// package syscall: token files then cost their size in memory.
func mapFile(name string) ([]byte, error) { return os.ReadFile(name) }

// unmap releases what mapFile returned.
func unmap([]byte) error { return nil }
