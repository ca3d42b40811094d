package sim

import (
	"bytes"
	"errors"
	"net/http"
	"sync"
)

// sseWriter writes server-sent events, flushing after every write. It is
// safe for concurrent use by the items of a batch; after the stream is
// closed (done or fail) further writes are dropped.
type sseWriter struct {
	mu     sync.Mutex
	w      http.ResponseWriter
	rc     *http.ResponseController
	closed bool
	err    error
	// errBody renders the in-stream error frame's payload.
	errBody func(*apiError) []byte
}

// startSSE sends the 200 and event-stream headers; errBody renders a
// later in-stream error.
func startSSE(w http.ResponseWriter, errBody func(*apiError) []byte) *sseWriter {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	s := &sseWriter{w: w, rc: http.NewResponseController(w), errBody: errBody}
	s.mu.Lock()
	s.flushLocked()
	s.mu.Unlock()
	return s
}

// send writes frames; it reports false once the stream is closed or broken.
func (s *sseWriter) send(frames ...frame) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.err != nil {
		return false
	}
	for _, f := range frames {
		s.writeLocked(f)
	}
	s.flushLocked()
	return s.err == nil
}

// fail sends SGLang's in-stream error frame and [DONE], then closes.
func (s *sseWriter) fail(err *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.writeLocked(frame{data: s.errBody(err)})
	s.writeLocked(frame{data: []byte("[DONE]")})
	s.flushLocked()
	s.closed = true
}

// done sends [DONE] and closes.
func (s *sseWriter) done() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	s.writeLocked(frame{data: []byte("[DONE]")})
	s.flushLocked()
	s.closed = true
}

// isClosed reports whether done or fail was called.
func (s *sseWriter) isClosed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.closed
}

// writeLocked writes one event.
func (s *sseWriter) writeLocked(f frame) {
	if s.err != nil {
		return
	}
	var b bytes.Buffer
	if f.event != "" {
		b.WriteString("event: ")
		b.WriteString(f.event)
		b.WriteByte('\n')
	}
	b.WriteString("data: ")
	b.Write(f.data)
	b.WriteString("\n\n")
	_, s.err = s.w.Write(b.Bytes())
}

// flushLocked flushes buffered output to the client.
func (s *sseWriter) flushLocked() {
	if s.err != nil {
		return
	}
	if err := s.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		s.err = err
	}
}

// broken reports whether a write to the client failed.
func (s *sseWriter) broken() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err != nil
}
