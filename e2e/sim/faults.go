package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
)

// ErrDied is delivered by Server.Errors when the server crashed on
// purpose (Faults.DieAfter).
var ErrDied = errors.New("simulated crash (--fault-die-after)")

// LoadsFault selects how /v1/loads and /metrics answer (Faults.Loads).
type LoadsFault string

// Loads faults.
const (
	// LoadsOK answers normally (the default; "" means the same).
	LoadsOK LoadsFault = "ok"
	// LoadsGarbage answers 200 with bytes that parse neither as JSON nor
	// as Prometheus text.
	LoadsGarbage LoadsFault = "garbage"
	// Loads500 answers HTTP 500 Internal Server Error.
	Loads500 LoadsFault = "500"
)

// ParseLoadsFault parses a --fault-loads value.
func ParseLoadsFault(s string) (LoadsFault, error) {
	switch LoadsFault(s) {
	case "", LoadsOK:
		return LoadsOK, nil
	case LoadsGarbage, Loads500:
		return LoadsFault(s), nil
	}
	return "", fmt.Errorf("invalid loads fault %q: want ok, garbage or 500", s)
}

// garbageScrape is the body of a scrape under LoadsGarbage: neither JSON
// nor Prometheus text.
const garbageScrape = "{\"loads\": [{\"dp_rank\": 0, \"num_running_reqs\": \x00\xff\xfe sglang:num_running_reqs{dp_rank=\"0\" ?\n"

