package transport

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/pipetrain/pipetrain/internal/words"
)

// Group says which axis of the process grid a link runs along.
type Group uint8

const (
	PipelineGroup Group = iota // neighbouring stages of one replica (the zero value: today's links)
	ReplicaGroup               // the same stage of neighbouring replicas: the data-parallel ring
)

func (g Group) String() string {
	switch g {
	case PipelineGroup:
		return "pipeline"
	case ReplicaGroup:
		return "replica ring"
	}
	return fmt.Sprintf("group %d", uint8(g))
}

// Hello is exchanged once when a stream opens (the handshake), so that two
// stages started from different configs fail at once with a clear message
// instead of exchanging tensors they would misread.
//
// A stage process may hold several model chunks (interleaved schedules with
// v virtual stages per process); one link then carries the tensors of every
// chunk, told apart by Tensor.Chunk, and Shapes has one entry per chunk. A
// plain pipeline has one chunk and one entry.
//
// With data parallelism the processes form a grid of stages × replicas.
// Group says which of a process's links the hello is for: a pipeline link
// joins neighbouring stages of one replica, a replica-ring link the same
// stage of neighbouring replicas.
type Hello struct {
	Stage        int    // sender's stage index
	Stages       int    // total stages in the run
	ConfigDigest string // hex digest of the run's config; must match
	Address      string // sender's listen address (for messages)
	DType        DType  // dtype of tensors on this link
	// Shapes[c] is the shape of one activation message of chunk c
	// (Tensor.Chunk == c) on this link; chunk c's gradient messages have the
	// same shape. Both sides must agree on the whole list.
	Shapes [][]int
	// Ring says that the run uses the ring link of interleaved schedules: the
	// last stage (Stages-1) also dials stage 0, to send its chunk-c output to
	// stage 0's chunk c+1. Both sides of every link must agree on it.
	Ring bool
	// Group is the axis the link runs along; both sides must agree on it.
	Group Group
	// Replica is the sender's data-parallel replica, 0 without data
	// parallelism, and Replicas the number of replicas of the pipeline (0
	// and 1 both mean none). Replica ring link r dials replica (r+1)%Replicas
	// of the same stage.
	Replica  int
	Replicas int
	// Kernels names the matrix kernels the sender computes with
	// (internal/blas.KernelSet: "OpenBLAS Haswell", "gonum"), which change
	// a product's last bits: both sides must agree on it. "" says nothing
	// (a process that computes nothing the run's results depend on).
	Kernels string
	// StreamSocket is, in a replica ring listener's answer, the abstract
	// Unix socket ("@pipetrain-ring-...") on which it also takes ring
	// streams (streamsock.go): a dialer on the same host reaches it there
	// instead of over TCP. "" says it has none. It is not compared.
	StreamSocket string
}

// who is how messages refer to a process without its address: "stage 2",
// or "stage 2 replica 1" with data parallelism.
func (h Hello) who() string {
	if h.replicas() > 1 {
		return fmt.Sprintf("stage %d replica %d", h.Stage, h.Replica)
	}
	return fmt.Sprintf("stage %d", h.Stage)
}

// name is how errors refer to a stage: "stage 2 (127.0.0.1:7102)", or
// "stage 2 replica 1 (127.0.0.1:7102)" with data parallelism.
func (h Hello) name() string {
	if h.Address == "" {
		return h.who()
	}
	return fmt.Sprintf("%s (%s)", h.who(), h.Address)
}

// replicas is Replicas with 0 (unset) read as 1, so that the two spellings
// of "no data parallelism" compare equal.
func (h Hello) replicas() int {
	if h.Replicas == 0 {
		return 1
	}
	return h.Replicas
}

// clone deep-copies h, so a link never shares Shapes with its caller.
func (h Hello) clone() Hello {
	if old := h.Shapes; old != nil {
		h.Shapes = make([][]int, len(old))
		for i, s := range old {
			h.Shapes[i] = slices.Clone(s)
		}
	}
	return h
}

