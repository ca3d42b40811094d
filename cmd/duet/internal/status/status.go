// Package status serves duet's live status page on the admin port:
// GET /status, a self-contained HTML page (inline CSS and JavaScript, no
// external resource), which polls GET /status.json: for each pool (one
// model's engines, one scheduler), the scheduler's state per endpoint and
// DP rank, the balance of each role and the recent decisions.
// docs/status-page.md describes the page and the JSON.
package status

import (
	_ "embed"
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/duet-router/duet/scheduler"
	"github.com/duet-router/duet/scheduler/admit"
)

// Source is the state the page shows of one pool; *scheduler.Scheduler
// implements it.
type Source interface {
	Status() scheduler.Status
}

// Pool is one pool the page shows.
type Pool struct {
	// Name is the pool's name, e.g. "default" or "deepseek".
	Name string
	// Models are the model names it serves; empty for the implicit single
	// pool, which serves every model.
	Models []string
	// Source is the pool's scheduler.
	Source Source
	// Admission is the pool's admission queue; nil when it has none.
	Admission AdmissionSource
}

// AdmissionSource is what the page reads of a pool's admission queue
// (admit.Admitter).
type AdmissionSource interface {
	Snapshot() admit.Snapshot
}

// Single returns the one pool of a configuration without pools: src, named
// "default", serving every model.
func Single(src Source) []Pool {
	return []Pool{{Name: "default", Source: src}}
}

// DefaultRateWindow is the window of the pick rates when Options.RateWindow
// is zero.
const DefaultRateWindow = 5 * time.Second

// Options configure a Handler.
type Options struct {
	// Version is shown on the page; empty shows none.
	Version string
	// RateWindow is the span over which picks per second are averaged
	// (default DefaultRateWindow).
	RateWindow time.Duration
	// Sync, when set, reports the replicas this one shares state with.
	Sync func() *Sync
}

// Sync is what the page shows of the replicas sharing state over NATS.
type Sync struct {
	// Replica is this replica's name.
	Replica string `json:"replica"`
	// Connected reports whether it is connected to NATS (else it routes
	// alone).
	Connected bool `json:"connected"`
	// Peers are the other replicas heard from.
	Peers []SyncPeer `json:"peers"`
}

// SyncPeer is another replica.
type SyncPeer struct {
	Name string `json:"name"`
	// Alive reports whether it was heard from within three heartbeats.
	Alive    bool      `json:"alive"`
	LastSeen time.Time `json:"last_seen"`
	// LagMs is the delay of its last event, in milliseconds.
	LagMs float64 `json:"lag_ms"`
}

// Handler serves the status page and its JSON. It keeps each pool's pick
// counts of the last RateWindow, sampled when /status.json is fetched, to
// turn them into rates; the first fetch after an idle window has no rates
// yet.
type Handler struct {
	pools   []pool
	version string
	window  time.Duration
	sync    func() *Sync
}

// pool is one shown pool with its own pick samples: each pool's scheduler
// has its own clock readings, targets and counters.
type pool struct {
	Pool
	rates *sampler
}

// sampler keeps one pool's pick samples.
type sampler struct {
	mu      sync.Mutex
	samples []sample // oldest first, spanning at most the window
}

// sample is the cumulative pick count of every target at one instant.
type sample struct {
	at    time.Time
	picks map[targetID]uint64
}

// targetID names a target across one pool's snapshots: endpoint URLs are
// unique across roles. Each pool has its own samples, so an engine that
// two pools list has a rate in each.
type targetID struct {
	url  string
	rank int
}

// New returns a Handler that shows pools, in order. The first pool's state
// is also the document's top level, as before pools existed.
func New(pools []Pool, opts Options) *Handler {
	if opts.RateWindow <= 0 {
		opts.RateWindow = DefaultRateWindow
	}
	h := &Handler{version: opts.Version, window: opts.RateWindow, sync: opts.Sync}
	for _, p := range pools {
		p.Models = append([]string{}, p.Models...)
		h.pools = append(h.pools, pool{Pool: p, rates: &sampler{}})
	}
	return h
}

// Register adds GET /status and GET /status.json to mux.
func (h *Handler) Register(mux *http.ServeMux) {
	mux.HandleFunc("GET /status", h.servePage)
	mux.HandleFunc("GET /status.json", h.serveJSON)
}

