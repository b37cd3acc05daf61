package data

import (
	"os"
	"syscall"
	"unsafe"
)

// releaseAbove is the size of mapping that release drops from the resident
// set after each read. A smaller file stays resident as it is read: its
// pages cost the process at most their size, and dropping them would cost a
// page fault per row or window read again (a tenth of the demo's first
// stage, measured on Fashion-MNIST's 47 MB of images).
const releaseAbove = 64 << 20

// release drops the pages of mapped, a whole mapping of mapFile, from the
// process's resident set when the mapping is larger than releaseAbove. The
// kernel maps a file's pages around each one a read touches (whole large
// folios, up to 2 MiB), so a run reading windows or rows spread over a
// large file would otherwise count most of the file in its resident set as
// it goes. The pages stay in the page cache: a later read of them is a
// minor fault.
func release(mapped []byte) {
	if len(mapped) < releaseAbove {
		return
	}
	page := uintptr(os.Getpagesize())
	start := uintptr(unsafe.Pointer(unsafe.SliceData(mapped)))
	end := (start + uintptr(len(mapped)) + page - 1) &^ (page - 1)
	// The mapping starts on a page and spans whole pages: the range is its
	// own, never a neighbour's.
	syscall.Syscall(syscall.SYS_MADVISE, start, end-start, syscall.MADV_DONTNEED)
}
