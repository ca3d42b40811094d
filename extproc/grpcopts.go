package extproc

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"
)

// grpcWindow is the HTTP/2 flow-control window duet grants Envoy, per
// stream and per connection. grpc-go starts at 64 KiB and grows it by BDP
// probing, so a 256 KiB body first waits for window updates; a fixed 16 MiB
// window lets Envoy send any body up to that size without a pause.
const grpcWindow = 16 << 20

// grpcIOBuffer is the size of the gRPC transport's read and write buffers
// (grpc-go's default is 32 KiB): a buffered body is read, and its rewritten
// copy written, in fewer system calls.
const grpcIOBuffer = 256 << 10

// ServerOptions returns the gRPC server options of duet's ext_proc listener
// for bodies of up to maxBodyBytes (Envoy sends the whole body in one
// message, so the message limit is that plus room for framing).
//
// The buffer pool matters most. grpc-go's default pool has tiers of 256 B,
// 4, 16 and 32 KiB and 1 MiB, and zeroes a pooled buffer's whole capacity
// on every Get: a 33 KiB message (a 32 KiB body and its headers) took a
// 1 MiB buffer and cleared it, once to receive the body and once to marshal
// the rewritten copy. That was 13 % of the whole exchange's CPU
// (docs/benchmarks/exchange-benchstat.txt). See BufferPool.
func ServerOptions(maxBodyBytes int) []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxMessageBytes(maxBodyBytes)),
		grpc.InitialWindowSize(grpcWindow),
		grpc.InitialConnWindowSize(grpcWindow),
		grpc.ReadBufferSize(grpcIOBuffer),
		grpc.WriteBufferSize(grpcIOBuffer),
		experimental.BufferPool(BufferPool()),
	}
}

// BufferPool returns the gRPC buffer pool of duet's ext_proc server: a
// sync.Pool per power of two from 256 B to 4 MiB (larger buffers, for
// bodies of megabytes, are allocated and left to the collector rather than
// kept in a pool), handing buffers out without zeroing them. gRPC
// fills every byte of a buffer it asks for (a message read off the wire, or
// one marshalled into it), so the zeroing of grpc-go's own tiered pool (its
// only public kind) is pure cost: it cleared up to 1 MiB on every Get.
//
// The proto codec marshals into, and reads messages out of, the process's
// default pool whatever a server is given, so a program serving ext_proc
// also installs this one as the default, in an init function:
// experimental.SetDefaultBufferPool(extproc.BufferPool()). Tests that play
// Envoy's side use it too, so that a benchmark measures duet's costs
// rather than its client's.
func BufferPool() mem.BufferPool {
	return &bufferPool{top: maxBufferExp}
}

// maxBufferExp is the largest pooled size, 2^22 bytes.
const maxBufferExp = 22

// minBufferExp is the smallest pooled size, 2^8 bytes; smaller Gets are
// served from that tier.
const minBufferExp = 8

// bufferPool implements mem.BufferPool (see BufferPool).
type bufferPool struct {
	top   int // largest pooled size is 2^top
	tiers [64]sync.Pool
}

// Get returns a buffer of length n, its contents unspecified.
func (p *bufferPool) Get(n int) *[]byte {
	exp := max(bits.Len(uint(n-1)), minBufferExp)
	if n <= 0 || exp > p.top {
		b := make([]byte, max(n, 0))
		return &b
	}
	if b, ok := p.tiers[exp].Get().(*[]byte); ok {
		*b = (*b)[:n]
		return b
	}
	b := make([]byte, n, 1<<exp)
	return &b
}

// Put keeps buf for reuse in the largest tier its capacity covers.
func (p *bufferPool) Put(buf *[]byte) {
	exp := bits.Len(uint(cap(*buf))) - 1
	if exp < minBufferExp || exp > p.top {
		return
	}
	*buf = (*buf)[:0]
	p.tiers[exp].Put(buf)
}

// maxMessageBytes is the largest ext_proc message for a body limit: the
// body plus its headers, attributes and framing.
func maxMessageBytes(maxBodyBytes int) int {
	return maxBodyBytes + 1<<20
}
