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
