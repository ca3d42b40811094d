package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/duet-router/duet/envoy/contract"
	"github.com/duet-router/duet/extproc/routed"
	"github.com/duet-router/duet/scheduler"
)

// Picker chooses the targets of one request. Pick must not keep req.Prompt,
// or anything that shares its memory, once it returns: the Server reuses
// that memory for the next request's prompt.
type Picker interface {
	Pick(ctx context.Context, req *scheduler.Request) (scheduler.Decision, error)
}

// LegTracker follows the two legs of each routed PD request, so that the
// surviving leg can be aborted when the other fails (package legs).
type LegTracker interface {
	// Track records a PD request routed to d under duet's request id, which
	// is also the request's SGLang rid; items is the body's batch size (0
	// for a single request); decodeFallback is the decode engine listed
	// second for Envoy's connect-failure retry, or nil.
	Track(id string, items int, d scheduler.Decision, decodeFallback *scheduler.Endpoint)
}

// RouteRecorder is told where each routed request's legs go, before Envoy
// hears of it, so that access-log entries about the request can be checked
// against it (package routed implements it).
type RouteRecorder interface {
	Record(id string, r routed.Route)
}

// DecodeFallbacker names a second decode engine for a decode target, for
// Envoy's retry when the chosen engine refuses the connection; nil when
// there is none (package scheduler implements it).
type DecodeFallbacker interface {
	DecodeFallback(d scheduler.Target) *scheduler.Endpoint
}

// Options configure a Server.
type Options struct {
	// Pools are the models' engines, each request routed to the pool that
	// serves its body's model. Without Pools, Picker, PrefillCluster and
	// Fallbacks are the one pool (named "default"), which serves every
	// model.
	Pools []Pool
	// Picker chooses targets, when Pools is empty.
	Picker Picker
	// PrefillCluster is the Envoy cluster the mirror goes to (x-duet-mirror),
	// when Pools is empty.
	PrefillCluster string
	// MaxBodyBytes rejects larger bodies with 413 (Envoy's own buffer limit
	// should already have); 0 means no limit.
	MaxBodyBytes int
	// Logger; nil means no logging.
	Logger *zap.Logger
	// Metrics; nil means none are recorded.
	Metrics *Metrics
	// Legs, when set, is told about every routed PD inference request.
	Legs LegTracker
	// Routes, when set, is told about every routed request.
	Routes RouteRecorder
	// Fallbacks, when set, adds a second decode host to
	// contract.HeaderDecodeEndpoint: Envoy's override_host tries it when the first
	// refuses the connection (when Pools is empty).
	Fallbacks DecodeFallbacker
	// MessageTimeout is the ext_proc message_timeout duet assumes of an
	// Envoy whose streams do not say theirs (duet's envoy.message_timeout):
	// it tells a queued request that Envoy gave up on from one whose
	// client left. 0 tells no such request apart.
	MessageTimeout time.Duration
	// Tracer, when set, records a span of each decision (SpanDecision)
	// whose parent, read from the ext_proc stream's gRPC metadata
	// (traceparent), Envoy sampled; duet starts no trace of its own. nil
	// turns tracing off: no metadata is read and nothing is allocated.
	Tracer trace.Tracer
}

// DefaultPool names the pool of a Server configured without Pools.
const DefaultPool = "default"

// Server implements the Envoy ExternalProcessor gRPC service.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer
	opts  Options
	pools *pools
	log   *zap.Logger
	// admitHeaders are the request headers some pool's admission reads.
	admitHeaders []string
	// prompts keeps the buffers that requests' rendered prompts are written
	// into (*[]byte): a prompt is as large as the body, and allocating it
	// anew was a quarter of duet's allocation at 32 KiB.
	prompts sync.Pool
	// traces keeps traced requests' *decisionTrace, with their attribute
	// buffers, for reuse.
	traces sync.Pool
	// limits are the ext_proc timeouts the streams' Envoy last told.
	limits envoyLimitsBook
}

// maxPooledPrompt is the largest prompt buffer the Server keeps for reuse;
// larger ones are left to the collector.
const maxPooledPrompt = 1 << 20

// promptBuffer returns an empty buffer for a request's prompt.
func (s *Server) promptBuffer() *[]byte {
	if b, ok := s.prompts.Get().(*[]byte); ok {
		return b
	}
	return new([]byte)
}

