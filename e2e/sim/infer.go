package sim

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	// maxBodyBytes bounds an inference request body.
	maxBodyBytes = 64 << 20
	// fakeBootstrapHost is SGLang's FAKE_BOOTSTRAP_HOST: requests carrying
	// it (health_generate) skip the KV transfer.
	fakeBootstrapHost = "2.2.2.2"
	// missingRoomMsg is SGLang's error for a PD request without a room.
	missingRoomMsg = "Disaggregated request received without bootstrap room id"
)

// Observability response headers.
const (
	headerServer       = "X-Sim-Server"
	headerMode         = "X-Sim-Mode"
	headerDPRank       = "X-Sim-DP-Rank"
	headerDPRanks      = "X-Sim-DP-Ranks"
	headerPrefillRank  = "X-Sim-Prefill-DP-Rank"
	headerPrefillRanks = "X-Sim-Prefill-DP-Ranks"
)

// inferHandler serves one inference route.
func (s *Server) inferHandler(route routeKind) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s.serveInfer(r.Context(), w, r, route)
	}
}

// serveInfer runs one inference request end to end and records it.
func (s *Server) serveInfer(ctx context.Context, w http.ResponseWriter, r *http.Request, route routeKind) {
	faults := s.faults.next()
	if faults.die {
		s.faults.die()
		abortConnection()
	}
	// A crash cuts the requests in flight: their work stops and their
	// connections are dropped without a response.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(s.deadCtx, cancel)()
	defer func() {
		if s.faults.dead.Load() {
			abortConnection()
		}
	}()
	rec := &Record{
		Path:           r.URL.Path,
		Mode:           s.cfg.Mode,
		Headers:        firstHeaders(r.Header),
		TraceParent:    r.Header.Get("traceparent"),
		StartedAt:      time.Now(),
		DPRanks:        []int{},
		BootstrapRooms: []*int64{},
		RIDs:           []string{},
	}
	defer func() {
		rec.DurationMS = float64(time.Since(rec.StartedAt).Microseconds()) / 1000
		s.records.add(*rec)
		s.log.Debug("request done", zapRecord(rec)...)
	}()
	w.Header().Set(headerServer, s.name())
	w.Header().Set(headerMode, string(s.cfg.Mode))

	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	rec.Body = rawBody(body)
	if err != nil {
		s.reject(w, rec, route, badRequestf("read request body: %v", err))
		return
	}
	req, aerr := parseInferRequest(route, body, s.cfg.Model, s.parseOptions())
	if aerr != nil {
		s.reject(w, rec, route, aerr)
		return
	}
	rec.RIDs = req.rids
	rec.Priority = req.priority
	if faults.fail {
		s.reject(w, rec, route, internalErrorf("Internal server error (simulated fault: --fault-error-rate)"))
		return
	}
	rec.Stream = req.stream
	rec.BootstrapRooms = req.boot.rooms
	rec.BootstrapHost, rec.BootstrapPort = req.boot.hosts[0], req.boot.ports[0]

	pin, aerr := s.explicitRank(route, r.Header, req.bodyRank)
	if aerr != nil {
		s.reject(w, rec, route, aerr)
		return
	}
	if s.cfg.Mode != ModeNull {
		for _, room := range req.boot.rooms {
			if room == nil {
				s.reject(w, rec, route, badRequestf("%s", missingRoomMsg))
				return
			}
		}
	}
	// The rids are in flight from here on (SGLang's rid_to_state): a rid
	// already in flight is rejected, and /abort_request can reach them.
	items, aerr := s.inflight.register(r.URL.Path, s.cfg.Mode, req.rids)
	if aerr != nil {
		s.reject(w, rec, route, aerr)
		return
	}
	defer s.inflight.unregister(items)
	defer noteAborts(rec, items)
	plans := s.plan(req, pin, rec)
	w.Header().Set(headerDPRank, strconv.Itoa(plans[0].rank))
	w.Header().Set(headerDPRanks, joinInts(rec.DPRanks))
	if s.abortsPriority(req) {
		// The scheduler aborts it on arrival, before a decode looks for
		// its prefill.
		s.abortPriority(w, req, rec)
		return
	}

	// Decode learns the prefill's layout before it can wait for the KV. A
	// failure here surfaces after the stream started, as in SGLang.
	var deferred *apiError
	if s.cfg.Mode == ModeDecode {
		if err := s.resolvePrefillRanks(ctx, req, plans, rec); err != nil {
			if ctx.Err() != nil {
				s.markGone(rec)
				return
			}
			deferred = toAPIError(err)
		}
		if rec.PrefillDPRank != nil {
			w.Header().Set(headerPrefillRank, strconv.Itoa(*rec.PrefillDPRank))
			w.Header().Set(headerPrefillRanks, joinInts(rec.PrefillDPRanks))
		}
	}
	if faults.spike {
		if err := sleepModel(ctx, s.clk, faults.spikeFor); err != nil {
			s.markGone(rec)
			return
		}
	}
	if req.stream {
		s.runStreaming(ctx, w, req, plans, items, deferred, rec)
		return
	}
	if deferred != nil {
		s.inflight.unregister(items)
		s.reject(w, rec, route, deferred)
		return
	}
	s.runBlocking(ctx, w, req, plans, items, rec)
}