//go:embed page.html
var page []byte

func (h *Handler) servePage(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	// The page loads nothing from anywhere: not even from duet.
	w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:")
	_, _ = w.Write(page)
}

func (h *Handler) serveJSON(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(h.Page())
}

// Page is the document GET /status.json serves. Its fields from Time to
// Decisions (except Version and RateWindowSeconds) are the first pool's,
// as they were before pools existed; Pools has every pool's.
type Page struct {
	// Time is when the first pool's scheduler state was read.
	Time time.Time `json:"time"`
	// Version is duet's version, when known.
	Version string `json:"version,omitempty"`
	// Ready reports whether the first pool's scheduler is ready.
	Ready bool `json:"ready"`
	// Mode is the first pool's: "pd" (it has prefill engines) or
	// "aggregated".
	Mode string `json:"mode"`
	// EngineRanks reports that engines, not duet, choose DP ranks.
	EngineRanks bool `json:"engine_ranks"`
	// RateWindowSeconds is the span over which pick rates are averaged.
	RateWindowSeconds float64 `json:"rate_window_seconds"`
	// Reservations counts the requests in the first pool's reservation
	// ledger.
	Reservations int `json:"reservations"`
	// Roles summarizes the first pool's roles: prefill (PD mode only),
	// then decode.
	Roles []Role `json:"roles"`
	// Endpoints lists the first pool's endpoints with their ranks.
	Endpoints []Endpoint `json:"endpoints"`
	// Decisions are the first pool's latest picks, newest first.
	Decisions []Decision `json:"decisions"`
	// Sync is the replicas this one shares state with; absent when it
	// runs alone.
	Sync *Sync `json:"sync,omitempty"`
	// Pools are every pool's state, in configuration order; the first is
	// also the fields above.
	Pools []PoolPage `json:"pools"`
}

// PoolPage is one pool's state.
type PoolPage struct {
	// Name is the pool's name.
	Name string `json:"name"`
	// Models are the model names it serves; empty for the implicit pool.
	Models []string `json:"models"`
	// Time is when the pool's scheduler state was read.
	Time time.Time `json:"time"`
	// Ready reports whether the pool's scheduler is ready.
	Ready bool `json:"ready"`
	// Mode is "pd" (the pool has prefill engines) or "aggregated".
	Mode string `json:"mode"`
	// EngineRanks reports that engines, not duet, choose DP ranks.
	EngineRanks bool `json:"engine_ranks"`
	// Reservations counts the requests in the pool's reservation ledger.
	Reservations int `json:"reservations"`
	// Roles summarizes each role: prefill (PD mode only), then decode.
	Roles []Role `json:"roles"`
	// Endpoints lists every endpoint of the pool with its ranks.
	Endpoints []Endpoint `json:"endpoints"`
	// Decisions are the pool's latest picks, newest first.
	Decisions []Decision `json:"decisions"`
	// Admission is the pool's admission queue; null when it has none.
	Admission *Admission `json:"admission"`
}

// Admission is a pool's admission queue now.
type Admission struct {
	// Open reports that the pool has room: requests go on at once.
	Open bool `json:"open"`
	// Queued and QueuedTokens are the requests waiting and their tokens;
	// ByClass the requests waiting per class.
	Queued       int            `json:"queued"`
	QueuedTokens int64          `json:"queued_tokens"`
	ByClass      map[string]int `json:"by_class"`
	// DrainTokensPerSecond is how fast queued tokens were let through
	// lately; 0 while unknown.
	DrainTokensPerSecond float64 `json:"drain_tokens_per_second"`
}