// downstream is the neighbour h dials (the one it sends activations to), or
// -1 if it has none. On a pipeline link it is a stage: stage+1, or 0 from the
// last stage with the ring link. On the replica ring it is a replica of the
// same stage: (replica+1) mod replicas.
func (h Hello) downstream() int {
	if h.Group == ReplicaGroup {
		if r := h.replicas(); r >= 2 {
			return ((h.Replica+1)%r + r) % r
		}
		return -1
	}
	switch {
	case h.Stage < h.Stages-1:
		return h.Stage + 1
	case h.Ring:
		return 0
	}
	return -1
}

// upstream is the neighbour that dials h, or -1 if there is none: on a
// pipeline link stage-1, or the last stage for stage 0 with the ring link; on
// the replica ring replica (replica-1) mod replicas of the same stage.
func (h Hello) upstream() int {
	if h.Group == ReplicaGroup {
		if r := h.replicas(); r >= 2 {
			return ((h.Replica-1)%r + r) % r
		}
		return -1
	}
	switch {
	case h.Stage > 0:
		return h.Stage - 1
	case h.Ring:
		return h.Stages - 1
	}
	return -1
}

// neighbour names the neighbour with index n along h's group, as returned
// by upstream or downstream: "stage 2", "stage 2 replica 1" on a pipeline
// link with data parallelism, "replica 1 of stage 2" on the replica ring.
func (h Hello) neighbour(n int) string {
	switch {
	case h.Group == ReplicaGroup:
		return fmt.Sprintf("replica %d of stage %d", n, h.Stage)
	case h.replicas() > 1:
		return fmt.Sprintf("stage %d replica %d", n, h.Replica)
	}
	return fmt.Sprintf("stage %d", n)
}

// validate checks a local hello before it is used for a link.
func (h Hello) validate() error {
	switch h.Group {
	case PipelineGroup:
		if h.Stages < 2 || h.Stages > math.MaxInt32 || h.Stage < 0 || h.Stage >= h.Stages {
			return fmt.Errorf("stage %d of %d: a link needs 0 <= stage < stages and at least 2 stages", h.Stage, h.Stages)
		}
		if h.Replicas < 0 || h.Replicas > math.MaxInt32 || h.Replica < 0 || h.Replica >= h.replicas() {
			return fmt.Errorf("stage %d replica %d of %d: a link needs 0 <= replica < replicas", h.Stage, h.Replica, h.Replicas)
		}
	case ReplicaGroup:
		// A one-stage pipeline has no pipeline links but may have replicas.
		if h.Stages < 1 || h.Stages > math.MaxInt32 || h.Stage < 0 || h.Stage >= h.Stages {
			return fmt.Errorf("stage %d of %d: a replica ring link needs 0 <= stage < stages", h.Stage, h.Stages)
		}
		if h.Replicas < 2 || h.Replicas > math.MaxInt32 || h.Replica < 0 || h.Replica >= h.Replicas {
			return fmt.Errorf("stage %d replica %d of %d: a replica ring link needs 0 <= replica < replicas and at least 2 replicas", h.Stage, h.Replica, h.Replicas)
		}
	default:
		return fmt.Errorf("%s: unknown link group %d", h.who(), uint8(h.Group))
	}
	if len(h.Shapes) == 0 {
		return fmt.Errorf("%s: the link has no activation shapes (Hello.Shapes needs one per model chunk)", h.who())
	}
	if len(h.Shapes) > maxHelloChunks {
		return fmt.Errorf("%s: the link has %d message shapes, more than the %d a handshake may carry (fewer, larger all-reduce buckets need fewer)", h.who(), len(h.Shapes), maxHelloChunks)
	}
	if len(h.ConfigDigest) > maxHelloText || len(h.Address) > maxHelloText || len(h.Kernels) > maxHelloText || len(h.StreamSocket) > maxHelloText {
		return fmt.Errorf("%s: config digest (%d bytes), address (%d bytes), kernels (%d bytes) or stream socket (%d bytes) is longer than the %d bytes a handshake carries",
			h.who(), len(h.ConfigDigest), len(h.Address), len(h.Kernels), len(h.StreamSocket), maxHelloText)
	}
	for c, s := range h.Shapes {
		t := Tensor{Kind: Activation, DType: h.DType, Shape: s}
		if _, err := t.payloadSize(); err != nil {
			return fmt.Errorf("%s: link dtype/shape of chunk %d: %w", h.who(), c, err)
		}
	}
	return nil
}

