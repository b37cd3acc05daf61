//go:build !linux

package data

// release leaves the pages of a mapping to the system where pipetrain does
// not ask it to drop them (see the Linux version).
func release([]byte) {}