// Role is one role's summary and balance.
type Role struct {
	// Role is "prefill" or "decode".
	Role string `json:"role"`
	// Policy is the pool's policy.
	Policy string `json:"policy"`
	// Endpoints and ReadyEndpoints count the pool's endpoints.
	Endpoints      int `json:"endpoints"`
	ReadyEndpoints int `json:"ready_endpoints"`
	// Ranks counts the schedulable targets; PickableRanks those that are
	// neither ejected nor on an ejected endpoint.
	Ranks         int `json:"ranks"`
	PickableRanks int `json:"pickable_ranks"`
	// Tokens is the pool's total token load (scraped plus reserved).
	Tokens int64 `json:"tokens"`
	// TokenImbalance is max/mean of the token load over the pickable
	// ranks: 1 is perfectly balanced. Null when the pool is idle.
	TokenImbalance *float64 `json:"token_imbalance"`
	// PicksPerSecond is the pool's pick rate over the rate window; null
	// until two samples span some time.
	PicksPerSecond *float64 `json:"picks_per_second"`
	// PickImbalance is max/mean of the pick rates over the pickable
	// ranks; null without rates or picks.
	PickImbalance *float64 `json:"pick_imbalance"`
	// SaturatedRanks counts the pickable ranks that are saturated;
	// Saturated reports that all are (the pool queues requests).
	SaturatedRanks int  `json:"saturated_ranks"`
	Saturated      bool `json:"saturated"`
}

// Endpoint is one engine.
type Endpoint struct {
	Role    string `json:"role"`
	URL     string `json:"url"`
	Address string `json:"address"`
	// Ready reports whether discovery made the endpoint schedulable.
	Ready bool `json:"ready"`
	// DPSize is the data-parallel size; 0 while unknown.
	DPSize int `json:"dp_size"`
	// BootstrapPort is a prefill engine's bootstrap port; 0 for decode.
	BootstrapPort int `json:"bootstrap_port"`
	// Source names where DPSize and BootstrapPort came from.
	Source string `json:"source"`
	// DecodeCache is a decode engine's own prefix cache, as its
	// /server_info reports it: "radix" (SGLang's decode radix cache),
	// "radix+host" (with its host-memory tier), or "off"; empty for
	// prefill engines.
	DecodeCache string `json:"decode_cache,omitempty"`
	// LastError is the last discovery error, if any.
	LastError string `json:"last_error,omitempty"`
	// DisaggregationMode is the disaggregation_mode the engine last
	// reported; absent while unknown or not reported.
	DisaggregationMode string `json:"disaggregation_mode,omitempty"`
	// ExpectedMode is the disaggregation_mode the endpoint's role needs.
	ExpectedMode string `json:"expected_mode"`
	// WrongMode reports that DisaggregationMode contradicts the role: the
	// endpoint is not scheduled until the engine reports a mode that fits.
	WrongMode bool `json:"wrong_mode"`
	// NotReadyReason says why the endpoint is not scheduled
	// (scheduler.Endpoint.NotReadyReason); absent while it is ready.
	NotReadyReason string `json:"not_ready_reason,omitempty"`
	// Health is the endpoint's own health (all its ranks).
	Health Health `json:"health"`
	// Ranks are the endpoint's targets, in rank order.
	Ranks []Rank `json:"ranks"`
}

// Health is one health record.
type Health struct {
	// State is "healthy", "ejected" or "half_open".
	State string `json:"state"`
	// Reason is the ejection's reason while not healthy.
	Reason string `json:"reason,omitempty"`
	// Until is when an ejection ends.
	Until *time.Time `json:"until,omitempty"`
	// Ejections counts the ejections in a row without a recovery.
	Ejections int `json:"ejections,omitempty"`
}

// Rank is one (endpoint, DP rank) target.
type Rank struct {
	// Rank is the DP rank; null when the engine picks it.
	Rank *int `json:"rank"`
	// Target is the target's name, e.g. "127.0.0.1:30001/dp1".
	Target string `json:"target"`
	// Health is the target's own health.
	Health Health `json:"health"`
	// Pickable reports that neither the target nor its endpoint is ejected.
	Pickable bool `json:"pickable"`
	// Tokens is the load policies compare: ScrapedTokens + ReservedTokens.
	Tokens int64 `json:"tokens"`
	// ScrapedTokens is what the engine last reported (0 when stale).
	ScrapedTokens int64 `json:"scraped_tokens"`
	// ReservedTokens is what duet reserved since the last scrape.
	ReservedTokens int64 `json:"reserved_tokens"`
	// CapacityTokens is the rank's KV capacity; 0 when unknown.
	CapacityTokens int64 `json:"capacity_tokens"`
	// Running and Waiting are the engine-reported request counts.
	Running int `json:"running"`
	Waiting int `json:"waiting"`
	// LoadFresh reports that a recent scrape backs the scraped numbers.
	LoadFresh bool `json:"load_fresh"`
	// Saturated reports that the rank is saturated: one more request
	// would only wait in the engine's queue.
	Saturated bool `json:"saturated"`
	// LoadAgeSeconds is the age of the last successful scrape; null
	// before the first.
	LoadAgeSeconds *float64 `json:"load_age_seconds"`
	// Picks counts the requests sent to the target since it became
	// schedulable.
	Picks uint64 `json:"picks"`
	// PicksPerSecond is the pick rate over the rate window; null until two
	// samples span some time.
	PicksPerSecond *float64 `json:"picks_per_second"`
	// PrefixBlocks is the size of the target's prefix-index entry, in
	// prompt blocks.
	PrefixBlocks int `json:"prefix_blocks"`
	// KVEvents is what the rank's KV events say it caches; null when the
	// pool does not follow them.
	KVEvents *RankEvents `json:"kv_events"`
}