// HandshakeError is a refused handshake. Both ends of the link return one
// with the same text, which names both stages.
type HandshakeError struct{ Msg string }

func (e *HandshakeError) Error() string { return e.Msg }

// CheckPeer verifies a remote hello against the local one for the link.
// dialer says whether the local side dialed (is the upstream neighbour).
// Both sides must be on the same Group. On a pipeline link the stage count,
// Ring, the replica count and the replica are equal, and the dialer is the
// listener's upstream neighbour (dialer.Stage == listener.Stage-1, or with
// Ring the last stage dialing stage 0). On the replica ring the stage count,
// Ring, the stage and the replica count are equal, and the dialer is the
// listener's upstream replica (listener.Replica == (dialer.Replica+1) mod
// Replicas). On both, the config digest, the matrix kernels, dtype and the
// per-chunk shape list are equal. In messages the remote value comes first:
//
//	stage 2 (127.0.0.1:7102) refused stage 1 (127.0.0.1:7101): config digest 3fa2c1 differs from 9b01de
//	stage 2 (127.0.0.1:7102) refused stage 1 (127.0.0.1:7101): chunk 1 activation shape [32 256] float32 differs from [32 128] float32
//	stage 0 replica 2 (127.0.0.1:7202) refused stage 0 replica 0 (127.0.0.1:7200): only upstream neighbour replica 1 of stage 0 may connect
func CheckPeer(local, remote Hello, dialer bool) error {
	refuse := func(format string, args ...any) error {
		return &HandshakeError{fmt.Sprintf("%s refused %s: ", local.name(), remote.name()) + fmt.Sprintf(format, args...)}
	}
	if remote.Group != local.Group {
		d, l := remote.Group, local.Group
		if dialer {
			d, l = l, d
		}
		return refuse("link group %s differs from %s (a %s dialer reached a %s listener)", remote.Group, local.Group, d, l)
	}
	if remote.Stages != local.Stages {
		return refuse("stage count %d differs from %d", remote.Stages, local.Stages)
	}
	if remote.Ring != local.Ring {
		return refuse("ring %t differs from %t (whether stage %d also dials stage 0 for an interleaved schedule)", remote.Ring, local.Ring, local.Stages-1)
	}
	if remote.replicas() != local.replicas() {
		return refuse("replica count %d differs from %d", remote.replicas(), local.replicas())
	}
	if local.Group == ReplicaGroup {
		if remote.Stage != local.Stage {
			return refuse("stage %d differs from %d: the replica ring joins the replicas of one stage", remote.Stage, local.Stage)
		}
	} else if remote.Replica != local.Replica {
		return refuse("replica %d differs from %d: stage %d of one replica links only to its neighbour of the same replica", remote.Replica, local.Replica, local.Stage)
	}
	peer := remote.Stage
	if local.Group == ReplicaGroup {
		peer = remote.Replica
	}
	if dialer {
		switch want := local.downstream(); {
		case want < 0 && local.Group == ReplicaGroup:
			return refuse("%s has no replica ring with %d replica(s)", local.who(), local.replicas())
		case want < 0:
			return refuse("stage %d is the last stage and has no downstream neighbour without the ring link", local.Stage)
		case peer != want:
			return refuse("expected downstream neighbour %s", local.neighbour(want))
		}
	} else {
		switch want := local.upstream(); {
		case want < 0 && local.Group == ReplicaGroup:
			return refuse("%s has no replica ring with %d replica(s)", local.who(), local.replicas())
		case want < 0:
			return refuse("no upstream neighbour may connect to stage %d without the ring link", local.Stage)
		case peer != want:
			return refuse("only upstream neighbour %s may connect", local.neighbour(want))
		}
	}
	if remote.ConfigDigest != local.ConfigDigest {
		return refuse("config digest %s differs from %s (started from different configs or overrides)", short(remote.ConfigDigest), short(local.ConfigDigest))
	}
	if remote.Kernels != local.Kernels {
		return refuse("matrix kernels %q differ from %q: they round differently, so the run would not equal its reference (give every host the same with compute.blas_kernels: a core type all their CPUs run, such as Haswell)", remote.Kernels, local.Kernels)
	}
	if len(remote.Shapes) != len(local.Shapes) {
		return refuse("chunk count %d differs from %d (activation shapes %v vs %v)", len(remote.Shapes), len(local.Shapes), remote.Shapes, local.Shapes)
	}
	for c := range local.Shapes {
		if remote.DType != local.DType || !slices.Equal(remote.Shapes[c], local.Shapes[c]) {
			return refuse("chunk %d activation shape %v %s differs from %v %s", c, remote.Shapes[c], remote.DType, local.Shapes[c], local.DType)
		}
	}
	return nil
}