// validate reports the invalid fields of f.
func (f Faults) validate() []error {
	var errs []error
	for name, p := range map[string]float64{"fault spike probability": f.SpikeProb, "fault error rate": f.ErrorRate} {
		if !(p >= 0 && p <= 1) {
			errs = append(errs, fmt.Errorf("%s must be in [0, 1], got %v", name, p))
		}
	}
	if f.Spike < 0 || f.SlowScrape < 0 || f.DieAfter < 0 {
		errs = append(errs, errors.New("fault durations and counts must not be negative"))
	}
	if _, err := ParseLoadsFault(string(f.Loads)); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// FaultsJSON is the JSON form of Faults served by GET /sim/faults.
// Durations are milliseconds of model time.
type FaultsJSON struct {
	// Hang is Faults.Hang.
	Hang bool `json:"hang"`
	// Loads is Faults.Loads: ok, garbage or 500.
	Loads LoadsFault `json:"loads"`
	// ErrorRate is Faults.ErrorRate.
	ErrorRate float64 `json:"error_rate"`
	// SlowScrapeMS is Faults.SlowScrape in ms.
	SlowScrapeMS float64 `json:"slow_scrape_ms"`
	// SpikeProb is Faults.SpikeProb.
	SpikeProb float64 `json:"spike_prob"`
	// SpikeMS is Faults.Spike in ms.
	SpikeMS float64 `json:"spike_ms"`
	// DieAfter is Faults.DieAfter.
	DieAfter int `json:"die_after"`
}

// JSON returns f's JSON form.
func (f Faults) JSON() FaultsJSON {
	loads := f.Loads
	if loads == "" {
		loads = LoadsOK
	}
	return FaultsJSON{
		Hang: f.Hang, Loads: loads, ErrorRate: f.ErrorRate,
		SlowScrapeMS: durationMS(f.SlowScrape), SpikeProb: f.SpikeProb, SpikeMS: durationMS(f.Spike), DieAfter: f.DieAfter,
	}
}

// FaultUpdate changes the faults of a running server (POST /sim/faults,
// Server.UpdateFaults): set fields replace the current values, nil ones
// are kept. The JSON names are those of FaultsJSON.
type FaultUpdate struct {
	// Hang switches the hung engine on or off.
	Hang *bool `json:"hang,omitempty"`
	// Loads sets the /v1/loads and /metrics answers.
	Loads *LoadsFault `json:"loads,omitempty"`
	// ErrorRate sets the probability of an HTTP 500.
	ErrorRate *float64 `json:"error_rate,omitempty"`
	// SlowScrapeMS sets the scrape delay in ms (model time).
	SlowScrapeMS *float64 `json:"slow_scrape_ms,omitempty"`
	// SpikeProb sets the probability of a latency spike.
	SpikeProb *float64 `json:"spike_prob,omitempty"`
	// SpikeMS sets the spike duration in ms (model time).
	SpikeMS *float64 `json:"spike_ms,omitempty"`
	// DieAfter sets the crash threshold, counted in inference requests
	// since the server started (0 never).
	DieAfter *int `json:"die_after,omitempty"`

	// The fields below are actions, done once when the update is
	// applied, in this order: kv_events_drop, reset_cache,
	// kv_events_down_ms. GET /sim/faults does not report them.

	// ResetCache, when true, empties every rank's prefix cache now,
	// whatever it holds, as an engine restart does: each rank publishes
	// AllBlocksCleared (requests in flight keep their KV, uncached).
	ResetCache *bool `json:"reset_cache,omitempty"`
	// KVEventsDownMS takes the KV event publisher down for that many ms
	// (model time), as an engine process restart shows to a subscriber:
	// every rank's sockets close at once (the events of the meantime are
	// lost) and reopen on the same ports afterwards with a fresh
	// publisher, its sequence from 0, its replay buffer empty and its
	// first batch [AllBlocksCleared], the prefix cache being emptied then
	// (as ResetCache). It needs a "zmq" --kv-events-config.
	KVEventsDownMS *float64 `json:"kv_events_down_ms,omitempty"`
	// KVEventsDrop makes every rank's next N batches of KV events go
	// missing on the way, as messages a subscriber never got: they are
	// sequenced and kept for replay, but not sent on the PUB socket. A
	// subscriber sees the gap at the next batch and may replay it. It
	// needs a "zmq" --kv-events-config.
	KVEventsDrop *int `json:"kv_events_drop,omitempty"`
}

// apply returns f changed by u.
func (u FaultUpdate) apply(f Faults) Faults {
	if u.Hang != nil {
		f.Hang = *u.Hang
	}
	if u.Loads != nil {
		f.Loads = *u.Loads
	}
	if u.ErrorRate != nil {
		f.ErrorRate = *u.ErrorRate
	}
	if u.SlowScrapeMS != nil {
		f.SlowScrape = msDuration(*u.SlowScrapeMS)
	}
	if u.SpikeProb != nil {
		f.SpikeProb = *u.SpikeProb
	}
	if u.SpikeMS != nil {
		f.Spike = msDuration(*u.SpikeMS)
	}
	if u.DieAfter != nil {
		f.DieAfter = *u.DieAfter
	}
	if f.Loads == "" {
		f.Loads = LoadsOK
	}
	return f
}

// durationMS converts d to float milliseconds.
func durationMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// msDuration converts float milliseconds to a duration.
func msDuration(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// faultState holds the current faults and draws those of each inference
// request.
type faultState struct {
	seed    uint64
	arrived atomic.Uint64
	dead    atomic.Bool
	once    sync.Once
	onDie   func()

	mu  sync.Mutex
	cfg Faults
	// unhang is closed when a hang ends; replaced when one starts.
	unhang chan struct{}
}

// newFaultState returns the fault injector; onDie runs once, on the crash.
func newFaultState(cfg Faults, seed uint64, onDie func()) *faultState {
	f := &faultState{seed: seed, onDie: onDie, unhang: make(chan struct{})}
	f.set(cfg)
	return f
}

// current returns the faults in force.
func (f *faultState) current() Faults {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cfg
}

// set replaces the faults; ending a hang releases what it held.
func (f *faultState) set(cfg Faults) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if cfg.Hang && !f.cfg.Hang {
		f.unhang = make(chan struct{})
	} else if !cfg.Hang {
		select {
		case <-f.unhang:
		default:
			close(f.unhang)
		}
	}
	f.cfg = cfg
}

// hung reports whether the engine hangs and, if so, a channel closed when
// the hang ends.
func (f *faultState) hung() (bool, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.cfg.Hang, f.unhang
}

// requestFaults are the faults drawn for one request.
type requestFaults struct {
	// die: this request crashes the server.
	die bool
	// fail: answer HTTP 500.
	fail bool
	// spike: delay the request by spikeFor.
	spike    bool
	spikeFor time.Duration
}

// next numbers an arriving inference request and draws its faults from a
// source seeded by (seed, arrival number): the same seed and arrival
// order give the same faults, whatever the concurrency.
func (f *faultState) next() requestFaults {
	n := f.arrived.Add(1)
	cfg := f.current()
	var out requestFaults
	if f.dead.Load() || (cfg.DieAfter > 0 && n > uint64(cfg.DieAfter)) {
		out.die = true
		return out
	}
	if cfg.SpikeProb == 0 && cfg.ErrorRate == 0 {
		return out
	}
	rng := rand.New(rand.NewPCG(f.seed, n))
	// Always draw both, in this order, so one knob does not shift the
	// other's outcomes.
	spike, fail := rng.Float64(), rng.Float64()
	out.spike = spike < cfg.SpikeProb
	out.spikeFor = cfg.Spike
	out.fail = fail < cfg.ErrorRate
	return out
}

// die marks the server dead and runs onDie once.
func (f *faultState) die() {
	f.dead.Store(true)
	f.once.Do(func() {
		if f.onDie != nil {
			f.onDie()
		}
	})
}

// Faults returns the faults in force (the configured ones, as changed at
// runtime by UpdateFaults or POST /sim/faults).
func (s *Server) Faults() Faults { return s.faults.current() }

// UpdateFaults changes the faults of the running server and returns the
// new ones. Invalid values change nothing.
func (s *Server) UpdateFaults(u FaultUpdate) (Faults, error) {
	s.faultsMu.Lock()
	defer s.faultsMu.Unlock()
	next := u.apply(s.faults.current())
	errs := next.validate()
	if d := u.KVEventsDownMS; d != nil {
		switch {
		case s.kvpub == nil:
			errs = append(errs, errors.New(`kv_events_down_ms: no KV event publisher (--kv-events-config with "publisher": "zmq")`))
		case !(*d > 0) || math.IsInf(*d, 0):
			errs = append(errs, fmt.Errorf("kv_events_down_ms must be > 0, got %v", *d))
		}
	}
	if n := u.KVEventsDrop; n != nil {
		switch {
		case s.kvpub == nil:
			errs = append(errs, errors.New(`kv_events_drop: no KV event publisher (--kv-events-config with "publisher": "zmq")`))
		case *n < 0:
			errs = append(errs, fmt.Errorf("kv_events_drop must not be negative, got %d", *n))
		}
	}
	if len(errs) > 0 {
		return s.faults.current(), errors.Join(errs...)
	}
	s.faults.set(next)
	s.log.Info("faults changed", zap.Any("faults", next.JSON()))
	if u.KVEventsDrop != nil {
		s.kvpub.drop(*u.KVEventsDrop)
	}
	if u.ResetCache != nil && *u.ResetCache {
		s.resetCache()
	}
	if u.KVEventsDownMS != nil {
		s.kvEventsDown(msDuration(*u.KVEventsDownMS))
	}
	return next, nil
}

// resetCache empties every rank's prefix cache, whatever it holds
// (FaultUpdate.ResetCache); the simple model has none. A KV event
// publisher runs only with the engine model (--profile), whose reset
// publishes AllBlocksCleared.
func (s *Server) resetCache() {
	s.log.Warn("prefix cache reset (fault)")
	if s.eng != nil {
		s.eng.locked(func(core *engineCore, now time.Duration) { core.resetCache(now) })
	}
}

// kvEventsDown takes the KV event publisher down for d of model time and
// brings it back as a restarted engine's (FaultUpdate.KVEventsDownMS).
func (s *Server) kvEventsDown(d time.Duration) {
	gen := s.kvpub.stop()
	s.log.Warn("KV event publisher down (fault)", zap.Duration("for", d))
	time.AfterFunc(s.clk.Wall(d), func() {
		if !s.kvpub.current(gen) {
			return // stopped again, closed, or never started
		}
		// Under the engine's lock (a publisher runs only with the engine
		// model), so that no engine batch falls between the cache reset
		// and the fresh publisher's first batch.
		s.eng.locked(func(core *engineCore, now time.Duration) {
			core.resetCache(now)
			if err := s.kvpub.restart(gen); err != nil {
				s.log.Error("KV event publisher did not come back", zap.Error(err))
			}
		})
	})
}

// handleFlushCache serves GET and POST /flush_cache as SGLang does: every
// DP rank that holds no request empties its prefix cache (publishing
// AllBlocksCleared); the answer is rank 0's outcome, 200 "Cache flushed..."
// or 400 "Flush cache failed.". The simple model flushes only when the
// server holds no request. The timeout query parameter is not modelled.
func (s *Server) handleFlushCache(w http.ResponseWriter, _ *http.Request) {
	ok := false
	switch {
	case s.eng != nil:
		s.eng.locked(func(core *engineCore, now time.Duration) { ok = core.flushIdle(now) })
	case len(s.inflight.stats().InFlight) == 0:
		ok = true
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if !ok {
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, "Flush cache failed.\n")
		return
	}
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, "Cache flushed.\nPlease check backend logs for more details. "+
		"(When there are running or waiting requests, the operation will not be performed.)\n")
}

