package peers

import (
	"math"
	"time"

	"github.com/duet-router/duet/scheduler"
)

// smgLoadMonitorInterval is SMG's --load-monitor-interval default, the
// period of the per-rank load poll that feeds MinimumTokensPolicy
// (smg-project/smg@f8daa8835a8b model_gateway/src/main.rs, "Load
// Monitoring": default_value_t = 10; formerly --worker-load-check-interval).
const smgLoadMonitorInterval = 10 * time.Second

// dpRankCache is SMG's WorkerLoadManager as MinimumTokensPolicy uses it
// (smg-project/smg@f8daa8835a8b model_gateway/src/policies/dp_min_token.rs
// select_dp_rank; model_gateway/src/worker/monitor.rs update_dp_loads and
// select_and_increment_lowest_dp_load): per engine, a map rank -> load.
//
//   - Every poll replaces an engine's map with each rank's num_used_tokens
//     from GET /v1/loads (monitor.rs group_monitor_loop; only responses with
//     absolute token counts feed it, and a failed poll keeps the last
//     known good values).
//   - Each pick takes the rank with the least load, ties to the lower rank
//     (min_by_key on (load, rank)), and adds the request's estimated cost to
//     it; the addition lasts until the next poll overwrites the map.
//
// SMG wires it in PD mode only (model_gateway/src/routers/factory.rs,
// create_pd_router, if config.dp_minimum_tokens_scheduler), after the
// worker policy has chosen the prefill and the decode engine, once for each
// (routers/http/pd_router.rs: select_dp_rank for prefill, then for decode,
// with the same estimated_cost); the returned rank overrides any --dp-aware
// rank and is sent as routed_dp_rank.
//
// Adapted to duet's signals:
//   - the poll: SMG polls on a tokio interval whose first tick is
//     immediate. The port has no timer: it snapshots the candidates'
//     engine-reported loads at its first pick and then at its first pick at
//     or after each 10 s tick of the scheduler's clock (Request.Now, which
//     the simulator drives in virtual time).
//   - the polled value: SMG reads num_used_tokens. duet's Candidate carries
//     the engine-reported part as Load.Scraped: on a decode rank SGLang's
//     num_total_tokens (num_used_tokens plus the rank's pending prefill
//     tokens), on a prefill rank its pending prefill tokens
//     (num_total_tokens - num_used_tokens). num_used_tokens itself is not
//     available to a policy, so the port polls Scraped; on prefill ranks it
//     is a different, queue-like signal. A rank whose scrape is not fresh
//     keeps its last polled value, as SMG keeps last known good loads.
//   - a rank never polled (an engine that appears between polls) starts
//     from its current Scraped value; SMG would send no rank at all and let
//     the engine choose, which a duet policy cannot express.
type dpRankCache struct {
	next   time.Time
	polled bool
	loads  map[string]map[int]int64
}

func newDPRankCache() dpRankCache {
	return dpRankCache{loads: make(map[string]map[int]int64)}
}

// pick polls if a tick is due and returns the index in cands of engine
// url's rank with the least cached load (ties: lower rank), adding the
// request's estimated cost to it.
func (c *dpRankCache) pick(req *scheduler.Request, cands []scheduler.Candidate, url string) int {
	now := req.Now
	if now.IsZero() {
		now = time.Now()
	}
	c.poll(now, cands)
	m := c.loads[url]
	if m == nil { // an engine that appeared since the last poll
		m = make(map[int]int64)
		c.loads[url] = m
	}
	best := -1
	var bestLoad int64
	for i := range cands {
		cd := &cands[i]
		if cd.Endpoint.URL != url {
			continue
		}
		l, ok := m[cd.Rank]
		if !ok {
			l = scraped(cd)
			m[cd.Rank] = l
		}
		if best < 0 || l < bestLoad || l == bestLoad && cd.Rank < cands[best].Rank {
			best, bestLoad = i, l
		}
	}
	m[cands[best].Rank] += smgEstimatedCost(req)
	return best
}

// poll snapshots every candidate's engine-reported load when the poll
// timer has ticked since the last snapshot (or on the first call).
func (c *dpRankCache) poll(now time.Time, cands []scheduler.Candidate) {
	if c.polled && now.Before(c.next) {
		return
	}
	for i := range cands {
		cd := &cands[i]
		m := c.loads[cd.Endpoint.URL]
		if m == nil {
			m = make(map[int]int64)
			c.loads[cd.Endpoint.URL] = m
		}
		if _, ok := m[cd.Rank]; cd.Load.Fresh || !ok {
			m[cd.Rank] = scraped(cd)
		}
	}
	if !c.polled {
		c.polled, c.next = true, now
	}
	// The next tick on the interval's grid after now.
	if !c.next.After(now) {
		c.next = c.next.Add((now.Sub(c.next)/smgLoadMonitorInterval + 1) * smgLoadMonitorInterval)
	}
}

// scraped is the candidate's engine-reported load, 0 when not fresh.
func scraped(c *scheduler.Candidate) int64 {
	if !c.Load.Fresh {
		return 0
	}
	return c.Load.Scraped
}

// smgEstimatedCost is what SMG's PD router adds to the chosen rank's cached
// load (smg-project/smg@f8daa8835a8b model_gateway/src/routers/http/
// pd_router.rs, the estimated_cost match before select_dp_rank): over
// HTTP, where the router has text and no token ids, ceil(words x 1.3) with
// words counted by whitespace over the routing text; at least 1.
//
// Adapted: the routing text is duet's rendered prompt (Request.Prompt,
// chat messages as "role\ncontent\n", so one extra word per message against
// SMG's extract_text_for_routing, which joins the contents with spaces; a
// batch counts its first item only). A request given as input_ids counts one
// word per id, as SMG's /generate text for input_ids is the ids joined by
// spaces. On the simulator's synthetic prompts a word is one token, so the
// estimate runs 30% above the true prompt length, as SMG's would.
func smgEstimatedCost(req *scheduler.Request) int64 {
	n := len(req.TokenIDs)
	if n == 0 {
		n = words(req.Prompt)
	}
	return max(int64(math.Ceil(float64(n)*1.3)), 1)
}