// RankEvents is one rank's view from its KV events.
type RankEvents struct {
	// State is live, warming or fallback (docs/kv-events.md).
	State string `json:"state"`
	// Blocks is the prefix blocks the events say the rank holds.
	Blocks int `json:"blocks"`
	// LagSeconds is how long ago the engine stamped the last batch; null
	// before the first.
	LagSeconds *float64 `json:"lag_seconds"`
}

// Decision is one recent pick.
type Decision struct {
	Time time.Time `json:"time"`
	// RequestID is duet's request id (x-duet-request-id).
	RequestID string `json:"request_id"`
	// Path is the request's path without its query.
	Path  string `json:"path"`
	Model string `json:"model,omitempty"`
	// Prefill and Decode are the choices; null when not made.
	Prefill *Choice `json:"prefill"`
	Decode  *Choice `json:"decode"`
	// Error is why the pick failed.
	Error string `json:"error,omitempty"`
}

// Choice is one role's part of a decision: where, and why.
type Choice struct {
	Target string `json:"target"`
	URL    string `json:"url"`
	// Rank is the chosen rank; null when the engine picks it.
	Rank   *int   `json:"rank"`
	Policy string `json:"policy"`
	// Candidates is how many ranks the policy chose among.
	Candidates int `json:"candidates"`
	// LoadTokens is the chosen rank's load when the policy ran.
	LoadTokens int64 `json:"load_tokens"`
	// Prefix is the share of the prompt the prefix index believed cached
	// on the chosen rank (0 to 1).
	Prefix float64 `json:"prefix"`
	// CachedTokens is the prompt tokens duet believed the chosen rank
	// caches; on a decode engine with a decode radix cache, earlier
	// turns' answers included.
	CachedTokens int64 `json:"cached_tokens"`
	// Tokens is what duet reserved there for the request.
	Tokens int64 `json:"tokens"`
}

// Page reads every pool's scheduler state and builds the document. Without
// a pool, the top level is an empty, not ready, aggregated one.
func (h *Handler) Page() Page {
	pools := make([]PoolPage, 0, len(h.pools))
	for _, pl := range h.pools {
		pools = append(pools, h.poolPage(pl))
	}
	first := PoolPage{Mode: "aggregated", Roles: []Role{}, Endpoints: []Endpoint{}, Decisions: []Decision{}}
	if len(pools) > 0 {
		first = pools[0]
	}
	p := Page{
		Time:              first.Time,
		Version:           h.version,
		Ready:             first.Ready,
		Mode:              first.Mode,
		EngineRanks:       first.EngineRanks,
		RateWindowSeconds: h.window.Seconds(),
		Reservations:      first.Reservations,
		Roles:             first.Roles,
		Endpoints:         first.Endpoints,
		Decisions:         first.Decisions,
		Pools:             pools,
	}
	if h.sync != nil {
		p.Sync = h.sync()
	}
	return p
}

