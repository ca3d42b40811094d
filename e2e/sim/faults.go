package sim

import (
	"context"
	"errors"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
)

// ErrDied is delivered by Server.Errors when the server crashed on
// purpose (Faults.DieAfter).
var ErrDied = errors.New("simulated crash (--fault-die-after)")

// faultState draws the faults of each inference request.
type faultState struct {
	cfg     Faults
	seed    uint64
	arrived atomic.Uint64
	dead    atomic.Bool
	once    sync.Once
	onDie   func()
}

// newFaultState returns the fault injector; onDie runs once, on the crash.
func newFaultState(cfg Faults, seed uint64, onDie func()) *faultState {
	return &faultState{cfg: cfg, seed: seed, onDie: onDie}
}

// requestFaults are the faults drawn for one request.
type requestFaults struct {
	// die: this request crashes the server.
	die bool
	// fail: answer HTTP 500.
	fail bool
	// spike: delay the request by Faults.Spike.
	spike bool
}

// next numbers an arriving inference request and draws its faults from a
// source seeded by (seed, arrival number): the same seed and arrival
// order give the same faults, whatever the concurrency.
func (f *faultState) next() requestFaults {
	n := f.arrived.Add(1)
	var out requestFaults
	if f.dead.Load() || (f.cfg.DieAfter > 0 && n > uint64(f.cfg.DieAfter)) {
		out.die = true
		return out
	}
	if f.cfg.SpikeProb == 0 && f.cfg.ErrorRate == 0 {
		return out
	}
	rng := rand.New(rand.NewPCG(f.seed, n))
	// Always draw both, in this order, so one knob does not shift the
	// other's outcomes.
	spike, fail := rng.Float64(), rng.Float64()
	out.spike = spike < f.cfg.SpikeProb
	out.fail = fail < f.cfg.ErrorRate
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

// crash simulates the engine process dying: listeners close, requests in
// flight are cut, Errors delivers ErrDied.
func (s *Server) crash() {
	s.log.Warn("simulated crash", zap.Int("die_after", s.cfg.Faults.DieAfter))
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

// slowScrape wraps a load or metrics handler with the scrape delay.
func (s *Server) slowScrape(h http.Handler) http.Handler {
	if s.cfg.Faults.SlowScrape <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := sleepModel(r.Context(), s.clk, s.cfg.Faults.SlowScrape); err != nil {
			return
		}
		h.ServeHTTP(w, r)
	})
}

// spikeDelay sleeps for the spike duration.
func (s *Server) spikeDelay(ctx context.Context) error {
	return sleepModel(ctx, s.clk, s.cfg.Faults.Spike)
}