// noteAborts records which items /abort_request hit.
func noteAborts(rec *Record, items []*inflightItem) {
	for _, it := range items {
		if it.aborted() {
			rec.Aborted = true
			rec.AbortedRIDs = append(rec.AbortedRIDs, it.rid)
		}
	}
}

// finishReasons lists every item's finish reason, "" for failed items.
func finishReasons(results []itemResult, errs []error) []string {
	out := make([]string, len(results))
	for i, res := range results {
		if errs[i] == nil {
			out[i] = res.finishReason()
		}
	}
	return out
}

// plan assigns a rank to every item and fills the rank fields of rec.
func (s *Server) plan(req *inferRequest, pin *pinnedRank, rec *Record) []*itemPlan {
	plans := make([]*itemPlan, len(req.items))
	for i, in := range req.items {
		p := &itemPlan{index: i, in: in, room: req.boot.rooms[i], host: req.boot.hosts[i], port: req.boot.ports[i]}
		p.rank, p.source = s.chooseRank(pin, p.room)
		plans[i] = p
		rec.DPRanks = append(rec.DPRanks, p.rank)
	}
	rank, src := plans[0].rank, string(plans[0].source)
	rec.DPRank, rec.RankSource = &rank, &src
	return plans
}

// resolvePrefillRanks finds, for each decode item, the prefill bootstrap
// address and the prefill rank expected to hold the KV: the body's
// disagg_prefill_dp_rank, else 0 for a dp_size 1 prefill, else
// bootstrap_room % prefill dp_size when the prefill follows the room.
// A null bootstrap_port means this server's own bootstrap port.
func (s *Server) resolvePrefillRanks(ctx context.Context, req *inferRequest, plans []*itemPlan, rec *Record) error {
	for _, p := range plans {
		host := "None"
		if p.host != nil {
			host = *p.host
		}
		if host == fakeBootstrapHost {
			p.fakeKV = true
			continue
		}
		port := s.cfg.BootstrapPort
		if p.port != nil {
			port = *p.port
		}
		p.bootAddr = net.JoinHostPort(host, strconv.Itoa(port))
		info, err := s.kv.prefillInfo(ctx, p.bootAddr)
		if err != nil {
			return err
		}
		var rank int
		switch {
		case req.disaggPrefillRank != nil:
			rank = *req.disaggPrefillRank
		case info.DPSize == 1:
			rank = 0
		case info.FollowBootstrapRoom && !s.cfg.ForceQueryPrefillDPRank:
			rank = pyMod(*p.room, info.DPSize)
		default:
			continue // the KV is accepted from whichever rank has it
		}
		p.prefillRank = &rank
		rec.PrefillDPRanks = append(rec.PrefillDPRanks, rank)
		if rec.PrefillDPRank == nil {
			r := rank
			rec.PrefillDPRank = &r
		}
	}
	return nil
}

// runBlocking serves a non-streaming request: every item runs to the end
// and the first failing item (by index) decides the error.
func (s *Server) runBlocking(ctx context.Context, w http.ResponseWriter, req *inferRequest, plans []*itemPlan, items []*inflightItem, rec *Record) {
	results, errs := s.runItems(ctx, req, plans, items, nil, nil)
	rec.FinishReasons = finishReasons(results, errs)
	noteDecodeCache(rec, results)
	if ctx.Err() != nil {
		s.markGone(rec)
		return
	}
	for _, err := range errs {
		if err != nil {
			s.reject(w, rec, req.route, toAPIError(err))
			return
		}
	}
	rec.Status = http.StatusOK
	writeJSON(w, http.StatusOK, s.newRenderer(req).full(results))
}

