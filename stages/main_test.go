package stages

import (
	"os"
	"testing"

	"github.com/pipetrain/pipetrain/transport"
)

// Every test runs with released tensors poisoned: a stage that used a received
// tensor after handing it back would compute NaNs and fail its comparison.
func TestMain(m *testing.M) {
	transport.PoisonReleased(true)
	os.Exit(m.Run())
}