// handshake is the first message in each direction. The listener answers
// with its own hello, or with Refused set before it ends the stream.
type handshake struct {
	Hello   Hello
	Refused string
}

// Handshake wire format, all integers little-endian:
//
//	magic    [3]byte "PTH"
//	version  uint8   (2)
//	flags    uint8   bit 0: Ring; bit 7: kernels follow the refusal; bit 6: the
//	                 stream socket follows them; the other bits are zero
//	dtype    uint8
//	group    uint8   0 pipeline, 1 replica ring
//	stage    int32
//	stages   int32
//	replica  int32
//	replicas int32   as given: 0 and 1 both mean no data parallelism
//	digest   uint32 length, then the bytes of ConfigDigest
//	address  uint32 length, then the bytes of Address
//	refused  uint32 length, then the bytes of Refused
//	kernels  with flag bit 7 only: uint32 length (>= 1), then the bytes of Kernels
//	socket   with flag bit 6 only: uint32 length (>= 1), then the bytes of StreamSocket
//	chunks   uint32 count, then per chunk:
//	           rank uint8 (<= MaxRank), dims rank × int64 (each >= 0)
//
// and nothing after. Every field has one encoding, so a decoded handshake
// re-encodes to exactly the same bytes. Version 0 was the JSON handshake of
// builds before per-chunk shapes ("PTH\x00" then JSON), version 1 this
// format without group, replica and replicas (builds before data
// parallelism): such a peer is refused with an "unsupported handshake
// version" message on this side, and it reports an unsupported version or a
// non-handshake message on its side, never misreads one.
const (
	handshakeMagic   = "PTH"
	handshakeVersion = 2
	handshakeFixed   = 3 + 1 + 1 + 1 + 1 + 4*4

	flagRing    = 1 << 0
	flagKernels = 1 << 7 // a build before Hello.Kernels refuses it as an unknown flag
	// flagStreamSocket: a build before Hello.StreamSocket refuses it too.
	flagStreamSocket = 1 << 6
)

// Handshake bounds. A listener decodes a hello before it knows the sender
// is its neighbour (a process holding the token may send anything), so each
// field has a limit that is checked before anything is allocated for it.
const (
	// maxHelloText bounds the config digest, the address, the kernels and
	// the stream socket: a digest is 64 hex digits, an address a host name
	// of at most 253 bytes and a port, or a Unix socket path of at most 108
	// bytes, the kernels a library and a core type's name.
	maxHelloText = 1 << 10
	// maxHelloRefusal bounds a refusal's text; marshal cuts a longer one (a
	// refusal names both stages and at worst both lists of shapes).
	maxHelloRefusal = 8 << 10
	// maxHelloChunks bounds the shapes of one link: a pipeline link has one
	// per model chunk of the stage, a replica ring link one per all-reduce
	// bucket and replica, plus two. A local hello with more is refused by
	// validate, before any peer sees it.
	maxHelloChunks = 1 << 20
	// minHelloLimit is the least helloLimit allows, whatever the local hello
	// holds, so that a peer started from another config (more chunks, other
	// ranks) still gets CheckPeer's message rather than a size error.
	minHelloLimit = 64 << 10
)

// helloLimit is the most bytes a peer's handshake may take on a link whose
// local hello is h. CheckPeer accepts only a peer with h's digest and
// shapes, so a hello it accepts is no longer than h's encoding with the
// address and the refusal at their limits; a longer one is refused unread.
func helloLimit(h Hello) int {
	n := handshakeFixed + 6*4 + 4*maxHelloText + maxHelloRefusal
	for _, s := range h.Shapes {
		n += 1 + 8*len(s)
	}
	return max(n, minHelloLimit)
}

