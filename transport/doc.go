// Package transport moves tensors between neighbouring pipeline stages.
//
// Each stage is a process. The downstream stage of each neighbour pair
// listens (Listen, Accept) and the upstream stage dials (Dial); one gRPC
// bidirectional stream then carries activations down and gradients up. With
// an interleaved schedule a stage holds several model chunks: one link
// carries the tensors of all of them (Tensor.Chunk, one shape per chunk in
// Hello.Shapes), and with Hello.Ring the last stage also dials stage 0 (the
// ring link, which carries chunk c's output to stage 0's chunk c+1). The
// first message each way is a Hello; a mismatched run (stage count, ring,
// config digest, dtype, per-chunk shapes, non-adjacent stage) is refused on
// both sides with an error naming both stages.
//
// With data parallelism the processes form a grid of stages × replicas, and
// the replicas of one stage also form a ring for the gradient all-reduce
// (Hello.Group ReplicaGroup): replica r dials replica (r+1) mod R of the
// same stage and accepts replica (r-1) mod R, so with R = 2 the two replicas
// hold two links, each dialed by one of them. Pipeline links then join the
// stages of one replica only. A ring link has the kinds of a pipeline link:
// the dialer sends Activation, so ring data flows dialer to listener as
// Activation and the Gradient direction may stay unused. Each process
// listens on one address for both kinds of link: Listen takes one Hello per
// group it serves, the dialer's Hello.Group picks the role its stream is
// for, and AcceptGroup takes each role's link in whatever order they
// connect; a dialer of a group the listener does not serve is refused.
//
// Tensors travel in a small binary format (Tensor.MarshalBinary) through a
// raw-bytes gRPC codec with large flow-control windows and socket buffers,
// the fastest gRPC setup measured on this machine (docs/transport.md).
// Each Link has a writer and a reader goroutine with bounded queues, so Send
// overlaps with compute and a slow peer applies backpressure.
//
// Links can be authenticated (docs/security.md): with Options.Token the
// dialer presents a shared secret with the stream's headers and the listener
// refuses a stream without it before reading from it; with Options.TLS both
// sides present certificates signed by one CA (mutual TLS). A refused
// stranger is logged (Options.Logf), never reported to Accept, which keeps
// waiting for the real neighbour. Without either, Listen binds loopback
// addresses only. Keep-alive pings (Options.Heartbeat, PeerTimeout) notice a
// neighbour that hangs without closing its connection.
//
// The replica ring may also move its all-reduces on ring streams beside its
// links (Options.Streams, DialStream, Server.AcceptStream; stream.go):
// framed byte streams on the listener's own address, or between processes
// of one host on its abstract Unix stream socket (streamsock.go), opened
// once the link's handshake has agreed on the peers, authenticated like a
// link before anything else is read, written from the caller's buffers and
// read into them (streamframe.go).
//
// Other packages' small gRPC services (the cluster's rendezvous) use
// Service, which serves and calls one raw-bytes stream method with exactly
// the links' security: the same token check before anything is read, the
// same mutual TLS, the same loopback-only rule without either.
//
// Pipe gives two connected in-memory Links for tests of other packages.
package transport