// poolPage reads one pool's scheduler state.
func (h *Handler) poolPage(pl pool) PoolPage {
	st := pl.Source.Status()
	p := PoolPage{
		Name:         pl.Name,
		Models:       pl.Models,
		Time:         st.At,
		Ready:        st.Ready,
		Mode:         "aggregated",
		EngineRanks:  st.EngineRanks,
		Reservations: st.Reservations,
		Endpoints:    make([]Endpoint, 0, len(st.Endpoints)),
		Decisions:    make([]Decision, 0, len(st.Decisions)),
	}
	if st.PD {
		p.Mode = "pd"
	}
	rates := pl.rates.record(st, h.window)
	for _, es := range st.Endpoints {
		p.Endpoints = append(p.Endpoints, endpointOf(es, st.At, rates))
	}
	if st.PD {
		p.Roles = append(p.Roles, roleOf(scheduler.RolePrefill, st.PrefillPolicy, p.Endpoints))
	}
	p.Roles = append(p.Roles, roleOf(scheduler.RoleDecode, st.DecodePolicy, p.Endpoints))
	for _, d := range st.Decisions {
		p.Decisions = append(p.Decisions, decisionOf(d))
	}
	for i := range p.Roles {
		for _, rs := range st.Saturation {
			if string(rs.Role) == p.Roles[i].Role {
				p.Roles[i].SaturatedRanks, p.Roles[i].Saturated = rs.Saturated, rs.Full()
			}
		}
	}
	if pl.Admission != nil {
		a := pl.Admission.Snapshot()
		p.Admission = &Admission{Open: a.Open, Queued: a.Queued, QueuedTokens: a.QueuedTokens, ByClass: a.ByClass, DrainTokensPerSecond: a.DrainRate}
	}
	return p
}

