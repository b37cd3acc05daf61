package transport

import (
	"encoding/json"
	"fmt"
	"slices"
)

// Hello is exchanged once when a stream opens (the handshake), so that two
// stages started from different configs fail at once with a clear message
// instead of exchanging tensors they would misread.
type Hello struct {
	Stage        int    // sender's stage index
	Stages       int    // total stages in the run
	ConfigDigest string // hex digest of the run's config; must match
	Address      string // sender's listen address (for messages)
	DType        DType  // dtype of tensors on this link
	Shape        []int  // shape of one activation message on this link (the gradient has the same shape)
}

// name is how errors refer to a stage: "stage 2 (127.0.0.1:7102)".
func (h Hello) name() string {
	if h.Address == "" {
		return fmt.Sprintf("stage %d", h.Stage)
	}
	return fmt.Sprintf("stage %d (%s)", h.Stage, h.Address)
}

// validate checks a local hello before it is used for a link.
func (h Hello) validate() error {
	if h.Stages < 2 || h.Stage < 0 || h.Stage >= h.Stages {
		return fmt.Errorf("stage %d of %d: a link needs 0 <= stage < stages and at least 2 stages", h.Stage, h.Stages)
	}
	t := Tensor{Kind: Activation, DType: h.DType, Shape: h.Shape}
	if _, err := t.payloadSize(); err != nil {
		return fmt.Errorf("stage %d: link dtype/shape: %w", h.Stage, err)
	}
	return nil
}

// HandshakeError is a refused handshake. Both ends of the link return one
// with the same text, which names both stages.
type HandshakeError struct{ Msg string }

func (e *HandshakeError) Error() string { return e.Msg }

// CheckPeer verifies a remote hello against the local one for the link.
// dialer says whether the local side dialed (is the upstream stage). Rules:
// the dialer is the listener's upstream neighbour, and the stage count, config
// digest, dtype and shape are equal. In messages the remote value comes first:
//
//	stage 2 (127.0.0.1:7102) refused stage 1 (127.0.0.1:7101): config digest 3fa2c1 differs from 9b01de
func CheckPeer(local, remote Hello, dialer bool) error {
	refuse := func(format string, args ...any) error {
		return &HandshakeError{fmt.Sprintf("%s refused %s: ", local.name(), remote.name()) + fmt.Sprintf(format, args...)}
	}
	switch {
	case remote.Stages != local.Stages:
		return refuse("stage count %d differs from %d", remote.Stages, local.Stages)
	case dialer && remote.Stage != local.Stage+1:
		return refuse("expected downstream neighbour stage %d", local.Stage+1)
	case !dialer && remote.Stage != local.Stage-1:
		return refuse("only upstream neighbour stage %d may connect", local.Stage-1)
	case remote.ConfigDigest != local.ConfigDigest:
		return refuse("config digest %s differs from %s (started from different configs or overrides)", short(remote.ConfigDigest), short(local.ConfigDigest))
	case remote.DType != local.DType || !slices.Equal(remote.Shape, local.Shape):
		return refuse("activation shape %v %s differs from %v %s", remote.Shape, remote.DType, local.Shape, local.DType)
	}
	return nil
}

// handshake is the first message in each direction. The listener answers
// with its own hello, or with Refused set before it ends the stream.
type handshake struct {
	Hello   Hello  `json:"hello"`
	Refused string `json:"refused,omitempty"`
}

// handshakeMagic differs from the tensor magic, so a stray frame of the
// wrong type is reported rather than misread.
const handshakeMagic = "PTH\x00"

func (h *handshake) marshal() []byte {
	b, err := json.Marshal(h)
	if err != nil {
		panic(err) // plain struct of strings and ints: cannot fail
	}
	return append([]byte(handshakeMagic), b...)
}

func (h *handshake) unmarshal(b []byte) error {
	if len(b) < len(handshakeMagic) || string(b[:len(handshakeMagic)]) != handshakeMagic {
		return fmt.Errorf("protocol error: expected a handshake message, got %d bytes starting %q", len(b), b[:min(len(b), 4)])
	}
	if err := json.Unmarshal(b[len(handshakeMagic):], h); err != nil {
		return fmt.Errorf("protocol error: bad handshake message: %w", err)
	}
	return nil
}

// short abbreviates a digest for messages, as git does.
func short(digest string) string {
	if len(digest) > 12 {
		return digest[:12]
	}
	return digest
}
