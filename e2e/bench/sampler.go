package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/tidwall/gjson"
)

// Roles of engines.
const (
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// Engine is one engine the sampler polls.
type Engine struct {
	// Role is RolePrefill or RoleDecode.
	Role string
	// Name labels the engine in plots (e.g. "prefill-0").
	Name string
	// URL is the engine's base URL.
	URL string
	// DPSize is its number of DP ranks.
	DPSize int
}

// Poll is one poll of every engine: per-rank values of each role, in
// engine order then rank order (see Sampler.Labels).
type Poll struct {
	// At is the model time since the run started.
	At time.Duration
	// Tokens is each rank's num_total_tokens (used plus pending tokens;
	// num_used_tokens when the engine does not report it), by role.
	Tokens map[string][]float64
	// CacheHitRate is each rank's cache_hit_rate gauge, by role.
	CacheHitRate map[string][]float64
}

// Sampler polls every engine's /v1/loads at a fixed wall-clock interval.
type Sampler struct {
	engines  []Engine
	interval time.Duration
	scale    float64
	client   *http.Client

	mu     sync.Mutex
	start  time.Time
	polls  []Poll
	errors int
}

// NewSampler returns a sampler of engines polled every interval (wall
// time); scale converts wall time into model time (see Config.Scale).
func NewSampler(engines []Engine, interval time.Duration, scale float64) *Sampler {
	return &Sampler{
		engines:  engines,
		interval: interval,
		scale:    scale,
		client:   &http.Client{Timeout: time.Second},
	}
}

// Labels returns the rank labels of role, in Poll order ("prefill-0/dp3").
func (s *Sampler) Labels(role string) []string {
	var out []string
	for _, e := range s.engines {
		if e.Role != role {
			continue
		}
		for r := range e.DPSize {
			out = append(out, fmt.Sprintf("%s/dp%d", e.Name, r))
		}
	}
	return out
}

// Run polls from start (the run's time origin) until ctx ends.
func (s *Sampler) Run(ctx context.Context, start time.Time) {
	s.mu.Lock()
	s.start = start
	s.mu.Unlock()
	tick := time.NewTicker(s.interval)
	defer tick.Stop()
	for {
		s.pollOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Polls returns the complete polls so far.
func (s *Sampler) Polls() []Poll {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Poll(nil), s.polls...)
}

// Errors returns how many polls were dropped because an engine did not
// answer.
func (s *Sampler) Errors() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.errors
}

// engineLoad is one engine's answer.
type engineLoad struct {
	tokens, hit []float64
	err         error
}

// pollOnce polls every engine concurrently and keeps the poll only when
// every engine answered.
func (s *Sampler) pollOnce(ctx context.Context) {
	at := time.Now()
	res := make([]engineLoad, len(s.engines))
	var wg sync.WaitGroup
	for i, e := range s.engines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i] = s.fetch(ctx, e)
		}()
	}
	wg.Wait()
	p := Poll{Tokens: map[string][]float64{}, CacheHitRate: map[string][]float64{}}
	for i, e := range s.engines {
		if res[i].err != nil {
			s.mu.Lock()
			if ctx.Err() == nil {
				s.errors++
			}
			s.mu.Unlock()
			return
		}
		p.Tokens[e.Role] = append(p.Tokens[e.Role], res[i].tokens...)
		p.CacheHitRate[e.Role] = append(p.CacheHitRate[e.Role], res[i].hit...)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	p.At = time.Duration(float64(at.Sub(s.start)) * s.scale)
	s.polls = append(s.polls, p)
}

// fetch reads one engine's per-rank load.
func (s *Sampler) fetch(ctx context.Context, e Engine) engineLoad {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.URL+"/v1/loads?include=core", nil)
	if err != nil {
		return engineLoad{err: err}
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return engineLoad{err: err}
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return engineLoad{err: err}
	}
	if resp.StatusCode != http.StatusOK {
		return engineLoad{err: fmt.Errorf("%s: status %d", e.Name, resp.StatusCode)}
	}
	return parseLoads(body, e.DPSize)
}

// parseLoads reads per-rank tokens and cache hit rates from a /v1/loads
// body. Ranks outside [0, dpSize) are an error; duplicate ranks are summed
// (as duet does).
func parseLoads(body []byte, dpSize int) engineLoad {
	out := engineLoad{tokens: make([]float64, dpSize), hit: make([]float64, dpSize)}
	loads := gjson.GetBytes(body, "loads")
	if !loads.IsArray() {
		return engineLoad{err: fmt.Errorf("/v1/loads: no loads array")}
	}
	for _, l := range loads.Array() {
		r := int(l.Get("dp_rank").Int())
		if r < 0 || r >= dpSize {
			return engineLoad{err: fmt.Errorf("/v1/loads: dp_rank %d out of range", r)}
		}
		tok := l.Get("num_total_tokens")
		if !tok.Exists() {
			tok = l.Get("num_used_tokens")
		}
		out.tokens[r] += tok.Float()
		out.hit[r] = l.Get("cache_hit_rate").Float()
	}
	return out
}
