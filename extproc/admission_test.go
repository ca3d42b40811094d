package extproc

import (
	"context"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/tidwall/gjson"

	"github.com/duet-router/duet/scheduler"
	"github.com/duet-router/duet/scheduler/admit"
)

// admissionClient serves one pool with admission over a gate the test
// opens and closes: class "batch" (engine priority 1, wait 100ms) by
// default, "interactive" (engine priority 9) by header.
func admissionClient(t *testing.T, open *atomic.Bool, enginePriority bool) extprocv3.ExternalProcessorClient {
	t.Helper()
	return clientFor(t, admissionOptions(t, open, enginePriority))
}

// admissionOptions are the Options of admissionClient's Server.
func admissionOptions(t *testing.T, open *atomic.Bool, enginePriority bool) Options {
	t.Helper()
	cfg := admit.Config{
		Classes:     []admit.Class{{Name: "batch", WaitLimit: 100 * time.Millisecond}, {Name: "interactive", Priority: 10, WaitLimit: time.Second}},
		MaxRequests: 10, MaxTokens: 1 << 20,
	}
	a, err := admit.NewAdmitter(cfg, func(float64) bool { return open.Load() }, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	cl, err := admit.Rules{Classes: []string{"batch", "interactive"}, ClassHeader: "x-duet-priority"}.Compile()
	if err != nil {
		t.Fatal(err)
	}
	adm := &Admission{Admitter: a, Classifier: cl, Cost: func(*scheduler.Request) int64 { return 100 }}
	if enginePriority {
		adm.EnginePriority = func(class int) (int, bool) { return []int{1, 9}[class], true }
	}
	return Options{Pools: []Pool{{Name: "p", Picker: &fakePicker{decision: pdPick}, PrefillCluster: "duet_prefill", Admission: adm}},
		Metrics: NewMetrics(prometheus.NewRegistry())}
}

// exchangeHeld is exchange for a request that may be held: it returns the
// final answer, and the message timeouts duet asked for on the way.
func exchangeHeld(t *testing.T, c extprocv3.ExternalProcessorClient, hdrs map[string]string, body []byte) (*extprocv3.ProcessingResponse, []time.Duration) {
	t.Helper()
	return exchangeHeldContext(t, context.Background(), c, hdrs, body)
}

// exchangeHeldContext is exchangeHeld on a stream opened with ctx.
func exchangeHeldContext(t *testing.T, ctx context.Context, c extprocv3.ExternalProcessorClient, hdrs map[string]string, body []byte) (*extprocv3.ProcessingResponse, []time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	stream, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hm := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")}}}
	for k, v := range hdrs {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: k, RawValue: []byte(v)})
	}
	for _, m := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hm}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}},
	} {
		if err := stream.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := stream.Recv(); err != nil { // the headers' answer
		t.Fatal(err)
	}
	var holds []time.Duration
	for {
		resp, err := stream.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if d := resp.GetOverrideMessageTimeout(); d != nil {
			holds = append(holds, d.AsDuration())
			continue
		}
		return resp, holds
	}
}

func TestAdmissionRoutes(t *testing.T) {
	tests := []struct {
		name           string
		enginePriority bool
		hdrs           map[string]string
		wantPriority   string // the body's priority field; "" absent
	}{
		{"engines without priority scheduling: the client's field goes", false, nil, ""},
		{"default class", true, nil, "1"},
		{"class by header", true, map[string]string{"x-duet-priority": "interactive"}, "9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var open atomic.Bool
			open.Store(true)
			c := admissionClient(t, &open, tt.enginePriority)
			resp, holds := exchangeHeld(t, c, tt.hdrs, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"priority":1000}`))
			if len(holds) != 0 {
				t.Errorf("held %v while the pool had room", holds)
			}
			body := common(resp).GetBodyMutation().GetBody()
			if body == nil {
				t.Fatalf("not routed: %v", resp)
			}
			if got := gjson.GetBytes(body, "priority").Raw; got != tt.wantPriority {
				t.Errorf("priority %q, want %q: %s", got, tt.wantPriority, body)
			}
		})
	}
}

// A request that waits past its class's limit gets 429 in OpenAI's shape
// with Retry-After, after duet asked Envoy to wait for it.
func TestAdmissionRefuses(t *testing.T) {
	var open atomic.Bool
	c := admissionClient(t, &open, false)
	start := time.Now()
	resp, holds := exchangeHeld(t, c, nil, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("answered after %v; the wait limit is 100ms", took)
	}
	if len(holds) != 1 || holds[0] != 100*time.Millisecond+HoldMargin {
		t.Errorf("asked Envoy to wait %v, want once the limit plus %v", holds, HoldMargin)
	}
	im := resp.GetImmediateResponse()
	if im == nil || im.GetStatus().GetCode() != http.StatusTooManyRequests {
		t.Fatalf("want an immediate 429: %v", resp)
	}
	h := map[string]string{}
	for _, o := range im.GetHeaders().GetSetHeaders() {
		h[o.GetHeader().GetKey()] = string(o.GetHeader().GetRawValue())
	}
	if h["retry-after"] != "1" || h["retry-after-ms"] == "" || h["content-type"] != "application/json" {
		t.Errorf("headers %v", h)
	}
	e := gjson.GetBytes(im.GetBody(), "error")
	if e.Get("code").String() != "rate_limit_exceeded" || e.Get("message").String() == "" {
		t.Errorf("body %s", im.GetBody())
	}
	// docs/troubleshooting.md quotes this message.
	if msg, want := e.Get("message").String(), "the engines of pool p are saturated and this request (class batch) cannot start within its wait limit; retry after 1s"; msg != want {
		t.Errorf("message %q, want %q", msg, want)
	}
	if im.GetDetails() != "duet_admission_wait_limit" {
		t.Errorf("details %q", im.GetDetails())
	}
}

// A queued request goes on as soon as the pool has room.
func TestAdmissionQueuesThenRoutes(t *testing.T) {
	var open atomic.Bool
	c := admissionClient(t, &open, false)
	go func() {
		time.Sleep(30 * time.Millisecond)
		open.Store(true)
	}()
	resp, holds := exchangeHeld(t, c, map[string]string{"x-duet-priority": "interactive"}, []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`))
	if len(holds) != 1 || holds[0] != time.Second+HoldMargin {
		t.Errorf("holds %v", holds)
	}
	if common(resp).GetBodyMutation().GetBody() == nil {
		t.Fatalf("not routed: %v", resp)
	}
}
