package sim

import (
	"encoding/json"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Record describes one inference HTTP request the simulator received.
// Records are appended when the request finishes, so Status is final.
// For batch requests the scalar fields (DPRank, PrefillDPRank,
// BootstrapHost, BootstrapPort) describe the first item and the list
// fields describe every item.
type Record struct {
	// Path is the request path, e.g. /v1/chat/completions.
	Path string `json:"path"`
	// Mode is the server's disaggregation mode.
	Mode Mode `json:"mode"`
	// Headers maps each lowercased header name to its first value.
	Headers map[string]string `json:"headers"`
	// Body is the raw JSON received (a JSON string if it was not JSON).
	Body json.RawMessage `json:"body"`
	// DPRank is the DP rank that served the request, nil if none was picked.
	DPRank *int `json:"dp_rank"`
	// DPRanks is the rank of every batch item.
	DPRanks []int `json:"dp_ranks"`
	// RankSource says where the rank came from: header, body, room,
	// round_robin, or least_loaded (vLLM flavour); nil if no rank was
	// picked.
	RankSource *string `json:"rank_source"`
	// BootstrapRooms lists the bootstrap rooms, one per item (nil items
	// for missing rooms).
	BootstrapRooms []*int64 `json:"bootstrap_rooms"`
	// BootstrapHost is the first item's bootstrap_host.
	BootstrapHost *string `json:"bootstrap_host"`
	// BootstrapPort is the first item's bootstrap_port.
	BootstrapPort *int `json:"bootstrap_port"`
	// PrefillDPRank is, on decode, the prefill rank expected to hold the KV.
	PrefillDPRank *int `json:"prefill_dp_rank"`
	// PrefillDPRanks lists the expected prefill rank of every item (decode).
	PrefillDPRanks []int `json:"prefill_dp_ranks,omitempty"`
	// Stream reports whether the client asked for a streaming response.
	Stream bool `json:"stream"`
	// Status is the HTTP status sent; 499 if the client disconnected. A
	// streaming request that failed after the 200 was sent keeps 200 and
	// sets Error.
	Status int `json:"status"`
	// Error is the failure message, empty on success.
	Error string `json:"error"`
	// RIDs is every item's request id (SGLang's rid, see the rid body
	// field), in item order; empty if the body did not parse.
	RIDs []string `json:"rids"`
	// FinishReasons is every item's finish reason: "length", "abort"
	// (aborted while generating), or "" for an item that failed or did
	// not finish.
	FinishReasons []string `json:"finish_reasons,omitempty"`
	// Aborted reports that /abort_request hit at least one item; Status,
	// Error and FinishReasons tell how it ended (500 with "... Aborted by
	// AbortReq." while waiting, finish_reason abort while generating).
	Aborted bool `json:"aborted"`
	// AbortedRIDs lists the rids of the items /abort_request hit.
	AbortedRIDs []string `json:"aborted_rids,omitempty"`
	// DecodePrefixLen is, on a decode with the decode radix cache (engine
	// model), every item's prompt tokens matched in the decode's cache at
	// preallocation (GPU and host tiers): the decode_prefix_len it sent to
	// its prefill. 0 for an item that was never preallocated.
	DecodePrefixLen []int `json:"decode_prefix_len,omitempty"`
	// HostHitTokens is the host-tier part of DecodePrefixLen (decode
	// HiCache), per item.
	HostHitTokens []int `json:"host_hit_tokens,omitempty"`
	// TransferredTokens is, on an engine-model prefill told by its decode
	// (every item that left the bootstrap queue), every item's tokens
	// whose KV it sent (prompt - decode_prefix_len); 0 for an item whose
	// transfer did not start.
	TransferredTokens []int `json:"transferred_tokens,omitempty"`
	// Priority is the body's priority field, nil when absent (and on
	// /v1/responses, whose priority SGLang does not hand to its engine).
	// A request without one runs at the lowest priority under
	// --enable-priority-scheduling.
	Priority *int64 `json:"priority"`
	// TraceParent is the W3C traceparent header the request carried (the
	// span of the proxy's request to this engine, when it traces), empty
	// without one. SGLang started with --enable-trace reads the same
	// header (with tracestate), so its own spans join that trace.
	TraceParent string `json:"traceparent,omitempty"`
	// StartedAt is when the request arrived.
	StartedAt time.Time `json:"started_at"`
	// DurationMS is how long the request took, in milliseconds.
	DurationMS float64 `json:"duration_ms"`
}

// noteDecodeCache fills rec's decode radix cache fields from the items'
// results: the decode's matches on a decode with the cache, the tokens
// sent on a prefill any of whose items was told its decode's prefix.
func noteDecodeCache(rec *Record, results []itemResult) {
	radix, told := false, false
	for _, res := range results {
		radix = radix || res.radix
		told = told || res.gotPrefix
	}
	if radix {
		rec.DecodePrefixLen = make([]int, len(results))
		rec.HostHitTokens = make([]int, len(results))
		for i, res := range results {
			rec.DecodePrefixLen[i], rec.HostHitTokens[i] = res.decodePrefix, res.hostHit
		}
	}
	if told {
		rec.TransferredTokens = make([]int, len(results))
		for i, res := range results {
			rec.TransferredTokens[i] = res.transferred
		}
	}
}

// recordStore is a bounded, mutex-protected list of records.
type recordStore struct {
	mu      sync.Mutex
	max     int
	records []Record
}

// newRecordStore returns a store keeping at most max records.
func newRecordStore(max int) *recordStore {
	return &recordStore{max: max}
}

// add appends r. When the store is full it drops the oldest tenth of the
// records at once, so that adding stays cheap on average.
func (s *recordStore) add(r Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.records) >= s.max {
		drop := min(len(s.records), s.max/10+1)
		n := copy(s.records, s.records[drop:])
		clear(s.records[n:])
		s.records = s.records[:n]
	}
	s.records = append(s.records, r)
}

// list returns a copy of all records, oldest first.
func (s *recordStore) list() []Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Record, len(s.records))
	copy(out, s.records)
	return out
}

// clear removes all records and returns how many there were.
func (s *recordStore) clear() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.records)
	s.records = nil
	return n
}

// handleList serves GET /sim/requests.
func (s *recordStore) handleList(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.list())
}

// handleClear serves DELETE /sim/requests.
func (s *recordStore) handleClear(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]int{"cleared": s.clear()})
}

// firstHeaders maps lowercased header names to their first value.
func firstHeaders(h http.Header) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		if len(v) > 0 {
			out[strings.ToLower(k)] = v[0]
		}
	}
	return out
}

// rawBody returns b as an embeddable JSON value: b itself if it is valid
// JSON, otherwise a JSON string holding it.
func rawBody(b []byte) json.RawMessage {
	if len(b) > 0 && json.Valid(b) {
		return json.RawMessage(append([]byte(nil), b...))
	}
	s, _ := json.Marshal(string(b))
	return s
}

// RequestID returns the request's x-request-id header.
func (r Record) RequestID() string { return r.Headers["x-request-id"] }

// Rooms returns the bootstrap rooms the request carried, missing ones left out.
func (r Record) Rooms() []uint64 {
	var out []uint64
	for _, room := range r.BootstrapRooms {
		if room != nil && *room >= 0 {
			out = append(out, uint64(*room))
		}
	}
	return out
}

// Source returns where the rank came from, or "" if no rank was picked.
func (r Record) Source() string { return stringOrEmpty(r.RankSource) }

// Host returns the first item's bootstrap_host, or "".
func (r Record) Host() string { return stringOrEmpty(r.BootstrapHost) }

func stringOrEmpty(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