// record records st's pick counts and returns each target's pick rate over
// window, against the oldest sample in it that knows the target. A target
// no earlier sample knows has no rate yet.
func (r *sampler) record(st scheduler.Status, window time.Duration) map[targetID]float64 {
	cur := sample{at: st.At, picks: map[targetID]uint64{}}
	for _, es := range st.Endpoints {
		for _, t := range es.Targets {
			cur.picks[targetID{es.Endpoint.URL, t.Rank}] = t.Picks
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	// Forget samples out of the window, and all of them if the clock went
	// back.
	keep := 0
	for keep < len(r.samples) && st.At.Sub(r.samples[keep].at) > window {
		keep++
	}
	r.samples = r.samples[keep:]
	if n := len(r.samples); n > 0 && r.samples[n-1].at.After(st.At) {
		r.samples = nil
	}
	out := make(map[targetID]float64, len(cur.picks))
	for id, n := range cur.picks {
		// Against the oldest sample that has the target with a count not
		// above the current one (a target that left and came back starts
		// over from zero).
		for _, base := range r.samples {
			b, ok := base.picks[id]
			if dt := st.At.Sub(base.at).Seconds(); ok && n >= b && dt > 0 {
				out[id] = float64(n-b) / dt
				break
			}
		}
	}
	// Keep at most about ten samples per window, however often the page is
	// fetched.
	if n := len(r.samples); n == 0 || st.At.Sub(r.samples[n-1].at) >= window/10 {
		r.samples = append(r.samples, cur)
	}
	return out
}

// endpointOf converts one endpoint's status.
func endpointOf(es scheduler.EndpointStatus, now time.Time, rates map[targetID]float64) Endpoint {
	ep := es.Endpoint
	e := Endpoint{
		Role: string(ep.Role), URL: ep.URL, Address: ep.Address, Ready: ep.Ready,
		DPSize: ep.DPSize, BootstrapPort: ep.BootstrapPort, Source: ep.Source, LastError: ep.LastError,
		DisaggregationMode: ep.Mode, ExpectedMode: ep.ExpectedMode, WrongMode: ep.WrongMode, NotReadyReason: ep.NotReadyReason(),
		Health: healthOf(es.Health),
		Ranks:  make([]Rank, 0, len(es.Targets)),
	}
	if ep.Role != scheduler.RolePrefill {
		e.BootstrapPort = 0
		e.DecodeCache = decodeCacheOf(ep.DecodeCache)
	}
	for _, t := range es.Targets {
		r := Rank{
			Rank:           rankOf(t.Rank),
			Target:         t.Name,
			Health:         healthOf(t.Health),
			Pickable:       t.Health.State != scheduler.HealthEjected && es.Health.State != scheduler.HealthEjected,
			Tokens:         t.Load.Tokens,
			ScrapedTokens:  t.Load.Tokens - t.Load.Reserved,
			ReservedTokens: t.Load.Reserved,
			Saturated:      t.Saturated,
			CapacityTokens: t.Load.Capacity,
			Running:        t.Load.Running,
			Waiting:        t.Load.Waiting,
			LoadFresh:      t.Load.Fresh,
			Picks:          t.Picks,
			PrefixBlocks:   t.PrefixBlocks,
		}
		if ev := t.Events; ev != nil {
			r.KVEvents = &RankEvents{State: ev.State, Blocks: ev.Blocks}
			if ev.HasBatch {
				lag := ev.Lag.Seconds()
				r.KVEvents.LagSeconds = &lag
			}
		}
		if !t.ScrapedAt.IsZero() {
			age := max(now.Sub(t.ScrapedAt).Seconds(), 0)
			r.LoadAgeSeconds = &age
		}
		if rate, ok := rates[targetID{ep.URL, t.Rank}]; ok {
			r.PicksPerSecond = &rate
		}
		e.Ranks = append(e.Ranks, r)
	}
	return e
}

// roleOf summarizes role's endpoints among eps.
func roleOf(role scheduler.Role, policy string, eps []Endpoint) Role {
	r := Role{Role: string(role), Policy: policy}
	var tokens, rates []float64
	var rateSum float64
	rated := false
	for _, e := range eps {
		if e.Role != string(role) {
			continue
		}
		r.Endpoints++
		if e.Ready {
			r.ReadyEndpoints++
		}
		for _, rk := range e.Ranks {
			r.Ranks++
			r.Tokens += rk.Tokens
			if rk.PicksPerSecond != nil {
				rated = true
				rateSum += *rk.PicksPerSecond
			}
			if !rk.Pickable {
				continue
			}
			r.PickableRanks++
			tokens = append(tokens, float64(rk.Tokens))
			if rk.PicksPerSecond != nil {
				rates = append(rates, *rk.PicksPerSecond)
			}
		}
	}
	r.TokenImbalance = imbalance(tokens)
	if rated {
		r.PicksPerSecond = &rateSum
		r.PickImbalance = imbalance(rates)
	}
	return r
}

// imbalance returns max/mean of xs, or nil when xs is empty or all zero.
func imbalance(xs []float64) *float64 {
	var sum, hi float64
	for _, x := range xs {
		sum += x
		hi = max(hi, x)
	}
	if sum <= 0 {
		return nil
	}
	v := hi / (sum / float64(len(xs)))
	return &v
}

// healthOf converts a health record.
func healthOf(hs scheduler.HealthStatus) Health {
	h := Health{State: hs.State, Reason: hs.Reason, Ejections: hs.Ejections}
	if !hs.Until.IsZero() {
		until := hs.Until
		h.Until = &until
	}
	return h
}

// rankOf returns rank, or nil for NoRank.
func rankOf(rank int) *int {
	if rank == scheduler.NoRank {
		return nil
	}
	return &rank
}

// decisionOf converts one decision. The path loses its query: it may carry
// what a client would not want shown.
func decisionOf(d scheduler.DecisionStatus) Decision {
	path := d.Path
	if i := strings.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	return Decision{
		Time: d.At, RequestID: d.RequestID, Path: path, Model: d.Model,
		Prefill: choiceOf(d.Prefill), Decode: choiceOf(d.Decode), Error: d.Err,
	}
}

// decodeCacheOf names a decode engine's cache for the page.
func decodeCacheOf(dc scheduler.DecodeCache) string {
	switch {
	case dc.Radix && dc.HostRatio > 0:
		return "radix+host"
	case dc.Radix:
		return "radix"
	}
	return "off"
}

// choiceOf converts one role's choice; nil stays nil.
func choiceOf(c *scheduler.ChoiceStatus) *Choice {
	if c == nil {
		return nil
	}
	return &Choice{
		Target: c.Target, URL: c.URL, Rank: rankOf(c.Rank), Policy: c.Policy,
		Candidates: c.Candidates, LoadTokens: c.LoadTokens, Prefix: c.Prefix, CachedTokens: c.CachedTokens, Tokens: c.Tokens,
	}
}
