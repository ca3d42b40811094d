package extproc

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/experimental"

	"github.com/duet-router/duet/envoy/contract"
	"github.com/duet-router/duet/scheduler"
)

// fakePicker returns a fixed decision or error; like the scheduler, it
// leaves out the prefill target of a decode-only request.
type fakePicker struct {
	decision scheduler.Decision
	err      error
	fallback *scheduler.Endpoint // DecodeFallback's answer
	// explain is copied into a request's Explain, when it asks.
	explain scheduler.DecisionStatus
	last    atomic.Pointer[scheduler.Request]
}

func (f *fakePicker) DecodeFallback(scheduler.Target) *scheduler.Endpoint { return f.fallback }

func (f *fakePicker) Pick(_ context.Context, req *scheduler.Request) (scheduler.Decision, error) {
	f.last.Store(req)
	if req.Explain != nil {
		*req.Explain = f.explain
	}
	d := f.decision
	if req.DecodeOnly {
		d.Prefill = nil
	}
	return d, f.err
}

var (
	prefillEP = &scheduler.Endpoint{Role: scheduler.RolePrefill, Address: "10.0.0.1:30000", BootstrapHost: "10.0.0.1", BootstrapPort: 8998, DPSize: 4, Ready: true}
	decodeEP  = &scheduler.Endpoint{Role: scheduler.RoleDecode, Address: "10.0.0.2:30000", BootstrapHost: "10.0.0.2", DPSize: 2, Ready: true}
	pdPick    = scheduler.Decision{Prefill: &scheduler.Target{Endpoint: prefillEP, Rank: 3}, Decode: scheduler.Target{Endpoint: decodeEP, Rank: 1}}
	aggPick   = scheduler.Decision{Decode: scheduler.Target{Endpoint: decodeEP, Rank: 1}}
)

// client starts a Server on loopback gRPC and returns a client for it.
func client(t testing.TB, picker Picker, maxBody int) extprocv3.ExternalProcessorClient {
	t.Helper()
	opts := Options{Picker: picker, PrefillCluster: "duet_prefill", MaxBodyBytes: maxBody,
		Metrics: NewMetrics(prometheus.NewRegistry())}
	if fb, ok := picker.(DecodeFallbacker); ok {
		opts.Fallbacks = fb
	}
	return clientFor(t, opts)
}

// clientFor starts a Server with opts on loopback gRPC and returns a client
// for it.
func clientFor(t testing.TB, opts Options) extprocv3.ExternalProcessorClient {
	t.Helper()
	maxBody := opts.MaxBodyBytes
	srv, err := NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(ServerOptions(max(maxBody, 1<<20))...)
	extprocv3.RegisterExternalProcessorServer(gs, srv)
	go gs.Serve(lis)
	t.Cleanup(gs.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		experimental.WithBufferPool(BufferPool()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return extprocv3.NewExternalProcessorClient(conn)
}

// exchange plays Envoy for one request: headers, then (if body != nil) the
// buffered body; it returns the response to the last message sent.
func exchange(t testing.TB, c extprocv3.ExternalProcessorClient, method, path string, hdrs map[string]string, body []byte) *extprocv3.ProcessingResponse {
	t.Helper()
	return exchangeContext(t, context.Background(), c, method, path, hdrs, body)
}

// exchangeContext is exchange on a stream opened with ctx, whose outgoing
// gRPC metadata the stream carries (Envoy's traceparent).
func exchangeContext(t testing.TB, ctx context.Context, c extprocv3.ExternalProcessorClient, method, path string, hdrs map[string]string, body []byte) *extprocv3.ProcessingResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	stream, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
		{Key: ":method", RawValue: []byte(method)}, {Key: ":path", RawValue: []byte(path)},
	}}
	for k, v := range hdrs {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: hm, EndOfStream: body == nil}}}); err != nil {
		t.Fatal(err)
	}
	resp, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if body == nil || resp.GetImmediateResponse() != nil {
		return resp
	}
	if err := stream.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	if resp, err = stream.Recv(); err != nil {
		t.Fatal(err)
	}
	return resp
}

func common(resp *extprocv3.ProcessingResponse) *extprocv3.CommonResponse {
	if b := resp.GetRequestBody(); b != nil {
		return b.GetResponse()
	}
	return resp.GetRequestHeaders().GetResponse()
}

