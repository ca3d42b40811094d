package extproc

import (
	"context"
	"net/http"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
	"google.golang.org/grpc/metadata"

	"github.com/duet-router/duet/envoy/contract"
	"github.com/duet-router/duet/scheduler"
	"github.com/duet-router/duet/scheduler/admit"
)

func TestParseEnvoyLimits(t *testing.T) {
	tests := []struct {
		message, held string
		want          envoyLimits
		wantErr       bool
	}{
		{"", "", envoyLimits{}, false},
		{"2s", "12s", envoyLimits{message: 2 * time.Second, held: 12 * time.Second}, false},
		{"2s", "2s", envoyLimits{message: 2 * time.Second, held: 2 * time.Second}, false},
		{"0.5s", "1.5s", envoyLimits{message: 500 * time.Millisecond, held: 1500 * time.Millisecond}, false},
		{"2s", "", envoyLimits{}, true},
		{"2s", "1s", envoyLimits{}, true},
		{"soon", "12s", envoyLimits{}, true},
		{"0s", "12s", envoyLimits{}, true},
	}
	for _, tt := range tests {
		got, err := parseEnvoyLimits(tt.message, tt.held)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("parseEnvoyLimits(%q, %q) = %+v, %v; want %+v, error %v", tt.message, tt.held, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestEnvoyLimitsHold(t *testing.T) {
	tests := []struct {
		name     string
		limits   envoyLimits
		limit    time.Duration // the class's wait limit
		maxWait  time.Duration
		hold     time.Duration
		wantHold bool
	}{
		{"unknown: today's hold, no cap", envoyLimits{}, 20 * time.Second, 0, 21 * time.Second, true},
		{"allowed", envoyLimits{message: 2 * time.Second, held: 22 * time.Second}, 20 * time.Second, 21 * time.Second, 21 * time.Second, true},
		{"raised past the bootstrap: clamped", envoyLimits{message: 2 * time.Second, held: 12 * time.Second}, 11 * time.Second, 11 * time.Second, 12 * time.Second, true},
		{"no max_message_timeout: no override", envoyLimits{message: 2 * time.Second, held: 2 * time.Second}, time.Second, time.Second, 0, false},
		{"message_timeout under the margin", envoyLimits{message: 500 * time.Millisecond, held: 500 * time.Millisecond}, time.Millisecond, time.Millisecond, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.limits.maxWait(); got != tt.maxWait {
				t.Errorf("maxWait %v, want %v", got, tt.maxWait)
			}
			d, ok := tt.limits.holdFor(tt.limit)
			if d != tt.hold || ok != tt.wantHold {
				t.Errorf("holdFor(%v) = %v, %v; want %v, %v", tt.limit, d, ok, tt.hold, tt.wantHold)
			}
		})
	}
}

func TestEnvoyGaveUp(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration) time.Time { return t0.Add(d) }
	known := envoyLimits{message: 2 * time.Second, held: 12 * time.Second}
	tests := []struct {
		name   string
		limits envoyLimits
		heldAt time.Duration // after arrival; with held 0, no override
		held   time.Duration
		ended  time.Duration
		want   bool
	}{
		{"no override: ended at message_timeout", known, 0, 0, 2 * time.Second, true},
		{"no override: ended a little early (Envoy's clock started first)", known, 0, 0, 1980 * time.Millisecond, true},
		{"no override: the client left before", known, 0, 0, time.Second, false},
		{"no override: the client left after", known, 0, 0, 4 * time.Second, false},
		{"override honoured: ended at the message_timeout is the client", known, 10 * time.Millisecond, 12 * time.Second, 2 * time.Second, false},
		{"override honoured: ended at its end", known, 10 * time.Millisecond, 12 * time.Second, 12010 * time.Millisecond, true},
		{"override above the max, ignored: ended at message_timeout", known, 10 * time.Millisecond, 21 * time.Second, 2 * time.Second, true},
		{"unknown limits, fallback message_timeout: override ignored", envoyLimits{}, 10 * time.Millisecond, 21 * time.Second, 2 * time.Second, true},
		{"unknown limits: override honoured and outlived", envoyLimits{}, 10 * time.Millisecond, 21 * time.Second, 21010 * time.Millisecond, true},
		{"unknown limits: the client left", envoyLimits{}, 10 * time.Millisecond, 21 * time.Second, 5 * time.Second, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := &holdWatch{arrived: t0, limits: tt.limits, fallback: 2 * time.Second}
			if tt.held > 0 {
				w.hold(at(tt.heldAt), tt.held)
			}
			if got := w.envoyGaveUp(at(tt.ended)); got != tt.want {
				t.Errorf("envoyGaveUp after %v = %v, want %v", tt.ended, got, tt.want)
			}
		})
	}
}

