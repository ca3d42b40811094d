package sim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"
)

// abortReqMsg ends the message of every abort that fails its request.
const abortReqMsg = "Aborted by AbortReq."

// itemStage is where an in-flight item is; it decides what an abort does.
type itemStage int32

const (
	// stageQueued: accepted, not started yet.
	stageQueued itemStage = iota
	// stagePrefill: a prefill leg at work (bootstrap, forward, KV transfer).
	stagePrefill
	// stageWaitKV: a decode leg waiting for its KV (prealloc and transfer
	// queues).
	stageWaitKV
	// stageRunning: generating tokens (decode after its KV arrived, or
	// aggregated).
	stageRunning
)

// String returns the stage's name in GET /sim/stats.
func (s itemStage) String() string {
	switch s {
	case stagePrefill:
		return "prefill"
	case stageWaitKV:
		return "waiting_kv"
	case stageRunning:
		return "running"
	}
	return "queued"
}

// abortCause is the cancellation cause of an item aborted by
// /abort_request. graceful aborts end the item with finish_reason abort
// (HTTP 200, partial output); the others fail it with a 500.
type abortCause struct {
	graceful bool
	// msg is the finish_reason message of a graceful abort.
	msg string
}

// Error implements error.
func (c *abortCause) Error() string { return abortReqMsg }

// abortOf returns the abort that cancelled ctx, or nil.
func abortOf(ctx context.Context) *abortCause {
	if ctx.Err() == nil {
		return nil
	}
	c, _ := context.Cause(ctx).(*abortCause)
	return c
}

// inflightItem is one item of an inference request between its
// acceptance and its end, as SGLang's rid_to_state entry.
type inflightItem struct {
	rid  string
	path string
	mode Mode

	mu     sync.Mutex
	stage  itemStage
	cause  *abortCause
	cancel context.CancelCauseFunc
}

// setStage records the item's progress.
func (it *inflightItem) setStage(st itemStage) {
	it.mu.Lock()
	defer it.mu.Unlock()
	it.stage = st
}

// attach gives the item the cancel function of its running context; an
// abort that came earlier cancels it at once.
func (it *inflightItem) attach(cancel context.CancelCauseFunc) {
	it.mu.Lock()
	defer it.mu.Unlock()
	it.cancel = cancel
	if it.cause != nil {
		cancel(it.cause)
	}
}

// abort ends the item the way SGLang's scheduler does for its stage: an
// aggregated item, or a decode item already generating, finishes with
// finish_reason abort; a prefill item, or a decode item still waiting
// for its KV, fails. It reports false if the item was already aborted.
func (it *inflightItem) abort() bool {
	it.mu.Lock()
	defer it.mu.Unlock()
	if it.cause != nil {
		return false
	}
	c := &abortCause{graceful: it.mode == ModeNull || it.stage == stageRunning, msg: "Aborted"}
	if c.graceful && it.stage == stageQueued {
		c.msg = "Abort in waiting queue"
	}
	it.cause = c
	if it.cancel != nil {
		it.cancel(c)
	}
	return true
}

// aborted reports whether /abort_request hit the item.
func (it *inflightItem) aborted() bool {
	it.mu.Lock()
	defer it.mu.Unlock()
	return it.cause != nil
}

// InFlightItem describes an item in flight in GET /sim/stats.
type InFlightItem struct {
	// RID is the item's request id.
	RID string `json:"rid"`
	// Path is the route of its request.
	Path string `json:"path"`
	// Stage is queued, prefill, waiting_kv or running.
	Stage string `json:"stage"`
	// Aborted is true once /abort_request hit it (it may take a moment to
	// end).
	Aborted bool `json:"aborted"`
}

// Stats is the body of GET /sim/stats.
type Stats struct {
	// AbortRequests counts the POST /abort_request calls received.
	AbortRequests int64 `json:"abort_requests"`
	// Aborted counts the items those calls aborted (also exported as
	// sglang:num_aborted_requests_total).
	Aborted int64 `json:"aborted"`
	// InFlight lists the items in flight, by rid.
	InFlight []InFlightItem `json:"in_flight"`
}