// runStreaming serves a streaming request. The 200 is sent first; a later
// failure becomes SGLang's in-stream error frame and stops the other items.
func (s *Server) runStreaming(ctx context.Context, w http.ResponseWriter, req *inferRequest, plans []*itemPlan, items []*inflightItem,
	deferred *apiError, rec *Record) {
	sse := startSSE(w, s.streamErrorBody)
	rec.Status = http.StatusOK
	if deferred != nil {
		s.inflight.unregister(items)
		sse.fail(deferred)
		rec.Error = deferred.msg
		return
	}
	rend := s.newRenderer(req)
	em := newStreamEmitter(sse, rend, len(plans), s.cfg.StreamInterval)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var once sync.Once
	onErr := func(err error) {
		if errors.Is(err, errStreamClosed) || runCtx.Err() != nil {
			return
		}
		once.Do(func() {
			ae := toAPIError(err)
			rec.Error = ae.msg
			sse.fail(ae)
			cancel()
		})
	}
	results, errs := s.runItems(runCtx, req, plans, items, em, onErr)
	rec.FinishReasons = finishReasons(results, errs)
	noteDecodeCache(rec, results)
	if ctx.Err() != nil || sse.broken() {
		s.markGone(rec)
		return
	}
	if !sse.isClosed() {
		sse.send(rend.endFrames(results)...)
		sse.done()
	}
}

// runItems runs the items concurrently and returns their results and
// errors, indexed like plans. Each item runs in its own context, which
// /abort_request cancels (items[i] belongs to plans[i]). onErr, if set,
// is called as errors happen.
func (s *Server) runItems(ctx context.Context, req *inferRequest, plans []*itemPlan, items []*inflightItem,
	em emitter, onErr func(error)) ([]itemResult, []error) {
	results := make([]itemResult, len(plans))
	errs := make([]error, len(plans))
	var wg sync.WaitGroup
	for i, p := range plans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ictx, cancel := context.WithCancelCause(ctx)
			defer cancel(nil)
			items[i].attach(cancel)
			results[i], errs[i] = s.runItem(ictx, req, p, items[i], em)
			// Like SGLang, forget the rid as soon as the item finished,
			// before the response is written: the client may reuse it at
			// once.
			s.inflight.unregister(items[i : i+1])
			if errs[i] == nil {
				s.totals.add(results[i])
			} else if onErr != nil {
				onErr(errs[i])
			}
		}()
	}
	wg.Wait()
	return results, errs
}

// reject answers with err as a real HTTP error (nothing was sent yet).
func (s *Server) reject(w http.ResponseWriter, rec *Record, route routeKind, err *apiError) {
	rec.Status = err.status
	rec.Error = err.msg
	writeRawJSON(w, err.status, s.errorBody(route, err))
}

// markGone records that the client went away.
func (s *Server) markGone(rec *Record) {
	rec.Status = statusClientClosed
	rec.Error = "client disconnected"
}

// toAPIError converts err into an apiError, defaulting to a 500.
func toAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	return internalErrorf("%v", err)
}

// joinInts formats ints as a comma-separated list.
func joinInts(v []int) string {
	parts := make([]string, len(v))
	for i, n := range v {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ",")
}

// streamEmitter turns item progress into SSE frames. Each item touches
// only its own slots, so the slices need no lock.
//
// With an interval above 1 it batches tokens like SGLang's
// --stream-interval: the first token goes out at once, then one chunk per
// interval tokens (its delta holds them all), and the rest at finish.
type streamEmitter struct {
	sse      *sseWriter
	rend     *renderer
	started  []bool
	interval int
	pending  []strings.Builder // per item: deltas not sent yet
	held     []int             // per item: tokens in pending
}

// newStreamEmitter returns an emitter for items items.
func newStreamEmitter(sse *sseWriter, rend *renderer, items, interval int) *streamEmitter {
	return &streamEmitter{sse: sse, rend: rend, started: make([]bool, items), interval: max(interval, 1),
		pending: make([]strings.Builder, items), held: make([]int, items)}
}

// begin returns the start frames of an item the first time it is called.
func (e *streamEmitter) begin(index int) []frame {
	if e.started[index] {
		return nil
	}
	e.started[index] = true
	return e.rend.startFrames(index)
}

// token implements emitter.
func (e *streamEmitter) token(res itemResult, delta string, total int) bool {
	i := res.index
	if e.interval > 1 {
		e.pending[i].WriteString(delta)
		e.held[i]++
		if res.completionTokens > 1 && e.held[i] < e.interval && res.completionTokens < total {
			return true
		}
		delta = e.pending[i].String()
		e.pending[i].Reset()
		e.held[i] = 0
	}
	frames := append(e.begin(i), e.rend.tokenFrames(res, delta, total)...)
	return e.sse.send(frames...)
}

// finish implements emitter.
func (e *streamEmitter) finish(res itemResult) {
	frames := e.begin(res.index)
	if e.held[res.index] > 0 {
		frames = append(frames, e.rend.tokenFrames(res, e.pending[res.index].String(), res.completionTokens)...)
		e.pending[res.index].Reset()
		e.held[res.index] = 0
	}
	frames = append(frames, e.rend.finishFrames(res)...)
	e.sse.send(frames...)
}