// limitsServer is a Server of one pool with admission whose gate stays
// shut: class "batch" may wait 20 s. It logs to the returned observer and
// counts admission outcomes in the returned registry.
func limitsServer(t *testing.T, messageTimeout time.Duration) (extprocv3.ExternalProcessorClient, *observer.ObservedLogs, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := admit.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := admit.Config{Classes: []admit.Class{{Name: "batch", WaitLimit: 20 * time.Second}}, MaxRequests: 10, MaxTokens: 1 << 20}
	a, err := admit.NewAdmitter(cfg, func(float64) bool { return false }, m)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	cl, err := admit.Rules{Classes: []string{"batch"}}.Compile()
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zapcore.InfoLevel)
	adm := &Admission{Admitter: a, Classifier: cl, Cost: func(*scheduler.Request) int64 { return 100 }}
	opts := Options{
		Pools:          []Pool{{Name: "p", Picker: &fakePicker{decision: pdPick}, PrefillCluster: "duet_prefill", Admission: adm}},
		Metrics:        NewMetrics(prometheus.NewRegistry()),
		Logger:         zap.New(core),
		MessageTimeout: messageTimeout,
	}
	return clientFor(t, opts), logs, reg
}

// withEnvoyLimits is ctx carrying the metadata a rendered bootstrap sends.
func withEnvoyLimits(ctx context.Context, message, held string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, contract.MetadataMessageTimeout, message, contract.MetadataMaxMessageTimeout, held)
}

var chatBody = []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`)

// Issue 37: a class may wait 20 s, but the Envoy calling duet was
// rendered for 12 s (or allows no override at all). duet never asks for
// more than Envoy honours, answers 429 before Envoy gives up, and says so
// once, naming the class and what to re-render.
func TestAdmissionHeldWithinEnvoyLimits(t *testing.T) {
	tests := []struct {
		name          string
		message, held string
		wantHolds     []time.Duration
		wantWait      time.Duration // how long duet holds the request
	}{
		{"max_message_timeout below the wait limit", "1s", "1.3s", []time.Duration{1300 * time.Millisecond}, 300 * time.Millisecond},
		{"no max_message_timeout", "1.2s", "1.2s", nil, 200 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, logs, _ := limitsServer(t, 2*time.Second)
			for range 2 {
				start := time.Now()
				resp, holds := exchangeHeldContext(t, withEnvoyLimits(context.Background(), tt.message, tt.held), c, nil, chatBody)
				took := time.Since(start)
				if took < tt.wantWait || took > tt.wantWait+time.Second {
					t.Errorf("answered after %v, want about %v", took, tt.wantWait)
				}
				if len(holds) != len(tt.wantHolds) || (len(holds) > 0 && holds[0] != tt.wantHolds[0]) {
					t.Errorf("asked Envoy to wait %v, want %v", holds, tt.wantHolds)
				}
				if code := resp.GetImmediateResponse().GetStatus().GetCode(); int(code) != http.StatusTooManyRequests {
					t.Errorf("answered %v, want 429", code)
				}
			}
			warned := logs.FilterMessageSnippet("cuts this class's wait limit short").All()
			if len(warned) != 1 {
				t.Fatalf("warned %d times, want once: %v", len(warned), logs.All())
			}
			f := warned[0].ContextMap()
			if f["class"] != "batch" || f["wait_limit"] != 20*time.Second || f["needs_max_message_timeout"] != 22*time.Second {
				t.Errorf("warning fields %v", f)
			}
		})
	}
}

// A stream whose Envoy does not tell its limits (a bootstrap duet did not
// render) and that ends at Envoy's message_timeout while its request is
// queued: Envoy gave up, not the client. duet counts it as proxy_timeout,
// apart from clients that left, and warns with the fix.
func TestAdmissionProxyTimeoutCounted(t *testing.T) {
	const messageTimeout = time.Second
	c, logs, reg := limitsServer(t, messageTimeout)
	send := func(after time.Duration) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		stream, err := c.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range chatMessages(chatBody) {
			if err := stream.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := stream.Recv(); err != nil { // the headers' answer
			t.Fatal(err)
		}
		time.Sleep(after)
		cancel()
	}
	send(messageTimeout)         // Envoy's timer
	send(100 * time.Millisecond) // the client
	count := func(outcome string) float64 { return admissionCount(t, reg, outcome) }
	deadline := time.Now().Add(5 * time.Second)
	for count("proxy_timeout")+count("left") < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := count("proxy_timeout"); got != 1 {
		t.Errorf("proxy_timeout %v, want 1", got)
	}
	if got := count("left"); got != 1 {
		t.Errorf("left %v, want 1", got)
	}
	if n := logs.FilterMessageSnippet("Envoy stopped waiting for a queued request").Len(); n != 1 {
		t.Errorf("warned %d times, want once", n)
	}
}

// admissionCount is duet_admission_requests_total for outcome, over
// every class and tenant, in reg.
func admissionCount(t *testing.T, reg *prometheus.Registry, outcome string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "duet_admission_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

// chatMessages are the ext_proc messages of a chat request with body.
func chatMessages(body []byte) []*extprocv3.ProcessingRequest {
	return []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
		}}}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}},
	}
}