// releasePrompt keeps buf for reuse, with used, the memory the prompt ended
// up in (a larger one if the prompt outgrew buf; nil if the prompt was
// token ids), once nothing reads the prompt any more.
func (s *Server) releasePrompt(buf *[]byte, used []byte) {
	if used != nil {
		*buf = used
	}
	if cap(*buf) > maxPooledPrompt {
		return
	}
	*buf = (*buf)[:0]
	s.prompts.Put(buf)
}

// NewServer returns a Server.
func NewServer(opts Options) (*Server, error) {
	list := opts.Pools
	if len(list) == 0 {
		if opts.Picker == nil {
			return nil, errors.New("extproc: a Picker is required")
		}
		if opts.PrefillCluster == "" {
			return nil, errors.New("extproc: the prefill cluster name is required")
		}
		list = []Pool{{Name: DefaultPool, Picker: opts.Picker, PrefillCluster: opts.PrefillCluster, Fallbacks: opts.Fallbacks}}
	} else if opts.Picker != nil || opts.PrefillCluster != "" || opts.Fallbacks != nil {
		return nil, errors.New("extproc: Picker, PrefillCluster and Fallbacks are for a Server without Pools")
	}
	ps, err := newPools(slices.Clone(list), time.Now())
	if err != nil {
		return nil, err
	}
	log := opts.Logger
	if log == nil {
		log = zap.NewNop()
	}
	srv := &Server{opts: opts, pools: ps, log: log}
	for _, p := range ps.list {
		if p.Admission == nil {
			continue
		}
		if p.Admission.Admitter == nil || p.Admission.Classifier == nil || p.Admission.Cost == nil {
			return nil, fmt.Errorf("extproc: pool %s: admission needs an Admitter, a Classifier and a Cost", p.Name)
		}
		for _, h := range p.Admission.Classifier.Headers() {
			if !slices.Contains(srv.admitHeaders, h) {
				srv.admitHeaders = append(srv.admitHeaders, h)
			}
		}
	}
	return srv, nil
}

// request is the state of one HTTP request on the stream.
type request struct {
	route     Route
	method    string
	path      string
	requestID string // from the client; empty when duet must mint one
	duetID    string // minted by duet for every request: keys all duet tracks
	pool      string // the pool routed to; "" before one is chosen
	body      []byte
	arrived   time.Time // when the message duet answers arrived
	// headers are the values of the headers admission reads, by name
	// (Server.admitHeaders); nil when no pool has admission.
	headers map[string]string
	// trace is the decision's span and what it will say; nil when the
	// request is not traced.
	trace *decisionTrace
}

// header returns the value of a header admission reads ("" when absent).
func (r *request) header(name string) string { return r.headers[name] }

// Process handles one Envoy ext_proc stream (one HTTP request).
//
// duet processes the request headers and body only (the rendered filter
// skips trailers and every response phase), so the stream ends as soon as
// duet has answered the message that completes the request. Holding it
// open for the life of the HTTP request would tie every in-flight stream
// to duet: a duet restart would make Envoy cut streams whose routing was
// long decided, and a graceful stop would wait for the longest generation.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	ctx := stream.Context()
	var req *request
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
			return nil
		}
		if err != nil {
			return fmt.Errorf("receive ext_proc message: %w", err)
		}
		var resp *extprocv3.ProcessingResponse
		last := false // resp completes duet's part: end the stream after it
		switch m := msg.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			req = newRequest(m.RequestHeaders, s.admitHeaders)
			if m.RequestHeaders.EndOfStream {
				resp, last = s.decide(s.startTrace(ctx, req), req, phaseHeaders, nil), true
				s.endTrace(req, resp)
			} else {
				resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
					RequestHeaders: &extprocv3.HeadersResponse{},
				}}
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			if req == nil {
				return status.Error(codes.FailedPrecondition, "request body before request headers")
			}
			if req.body == nil {
				// BUFFERED: the whole body in one message. Keep the
				// message's bytes rather than a copy (the message is not
				// reused; nothing writes to them).
				req.body = m.RequestBody.Body
			} else {
				req.body = append(req.body, m.RequestBody.Body...)
			}
			dctx := s.startTrace(ctx, req)
			if s.opts.MaxBodyBytes > 0 && len(req.body) > s.opts.MaxBodyBytes {
				resp = s.reject(req, http.StatusRequestEntityTooLarge, "body_too_large",
					contract.BodyTooLargeMessage(s.opts.MaxBodyBytes))
			} else if !m.RequestBody.EndOfStream {
				// Only BUFFERED is supported: the whole body arrives in one message.
				resp = s.reject(req, http.StatusInternalServerError, "body_mode",
					"duet requires ext_proc request_body_mode BUFFERED")
			} else {
				resp = s.decide(dctx, req, phaseBody, func(d time.Duration) {
					// Envoy waits d for the answer; a failed send shows up
					// at the answer's.
					_ = stream.Send(&extprocv3.ProcessingResponse{OverrideMessageTimeout: durationpb.New(d)})
				})
			}
			s.endTrace(req, resp)
			last = true
		case *extprocv3.ProcessingRequest_RequestTrailers:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
				RequestTrailers: &extprocv3.TrailersResponse{},
			}}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
				ResponseHeaders: &extprocv3.HeadersResponse{},
			}}
		case *extprocv3.ProcessingRequest_ResponseBody:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
				ResponseBody: &extprocv3.BodyResponse{},
			}}
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			resp = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
				ResponseTrailers: &extprocv3.TrailersResponse{},
			}}
		default:
			return status.Errorf(codes.InvalidArgument, "unknown ext_proc message %T", m)
		}
		if err := stream.Send(resp); err != nil {
			return fmt.Errorf("send ext_proc response: %w", err)
		}
		if last {
			return nil
		}
	}
}

