package transport

import (
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/mem"
)

// Tuning measured on this machine (docs/transport.md): a raw-bytes
// codec with 64 MiB flow-control windows and 1 MiB socket buffers reached
// ~0.5-0.7 of raw TCP, 44-60% more than gRPC defaults; protobuf was slower.
const (
	windowSize = 64 << 20
	bufferSize = 1 << 20
	// maxMsgSize bounds one message (a tensor's header plus payload) sent;
	// what a link receives is bounded tighter, by recvLimit.
	maxMsgSize = 1 << 30

	// Keepalive pings notice a peer that hangs (a stopped process) or whose
	// machine or network died without closing the TCP connection; a peer
	// process that dies on a live machine is noticed at once because the
	// kernel closes its sockets. Options.Heartbeat and PeerTimeout override
	// these defaults.
	defaultHeartbeat   = 10 * time.Second
	defaultPeerTimeout = 5 * time.Second

	// gRPC raises a client ping interval below 10s to 10s (and logs a
	// warning), so the dialer's heartbeat is raised here, quietly. A server
	// may ping every second, which is why the listener's pings are the ones
	// that catch a hung peer quickly.
	minClientPing = 10 * time.Second
	minServerPing = time.Second
	// A listener closes the connection of a dialer that pings more often
	// than this. Half the fastest any dialer may ping, so that stages
	// configured with different heartbeats never cut each other off.
	pingPolicyMinTime = minClientPing / 2
)

// codecName is the content-subtype of the raw codec
// ("application/grpc+pipetrain-raw" on the wire).
const codecName = "pipetrain-raw"

func init() { encoding.RegisterCodecV2(rawCodec{}) }

// frame is an outgoing message made of parts sent back to back, so a
// tensor's header and payload go out without being joined into one buffer.
type frame [][]byte

// rawCodec moves bytes without protobuf. Marshal hands gRPC the caller's
// buffers without copying (which is why a sent tensor must not change);
// Unmarshal copies once, into a fresh buffer or (for tensors) one from
// recvBuffers, that the receiver then owns.
type rawCodec struct{}

func (rawCodec) Name() string { return codecName }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	f, ok := v.(frame)
	if !ok {
		return nil, fmt.Errorf("%s codec: cannot marshal %T", codecName, v)
	}
	out := make(mem.BufferSlice, 0, len(f))
	for _, p := range f {
		if len(p) > 0 {
			out = append(out, mem.SliceBuffer(p))
		}
	}
	return out, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	switch p := v.(type) {
	case *[]byte:
		*p = data.Materialize()
	case *received:
		p.buf = recvBuffers.get(data.Len())
		data.CopyTo(*p.buf)
	case *helloBytes:
		if n := data.Len(); n > p.limit {
			p.err = badHandshake("%d bytes is longer than the %d bytes a hello for this link can hold", n, p.limit)
			return p.err
		}
		p.b = data.Materialize()
	default:
		return fmt.Errorf("%s codec: cannot unmarshal into %T", codecName, v)
	}
	return nil
}

// received is a message read into a buffer of recvBuffers.
type received struct{ buf *[]byte }

// helloBytes receives a handshake: one longer than limit (helloLimit) is
// refused before it is copied out of gRPC's buffers, and err says why
// (gRPC reports a codec's error as its own).
type helloBytes struct {
	limit int
	b     []byte
	err   error
}

// recvLimit is the longest message a link whose local hello is h can
// legitimately receive: the peer's hello (helloLimit), or a tensor of one of
// h's shapes, which the handshake makes the peer's too. gRPC refuses a
// longer message from its length prefix, before reading it.
func recvLimit(h Hello) int {
	n := helloLimit(h)
	for _, s := range h.Shapes {
		t := Tensor{Kind: Activation, DType: h.DType, Shape: s}
		if size, err := t.payloadSize(); err == nil { // validate refused any other
			n = max(n, fixedHeader+8*len(s)+size)
		}
	}
	return min(n, maxMsgSize)
}

// The service is written by hand (no protoc): one bidirectional stream per
// neighbour pair carries activations down and gradients up.
const (
	serviceName = "pipetrain.transport.Pipeline"
	streamName  = "Link"
	fullMethod  = "/" + serviceName + "/" + streamName
)

var streamDesc = grpc.StreamDesc{StreamName: streamName, ServerStreams: true, ClientStreams: true}

// linkHandler is the service's handler type; *Server implements it.
type linkHandler interface {
	serveLink(grpc.ServerStream) error
}

var serviceDesc = grpc.ServiceDesc{
	ServiceName: serviceName,
	HandlerType: (*linkHandler)(nil),
	Streams: []grpc.StreamDesc{{
		StreamName:    streamName,
		ServerStreams: true,
		ClientStreams: true,
		Handler: func(srv any, stream grpc.ServerStream) error {
			return srv.(linkHandler).serveLink(stream)
		},
	}},
}

// listenOptions are the gRPC server options of a listener with o's
// keep-alives and security; who names the stage in logged refusals.
func listenOptions(o Options, who string) []grpc.ServerOption {
	return []grpc.ServerOption{
		serverTransport(o, who),
		grpc.ForceServerCodecV2(rawCodec{}),
		experimental.BufferPool(wirePool),
		grpc.InitialWindowSize(windowSize),
		grpc.InitialConnWindowSize(windowSize),
		grpc.WriteBufferSize(bufferSize),
		grpc.ReadBufferSize(bufferSize),
		grpc.MaxRecvMsgSize(maxMsgSize),
		grpc.MaxSendMsgSize(maxMsgSize),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: max(o.Heartbeat, minServerPing), Timeout: o.PeerTimeout}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: pingPolicyMinTime, PermitWithoutStream: true}),
	}
}
