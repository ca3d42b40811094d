package scheduler

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/duet-router/duet/scheduler/load"
	"github.com/duet-router/duet/scheduler/prefix"
)

// runScrapes scrapes every ready endpoint's load each LoadConfig.Interval
// until ctx is done, and expires reservations whose feedback never came.
func (s *Scheduler) runScrapes(ctx context.Context) {
	ticker := time.NewTicker(s.loadCfg.Interval)
	defer ticker.Stop()
	for {
		s.ScrapeLoads(ctx)
		if n := s.ledger.expire(s.now()); n > 0 {
			s.log.Warn("reservations expired without feedback", zap.Int("count", n))
		}
		select {
		case <-ctx.Done():
			return
		case <-ticker.C:
		}
	}
}

// ScrapeLoads scrapes every ready endpoint once, at most
// LoadConfig.Concurrency at a time, and records the results in the ledger.
// Failures are counted and logged; the targets' numbers then age until they
// are stale and no longer trusted. A scrape whose connection failed or was
// cut also counts toward the endpoint's ejection; a timed-out scrape, or an
// answer that is an HTTP error or cannot be parsed, does not.
func (s *Scheduler) ScrapeLoads(ctx context.Context) {
	afterDiscovery := s.discovered.Load()
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
			s.scrapeEndpoint(ctx, ep)
		})
	}
	wg.Wait()
	if afterDiscovery && ctx.Err() == nil {
		s.scraped.Store(true)
	}
	s.released()
}

// scrapeEndpoint scrapes one endpoint, records its loads and feeds its
// health.
func (s *Scheduler) scrapeEndpoint(ctx context.Context, ep *Endpoint) {
	rep, err := s.scraper.Scrape(ctx, ep.URL)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		s.log.Debug("load scrape failed", zap.String("url", ep.URL), zap.Error(err))
		if s.metrics != nil {
			s.metrics.scrapeErrors.WithLabelValues(string(ep.Role), ep.URL).Inc()
		}
		rec := s.health.endpoint(ep.URL) // nil once the endpoint is removed: ignored
		switch {
		case errors.Is(err, load.ErrTransport) && !timedOut(err):
			// No connection, or one cut before an answer: the engine is gone.
			s.report(s.health.fail(rec, sigScrape, s.now(), nil))
		case errors.Is(err, load.ErrTransport):
			// A slow /v1/loads (SGLang asks every DP rank's scheduler) is
			// not a dead engine; a hung one fails its /health probe, which
			// generates a token. The loads only go stale.
		default:
			// The engine answered: its loads are only stale, not gone.
			s.health.reset(rec, sigScrape)
		}
		return
	}
	s.report(s.health.succeed(s.health.endpoint(ep.URL), sigScrape, s.now(), nil))
	ranks := make([]rankLoad, 0, len(rep.Ranks))
	for _, r := range rep.Ranks {
		ranks = append(ranks, rankLoadOf(ep, r))
	}
	if s.engineRanks && len(ranks) > 0 {
		// The engine's one target (NoRank) carries the sum of its ranks.
		ranks = []rankLoad{engineLoad(ep, ranks)}
	}
	s.ledger.observe(ranks, rep.StartedAt, rep.FinishedAt)
	s.boundPrefixes(ep, ranks)
	s.boundViews(ep, ranks)
}

// capacityBounder is a CacheView whose per-target memory follows the
// targets' KV capacity (kvevents.Tracker).
type capacityBounder interface {
	SetCapacity(key TargetKey, tokens int64)
}

// boundViews tells the cache view each scraped rank's KV capacity, in
// tokens, with its host tier where discovery knows one: the view's memory
// per rank stays within a multiple of it.
func (s *Scheduler) boundViews(ep *Endpoint, ranks []rankLoad) {
	b, ok := s.cacheView.(capacityBounder)
	if !ok {
		return
	}
	scale := 1 + ep.DecodeCache.HostRatio
	for _, r := range ranks {
		if r.capacity > 0 {
			b.SetCapacity(r.key, int64(scale*float64(r.capacity)))
		}
	}
}

// boundPrefixes bounds each scraped rank's entry in the prefix index by the
// rank's KV capacity, so that duet forgets a prefix about when the engine's
// cache must have evicted it: an index that believes more than the engine
// holds sends requests after prefixes that are gone. Roles whose policy
// reads no prefix are not indexed, and PrefixConfig.IgnoreCapacity keeps
// only MaxBlocksPerTarget. A decode engine with a host tier (hierarchical
// cache) keeps (1 + its host ratio) times its KV capacity.
func (s *Scheduler) boundPrefixes(ep *Endpoint, ranks []rankLoad) {
	if s.prefixIgnoreCapacity {
		return
	}
	policy := s.decodePolicy
	if ep.Role == RolePrefill {
		policy = s.prefillPolicy
	}
	decodeCache := ep.Role == RoleDecode && ep.DecodeCache.Radix && readsDecodeCache(policy)
	if !readsPrefix(policy) && !decodeCache {
		return
	}
	scale := 1.0
	if decodeCache {
		scale += ep.DecodeCache.HostRatio
	}
	perBlock := float64(orPositive(s.hasher.BlockBytes, prefix.DefaultBlockBytes)) / s.tokens.Ratio("")
	for _, r := range ranks {
		if r.capacity > 0 && perBlock > 0 {
			s.ledger.setIndexed(r.key, s.index.SetBound(r.key, int(scale*float64(r.capacity)/perBlock)))
			s.turnEnds.setCapacity(r.key, int64(scale*float64(r.capacity)))
		}
	}
}

// rankLoadOf keys one reported rank by the target it belongs to. A
// single-rank decode engine's target has NoRank. A decode (or aggregated)
// rank's load is its tokens (KV in use plus pending prefill); a prefill
// rank's is its pending prefill tokens. Engines that report no absolute
// token counts (vLLM) contribute their request counts only.
func rankLoadOf(ep *Endpoint, r load.Rank) rankLoad {
	rank := r.Rank
	if ep.DPSize == 1 && ep.Role == RoleDecode {
		rank = NoRank
	}
	rl := rankLoad{
		key:      TargetKey{URL: ep.URL, Rank: rank},
		capacity: r.MaxTotalTokens,
		running:  r.Running,
		waiting:  r.Waiting,
	}
	if r.HasTokens {
		rl.tokens = max(r.TotalTokens, r.UsedTokens)
		if ep.Role == RolePrefill {
			// A prefill rank's backlog is the prompt tokens still to be
			// computed (SGLang's num_pending_tokens). Its used tokens are
			// mostly KV held until decode pulls it, which costs no compute.
			rl.tokens = max(r.TotalTokens-r.UsedTokens, 0)
		}
	}
	return rl
}

// engineLoad sums an engine's ranks into the load of its one target under
// engine_ranks (NoRank): tokens, KV capacity and request counts.
func engineLoad(ep *Endpoint, ranks []rankLoad) rankLoad {
	sum := rankLoad{key: TargetKey{URL: ep.URL, Rank: NoRank}}
	for _, r := range ranks {
		sum.tokens += r.tokens
		sum.capacity += r.capacity
		sum.running += r.running
		sum.waiting += r.waiting
	}
	return sum
}

// timedOut reports whether err is a timeout rather than a failed or cut
// connection.
func timedOut(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
