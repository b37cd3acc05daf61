package launcher

import (
	"strings"
	"time"
)

// errorPrefix starts the line a pipetrain process prints when it fails
// (cmd/pipetrain's main: "pipetrain: <err>").
const errorPrefix = "pipetrain: "

// modulePrefix starts the functions of pipetrain's own packages in a Go
// stack trace; package main's start with "main.".
const modulePrefix = "github.com/pipetrain/pipetrain/"

// reason follows a stage process's output for the line that says why it
// failed: its error line, or the first line of a panic (or a Go runtime
// fatal error) and the first frame of the trace in pipetrain's code. The
// process's last line is often not it: a panic ends with its stack trace, an
// error of several problems with the last of them.
type reason struct {
	errLine string // the latest error line, prefix cut, with its continuation lines
	errOpen bool   // nothing but errLine's continuation has come since it

	panicLine string
	frame     string // "pkg.Func at /path/file.go:12": the first frame in pipetrain's code
	fn        string // a pipetrain function line of the trace, awaiting its file line

	at time.Time // when the error or panic line came
}

// add notes one line of the process's output (status lines excluded).
func (r *reason) add(line string) {
	switch {
	case r.panicLine != "":
		r.traceLine(line)
	case strings.HasPrefix(line, "panic: "), strings.HasPrefix(line, "fatal error: "):
		r.panicLine, r.at = line, time.Now()
	case strings.HasPrefix(line, errorPrefix):
		r.errLine, r.errOpen, r.at = strings.TrimPrefix(line, errorPrefix), true, time.Now()
	case r.errOpen && (strings.HasPrefix(line, " ") || strings.HasPrefix(line, "\t")):
		// A list of problems: "cfg.yaml: 2 problems:" then one indented line each.
		sep := "; "
		if strings.HasSuffix(r.errLine, ":") {
			sep = " "
		}
		r.errLine += sep + strings.TrimSpace(line)
	default:
		r.errOpen = false
	}
}

// traceLine reads a line of a panic's stack trace: function lines
// ("pkg.F(args)"), each followed by its file line ("\t/path/f.go:12 +0x1f").
func (r *reason) traceLine(line string) {
	if r.frame != "" {
		return
	}
	if file, ok := strings.CutPrefix(line, "\t"); ok {
		if r.fn != "" {
			file, _, _ = strings.Cut(file, " +0x")
			r.frame = r.fn + " at " + file
		}
		return
	}
	r.fn = ""
	if strings.HasPrefix(line, modulePrefix) || strings.HasPrefix(line, "main.") {
		fn := strings.TrimPrefix(line, modulePrefix)
		if i := strings.LastIndexByte(fn, '('); i > 0 {
			fn = fn[:i] // the arguments
		}
		r.fn = fn
	}
}

// String is the reason, "" when the output gave none (the process was
// killed, or printed its error in another form).
func (r *reason) String() string {
	switch {
	case r.panicLine != "" && r.frame != "":
		return r.panicLine + " (in " + r.frame + ")"
	case r.panicLine != "":
		return r.panicLine
	case r.errOpen:
		return r.errLine
	}
	return ""
}

// saidAt is when the process said why it failed; zero if it did not.
func (r *reason) saidAt() time.Time {
	if r.String() == "" {
		return time.Time{}
	}
	return r.at
}

// repeatsPrefix starts the line a stage process prints after its error line
// when a restart from a checkpoint would fail the same way (it then exits
// with ExitRepeats); the rest of the line says why, for the launcher to
// repeat. Like status lines, it goes to the stage's log, not the terminal.
const repeatsPrefix = "pipetrain-repeats:"

// FormatRepeats is the line a stage process prints when a restart would fail
// as it did; why completes "stage 0 ...", e.g. "ran out of disk space in
// runs/x".
func FormatRepeats(why string) string { return repeatsPrefix + " " + why }

// parseRepeats reads a line printed by FormatRepeats.
func parseRepeats(line string) (why string, ok bool) {
	why, ok = strings.CutPrefix(line, repeatsPrefix)
	return strings.TrimSpace(why), ok
}
