package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"

	"github.com/duet-router/duet/e2e/sim"
)

// Sim is a running duet-sim engine.
type Sim struct {
	*Process
	// Mode is prefill, decode or null.
	Mode string
	// URL is the engine's base URL; Address its "ip:port".
	URL, Address string
	// BootstrapPort is the prefill bootstrap server's port.
	BootstrapPort int
	// DPSize is the engine's data-parallel size.
	DPSize int
	// KVEventsPort and KVReplayPort are rank 0's KV event PUB and replay
	// ports (rank r: + r) under Options.KVEvents; 0 otherwise.
	KVEventsPort, KVReplayPort int
}

// Restart starts the engine again on the same ports after it stopped or
// was killed, and waits until it is healthy.
func (s *Sim) Restart(ctx context.Context) error {
	if err := s.Process.Restart(); err != nil {
		return err
	}
	return waitHTTP(ctx, s.Process, s.URL+"/health")
}

// Record is one inference request as the simulated engine saw it (the
// JSON of GET /sim/requests).
type Record = sim.Record

// Requests returns what the engine has recorded.
func (s *Sim) Requests(ctx context.Context) ([]Record, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/sim/requests", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("%s records: %w", s.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s records: status %d", s.Name, resp.StatusCode)
	}
	var recs []Record
	if err := json.NewDecoder(resp.Body).Decode(&recs); err != nil {
		return nil, fmt.Errorf("%s records: %w", s.Name, err)
	}
	return recs, nil
}

// Reset clears the engine's records.
func (s *Sim) Reset(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, s.URL+"/sim/requests", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s reset: %w", s.Name, err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s reset: status %d", s.Name, resp.StatusCode)
	}
	return nil
}

// SetFaults changes the engine's faults at runtime (POST /sim/faults):
// set fields replace the current values, nil ones are kept. It returns
// the faults now in force.
func (s *Sim) SetFaults(ctx context.Context, u sim.FaultUpdate) (sim.FaultsJSON, error) {
	var out sim.FaultsJSON
	body, err := json.Marshal(u)
	if err != nil {
		return out, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+"/sim/faults", bytes.NewReader(body))
	if err != nil {
		return out, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return out, fmt.Errorf("%s set faults: %w", s.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<10))
		return out, fmt.Errorf("%s set faults: status %d: %s", s.Name, resp.StatusCode, msg)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return out, fmt.Errorf("%s set faults: %w", s.Name, err)
	}
	return out, nil
}

// Stats returns the engine's abort counters and the rids in flight (GET
// /sim/stats).
func (s *Sim) Stats(ctx context.Context) (sim.Stats, error) {
	var out sim.Stats
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/sim/stats", nil)
	if err != nil {
		return out, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return out, fmt.Errorf("%s stats: %w", s.Name, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return out, fmt.Errorf("%s stats: status %d", s.Name, resp.StatusCode)
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		return out, fmt.Errorf("%s stats: %w", s.Name, err)
	}
	return out, nil
}