func appendString(b []byte, s string) []byte {
	if uint64(len(s)) > math.MaxUint32 {
		panic("transport: handshake string longer than 4 GiB")
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(s)))
	return append(b, s...)
}

// marshal encodes h, cutting a refusal to maxHelloRefusal bytes. It cannot
// fail for a hello that passed validate or that unmarshal produced, nor for
// any other whose Shapes have ranks <= MaxRank.
func (h *handshake) marshal() []byte {
	x := &h.Hello
	refused := words.Clip(h.Refused, maxHelloRefusal)
	n := handshakeFixed + 6*4 + len(x.ConfigDigest) + len(x.Address) + len(refused) + len(x.Kernels) + len(x.StreamSocket)
	for _, s := range x.Shapes {
		n += 1 + 8*len(s)
	}
	b := make([]byte, 0, n)
	b = append(b, handshakeMagic...)
	var flags byte
	if x.Ring {
		flags |= flagRing
	}
	if x.Kernels != "" {
		flags |= flagKernels
	}
	if x.StreamSocket != "" {
		flags |= flagStreamSocket
	}
	b = append(b, handshakeVersion, flags, byte(x.DType), byte(x.Group))
	for _, v := range [...]int{x.Stage, x.Stages, x.Replica, x.Replicas} {
		b = binary.LittleEndian.AppendUint32(b, uint32(int32(v)))
	}
	b = appendString(b, x.ConfigDigest)
	b = appendString(b, x.Address)
	b = appendString(b, refused)
	if x.Kernels != "" {
		b = appendString(b, x.Kernels)
	}
	if x.StreamSocket != "" {
		b = appendString(b, x.StreamSocket)
	}
	if uint64(len(x.Shapes)) > math.MaxUint32 {
		panic("transport: too many chunks for a handshake")
	}
	b = binary.LittleEndian.AppendUint32(b, uint32(len(x.Shapes)))
	for _, s := range x.Shapes {
		if len(s) > MaxRank {
			panic(fmt.Sprintf("transport: handshake shape %v has rank > %d", s, MaxRank))
		}
		b = append(b, byte(len(s)))
		for _, d := range s {
			b = binary.LittleEndian.AppendUint64(b, uint64(d))
		}
	}
	return b
}

// unmarshal decodes a handshake, validating the framing of every field. It
// never panics, refuses a field beyond its limit (maxHelloText,
// maxHelloRefusal, maxHelloChunks) before allocating for it, and allocates
// no more than a small multiple of len(b). The hello's values are checked by
// CheckPeer, not here.
func (h *handshake) unmarshal(b []byte) error {
	var x handshake
	rest, err := x.unmarshalHead(b)
	if err != nil {
		return err
	}
	if err := x.unmarshalShapes(rest); err != nil {
		return err
	}
	*h = x
	return nil
}

// badHandshake is the error of a malformed handshake.
func badHandshake(format string, args ...any) error {
	return fmt.Errorf("protocol error: bad handshake message: "+format, args...)
}