// newRequest reads a request's headers: its method, path and id, and the
// values of the headers named in keep.
func newRequest(h *extprocv3.HttpHeaders, keep []string) *request {
	r := &request{}
	for _, hv := range h.GetHeaders().GetHeaders() {
		v := hv.Value
		if len(hv.RawValue) > 0 {
			v = string(hv.RawValue)
		}
		switch hv.Key {
		case ":method":
			r.method = v
		case ":path":
			r.path = v
		case contract.HeaderRequestID:
			r.requestID = v
		default:
			if slices.Contains(keep, hv.Key) {
				if r.headers == nil {
					r.headers = make(map[string]string, len(keep))
				}
				r.headers[hv.Key] = v
			}
		}
	}
	r.route = ClassifyRoute(r.method, r.path)
	return r
}

type phase int

const (
	phaseHeaders phase = iota // the request has no body
	phaseBody
)

// decide picks targets and builds the response for the message that
// completes the request (headers without body, or the buffered body).
// hold, when set, asks Envoy to wait longer for the answer (a request
// queued by admission).
func (s *Server) decide(ctx context.Context, req *request, ph phase, hold func(time.Duration)) *extprocv3.ProcessingResponse {
	start := time.Now()
	req.arrived = start
	resp := s.route(ctx, req, ph, hold)
	if s.opts.Metrics != nil {
		s.opts.Metrics.latency.WithLabelValues(req.route.String()).Observe(time.Since(start).Seconds())
	}
	return resp
}

