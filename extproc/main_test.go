package extproc

import (
	"google.golang.org/grpc/experimental"
)

// The tests' gRPC servers and clients take their proto buffers from the
// default pool, as duet's do (cmd/duet installs BufferPool at init).
func init() { experimental.SetDefaultBufferPool(BufferPool()) }