// unmarshalHead decodes everything before the shapes into h (leaving
// Shapes nil) and returns the encoded shapes, so that a listener can tell
// the dialer's group and name, and refuse a dialer it would refuse anyway,
// without decoding the part of the hello that may be large.
func (h *handshake) unmarshalHead(b []byte) (shapes []byte, err error) {
	if len(b) < 4 || string(b[:3]) != handshakeMagic {
		return nil, fmt.Errorf("protocol error: expected a handshake message, got %d bytes starting %q", len(b), b[:min(len(b), 4)])
	}
	if b[3] != handshakeVersion {
		return nil, fmt.Errorf("protocol error: unsupported handshake version %d (this build speaks version %d): the peer runs an incompatible pipetrain build", b[3], handshakeVersion)
	}
	bad := badHandshake
	if len(b) < handshakeFixed {
		return nil, bad("%d bytes is shorter than the %d-byte header", len(b), handshakeFixed)
	}
	flags := b[4]
	if flags&^(flagRing|flagKernels|flagStreamSocket) != 0 {
		return nil, bad("unknown flags %#x", flags)
	}
	group := Group(b[6])
	if group != PipelineGroup && group != ReplicaGroup {
		return nil, bad("unknown link group %d", b[6])
	}
	i32 := func(off int) int { return int(int32(binary.LittleEndian.Uint32(b[off:]))) }
	x := Hello{
		Ring:     flags&flagRing != 0,
		DType:    DType(b[5]),
		Group:    group,
		Stage:    i32(7),
		Stages:   i32(11),
		Replica:  i32(15),
		Replicas: i32(19),
	}
	rest := b[handshakeFixed:]
	str := func(what string, limit int) (string, error) {
		if len(rest) < 4 {
			return "", bad("truncated %s length", what)
		}
		n := uint64(binary.LittleEndian.Uint32(rest))
		rest = rest[4:]
		if n > uint64(limit) {
			return "", bad("%s of %d bytes exceeds the %d-byte limit", what, n, limit)
		}
		if n > uint64(len(rest)) {
			return "", bad("%s of %d bytes is longer than the %d bytes left", what, n, len(rest))
		}
		s := string(rest[:n])
		rest = rest[n:]
		return s, nil
	}
	var refused string
	if x.ConfigDigest, err = str("config digest", maxHelloText); err != nil {
		return nil, err
	}
	if x.Address, err = str("address", maxHelloText); err != nil {
		return nil, err
	}
	if refused, err = str("refusal", maxHelloRefusal); err != nil {
		return nil, err
	}
	if flags&flagKernels != 0 {
		if x.Kernels, err = str("kernels", maxHelloText); err != nil {
			return nil, err
		}
		if x.Kernels == "" {
			return nil, bad("the kernels flag with no kernels") // one encoding per hello
		}
	}
	if flags&flagStreamSocket != 0 {
		if x.StreamSocket, err = str("stream socket", maxHelloText); err != nil {
			return nil, err
		}
		if x.StreamSocket == "" {
			return nil, bad("the stream socket flag with no socket")
		}
	}
	*h = handshake{Hello: x, Refused: refused}
	return rest, nil
}

// unmarshalShapes decodes the chunk count and shapes that unmarshalHead
// left into h.Hello.Shapes, which it sets only on success. A first pass
// checks the framing and counts the dimensions, so that all the shapes
// share one array: two allocations, whatever the chunk count.
func (h *handshake) unmarshalShapes(b []byte) error {
	bad := badHandshake
	if len(b) < 4 {
		return bad("truncated chunk count")
	}
	chunks := uint64(binary.LittleEndian.Uint32(b))
	b = b[4:]
	if chunks > maxHelloChunks {
		return bad("%d chunks exceed the limit of %d", chunks, maxHelloChunks)
	}
	if chunks > uint64(len(b)) { // each chunk takes at least its rank byte
		return bad("%d chunks do not fit in the %d bytes left", chunks, len(b))
	}
	dims, off := 0, 0
	for c := range int(chunks) {
		if off >= len(b) {
			return bad("truncated shape of chunk %d", c)
		}
		rank := int(b[off])
		off++
		if rank > MaxRank {
			return bad("chunk %d: rank %d exceeds %d", c, rank, MaxRank)
		}
		if len(b)-off < 8*rank {
			return bad("truncated shape of chunk %d", c)
		}
		for i := range rank {
			if d := binary.LittleEndian.Uint64(b[off+8*i:]); d > maxPayload {
				return bad("chunk %d: dimension %d of %d is out of range", c, i, d)
			}
		}
		off += 8 * rank
		dims += rank
	}
	if off != len(b) {
		return bad("%d unexpected bytes after the shapes", len(b)-off)
	}
	shapes, all := make([][]int, chunks), make([]int, dims)
	off = 0
	for c := range shapes {
		rank := int(b[off])
		off++
		s := all[:rank:rank]
		all = all[rank:]
		for i := range s {
			s[i] = int(binary.LittleEndian.Uint64(b[off+8*i:]))
		}
		off += 8 * rank
		shapes[c] = s
	}
	h.Hello.Shapes = shapes
	return nil
}

// short abbreviates a digest for messages, as git does.
func short(digest string) string {
	if len(digest) > 12 {
		return digest[:12]
	}
	return digest
}