// inflightSet is the server's in-flight items by rid, as SGLang's
// tokenizer manager keeps rid_to_state.
type inflightSet struct {
	mu    sync.Mutex
	items map[string]*inflightItem

	abortRequests atomic.Int64
	aborted       atomic.Int64
}

// newInflightSet returns an empty set.
func newInflightSet() *inflightSet {
	return &inflightSet{items: make(map[string]*inflightItem)}
}

// register adds one item per rid, all or none: a rid already in flight is
// SGLang's 400 "Duplicate request ID detected".
func (s *inflightSet) register(path string, mode Mode, rids []string) ([]*inflightItem, *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, rid := range rids {
		if _, ok := s.items[rid]; ok {
			return nil, badRequestf("%s%s", duplicateRIDPrefix, rid)
		}
	}
	out := make([]*inflightItem, len(rids))
	for i, rid := range rids {
		it := &inflightItem{rid: rid, path: path, mode: mode}
		s.items[rid] = it
		out[i] = it
	}
	return out, nil
}

// unregister removes items, which ended.
func (s *inflightSet) unregister(items []*inflightItem) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, it := range items {
		if s.items[it.rid] == it {
			delete(s.items, it.rid)
		}
	}
}

// abort carries out an /abort_request: unless all, rid must be exactly the
// rid of an item in flight (the tokenizer's check; an empty rid is
// ignored), and then every item whose rid starts with it is aborted (the
// scheduler's prefix match). It returns how many items it aborted.
func (s *inflightSet) abort(rid string, all bool) int {
	s.abortRequests.Add(1)
	s.mu.Lock()
	var hit []*inflightItem
	if _, ok := s.items[rid]; all || (rid != "" && ok) {
		for r, it := range s.items {
			if all || strings.HasPrefix(r, rid) {
				hit = append(hit, it)
			}
		}
	}
	s.mu.Unlock()
	n := 0
	for _, it := range hit {
		if it.abort() {
			n++
		}
	}
	s.aborted.Add(int64(n))
	return n
}

// stats returns the counters and the items in flight, sorted by rid.
func (s *inflightSet) stats() Stats {
	s.mu.Lock()
	items := make([]*inflightItem, 0, len(s.items))
	for _, it := range s.items {
		items = append(items, it)
	}
	s.mu.Unlock()
	out := Stats{AbortRequests: s.abortRequests.Load(), Aborted: s.aborted.Load(), InFlight: []InFlightItem{}}
	for _, it := range items {
		it.mu.Lock()
		out.InFlight = append(out.InFlight, InFlightItem{RID: it.rid, Path: it.path, Stage: it.stage.String(), Aborted: it.cause != nil})
		it.mu.Unlock()
	}
	sort.Slice(out.InFlight, func(i, j int) bool { return out.InFlight[i].RID < out.InFlight[j].RID })
	return out
}

// abortRequest is the body of POST /abort_request (SGLang's AbortReq; the
// internal fields are ignored).
type abortRequest struct {
	RID      *string `json:"rid"`
	AbortAll bool    `json:"abort_all"`
}

// handleAbort serves POST /abort_request: HTTP 200 with an empty body,
// whether or not anything matched. A hung engine (Faults.Hang) accepts the
// call and does nothing, as its stuck scheduler never reads the abort.
func (s *Server) handleAbort(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
	if err != nil {
		writeDetail(w, http.StatusBadRequest, "read request body: "+err.Error())
		return
	}
	var req abortRequest
	if len(strings.TrimSpace(string(body))) > 0 {
		if err := json.Unmarshal(body, &req); err != nil {
			writeDetail(w, http.StatusUnprocessableEntity, "invalid AbortReq: "+err.Error())
			return
		}
	}
	rid := ""
	if req.RID != nil {
		rid = *req.RID
	}
	if s.faults.current().Hang {
		s.inflight.abortRequests.Add(1)
		s.log.Info("abort_request ignored: engine hung (--fault-hang)")
	} else {
		n := s.inflight.abort(rid, req.AbortAll)
		s.log.Debug("abort_request", zap.String("rid", rid), zap.Bool("abort_all", req.AbortAll), zap.Int("aborted", n))
	}
	w.WriteHeader(http.StatusOK)
}

// handleStats serves GET /sim/stats.
func (s *Server) handleStats(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.inflight.stats())
}
