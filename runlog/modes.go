package runlog

import (
	"io/fs"
	"os"
	"sync/atomic"
)

// The permissions of what a run writes. A run directory holds the model's
// weights and checkpoints, the training log and the data's losses: on a
// host shared with other users, nobody else should read them unless the
// run's owner says so. Every writer of a run directory (the stages, the
// launcher, the checkpoints, the gather at rank 0) takes its modes from
// here, not from literals of its own.
const (
	// PrivateDir and PrivateFile are the modes by default: the owner alone.
	PrivateDir  fs.FileMode = 0o700
	PrivateFile fs.FileMode = 0o600
	// SharedDir and SharedFile are the modes with run_dir_mode: shared
	// (--share-run-dir): every user may read and list, as before run
	// directories were private. A group is narrowed to by the folder the
	// run directory is in, which pipetrain does not create.
	SharedDir  fs.FileMode = 0o755
	SharedFile fs.FileMode = 0o644
)

// The run_dir_mode values.
const (
	ModePrivate = "private"
	ModeShared  = "shared"
)

// shared is process-wide: a pipetrain process writes one run directory,
// and its writers are spread over packages that know nothing of its config.
var shared atomic.Bool

// ShareRunDirs sets whether what this process writes from now on is
// readable by other users (run_dir_mode: shared) or by its owner alone.
func ShareRunDirs(share bool) { shared.Store(share) }

// DirMode is the mode a folder of a run directory is created with (the
// umask may take bits away, never add them).
func DirMode() fs.FileMode {
	if shared.Load() {
		return SharedDir
	}
	return PrivateDir
}

// FileMode is the mode a file of a run directory is created with.
func FileMode() fs.FileMode {
	if shared.Load() {
		return SharedFile
	}
	return PrivateFile
}

// MkdirAll creates dir and its missing parents with DirMode. Folders that
// exist keep their mode: their owner chose it.
func MkdirAll(dir string) error { return os.MkdirAll(dir, DirMode()) }
