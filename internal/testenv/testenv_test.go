package testenv

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// ending records how RequireOrSkip ended a test instead of ending this one.
type ending struct {
	testing.TB
	fatal, skip string
}

func (e *ending) Helper() {}

func (e *ending) Fatalf(format string, args ...any) {
	e.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func (e *ending) Skipf(format string, args ...any) {
	e.skip = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// end runs RequireOrSkip on its own goroutine, as the testing package runs a
// test, so that the Goexit of Fatalf or Skipf ends only that goroutine.
func end(t *testing.T) *ending {
	e := &ending{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		RequireOrSkip(e, "prometheus", "promtool not found")
	}()
	<-done
	return e
}

func TestRequireOrSkipSkipsByDefault(t *testing.T) {
	t.Setenv(RequireAllEnv, "")
	e := end(t)
	if e.fatal != "" || !strings.Contains(e.skip, "needs prometheus: promtool not found") {
		t.Errorf("without %s: skip %q, fatal %q; want a skip naming the part and why", RequireAllEnv, e.skip, e.fatal)
	}
}

func TestRequireOrSkipFailsWhenAllAreRequired(t *testing.T) {
	t.Setenv(RequireAllEnv, "1")
	e := end(t)
	if e.skip != "" || !strings.Contains(e.fatal, "needs prometheus") || !strings.Contains(e.fatal, RequireAllEnv+"=1") || !strings.Contains(e.fatal, "promtool not found") {
		t.Errorf("with %s=1: skip %q, fatal %q; want a failure naming the part, the variable and why", RequireAllEnv, e.skip, e.fatal)
	}
}
