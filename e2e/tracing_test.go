package e2e

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/harness"
)

// startJaeger runs Jaeger for one test, its log shown if the test fails.
func startJaeger(t *testing.T, ctx context.Context) *harness.Jaeger {
	t.Helper()
	j, err := harness.StartJaeger(ctx, t.TempDir(), harness.JaegerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("jaeger log:\n%s", j.Tail(4000))
		}
		j.Stop(5 * time.Second)
	})
	return j
}

// waitTrace polls Jaeger until the trace holds spans that satisfy done
// (Envoy's tracer and duet's exporter both send in batches), and returns
// them; it fails the test after 30 s with the spans it has.
func waitTrace(t *testing.T, ctx context.Context, j *harness.Jaeger, traceID string, done func([]harness.TraceSpan) bool) []harness.TraceSpan {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	var spans []harness.TraceSpan
	for {
		var err error
		spans, err = j.Trace(ctx, traceID)
		if err != nil && !errors.Is(err, harness.ErrTraceNotFound) {
			t.Fatal(err)
		}
		if err == nil && done(spans) {
			return spans
		}
		if time.Now().After(deadline) {
			t.Fatalf("trace %s incomplete after 30s:\n%s", traceID, describeSpans(spans))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// describeSpans lists spans one per line, for failure messages.
func describeSpans(spans []harness.TraceSpan) string {
	var b strings.Builder
	for _, s := range spans {
		fmt.Fprintf(&b, "  %s %s/%q parent=%s kind=%s error=%v events=%v tags=%v\n", s.SpanID, s.Service, s.Operation, s.ParentID, s.Kind(), s.Failed(), s.Events, s.Tags)
	}
	return b.String()
}

// spansWhere returns the spans that match.
func spansWhere(spans []harness.TraceSpan, match func(harness.TraceSpan) bool) []harness.TraceSpan {
	var out []harness.TraceSpan
	for _, s := range spans {
		if match(s) {
			out = append(out, s)
		}
	}
	return out
}

// traceparent is a client's W3C trace context, sampled, under a trace id
// made from n.
func traceparent(n int) (header, traceID, spanID string) {
	traceID = fmt.Sprintf("%032x", 0xd0e7000000+n)
	spanID = fmt.Sprintf("%016x", 0xc11e47+n)
	return "00-" + traceID + "-" + spanID + "-01", traceID, spanID
}

// Claims 40-44: with duet's otlp section, one request is one trace across
// Envoy, duet and both legs (docs/tracing.md). The stack exports to a real
// Jaeger; every assertion reads the trace back from Jaeger's query API.
func TestTracing(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	j := startJaeger(t, ctx)
	st := startPoolsStackWith(t, ctx, fmt.Sprintf("otlp: {endpoint: %q, sampling_percent: 100}\n", j.OTLPAddr))
	send := func(id string, body []byte, hdr map[string]string) (*http.Response, []byte) {
		t.Helper()
		return st.chat(t, ctx, id, body, hdr)
	}
	// lastRecord is the newest request an engine received.
	lastRecord := func(sim *harness.Sim) harness.Record {
		t.Helper()
		recs, err := sim.Requests(ctx)
		if err != nil || len(recs) == 0 {
			t.Fatalf("%s records: %v (%d)", sim.Name, err, len(recs))
		}
		return recs[len(recs)-1]
	}
	one := func(t *testing.T, spans []harness.TraceSpan, what string, match func(harness.TraceSpan) bool) harness.TraceSpan {
		t.Helper()
		got := spansWhere(spans, match)
		if len(got) != 1 {
			t.Fatalf("%d spans for %s, want 1:\n%s", len(got), what, describeSpans(spans))
		}
		return got[0]
	}
	envoySpan := func(op string) func(harness.TraceSpan) bool {
		return func(s harness.TraceSpan) bool { return s.Service == "duet-envoy" && s.Operation == op }
	}
	duetSpan := func(s harness.TraceSpan) bool { return s.Service == "duet" && s.Operation == "duet.route" }
	const extProc = "async envoy.service.ext_proc.v3.ExternalProcessor.Process egress"
	decodeOp, mirrorOp := "router duet_deepseek_decode egress", "mirror"

	t.Run("a PD request is one trace", func(t *testing.T) {
		resp, body := send(requestID(t, 0), modelChat(pdModel, false), nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		decode, prefill := lastRecord(st.decode), lastRecord(st.prefill)
		traceID := harness.TraceID(decode.TraceParent)
		if traceID == "" || harness.TraceID(prefill.TraceParent) != traceID || !strings.HasSuffix(decode.TraceParent, "-01") {
			t.Fatalf("legs' traceparents: decode %q, prefill %q: want one sampled trace", decode.TraceParent, prefill.TraceParent)
		}
		spans := waitTrace(t, ctx, j, traceID, func(s []harness.TraceSpan) bool {
			return len(spansWhere(s, duetSpan)) > 0 && len(spansWhere(s, envoySpan("ingress"))) > 0 && len(spansWhere(s, envoySpan(mirrorOp))) > 0
		})
		ingress := one(t, spans, "Envoy's ingress", envoySpan("ingress"))
		if ingress.ParentID != "" || ingress.Kind() != "server" || ingress.Tag("http.status_code") != "200" {
			t.Errorf("ingress span: %+v", ingress)
		}
		ext := one(t, spans, "the ext_proc stream", envoySpan(extProc))
		dec := one(t, spans, "the decode leg", envoySpan(decodeOp))
		mir := one(t, spans, "the prefill mirror", envoySpan(mirrorOp))
		for _, s := range []harness.TraceSpan{ext, dec, mir} {
			if s.ParentID != ingress.SpanID || s.Kind() != "client" || s.Failed() {
				t.Errorf("%s: parent %s (want the ingress span %s), kind %s, failed %v", s.Operation, s.ParentID, ingress.SpanID, s.Kind(), s.Failed())
			}
		}
		if dec.SpanID != harness.ParentSpanID(decode.TraceParent) || dec.Tag("upstream_address") != st.decode.Address {
			t.Errorf("the decode engine got traceparent %q; Envoy's decode span is %s to %s", decode.TraceParent, dec.SpanID, dec.Tag("upstream_address"))
		}
		if mir.SpanID != harness.ParentSpanID(prefill.TraceParent) || mir.Tag("upstream_address") != st.prefill.Address ||
			mir.Tag("upstream_cluster") != "duet_deepseek_prefill" {
			t.Errorf("the prefill engine got traceparent %q; Envoy's mirror span is %s to %s (%s)", prefill.TraceParent, mir.SpanID, mir.Tag("upstream_address"), mir.Tag("upstream_cluster"))
		}
		route := one(t, spans, "duet's decision", duetSpan)
		if route.ParentID != ext.SpanID {
			t.Errorf("duet's span's parent is %s, want the ext_proc span %s", route.ParentID, ext.SpanID)
		}
		decodeRank, prefillRank := *decode.DPRank, *prefill.DPRank
		for k, want := range map[string]string{
			"duet.pool": "deepseek", "gen_ai.request.model": pdModel, "duet.outcome": "routed",
			"duet.decode.endpoint": st.decode.Address, "duet.decode.rank": fmt.Sprint(decodeRank),
			"duet.prefill.endpoint": st.prefill.Address, "duet.prefill.rank": fmt.Sprint(prefillRank),
			"duet.decode.policy": "least_cost", "duet.prefill.policy": "least_cost",
			"duet.decode.candidates": "2", "duet.prefill.candidates": "2",
		} {
			if got := route.Tag(k); got != want {
				t.Errorf("duet's span: %s = %q, want %q", k, got, want)
			}
		}
		if route.Failed() {
			t.Errorf("duet's span of a routed request is an error: %v", route.Tags)
		}
	})

	t.Run("a client's traceparent is continued, a 404 traced", func(t *testing.T) {
		header, traceID, clientSpan := traceparent(1)
		resp, body := send(requestID(t, 1), modelChat("no/such-model", false), map[string]string{"traceparent": header})
		if resp.StatusCode != http.StatusNotFound {
			t.Fatalf("status %d, want duet's 404: %s", resp.StatusCode, body)
		}
		spans := waitTrace(t, ctx, j, traceID, func(s []harness.TraceSpan) bool {
			return len(spansWhere(s, duetSpan)) > 0 && len(spansWhere(s, envoySpan("ingress"))) > 0
		})
		ingress := one(t, spans, "Envoy's ingress", envoySpan("ingress"))
		if ingress.ParentID != clientSpan || ingress.Tag("http.status_code") != "404" {
			t.Errorf("ingress span: parent %s (want the client's %s), status %s", ingress.ParentID, clientSpan, ingress.Tag("http.status_code"))
		}
		ext := one(t, spans, "the ext_proc stream", envoySpan(extProc))
		route := one(t, spans, "duet's decision", duetSpan)
		if route.ParentID != ext.SpanID || route.Tag("duet.outcome") != "model_not_found" || route.Tag("http.response.status_code") != "404" {
			t.Errorf("duet's span: parent %s (ext_proc %s), tags %v", route.ParentID, ext.SpanID, route.Tags)
		}
		if n := len(spansWhere(spans, func(s harness.TraceSpan) bool {
			return strings.HasPrefix(s.Operation, "router ") || s.Operation == mirrorOp
		})); n != 0 {
			t.Errorf("%d upstream spans for a request no engine saw:\n%s", n, describeSpans(spans))
		}
	})

	t.Run("a failed prefill is an error on its trace", func(t *testing.T) {
		if err := st.prefill.Stop(5 * time.Second); err != nil {
			t.Fatal(err)
		}
		header, traceID, _ := traceparent(2)
		resp, body := send(requestID(t, 2), modelChat(pdModel, false), map[string]string{"traceparent": header})
		if resp.StatusCode < 500 {
			t.Fatalf("status %d with the prefill engine down: %s", resp.StatusCode, body)
		}
		spans := waitTrace(t, ctx, j, traceID, func(s []harness.TraceSpan) bool {
			return len(spansWhere(s, func(s harness.TraceSpan) bool { return s.Service == "duet" && s.Operation == "duet.leg" && s.Failed() })) > 0 &&
				len(spansWhere(s, envoySpan(mirrorOp))) > 0
		})
		mir := one(t, spans, "the prefill mirror", envoySpan(mirrorOp))
		if !mir.Failed() {
			t.Errorf("Envoy's mirror span of a refused connection is not an error: %v", mir.Tags)
		}
		leg := one(t, spans, "duet's failed prefill leg", func(s harness.TraceSpan) bool {
			return s.Service == "duet" && s.Operation == "duet.leg" && s.Tag("duet.leg.name") == "prefill"
		})
		if leg.ParentID != mir.SpanID || !leg.Failed() || leg.Tag("duet.leg.endpoint") != st.prefill.Address ||
			leg.Tag("duet.leg.outcome") != "unreachable" || leg.Tag("duet.leg.response_flags") != "UF" {
			t.Errorf("duet's prefill leg span: parent %s (want the mirror %s), failed %v, tags %v", leg.ParentID, mir.SpanID, leg.Failed(), leg.Tags)
		}
		// duet aborted the decode leg, which waited for the KV, and
		// ejected the prefill engine: both are events of the failed leg.
		if !slices.Contains(leg.Events, "duet.abort") || !slices.Contains(leg.Events, "duet.ejection") {
			t.Errorf("duet's prefill leg span has events %v, want duet.abort and duet.ejection", leg.Events)
		}
	})
}

// Claim 45: sampling is the tracer's, and follows a client's decision.
// With sampling_percent 0 no request without a traceparent is traced, one
// whose client sampled it is, and one whose client did not sample it is
// not (each engine gets flags 00).
func TestTracingFollowsClientDecision(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	j := startJaeger(t, ctx)
	st := startPoolsStackWith(t, ctx, fmt.Sprintf("otlp: {endpoint: %q, sampling_percent: 0}\n", j.OTLPAddr))
	send := func(i int, traceparent string) harness.Record {
		t.Helper()
		var h map[string]string
		if traceparent != "" {
			h = map[string]string{"traceparent": traceparent}
		}
		if resp, body := st.chat(t, ctx, requestID(t, i), modelChat(pdModel, false), h); resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %d %s", i, resp.StatusCode, body)
		}
		recs, err := st.decode.Requests(ctx)
		if err != nil || len(recs) == 0 {
			t.Fatalf("decode records: %v", err)
		}
		return recs[len(recs)-1]
	}
	// Ten requests of its own: none is sampled (Envoy's random_sampling
	// alone would not do: with the request id out of the decision, every
	// request reaches the tracer, whose sampler decides).
	var plain harness.Record
	for i := range 10 {
		if plain = send(100+i, ""); !strings.HasSuffix(plain.TraceParent, "-00") {
			t.Fatalf("request %d reached decode with traceparent %q at sampling_percent 0, want flags 00", i, plain.TraceParent)
		}
	}
	_, unsampledID, _ := traceparent(10)
	declined := send(1, "00-"+unsampledID+"-0000000000c11e4a-00")
	header, sampledID, clientSpan := traceparent(11)
	sampled := send(2, header)
	for _, r := range []harness.Record{plain, declined} {
		if !strings.HasSuffix(r.TraceParent, "-00") {
			t.Errorf("an unsampled request reached decode with traceparent %q, want flags 00", r.TraceParent)
		}
	}
	if harness.TraceID(declined.TraceParent) != unsampledID || harness.TraceID(sampled.TraceParent) != sampledID || !strings.HasSuffix(sampled.TraceParent, "-01") {
		t.Errorf("traceparents at decode: declined %q, sampled %q: want the clients' traces, the second sampled", declined.TraceParent, sampled.TraceParent)
	}
	spans := waitTrace(t, ctx, j, sampledID, func(s []harness.TraceSpan) bool {
		return len(spansWhere(s, func(s harness.TraceSpan) bool { return s.Operation == "duet.route" })) > 0 &&
			len(spansWhere(s, func(s harness.TraceSpan) bool { return s.Operation == "ingress" })) > 0
	})
	if in := spansWhere(spans, func(s harness.TraceSpan) bool { return s.Operation == "ingress" }); in[0].ParentID != clientSpan {
		t.Errorf("ingress parent %s, want the client's span %s", in[0].ParentID, clientSpan)
	}
	// The sampled request was sent last: its spans are exported, so the
	// others' would be by now.
	for _, id := range []string{harness.TraceID(plain.TraceParent), unsampledID} {
		if got, err := j.Trace(ctx, id); !errors.Is(err, harness.ErrTraceNotFound) {
			t.Errorf("unsampled trace %s: %v\n%s", id, err, describeSpans(got))
		}
	}
}