func (s *Server) route(ctx context.Context, req *request, ph phase, hold func(time.Duration)) *extprocv3.ProcessingResponse {
	if AdminPath(req.path) {
		return s.reject(req, http.StatusForbidden, "admin_path",
			fmt.Sprintf("%s is an engine administration endpoint and cannot be reached through duet", req.path))
	}
	if s.pools.byModelName() {
		if model, one, ok := modelsPath(req.method, req.path); ok {
			s.count(req, "models")
			return s.pools.answerModels(model, one)
		}
	}
	var body *Body
	pool := s.pools.forOther()
	var model string // the model name to write into the body (an alias's), or ""
	if req.route.Inference() {
		var err error
		if ph == phaseHeaders {
			err = fmt.Errorf("%w: %s requests need a JSON body", errBadBody, req.path)
		} else {
			body, err = ParseBody(req.route, req.body)
		}
		if err == nil {
			if req.trace != nil {
				req.trace.setModel(body.field("model").String())
			}
			pool, model, err = s.pools.forBody(req.route, body)
		}
		if notFound := (*modelNotFoundError)(nil); errors.As(err, &notFound) {
			return s.refuse(req, http.StatusNotFound, "model_not_found", err.Error(), modelNotFound(notFound))
		}
		if err != nil {
			return s.reject(req, http.StatusBadRequest, "invalid_body", err.Error())
		}
	}
	req.pool = pool.Name
	req.duetID = newRequestID()
	if req.requestID == "" {
		req.requestID = req.duetID
	}
	sreq := &scheduler.Request{ID: req.duetID, Path: req.path, DecodeOnly: !req.route.Inference()}
	if req.trace != nil {
		sreq.Explain = &req.trace.explain
	}
	if body != nil {
		buf := s.promptBuffer()
		sreq.Prompt = *buf
		defer func() { s.releasePrompt(buf, sreq.Prompt) }()
		if pool.Tokenizer == nil {
			describe(req.route, body, sreq)
		} else {
			describeMeta(body, sreq)
			start := time.Now()
			outcome, err := tokenizeBody(pool.Tokenizer, req.route, body, sreq)
			s.opts.Metrics.observeTokenize(pool.Name, outcome, time.Since(start))
			switch {
			case errors.Is(err, errInvalidMessages):
				return s.reject(req, http.StatusBadRequest, "invalid_messages", err.Error())
			case err != nil:
				s.log.Warn("chat template failed; routing by the text estimate", zap.String("pool", pool.Name),
					zap.String("request_id", req.requestID), zap.Error(err))
			}
		}
	}
	var adm admitted
	if pool.Admission != nil && body != nil {
		var refused *extprocv3.ProcessingResponse
		if adm, refused = s.admit(ctx, req, pool, sreq, hold); refused != nil {
			return refused
		}
	}
	decision, err := pool.Picker.Pick(ctx, sreq)
	// The next queued request is judged once this one has reserved.
	adm.ticket.Done()
	if err != nil {
		code := http.StatusInternalServerError
		if errors.Is(err, scheduler.ErrNoEndpoints) {
			code = http.StatusServiceUnavailable
		}
		s.log.Warn("no target", zap.String("pool", pool.Name), zap.String("request_id", req.requestID), zap.String("duet_request_id", req.duetID), zap.Error(err))
		return s.reject(req, code, "no_target", fmt.Sprintf("no inference endpoint of pool %s is available: %v", pool.Name, err))
	}
	req.trace.setDecision(decision, sreq.PromptTokens)

	// Every routing header is either set or removed, so nothing a client sent
	// (should Envoy's own stripping be misconfigured) survives.
	mut := &extprocv3.HeaderMutation{}
	set := func(k, v string) { mut.SetHeaders = append(mut.SetHeaders, setHeader(k, v)) }
	decodeHosts := decision.Decode.Endpoint.Address
	var fallback *scheduler.Endpoint
	if pool.Fallbacks != nil {
		if fallback = pool.Fallbacks.DecodeFallback(decision.Decode); fallback != nil {
			decodeHosts += "," + fallback.Address
		}
	}
	set(contract.HeaderDecodeEndpoint, decodeHosts)
	set(contract.HeaderRequestID, req.requestID)
	set(contract.HeaderDuetRequestID, req.duetID)
	set(contract.HeaderPool, pool.Name)
	mirror := decision.Prefill != nil
	if mirror {
		set(contract.HeaderPrefillEndpoint, decision.Prefill.Endpoint.Address)
		set(contract.HeaderMirror, pool.PrefillCluster)
		if decision.Prefill.Rank != scheduler.NoRank {
			set(contract.HeaderPrefillRank, strconv.Itoa(decision.Prefill.Rank))
		} else {
			mut.RemoveHeaders = append(mut.RemoveHeaders, contract.HeaderPrefillRank)
		}
	} else {
		mut.RemoveHeaders = append(mut.RemoveHeaders, contract.HeaderPrefillEndpoint, contract.HeaderPrefillRank, contract.HeaderMirror)
	}
	route := routed.Route{Pool: pool.Name, Decode: decision.Decode.Endpoint.Address, DecodeRank: routed.NoRank, PrefillRank: routed.NoRank}
	if fallback != nil {
		route.DecodeFallback = fallback.Address
	}
	if mirror {
		route.Prefill, route.PrefillRank = decision.Prefill.Endpoint.Address, decision.Prefill.Rank
	}
	if decision.Decode.Rank != scheduler.NoRank && req.route.Inference() {
		set(contract.HeaderDPRank, strconv.Itoa(decision.Decode.Rank))
		route.DecodeRank = decision.Decode.Rank
	} else {
		mut.RemoveHeaders = append(mut.RemoveHeaders, contract.HeaderDPRank)
	}
	if mirror && req.route == RouteGenerate && decision.Decode.Rank != scheduler.NoRank {
		set(contract.HeaderDecodeBodyRank, strconv.Itoa(decision.Decode.Rank))
	} else {
		mut.RemoveHeaders = append(mut.RemoveHeaders, contract.HeaderDecodeBodyRank)
	}

	meta := map[string]any{
		"request_id":        req.duetID,
		"pool":              pool.Name,
		"client_request_id": req.requestID,
		"route":             req.route.String(),
		"decode":            decision.Decode.String(),
	}
	// With several pools, the route depends on contract.HeaderPool: Envoy
	// must choose it again (it chose one before asking duet).
	common := &extprocv3.CommonResponse{HeaderMutation: mut, ClearRouteCache: s.pools.byModelName()}
	if body != nil {
		pl := Placement{PD: mirror, RoutedRank: scheduler.NoRank, Model: model, OwnPriority: pool.Admission != nil}
		if adm.write {
			pl.Priority = &adm.priority
		}
		if req.route.HasRID() {
			pl.RID = req.duetID
		}
		if mirror {
			p := decision.Prefill
			pl.BootstrapHost = p.Endpoint.BootstrapHost
			pl.BootstrapPort = p.Endpoint.BootstrapPort
			pl.PrefillRank = p.Rank
			pl.PrefillDPSize = p.Endpoint.DPSize
			meta["prefill"] = p.String()
		} else if req.route == RouteGenerate {
			// Single leg: SGLang ignores the header on /generate, the body pins it.
			pl.RoutedRank = decision.Decode.Rank
		}
		out, rooms, err := body.Rewrite(pl)
		if err != nil {
			return s.reject(req, http.StatusBadRequest, "rewrite", err.Error())
		}
		if len(rooms) > 0 {
			meta["bootstrap_room"] = strconv.FormatUint(rooms[0], 10)
		}
		common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: out}}
		set("content-length", strconv.Itoa(len(out)))
	}
	md, err := structpb.NewStruct(map[string]any{contract.MetadataNamespace: meta})
	if err != nil {
		return s.reject(req, http.StatusInternalServerError, "metadata", err.Error())
	}
	s.count(req, "routed")
	if s.opts.Routes != nil {
		s.opts.Routes.Record(req.duetID, route)
	}
	if mirror && body != nil && req.route.HasRID() && s.opts.Legs != nil {
		s.opts.Legs.Track(req.duetID, body.Batch, decision, fallback)
	}
	if s.log.Core().Enabled(zap.DebugLevel) {
		s.log.Debug("routed", zap.String("request_id", req.requestID), zap.String("duet_request_id", req.duetID), zap.String("route", req.route.String()),
			zap.Any("targets", meta))
	}
	resp := &extprocv3.ProcessingResponse{DynamicMetadata: md}
	if ph == phaseHeaders {
		resp.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: common}}
	} else {
		resp.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: common}}
	}
	return resp
}

func (s *Server) reject(req *request, code int, details, message string) *extprocv3.ProcessingResponse {
	return s.refuse(req, code, details, message, immediateError(code, details, message))
}

// refuse counts and logs a request duet answers itself with resp, an
// error of status code.
func (s *Server) refuse(req *request, code int, details, message string, resp *extprocv3.ProcessingResponse) *extprocv3.ProcessingResponse {
	s.count(req, details)
	req.trace.setMessage(message)
	s.log.Info("rejected", zap.String("path", req.path), zap.Int("status", code), zap.String("reason", message))
	return resp
}

func (s *Server) count(req *request, outcome string) {
	if s.opts.Metrics != nil {
		s.opts.Metrics.requests.WithLabelValues(req.route.String(), req.pool, outcome).Inc()
	}
}

// newRequestID returns a random UUIDv4 string.
func newRequestID() string {
	var b [16]byte
	for i := 0; i < 16; i += 8 {
		v := rand.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	const hex = "0123456789abcdef"
	out := make([]byte, 0, 36)
	for i, c := range b {
		if i == 4 || i == 6 || i == 8 || i == 10 {
			out = append(out, '-')
		}
		out = append(out, hex[c>>4], hex[c&0xf])
	}
	return string(out)
}
