package load

import "errors"

// ErrNoLoadMetrics is returned by [ParseMetrics] when the exposition holds
// no SGLang or vLLM load metric it can use.
var ErrNoLoadMetrics = errors.New("no known load metrics")

// ErrNoLoads is returned by [ParseLoads] when the document has no usable
// per-rank entry.
var ErrNoLoads = errors.New("no per-rank loads")

// ErrBodyTooLarge is returned by [Scraper.Scrape] when an engine's response
// is larger than the package reads (8 MiB).
var ErrBodyTooLarge = errors.New("response body too large")

// ErrTransport is matched (errors.Is) by the errors of [Scraper.Scrape]
// that mean no answer came from the engine: the connection failed, was
// reset, or timed out, before or while the response was read. An HTTP error
// status, an oversize body or an unparsable payload is an answer and does
// not match it.
var ErrTransport = errors.New("transport failure")

// transportError marks an error as a transport failure without changing its
// message.
type transportError struct{ err error }

// Error implements error.
func (e *transportError) Error() string { return e.err.Error() }

// Unwrap returns the underlying error.
func (e *transportError) Unwrap() error { return e.err }

// Is makes errors.Is(err, ErrTransport) true.
func (e *transportError) Is(target error) bool { return target == ErrTransport }
