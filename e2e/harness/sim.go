package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
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
}

// Record is one inference request as the simulated engine saw it.
type Record struct {
	Path           string            `json:"path"`
	Mode           string            `json:"mode"`
	Headers        map[string]string `json:"headers"`
	Body           json.RawMessage   `json:"body"`
	DPRank         *int              `json:"dp_rank"`
	RankSource     string            `json:"rank_source"`
	BootstrapRooms []*uint64         `json:"bootstrap_rooms"`
	BootstrapHost  string            `json:"bootstrap_host"`
	BootstrapPort  *int              `json:"bootstrap_port"`
	PrefillDPRank  *int              `json:"prefill_dp_rank"`
	Status         int               `json:"status"`
	Error          string            `json:"error"`
}

// Rooms returns the bootstrap rooms the request carried (missing ones left out).
func (r Record) Rooms() []uint64 {
	var out []uint64
	for _, room := range r.BootstrapRooms {
		if room != nil {
			out = append(out, *room)
		}
	}
	return out
}

// RequestID returns the record's x-request-id header.
func (r Record) RequestID() string { return r.Headers["x-request-id"] }

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