// handleGetFaults serves GET /sim/faults.
func (s *Server) handleGetFaults(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.faults.current().JSON())
}

// handleSetFaults serves POST /sim/faults: a FaultUpdate; it answers the
// faults now in force, or 400 (nothing changed).
func (s *Server) handleSetFaults(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		writeDetail(w, http.StatusBadRequest, "read request body: "+err.Error())
		return
	}
	var u FaultUpdate
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&u); err != nil {
		writeDetail(w, http.StatusBadRequest, "invalid fault update: "+err.Error())
		return
	}
	f, err := s.UpdateFaults(u)
	if err != nil {
		writeDetail(w, http.StatusBadRequest, err.Error())
		return
	}
	writeJSON(w, http.StatusOK, f.JSON())
}

// stall blocks while the engine hangs (Faults.Hang), until the hang ends
// or ctx is done.
func (s *Server) stall(ctx context.Context) error {
	for {
		hung, unhang := s.faults.hung()
		if !hung {
			return ctx.Err()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-unhang:
		}
	}
}

// crash simulates the engine process dying: listeners close, requests in
// flight are cut, Errors delivers ErrDied.
func (s *Server) crash() {
	s.log.Warn("simulated crash", zap.Int("die_after", s.faults.current().DieAfter))
	s.kill()
	s.mu.Lock()
	errs := s.serveErrs
	s.mu.Unlock()
	if errs != nil {
		select {
		case errs <- ErrDied:
		default:
		}
	}
	go func() { _ = s.Close() }()
}

