package load

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"time"
)

const (
	// defaultTimeout bounds one scrape when NewScraper is given none.
	defaultTimeout = time.Second
	// reprobeInterval is how long an engine that lacks /v1/loads is
	// scraped through /metrics before /v1/loads is tried again.
	reprobeInterval = 5 * time.Minute
	// loadsPath is SGLang's per-rank load endpoint, limited to the
	// sections the package reads.
	loadsPath = "/v1/loads?include=core,disagg"
	// metricsPath is the Prometheus endpoint of SGLang and vLLM.
	metricsPath = "/metrics"
)

// Scraper fetches Reports. Safe for concurrent use.
type Scraper struct {
	client  *http.Client
	timeout time.Duration
	now     func() time.Time
	memo    *absentMemo
}

// NewScraper returns a Scraper that sends requests with client (a new
// default client when nil). timeout bounds one scrape, including a fallback
// from /v1/loads to /metrics; zero or negative means one second.
func NewScraper(client *http.Client, timeout time.Duration) *Scraper {
	if client == nil {
		client = &http.Client{}
	}
	if timeout <= 0 {
		timeout = defaultTimeout
	}
	return &Scraper{
		client:  client,
		timeout: timeout,
		now:     time.Now,
		memo:    newAbsentMemo(reprobeInterval),
	}
}

// SetClock makes the Scraper stamp its reports (Report.StartedAt and
// FinishedAt) and time its /v1/loads re-probes with now instead of
// time.Now. Call it before the first Scrape.
func (s *Scraper) SetClock(now func() time.Time) { s.now = now }

// Scrape fetches the load of the engine at baseURL (scheme, host and port,
// with an optional path prefix).
//
// It asks GET {baseURL}/v1/loads?include=core,disagg first. If that answers
// 404, 405 or 501 the engine is remembered as lacking it, and this and the
// following scrapes of baseURL use GET {baseURL}/metrics instead, until
// /v1/loads is tried again five minutes later. Any other failure (transport
// error, other non-2xx status, unparsable body) is returned as an error
// without falling back. Errors name the URL.
func (s *Scraper) Scrape(ctx context.Context, baseURL string) (Report, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	base := strings.TrimRight(baseURL, "/")
	if !s.memo.absent(base, s.now()) {
		rep, found, err := s.scrapeLoads(ctx, base)
		if err != nil || found {
			return rep, err
		}
	}
	return s.scrapeMetrics(ctx, base)
}

// scrapeLoads tries /v1/loads. found is false, with no error, when the
// engine says the endpoint does not exist; that is then remembered.
func (s *Scraper) scrapeLoads(ctx context.Context, base string) (rep Report, found bool, err error) {
	u := base + loadsPath
	resp, err := get(ctx, s.client, s.now, u, "application/json")
	if err != nil {
		return Report{}, false, err
	}
	switch {
	case resp.status == http.StatusNotFound || resp.status == http.StatusMethodNotAllowed || resp.status == http.StatusNotImplemented:
		s.memo.markAbsent(base, s.now())
		return Report{}, false, nil
	case !resp.ok():
		return Report{}, false, errorFor(u, resp)
	}
	s.memo.markPresent(base)
	ranks, err := ParseLoads(resp.body)
	if err != nil {
		return Report{}, false, fmt.Errorf("GET %s: %w", u, err)
	}
	return Report{Ranks: ranks, Source: SourceLoads, StartedAt: resp.startedAt, FinishedAt: s.now()}, true, nil
}

// scrapeMetrics fetches and parses /metrics.
func (s *Scraper) scrapeMetrics(ctx context.Context, base string) (Report, error) {
	u := base + metricsPath
	resp, err := get(ctx, s.client, s.now, u, "text/plain;version=0.0.4")
	if err != nil {
		return Report{}, err
	}
	if !resp.ok() {
		return Report{}, errorFor(u, resp)
	}
	ranks, source, err := ParseMetrics(bytes.NewReader(resp.body))
	if err != nil {
		return Report{}, fmt.Errorf("GET %s: %w", u, err)
	}
	return Report{Ranks: ranks, Source: source, StartedAt: resp.startedAt, FinishedAt: s.now()}, nil
}