func setHeaders(c *extprocv3.CommonResponse) map[string]string {
	out := map[string]string{}
	for _, h := range c.GetHeaderMutation().GetSetHeaders() {
		out[h.GetHeader().GetKey()] = string(h.GetHeader().GetRawValue())
	}
	return out
}

func removed(c *extprocv3.CommonResponse) map[string]bool {
	out := map[string]bool{}
	for _, h := range c.GetHeaderMutation().GetRemoveHeaders() {
		out[h] = true
	}
	return out
}

func TestProcessPDChat(t *testing.T) {
	picker := &fakePicker{decision: pdPick}
	c := client(t, picker, 1<<20)
	resp := exchange(t, c, "POST", "/v1/chat/completions", map[string]string{"x-request-id": "abc"},
		[]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"routed_dp_rank":0,"rid":"someone-elses"}`))
	pickedID := picker.last.Load().ID
	cr := common(resp)
	if cr == nil {
		t.Fatalf("no body response: %v", resp)
	}
	body := cr.GetBodyMutation().GetBody()
	h := setHeaders(cr)
	want := map[string]string{
		contract.HeaderDecodeEndpoint: "10.0.0.2:30000", contract.HeaderPrefillEndpoint: "10.0.0.1:30000",
		contract.HeaderMirror: "duet_prefill", contract.HeaderPrefillRank: "3", contract.HeaderDPRank: "1",
		contract.HeaderRequestID: "abc", "content-length": strconv.Itoa(len(body)),
	}
	for k, v := range want {
		if h[k] != v {
			t.Errorf("header %s = %q, want %q", k, h[k], v)
		}
	}
	j := gjson.ParseBytes(body)
	if j.Get("bootstrap_room").Uint()%4 != 3 || j.Get("disagg_prefill_dp_rank").Int() != 3 ||
		j.Get("bootstrap_host").String() != "10.0.0.1" || j.Get("bootstrap_port").Int() != 8998 {
		t.Errorf("body not rewritten for prefill rank 3: %s", body)
	}
	if j.Get("routed_dp_rank").Exists() {
		t.Errorf("shared PD body must not pin a rank: %s", body)
	}
	if _, set := h[contract.HeaderDecodeBodyRank]; set || !removed(cr)[contract.HeaderDecodeBodyRank] {
		t.Errorf("chat must not carry %s", contract.HeaderDecodeBodyRank)
	}
	gen := setHeaders(common(exchange(t, c, "POST", "/generate", nil, []byte(`{"text":"hi"}`))))
	if gen[contract.HeaderDecodeBodyRank] != "1" {
		t.Errorf("PD /generate: %s = %q, want the decode rank 1", contract.HeaderDecodeBodyRank, gen[contract.HeaderDecodeBodyRank])
	}
	// Identity: duet mints its own id, which keys the pick and is the rid;
	// the client's id is kept for logs but keys nothing.
	duetID := h[contract.HeaderDuetRequestID]
	if len(duetID) != 36 || duetID == "abc" {
		t.Errorf("%s = %q, want a minted UUID", contract.HeaderDuetRequestID, duetID)
	}
	if got := pickedID; got != duetID {
		t.Errorf("picked under id %q, want duet's %q", got, duetID)
	}
	if rid := j.Get("rid").String(); rid != duetID {
		t.Errorf("rid = %q, want duet's id %q (the client's rid must be replaced)", rid, duetID)
	}
	md := resp.GetDynamicMetadata().GetFields()[contract.MetadataNamespace].GetStructValue().GetFields()
	if md["request_id"].GetStringValue() != duetID || md["client_request_id"].GetStringValue() != "abc" ||
		md["prefill"].GetStringValue() == "" {
		t.Errorf("dynamic metadata = %v", md)
	}
	// The same client id twice still gives two distinct duet ids.
	again := setHeaders(common(exchange(t, c, "POST", "/v1/chat/completions", map[string]string{"x-request-id": "abc"},
		[]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))))
	if again[contract.HeaderDuetRequestID] == duetID || again[contract.HeaderRequestID] != "abc" {
		t.Errorf("second request with the same x-request-id: duet id %q (first %q), x-request-id %q",
			again[contract.HeaderDuetRequestID], duetID, again[contract.HeaderRequestID])
	}
}

// With engine-chosen ranks the shared body carries a random room and no
// disagg_prefill_dp_rank, and neither leg is pinned by a header.
func TestProcessEngineRanks(t *testing.T) {
	pick := scheduler.Decision{
		Prefill: &scheduler.Target{Endpoint: prefillEP, Rank: scheduler.NoRank},
		Decode:  scheduler.Target{Endpoint: decodeEP, Rank: scheduler.NoRank},
	}
	c := client(t, &fakePicker{decision: pick}, 1<<20)
	rooms := map[uint64]bool{}
	for range 20 {
		cr := common(exchange(t, c, "POST", "/generate", nil, []byte(`{"text":"hi"}`)))
		h, rm := setHeaders(cr), removed(cr)
		body := gjson.ParseBytes(cr.GetBodyMutation().GetBody())
		if body.Get("disagg_prefill_dp_rank").Exists() || !body.Get("bootstrap_room").Exists() {
			t.Fatalf("body = %s", cr.GetBodyMutation().GetBody())
		}
		for _, k := range []string{contract.HeaderPrefillRank, contract.HeaderDPRank, contract.HeaderDecodeBodyRank} {
			if _, set := h[k]; set || !rm[k] {
				t.Errorf("%s must be removed", k)
			}
		}
		if h[contract.HeaderMirror] == "" {
			t.Error("PD request not mirrored")
		}
		rooms[body.Get("bootstrap_room").Uint()%4] = true
	}
	if len(rooms) < 3 {
		t.Errorf("rooms cover only %d of 4 prefill ranks over 20 requests", len(rooms))
	}
}

func TestProcessPassThroughAndAggregated(t *testing.T) {
	tests := []struct {
		name       string
		pick       scheduler.Decision
		method     string
		path       string
		body       []byte
		wantRank   string // "" = removed
		wantRouted int64  // -1 = absent
	}{
		{"GET models in PD", pdPick, "GET", "/v1/models", nil, "", -1},
		{"unknown POST in PD", pdPick, "POST", "/v1/embeddings", []byte(`{"input":"x"}`), "", -1},
		{"aggregated chat", aggPick, "POST", "/v1/chat/completions", []byte(`{"messages":[]}`), "1", -1},
		{"aggregated generate", aggPick, "POST", "/generate", []byte(`{"text":"x","bootstrap_room":9}`), "1", 1},
		{"aggregated no rank", scheduler.Decision{Decode: scheduler.Target{Endpoint: decodeEP, Rank: scheduler.NoRank}},
			"POST", "/generate", []byte(`{"text":"x","routed_dp_rank":0}`), "", -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			picker := &fakePicker{decision: tt.pick}
			c := client(t, picker, 1<<20)
			cr := common(exchange(t, c, tt.method, tt.path, nil, tt.body))
			inference := ClassifyRoute(tt.method, tt.path).Inference()
			if picker.last.Load().DecodeOnly == inference {
				t.Errorf("DecodeOnly = %v for an inference=%v route", !inference, inference)
			}
			h, rm := setHeaders(cr), removed(cr)
			if h[contract.HeaderDecodeEndpoint] != "10.0.0.2:30000" {
				t.Errorf("decode endpoint = %q", h[contract.HeaderDecodeEndpoint])
			}
			for _, k := range []string{contract.HeaderMirror, contract.HeaderPrefillEndpoint, contract.HeaderPrefillRank} {
				if _, set := h[k]; set || !rm[k] {
					t.Errorf("%s must be removed (set=%v removed=%v)", k, set, rm[k])
				}
			}
			if got := h[contract.HeaderDPRank]; got != tt.wantRank || (tt.wantRank == "" && !rm[contract.HeaderDPRank]) {
				t.Errorf("rank header = %q (removed %v), want %q", got, rm[contract.HeaderDPRank], tt.wantRank)
			}
			if len(h[contract.HeaderRequestID]) != 36 {
				t.Errorf("request id not minted: %q", h[contract.HeaderRequestID])
			}
			body := cr.GetBodyMutation().GetBody()
			if !inference {
				if body != nil {
					t.Errorf("pass-through body rewritten: %s", body)
				}
				return
			}
			j := gjson.ParseBytes(body)
			if j.Get("bootstrap_room").Exists() {
				t.Errorf("aggregated body has bootstrap fields: %s", body)
			}
			if r := j.Get("routed_dp_rank"); (tt.wantRouted < 0) == r.Exists() || (r.Exists() && r.Int() != tt.wantRouted) {
				t.Errorf("routed_dp_rank = %s, want %d: %s", r.Raw, tt.wantRouted, body)
			}
		})
	}
}

func TestProcessRejects(t *testing.T) {
	tests := []struct {
		name   string
		picker *fakePicker
		path   string
		body   []byte
		status int
	}{
		{"malformed json", &fakePicker{decision: pdPick}, "/v1/chat/completions", []byte(`{"messages":[`), 400},
		{"not an object", &fakePicker{decision: pdPick}, "/v1/completions", []byte(`[1]`), 400},
		{"no body", &fakePicker{decision: pdPick}, "/generate", nil, 400},
		{"too large", &fakePicker{decision: pdPick}, "/generate", []byte(`{"text":"` + string(make([]byte, 2048)) + `"}`), 413},
		{"no endpoints", &fakePicker{err: fmt.Errorf("decode: %w", scheduler.ErrNoEndpoints)}, "/generate", []byte(`{"text":"x"}`), 503},
		{"picker failure", &fakePicker{err: fmt.Errorf("boom")}, "/generate", []byte(`{"text":"x"}`), 500},
		{"client abort of any request", &fakePicker{decision: pdPick}, "/abort_request", []byte(`{"abort_all":true}`), 403},
		{"engine admin path with a query", &fakePicker{decision: pdPick}, "/flush_cache?x=1", []byte(`{}`), 403},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := client(t, tt.picker, 1024)
			ir := exchange(t, c, "POST", tt.path, nil, tt.body).GetImmediateResponse()
			if ir == nil {
				t.Fatal("no immediate response")
			}
			if int(ir.GetStatus().GetCode()) != tt.status {
				t.Errorf("status = %d, want %d", ir.GetStatus().GetCode(), tt.status)
			}
			var e openAIError
			if err := json.Unmarshal(ir.GetBody(), &e); err != nil || e.Error.Message == "" || e.Error.Code != float64(tt.status) {
				t.Errorf("body is not an OpenAI error: %s (%v)", ir.GetBody(), err)
			}
		})
	}
}

// A decode fallback is listed after the chosen host, for Envoy's
// connect-failure retry; without one, only the chosen host is named.
func TestDecodeFallbackHost(t *testing.T) {
	other := &scheduler.Endpoint{Role: scheduler.RoleDecode, Address: "10.0.0.3:30000", DPSize: 2, Ready: true}
	tests := []struct {
		name     string
		fallback *scheduler.Endpoint
		want     string
	}{
		{"fallback", other, "10.0.0.2:30000,10.0.0.3:30000"},
		{"none", nil, "10.0.0.2:30000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := client(t, &fakePicker{decision: pdPick, fallback: tt.fallback}, 1<<20)
			h := setHeaders(common(exchange(t, c, "POST", "/generate", nil, []byte(`{"text":"hi"}`))))
			if h[contract.HeaderDecodeEndpoint] != tt.want {
				t.Errorf("%s = %q, want %q", contract.HeaderDecodeEndpoint, h[contract.HeaderDecodeEndpoint], tt.want)
			}
		})
	}
}

// promptRecorder is a Picker that copies each request's prompt while Pick
// runs, the only time the prompt is valid.
type promptRecorder struct {
	mu      sync.Mutex
	prompts []string
}

func (p *promptRecorder) Pick(_ context.Context, req *scheduler.Request) (scheduler.Decision, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.prompts = append(p.prompts, string(req.Prompt))
	return aggPick, nil
}

// Prompt buffers are reused from request to request: a short prompt after a
// long one, and one after a request with token ids, carry nothing of the
// earlier ones.
func TestPromptBuffersAreReused(t *testing.T) {
	rec := &promptRecorder{}
	c := client(t, rec, 1<<20)
	long := strings.Repeat("long ", 4000)
	steps := []struct {
		path, body, want string
	}{
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"` + long + `"}]}`, "user\n" + long + "\n"},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":"short"}]}`, "user\nshort\n"},
		{"/generate", `{"input_ids":[1,2,3]}`, ""},
		{"/generate", `{"text":"next"}`, "next"},
	}
	for _, st := range steps {
		resp := exchange(t, c, "POST", st.path, nil, []byte(st.body))
		if common(resp).GetBodyMutation() == nil {
			t.Fatalf("%s: no body mutation: %v", st.body[:20], resp)
		}
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if len(rec.prompts) != len(steps) {
		t.Fatalf("%d picks, want %d", len(rec.prompts), len(steps))
	}
	for i, st := range steps {
		if rec.prompts[i] != st.want {
			t.Errorf("request %d: prompt of %d bytes %.40q, want %d bytes %.40q", i, len(rec.prompts[i]), rec.prompts[i], len(st.want), st.want)
		}
	}
}
