package scheduler

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"
)

// maxProbeBodyBytes bounds how much of a probe's answer is read (and
// discarded) so that the connection can be reused.
const maxProbeBodyBytes = 64 << 10

// runHealth probes every configured endpoint each HealthConfig.Interval
// (unless probing is disabled) and moves ended ejections to half-open,
// until ctx is done.
func (s *Scheduler) runHealth(ctx context.Context) {
	probing := s.health.cfg.Interval > 0
	every := sweepInterval
	if probing {
		every = s.health.cfg.Interval
	}
	ticker := time.NewTicker(every)
	defer ticker.Stop()
	for {
		s.sweepHealth()
		if probing {
			s.probeHealth(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// probeHealth sends GET {URL}{HealthConfig.Path} to every ready endpoint,
// ejected ones included, at most LoadConfig.Concurrency at a time. A 200 is
// a success; any other status or no answer is a failure.
//
// An endpoint that is not ready is left to discovery, which retries it with
// backoff: picks cannot choose it anyway, and an engine that was down at
// start must not come up ejected for the probes it failed meanwhile (with
// base_ejection doubling, minutes after it answers).
func (s *Scheduler) probeHealth(ctx context.Context) {
	snap := s.snap.Load()
	sem := make(chan struct{}, s.loadCfg.Concurrency)
	var wg sync.WaitGroup
	for i := range snap.endpoints {
		ep := &snap.endpoints[i]
		if !ep.Ready {
			continue
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			err := s.probeEndpoint(ctx, ep.URL)
			if ctx.Err() != nil {
				return
			}
			rec := s.health.endpoint(ep.URL) // nil once the endpoint is removed: ignored
			outcome := "ok"
			var evs []healthEvent
			if err != nil {
				outcome = "failed"
				s.log.Debug("health probe failed", zap.String("role", string(ep.Role)), zap.String("url", ep.URL), zap.Error(err))
				evs = s.health.fail(rec, sigProbe, s.now(), nil)
			} else {
				evs = s.health.succeed(rec, sigProbe, s.now(), nil)
			}
			if s.metrics != nil {
				s.metrics.probes.WithLabelValues(string(ep.Role), ep.URL, outcome).Inc()
			}
			s.report(evs)
		})
	}
	wg.Wait()
}

// probeEndpoint performs one health probe of the engine at base; nil means
// it answered 200.
func (s *Scheduler) probeEndpoint(ctx context.Context, base string) error {
	ctx, cancel := context.WithTimeout(ctx, s.health.cfg.Timeout)
	defer cancel()
	url := base + s.health.cfg.Path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		// The client's error already names the method and URL.
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxProbeBodyBytes))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %w", url, &statusError{code: resp.StatusCode})
	}
	return nil
}