// abortConnection cuts the client's connection the way a crashed process
// does (no HTTP response).
func abortConnection() {
	panic(http.ErrAbortHandler)
}

// scrapeFaults wraps a load or metrics handler with the scrape faults in
// force at each request: a hung engine never answers (until the client
// gives up or the hang ends), then the scrape delay, then a garbage or
// 500 answer instead of the real one.
func (s *Server) scrapeFaults(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.stall(r.Context()) != nil {
			return
		}
		f := s.faults.current()
		if f.SlowScrape > 0 {
			if err := sleepModel(r.Context(), s.clk, f.SlowScrape); err != nil {
				return
			}
		}
		switch f.Loads {
		case LoadsGarbage:
			ct := "application/json"
			if r.URL.Path == "/metrics" || r.URL.Query().Get("format") == "prometheus" {
				ct = "text/plain; version=0.0.4; charset=utf-8"
			}
			w.Header().Set("Content-Type", ct)
			w.WriteHeader(http.StatusOK)
			_, _ = io.WriteString(w, garbageScrape)
		case Loads500:
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.WriteHeader(http.StatusInternalServerError)
			_, _ = io.WriteString(w, "Internal Server Error")
		default:
			h.ServeHTTP(w, r)
		}
	})
}

// schedulerCall wraps a handler that, in SGLang, needs an answer from the
// scheduler (/server_info): it never answers while the engine hangs.
func (s *Server) schedulerCall(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.stall(r.Context()) != nil {
			return
		}
		h(w, r)
	}
}

// handleHealth serves GET /health and /health_generate like SGLang with
// SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION (its default): 503 while the
// server shuts down; otherwise a one-token generation is waited for, which
// a working engine answers at once (200) and a hung one never, giving 503
// after Config.HealthTimeout (model time).
func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	if hung, _ := s.faults.hung(); hung {
		ctx, cancel := context.WithTimeout(r.Context(), s.clk.Wall(s.cfg.HealthTimeout))
		defer cancel()
		if err := s.stall(ctx); err != nil {
			if r.Context().Err() == nil {
				s.log.Warn("health check failed: no generation within the health timeout (engine hung)")
				w.WriteHeader(http.StatusServiceUnavailable)
			}
			return
		}
		if s.draining.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
	}
	w.WriteHeader(http.StatusOK)
}
