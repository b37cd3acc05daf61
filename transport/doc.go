// Package transport moves tensors between neighbouring pipeline stages.
//
// Each stage is a process. The downstream stage of each neighbour pair
// listens (Listen, Accept) and the upstream stage dials (Dial); one gRPC
// bidirectional stream then carries activations down and gradients up. The
// first message each way is a Hello; a mismatched run (stage count, config
// digest, dtype, shape, non-adjacent stage) is refused on both sides with an
// error naming both stages.
//
// Tensors travel in a small binary format (Tensor.MarshalBinary) through a
// raw-bytes gRPC codec with large flow-control windows and socket buffers,
// the fastest gRPC setup measured on this machine (shared/notes/transport.md).
// Each Link has a writer and a reader goroutine with bounded queues, so Send
// overlaps with compute and a slow peer applies backpressure.
//
// Pipe gives two connected in-memory Links for tests of other packages.
package transport
