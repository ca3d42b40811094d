package envoygateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/e2e/sim"
	"github.com/duet-router/duet/envoy"
	"github.com/duet-router/duet/envoy/contract"
	"github.com/duet-router/duet/extproc/accesslog"
)

// requestTimeout bounds each request a test sends.
const requestTimeout = 30 * time.Second

var fastPrefill = []string{"--prefill-ms-per-1k-tokens", "1"}

// startGateway starts two prefill engines (dp 2 and dp 4), two decode
// engines (dp 2 each) and duet (with the ConfigMap's envoy.clusters,
// requiring mutual TLS), and Envoy 1.40 on the bootstrap made from egctl's
// translation of deploy/envoy-gateway with the stack's credentials
// (gatewayBootstrap). It returns the stack and its addresses.
func startGateway(t *testing.T) (*harness.Stack, harness.Addresses) {
	t.Helper()
	return startGatewayWith(t, keptDir(t, "duet-envoygateway-"), harness.Options{})
}

// keptDir makes a temporary directory that stays if the test fails, for
// the failure report.
func keptDir(t *testing.T, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if !t.Failed() {
			os.RemoveAll(dir)
		}
	})
	return dir
}

// startGatewayWith is startGateway with the stack's files in dir and extra
// options: the duet replicas and what their configuration adds.
func startGatewayWith(t *testing.T, dir string, extra harness.Options) (*harness.Stack, harness.Addresses) {
	t.Helper()
	egctl, err := egctlPath()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := loadManifests()
	if err != nil {
		t.Fatal(err)
	}
	var addrs harness.Addresses
	decodeCluster, prefillCluster, err := duetClusters(objs)
	if err != nil {
		t.Fatal(err)
	}
	maxBody, err := duetMaxBody(objs)
	if err != nil {
		t.Fatal(err)
	}
	s, err := harness.Start(context.Background(), harness.Options{
		// Fast prefill, so that the 2 MiB body stays within the KV timeout.
		Prefill:        []harness.SimSpec{{DPSize: 2, Args: fastPrefill}, {DPSize: 4, Args: fastPrefill}},
		Decode:         []harness.SimSpec{{DPSize: 2}, {DPSize: 2}},
		MaxBodyBytes:   maxBody,
		DecodeCluster:  decodeCluster,
		PrefillCluster: prefillCluster,
		Dir:            dir,
		// duet requires mutual TLS on its gRPC port (the harness's
		// default, spelled out): the manifests' recipe.
		Auth:         harness.AuthMTLS,
		DuetReplicas: extra.DuetReplicas,
		DuetYAML:     extra.DuetYAML,
		Bootstrap: func(ctx context.Context, a harness.Addresses) ([]byte, error) {
			addrs = a
			return gatewayBootstrap(ctx, egctl, dir, objs, addrs, addrs.Credentials)
		},
	})
	if err != nil {
		t.Fatalf("start the Envoy Gateway stack (files in %s): %v", dir, err)
	}
	t.Cleanup(func() { s.CloseLoggingIfFailed(t) })
	return s, addrs
}

// secondEnvoy is an Envoy started beside a stack's.
type secondEnvoy struct{ url, adminURL string }

// startSecondEnvoy starts another Envoy, logging into dir, for the stack at
// addrs (its duet and engines) on new loopback ports, with the bootstrap
// that makeBootstrap returns; the test stops it.
func startSecondEnvoy(t *testing.T, addrs harness.Addresses, dir string,
	makeBootstrap func(context.Context, harness.Addresses) ([]byte, error)) secondEnvoy {
	t.Helper()
	ports, err := harness.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	addrs.EnvoyListen = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	addrs.EnvoyAdmin = net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	bootstrap, err := makeBootstrap(ctx, addrs)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "envoy.json")
	if err := os.WriteFile(path, bootstrap, 0o644); err != nil {
		t.Fatal(err)
	}
	e := secondEnvoy{url: "http://" + addrs.EnvoyListen, adminURL: "http://" + addrs.EnvoyAdmin}
	p, err := harness.StartEnvoy(ctx, dir, path, e.adminURL)
	if err != nil {
		t.Fatalf("start a second Envoy (files in %s): %v", dir, err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("second Envoy's log:\n%s", p.Tail(40))
		}
		p.Stop(5 * time.Second)
	})
	return e
}

// duetByReason is one of duet's counters with a reason label (such as
// duet_auth_refused_total) by reason, summed over its other labels.
func duetByReason(t *testing.T, s *harness.Stack, name string) map[string]float64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	mfs, err := s.DuetMetrics(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, m := range mfs[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "reason" {
				out[l.GetValue()] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

// envoySSL sums Envoy's ssl.<name> counters over its clusters (only the
// clusters to duet use TLS).
func envoySSL(t *testing.T, adminURL, name string) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	counters, err := harness.EnvoyCounters(ctx, adminURL, `^cluster\..*\.ssl\.`+regexp.QuoteMeta(name)+`$`)
	if err != nil {
		t.Fatal(err)
	}
	var sum int64
	for _, n := range counters {
		sum += n
	}
	return sum
}

// gatewayBootstrap translates the manifests objs (which it changes) with
// egctl in dir, Envoy's side of mutual TLS with duet filled in from creds,
// and returns the static bootstrap for the stack at addrs. The translation
// must be accepted whole: every route and policy Accepted, every reference
// resolved, every patch applied, TLS on every cluster to duet.
func gatewayBootstrap(ctx context.Context, egctl, dir string, objs []object, addrs harness.Addresses, creds harness.Credentials) ([]byte, error) {
	decodeCluster, prefillCluster, err := duetClusters(objs)
	if err != nil {
		return nil, err
	}
	tr, g, secrets, err := translateWhole(ctx, egctl, dir, objs, creds, "the manifests", func(extra []object) ([]byte, error) {
		return translationInput(objs, extra, addrs)
	})
	if err != nil {
		return nil, err
	}
	// The ext_proc cluster sheds past envoy.max_routing_requests
	// (policies.yaml's backendSettings.circuitBreaker).
	if out, err := os.ReadFile(filepath.Join(dir, "envoy-gateway-output.json")); err != nil {
		return nil, err
	} else if !regexp.MustCompile(`"maxRequests":\s*256`).Match(out) || !regexp.MustCompile(`"maxPendingRequests":\s*256`).Match(out) {
		return nil, errors.New("the translated ext_proc cluster has no circuit breaker of 256 requests")
	}
	m, err := remap(addrs)
	if err != nil {
		return nil, err
	}
	return tr.bootstrap(addrs, m, decodeCluster, prefillCluster, g, secrets)
}

// TestEnvoyGateway runs duet's core claims through the Envoy that Envoy
// Gateway's translation of deploy/envoy-gateway configures.
func TestEnvoyGateway(t *testing.T) {
	s, addrs := startGateway(t)

	// Claims 1, 3, 4 of docs/envoy-contract.md: each leg reaches the engine
	// duet named, the mirror carries the rewritten body, and each leg its
	// own DP rank.
	t.Run("legs reach the engines duet named with their own ranks", func(t *testing.T) {
		usedPrefill, usedDecode := map[string]bool{}, map[string]bool{}
		differ := 0
		for i := range 8 {
			id := requestID(t, i)
			resp, body := send(t, s, "/v1/chat/completions", map[string]string{"x-request-id": id}, chatBody(false))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			decSim, dec := only(t, legs(t, s.Decode, id, 1))
			preSim, pre := only(t, legs(t, s.Prefill, id, 1))
			if !bytes.Equal(dec.Body, pre.Body) {
				t.Errorf("legs got different bodies:\ndecode:  %s\nprefill: %s", dec.Body, pre.Body)
			}
			if named, _, _ := strings.Cut(dec.Headers["x-duet-decode-endpoint"], ","); named != decSim.Address {
				t.Errorf("decode leg reached %s, duet named %s", decSim.Address, named)
			}
			if named := pre.Headers["x-duet-prefill-endpoint"]; named != preSim.Address {
				t.Errorf("mirror reached %s, duet named %s", preSim.Address, named)
			}
			host, _, _ := net.SplitHostPort(preSim.Address)
			if dec.Host() != host || dec.BootstrapPort == nil || *dec.BootstrapPort != preSim.BootstrapPort {
				t.Errorf("bootstrap %s:%v does not name the prefill that got the mirror (%s, bootstrap port %d)",
					dec.Host(), dec.BootstrapPort, preSim.Address, preSim.BootstrapPort)
			}
			if dec.DPRank == nil || dec.Source() != "header" || dec.Headers["x-data-parallel-rank"] != strconv.Itoa(*dec.DPRank) {
				t.Fatalf("decode leg not pinned by its header: rank %v source %q header %q", dec.DPRank, dec.Source(), dec.Headers["x-data-parallel-rank"])
			}
			if pre.DPRank == nil || pre.Source() != "header" || pre.Headers["x-data-parallel-rank"] != pre.Headers["x-duet-prefill-dp-rank"] {
				t.Fatalf("prefill leg not pinned by its own header: rank %v source %q header %q, duet's prefill rank %q",
					pre.DPRank, pre.Source(), pre.Headers["x-data-parallel-rank"], pre.Headers["x-duet-prefill-dp-rank"])
			}
			if room := pre.Rooms()[0]; int(room%uint64(preSim.DPSize)) != *pre.DPRank {
				t.Errorf("prefill rank %d, but room %d %% %d = %d", *pre.DPRank, room, preSim.DPSize, room%uint64(preSim.DPSize))
			}
			if dec.PrefillDPRank == nil || *dec.PrefillDPRank != *pre.DPRank {
				t.Errorf("decode looked for KV on prefill rank %v, prefill ran on %d", dec.PrefillDPRank, *pre.DPRank)
			}
			for _, leg := range []harness.Record{dec, pre} {
				if leg.Status != http.StatusOK || leg.Error != "" {
					t.Errorf("%s leg failed: %d %s", leg.Mode, leg.Status, leg.Error)
				}
			}
			if *dec.DPRank != *pre.DPRank {
				differ++
			}
			usedPrefill[preSim.Name], usedDecode[decSim.Name] = true, true
		}
		if len(usedPrefill) != 2 || len(usedDecode) != 2 {
			t.Errorf("duet's choices did not reach every engine: prefill %v decode %v", usedPrefill, usedDecode)
		}
		if differ == 0 {
			t.Error("decode and prefill ranks never differed: per-leg rank headers not exercised")
		}
	})

	// Claim 9: clients cannot choose hosts, mirrors, ranks or duet's id.
	t.Run("spoofed routing headers are ignored", func(t *testing.T) {
		decodeCluster, _, _ := duetClustersOf(t)
		id := requestID(t, 0)
		resp, body := send(t, s, "/v1/chat/completions", map[string]string{
			"x-request-id":            id,
			"x-duet-mirror":           decodeCluster, // a second decode request, if it stuck
			"x-duet-decode-endpoint":  "127.0.0.1:1",
			"x-duet-prefill-endpoint": "127.0.0.1:1",
			"x-duet-prefill-dp-rank":  "7",
			"x-duet-request-id":       "spoofed",
			"x-duet-decode-body-rank": "1",
			"X-Data-Parallel-Rank":    "7",
		}, chatBody(false))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		decSim, dec := only(t, legs(t, s.Decode, id, 1))
		_, pre := only(t, legs(t, s.Prefill, id, 1))
		time.Sleep(200 * time.Millisecond) // a spoofed second decode leg would show up by now
		legs(t, s.Decode, id, 1)
		for _, leg := range []harness.Record{dec, pre} {
			if leg.Headers["x-duet-request-id"] == "spoofed" || leg.Headers["x-duet-request-id"] == "" {
				t.Errorf("%s leg: x-duet-request-id %q, want duet's own", leg.Mode, leg.Headers["x-duet-request-id"])
			}
			if leg.DPRank == nil || *leg.DPRank == 7 {
				t.Errorf("%s leg: rank %v, the client's 7 stuck", leg.Mode, leg.DPRank)
			}
			if strings.Contains(leg.Headers["x-duet-decode-endpoint"], "127.0.0.1:1") {
				t.Errorf("%s leg: the client's decode endpoint stuck: %q", leg.Mode, leg.Headers["x-duet-decode-endpoint"])
			}
		}
		if named, _, _ := strings.Cut(dec.Headers["x-duet-decode-endpoint"], ","); named != decSim.Address {
			t.Errorf("decode leg reached %s, duet named %s", decSim.Address, named)
		}
		// Headers duet does not set on a request must not pass either: the
		// decode body rank of /generate on a chat request, a mirror on a
		// request duet does not mirror.
		if bytes.Contains(dec.Body, []byte("routed_dp_rank")) {
			t.Errorf("a client x-duet-decode-body-rank reached the decode cluster's Lua filter: %s", dec.Body)
		}
		id = requestID(t, 1)
		_, prefillCluster, _ := duetClustersOf(t)
		resp, body = send(t, s, "/v1/models", map[string]string{
			"x-request-id": id, "x-duet-mirror": prefillCluster, "x-duet-prefill-endpoint": s.Prefill[0].Address,
		}, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET /v1/models: status %d: %s", resp.StatusCode, body)
		}
		time.Sleep(200 * time.Millisecond)
		legs(t, s.Prefill, id, 0)
	})

	// Claim 23: a PD /generate gets the decode rank in the decode leg's body
	// (the decode cluster's upstream Lua filter); the mirror keeps the
	// shared body.
	t.Run("generate carries the decode rank in the decode leg's body", func(t *testing.T) {
		id := requestID(t, 0)
		resp, body := send(t, s, "/generate", map[string]string{"x-request-id": id},
			[]byte(`{"text":"hello","sampling_params":{"max_new_tokens":4}}`))
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		_, dec := only(t, legs(t, s.Decode, id, 1))
		_, pre := only(t, legs(t, s.Prefill, id, 1))
		if dec.DPRank == nil || dec.Source() != "body" || strconv.Itoa(*dec.DPRank) != dec.Headers["x-duet-decode-body-rank"] {
			t.Errorf("decode leg: rank %v from %q, duet's decode rank %q", dec.DPRank, dec.Source(), dec.Headers["x-duet-decode-body-rank"])
		}
		if bytes.Contains(pre.Body, []byte("routed_dp_rank")) {
			t.Errorf("the mirror's body carries routed_dp_rank: %s", pre.Body)
		}
	})

	// Claim 5: a stream reaches the client as it is generated.
	t.Run("streaming", func(t *testing.T) {
		id := requestID(t, 0)
		resp, body := send(t, s, "/v1/chat/completions", map[string]string{"x-request-id": id}, chatBody(true))
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("content-type"), "text/event-stream") {
			t.Fatalf("status %d, content-type %q: %s", resp.StatusCode, resp.Header.Get("content-type"), body)
		}
		events := 0
		sc := bufio.NewScanner(bytes.NewReader(body))
		last := ""
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				events++
				last = data
			}
		}
		if events < 3 || last != "[DONE]" {
			t.Errorf("%d events, last %q: %s", events, last, body)
		}
		legs(t, s.Prefill, id, 1)
	})

	// Claim 6: a request duet does not mirror has no prefill leg.
	t.Run("non-inference paths are not mirrored", func(t *testing.T) {
		id := requestID(t, 0)
		resp, body := send(t, s, "/v1/models", map[string]string{"x-request-id": id}, nil)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		time.Sleep(200 * time.Millisecond)
		legs(t, s.Prefill, id, 0)
	})

	// Claim 7: bodies above Envoy Gateway's default 32 KiB buffer pass
	// whole to both legs (ClientTrafficPolicy and BackendTrafficPolicy
	// bufferLimit).
	t.Run("large bodies pass to both legs", func(t *testing.T) {
		id := requestID(t, 0)
		prompt := strings.Repeat("many tokens ", (2<<20)/12)
		req, err := json.Marshal(map[string]any{"model": "sim-model", "prompt": prompt, "max_tokens": 2})
		if err != nil {
			t.Fatal(err)
		}
		resp, body := send(t, s, "/v1/completions", map[string]string{"x-request-id": id}, req)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d: %.300s", resp.StatusCode, body)
		}
		_, dec := only(t, legs(t, s.Decode, id, 1))
		_, pre := only(t, legs(t, s.Prefill, id, 1))
		if len(dec.Body) < len(prompt) || !bytes.Equal(dec.Body, pre.Body) {
			t.Errorf("legs got %d and %d bytes, want the same body of more than %d", len(dec.Body), len(pre.Body), len(prompt))
		}
	})

	// Claim 7's other half and claim 12: a body above the buffer limit gets
	// Envoy's 413 before duet or an engine sees it, in the OpenAI error
	// envelope (local_reply_config).
	t.Run("a body above the limit gets 413 in the error envelope", func(t *testing.T) {
		id := requestID(t, 0)
		big := append([]byte(`{"model":"sim-model","prompt":"`), bytes.Repeat([]byte("x"), 33<<20)...)
		big = append(big, `","max_tokens":2}`...)
		resp, body := send(t, s, "/v1/completions", map[string]string{"x-request-id": id}, big)
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("status %d, want 413: %.300s", resp.StatusCode, body)
		}
		if msg, typ := openAIError(t, body); typ != "invalid_request_error" || msg != contract.BodyTooLargeMessage(32<<20) {
			t.Errorf("error %q of type %q, want %q as invalid_request_error", msg, typ, contract.BodyTooLargeMessage(32<<20))
		}
		legs(t, append(append([]*harness.Sim{}, s.Decode...), s.Prefill...), id, 0)
	})

	// Claim 25: every path passes duet, which refuses engine administration.
	t.Run("engine administration is refused", func(t *testing.T) {
		resp, body := send(t, s, "/flush_cache", nil, []byte(`{}`))
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("POST /flush_cache: status %d, want 403: %s", resp.StatusCode, body)
		}
		openAIError(t, body)
	})

	// Claim 28: an engine's own JSON error reaches the client in the
	// OpenAI error envelope (the connection manager's Lua filter).
	t.Run("engine errors get the error envelope", func(t *testing.T) {
		setErrorRate(t, s.Decode, 1)
		defer setErrorRate(t, s.Decode, 0)
		id := requestID(t, 0)
		resp, body := send(t, s, "/v1/chat/completions", map[string]string{"x-request-id": id}, chatBody(false))
		if resp.StatusCode != http.StatusInternalServerError {
			t.Fatalf("status %d, want the engine's 500: %s", resp.StatusCode, body)
		}
		if _, typ := openAIError(t, body); typ != "server_error" || bytes.Contains(body, []byte(`"object"`)) {
			t.Errorf("the engine's error was not rewritten: %s", body)
		}
		legs(t, s.Decode, id, 1)
	})

	// Claims 14, 16, 17: the access logs reach duet, and duet tells the legs
	// apart by Envoy Gateway's cluster names.
	t.Run("access-log feedback reaches duet for every leg", func(t *testing.T) {
		for i, stream := range []bool{false, true} {
			id := requestID(t, i)
			resp, body := send(t, s, "/v1/chat/completions", map[string]string{"x-request-id": id}, chatBody(stream))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
			decSim, dec := only(t, legs(t, s.Decode, id, 1))
			preSim, pre := only(t, legs(t, s.Prefill, id, 1))
			got := completions(t, s, id, 3)
			for leg, want := range map[accesslog.Leg]struct {
				upstream, rank string
			}{
				accesslog.LegDecode:  {decSim.Address, dec.Headers["x-data-parallel-rank"]},
				accesslog.LegPrefill: {preSim.Address, pre.Headers["x-data-parallel-rank"]},
				accesslog.LegRequest: {decSim.Address, dec.Headers["x-data-parallel-rank"]},
			} {
				c, ok := got[leg]
				if !ok {
					t.Errorf("stream=%v: no %s entry: %+v", stream, leg, got)
					continue
				}
				if c.Failed || c.Status != http.StatusOK || c.Upstream != want.upstream || strconv.Itoa(c.DPRank) != want.rank {
					t.Errorf("stream=%v: %s entry %+v, want status 200 from %s with rank %s", stream, leg, c, want.upstream, want.rank)
				}
				if c.RequestID != dec.Headers["x-duet-request-id"] {
					t.Errorf("stream=%v: %s entry has request id %q, want duet's %q", stream, leg, c.RequestID, dec.Headers["x-duet-request-id"])
				}
			}
			if req := got[accesslog.LegRequest]; req.DecodeTarget == "" || req.PrefillTarget == "" {
				t.Errorf("stream=%v: the request's entry lacks duet's metadata: %+v", stream, req)
			}
			// Claims 18, 19: the token usage (json_to_metadata, or
			// sse_to_metadata on the include_usage event) rides along.
			if req := got[accesslog.LegRequest]; req.PromptTokens <= 0 || req.CompletionTokens != 4 {
				t.Errorf("stream=%v: the request's entry has %v prompt and %v completion tokens, want some and 4", stream, req.PromptTokens, req.CompletionTokens)
			}
		}
	})

	// Issue 19: the gateway's Envoy reached duet, for ext_proc and both
	// access logs (the subtests above), over mutual TLS, and duet refused
	// none of its streams.
	t.Run("the gateway authenticates to duet with mutual TLS", func(t *testing.T) {
		if n := duetByReason(t, s, "duet_auth_refused_total"); len(n) != 0 {
			t.Errorf("duet_auth_refused_total by reason %v, want none: duet refused some of the gateway's streams", n)
		}
		if n := envoySSL(t, s.EnvoyAdminURL, "handshake"); n == 0 {
			t.Error("Envoy counted no TLS handshake: it does not reach duet over TLS")
		}
		// Every entry the gateway sent was about a request duet routed, on
		// the host and rank it chose: the gateway's legs carry the contract.
		if n := duetByReason(t, s, "duet_feedback_untrusted_total"); len(n) != 0 {
			t.Errorf("duet_feedback_untrusted_total by reason %v: duet did not believe some of the gateway's entries", n)
		}
	})

	// Issue 19: a gateway whose credentials do not fit duet's gets nothing
	// through, and each side is the one that refuses: duet a client
	// certificate from another CA, Envoy a duet certificate from a CA it
	// does not trust or without the BackendTLSPolicy's hostname. A CA
	// bundle that holds duet's CA beside another (the middle of a CA
	// rotation, docs/deploy/envoy-gateway.md) still serves. Each case starts
	// a second Envoy from a translation of the manifests with the case's
	// change; duet and the engines are the stack's.
	t.Run("a second gateway is served or refused by its credentials", func(t *testing.T) {
		egctl, err := egctlPath()
		if err != nil {
			t.Fatal(err)
		}
		// Credentials of another `duet certs` run: another CA.
		other, err := harness.MakeCredentials(context.Background(), s.Tools.Duet, filepath.Join(s.Dir, "other-credentials"))
		if err != nil {
			t.Fatal(err)
		}
		bundle := filepath.Join(s.Dir, "ca-bundle.crt")
		if b, err := pem(other.CAFile, addrs.Credentials.CAFile); err != nil {
			t.Fatal(err)
		} else if err := os.WriteFile(bundle, b, 0o644); err != nil {
			t.Fatal(err)
		}
		for i, c := range []struct {
			name string
			// change alters the manifests or Envoy's credentials.
			change func(objs []object, creds *harness.Credentials)
			// served: the request is served. Otherwise it gets 503 and
			// reaches no engine, and duetRefuses is the reason of
			// duet_auth_refused_total that counts duet's refusal, or
			// envoyRefusal the ssl.<name> counter of Envoy's refusal of
			// duet's certificate.
			served                    bool
			duetRefuses, envoyRefusal string
		}{
			{"Envoy trusts a bundle of another CA and duet's", func(_ []object, creds *harness.Credentials) {
				creds.CAFile = bundle
			}, true, "", ""},
			{"Envoy's client certificate from another CA", func(_ []object, creds *harness.Credentials) {
				creds.EnvoyCertFile, creds.EnvoyKeyFile = other.EnvoyCertFile, other.EnvoyKeyFile
			}, false, "tls_handshake", ""},
			{"Envoy trusts another CA for duet", func(_ []object, creds *harness.Credentials) {
				creds.CAFile = other.CAFile
			}, false, "", "fail_verify_error"},
			{"a hostname duet's certificate does not carry", func(objs []object, _ *harness.Credentials) {
				for _, o := range objs {
					if o["kind"] == "BackendTLSPolicy" {
						harness.Dig(o, "spec", "validation").(map[string]any)["hostname"] = "not-duet.example"
					}
				}
			}, false, "", "fail_verify_san"},
		} {
			t.Run(c.name, func(t *testing.T) {
				objs, err := loadManifests()
				if err != nil {
					t.Fatal(err)
				}
				creds := addrs.Credentials
				c.change(objs, &creds)
				dir := filepath.Join(s.Dir, fmt.Sprintf("second-gateway-%d", i))
				if err := os.Mkdir(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				envoy := startSecondEnvoy(t, addrs, dir, func(ctx context.Context, addrs harness.Addresses) ([]byte, error) {
					return gatewayBootstrap(ctx, egctl, dir, objs, addrs, creds)
				})
				refusedBefore := duetByReason(t, s, "duet_auth_refused_total")
				id := requestID(t, 0)
				ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
				defer cancel()
				resp, body, err := harness.Send(ctx, envoy.url, http.MethodPost, "/v1/chat/completions", map[string]string{"x-request-id": id}, chatBody(false))
				if err != nil {
					t.Fatal(err)
				}
				refused := func() map[string]float64 {
					after := duetByReason(t, s, "duet_auth_refused_total")
					t.Logf("duet_auth_refused_total by reason: before %v, after %v", refusedBefore, after)
					return after
				}
				if c.served {
					if resp.StatusCode != http.StatusOK {
						t.Fatalf("status %d, want 200: %s", resp.StatusCode, body)
					}
					legs(t, s.Decode, id, 1)
					after := refused()
					for reason, n := range after {
						if n != refusedBefore[reason] {
							t.Errorf("duet refused some of the second gateway's streams (%s)", reason)
						}
					}
					return
				}
				if resp.StatusCode != http.StatusServiceUnavailable {
					t.Errorf("status %d, want 503: %s", resp.StatusCode, body)
				}
				time.Sleep(200 * time.Millisecond)
				legs(t, append(append([]*harness.Sim{}, s.Decode...), s.Prefill...), id, 0)
				if after := refused(); c.duetRefuses != "" && after[c.duetRefuses] <= refusedBefore[c.duetRefuses] {
					t.Errorf("duet did not count the refusal in duet_auth_refused_total{reason=%q}", c.duetRefuses)
				}
				if c.envoyRefusal != "" {
					if n := envoySSL(t, envoy.adminURL, c.envoyRefusal); n == 0 {
						t.Errorf("Envoy's ssl.%s is 0: Envoy did not refuse duet's certificate", c.envoyRefusal)
					}
				}
			})
		}
	})

	// Claim 24, near the end because it kills a decode engine: a decode
	// engine that refuses the connection gets the request retried on the
	// next host duet listed (BackendTrafficPolicy retry, override_host),
	// and served: the refused attempt's access-log entry does not make duet
	// abort the prefill leg that the retried decode leg needs.
	t.Run("a refused decode connection is retried on the next listed engine", func(t *testing.T) {
		dead, alive := s.Decode[1], s.Decode[0]
		dead.Kill()
		retried := false
		for i := 0; i < 8 && !retried; i++ {
			id := requestID(t, i)
			resp, body := send(t, s, "/v1/chat/completions", map[string]string{"x-request-id": id}, chatBody(false))
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("request %d: status %d: %s", i, resp.StatusCode, body)
			}
			recs := legs(t, []*harness.Sim{alive}, id, 1)[alive]
			named, fallback, _ := strings.Cut(recs[0].Headers["x-duet-decode-endpoint"], ",")
			if named == dead.Address {
				retried = true
				if fallback != alive.Address {
					t.Errorf("duet listed %q after the dead engine, want %s", fallback, alive.Address)
				}
			}
		}
		if !retried {
			t.Fatal("duet never named the killed decode engine first, so no retry was exercised")
		}
	})

	// Claim 8, last because it stops duet: without duet nothing reaches an
	// engine, and the client gets 503.
	t.Run("fails closed without duet", func(t *testing.T) {
		if err := s.Duet.Stop(10 * time.Second); err != nil {
			t.Logf("stop duet: %v", err)
		}
		id := requestID(t, 0)
		resp, body := send(t, s, "/v1/chat/completions", map[string]string{"x-request-id": id}, chatBody(false))
		if resp.StatusCode != http.StatusServiceUnavailable {
			t.Errorf("status %d, want 503: %s", resp.StatusCode, body)
		}
		// Claim 46: the patched local_reply_config's plain message, not
		// Envoy's details.
		if msg, typ := openAIError(t, body); msg != envoy.MessageRouterUnavailable || typ != "server_error" {
			t.Errorf("error %q of type %q, want %q as server_error", msg, typ, envoy.MessageRouterUnavailable)
		}
		time.Sleep(200 * time.Millisecond)
		var running []*harness.Sim
		for _, sim := range append(append([]*harness.Sim{}, s.Decode...), s.Prefill...) {
			if !sim.Exited() {
				running = append(running, sim)
			}
		}
		legs(t, running, id, 0)
	})
}

// TestManifestPinsTheProvedEnvoy: the EnvoyProxy runs the Envoy release
// these tests run on.
func TestManifestPinsTheProvedEnvoy(t *testing.T) {
	version, err := harness.FindEnvoyVersion()
	if err != nil {
		t.Fatal(err)
	}
	objs, err := loadManifests()
	if err != nil {
		t.Fatal(err)
	}
	image := str(find(objs, "EnvoyProxy", "duet"), "spec", "provider", "kubernetes", "envoyDeployment", "container", "image")
	if !strings.HasSuffix(image, ":distroless-v"+version) {
		t.Errorf("EnvoyProxy duet runs image %q, want Envoy %s, the release proved here", image, version)
	}
}

// TestManifestLuaMatchesEnvoyPackage: the Lua sources the patch policy
// carries are the ones duet's own bootstrap renders, so a fix in one cannot
// miss the other.
func TestManifestLuaMatchesEnvoyPackage(t *testing.T) {
	objs, err := loadManifests()
	if err != nil {
		t.Fatal(err)
	}
	var sources []string
	for _, o := range objs {
		if o["kind"] != "EnvoyPatchPolicy" {
			continue
		}
		harness.Walk(o, func(m map[string]any) {
			if s := str(m, "inlineString"); s != "" {
				sources = append(sources, s)
			}
			if s := str(m, "inline_string"); s != "" {
				sources = append(sources, s)
			}
		})
	}
	for name, want := range map[string]string{"body rank": envoy.BodyRankLua(), "error envelope": envoy.ErrorEnvelopeLua()} {
		found := false
		for _, s := range sources {
			if strings.TrimSpace(s) == strings.TrimSpace(want) {
				found = true
			}
		}
		if !found {
			t.Errorf("no EnvoyPatchPolicy carries the %s Lua of package envoy", name)
		}
	}
}

// TestManifestLocalRepliesMatchEnvoyPackage: the patch policies give
// Envoy's own error replies the local_reply_config that duet's own
// bootstrap renders for the same 32 MiB body limit (the buffer limit of
// policies.yaml), so that the messages clients read are the same on
// every surface.
func TestManifestLocalRepliesMatchEnvoyPackage(t *testing.T) {
	want := renderedLocalReplies(t, 32<<20)
	for name, load := range map[string]func() ([]object, error){"single pool": loadManifests, "pools": loadPoolManifests} {
		objs, err := load()
		if err != nil {
			t.Fatal(err)
		}
		found := 0
		for _, o := range objs {
			if o["kind"] != "EnvoyPatchPolicy" {
				continue
			}
			for _, p := range list(harness.Dig(o, "spec", "jsonPatches")) {
				if !strings.HasSuffix(str(p, "operation", "path"), "/local_reply_config") {
					continue
				}
				found++
				if got := harness.Dig(p, "operation", "value"); !reflect.DeepEqual(got, want) {
					t.Errorf("%s: the patched local_reply_config\n%v\nis not the rendered bootstrap's\n%v", name, got, want)
				}
			}
		}
		if found != 1 {
			t.Errorf("%s: %d patches of local_reply_config, want 1", name, found)
		}
	}
}

// renderedLocalReplies is the local_reply_config of duet's rendered
// bootstrap for a maxBody body limit, as YAML decodes it.
func renderedLocalReplies(t *testing.T, maxBody int) any {
	t.Helper()
	addr := envoy.Address{Host: "127.0.0.1", Port: 1}
	var buf bytes.Buffer
	if err := envoy.Render(&buf, envoy.Params{Listen: addr, Admin: addr, Duet: addr, Decode: []envoy.Address{addr},
		MaxBodyBytes: maxBody, MessageTimeout: time.Second, StreamIdleTimeout: time.Minute, MaxRoutingRequests: 1}); err != nil {
		t.Fatal(err)
	}
	var boot any
	if err := yaml.Unmarshal(buf.Bytes(), &boot); err != nil {
		t.Fatal(err)
	}
	return harness.Dig(boot, "static_resources", "listeners", 0, "filter_chains", 0, "filters", 0, "typed_config", "local_reply_config")
}

func duetClustersOf(t *testing.T) (decode, prefill string, objs []object) {
	t.Helper()
	objs, err := loadManifests()
	if err != nil {
		t.Fatal(err)
	}
	decode, prefill, err = duetClusters(objs)
	if err != nil {
		t.Fatal(err)
	}
	return decode, prefill, objs
}

// chatBody is a chat request for 4 tokens; a stream asks for the usage event.
func chatBody(stream bool) []byte {
	usage := ""
	if stream {
		usage = `,"stream_options":{"include_usage":true}`
	}
	return fmt.Appendf(nil, `{"model":"sim-model","messages":[{"role":"user","content":"hello there"}],"max_tokens":4,"stream":%v%s}`, stream, usage)
}

// openAIError parses an OpenAI error envelope, failing the test unless body
// is one with a message.
func openAIError(t *testing.T, body []byte) (message, typ string) {
	t.Helper()
	var e struct {
		Error *struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.Error == nil || e.Error.Message == "" {
		t.Fatalf("not an OpenAI error envelope (%v): %s", err, body)
	}
	return e.Error.Message, e.Error.Type
}

// requestID is a client request id unique to the test and i.
func requestID(t *testing.T, i int) string {
	return fmt.Sprintf("%s-%d-%d", strings.ReplaceAll(t.Name(), "/", "-"), i, time.Now().UnixNano())
}

// send posts body (GET when nil) to the gateway and returns the response
// with its whole body (see harness.Stack.Send).
func send(t *testing.T, s *harness.Stack, path string, hdr map[string]string, body []byte) (*http.Response, []byte) {
	t.Helper()
	method := http.MethodGet
	if body != nil {
		method = http.MethodPost
	}
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	resp, data, err := s.Send(ctx, method, path, hdr, body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, data
}

// legs waits until the engines hold want records of request id (a mirror
// may end after the client's response) and returns them by engine.
func legs(t *testing.T, sims []*harness.Sim, id string, want int) map[*harness.Sim][]harness.Record {
	t.Helper()
	found, err := harness.WaitRecords(context.Background(), sims, id, want, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// setErrorRate makes the engines fail that share of requests with 500.
func setErrorRate(t *testing.T, sims []*harness.Sim, rate float64) {
	t.Helper()
	for _, e := range sims {
		if _, err := e.SetFaults(context.Background(), sim.FaultUpdate{ErrorRate: &rate}); err != nil {
			t.Fatal(err)
		}
	}
}

// only returns the one engine and record of found.
func only(t *testing.T, found map[*harness.Sim][]harness.Record) (*harness.Sim, harness.Record) {
	t.Helper()
	sim, rec, err := harness.OnlyRecord(found)
	if err != nil {
		t.Fatal(err)
	}
	return sim, rec
}

// completions waits until duet's /debug/completions holds want entries for
// request id and returns them by leg.
func completions(t *testing.T, s *harness.Stack, id string, want int) map[accesslog.Leg]accesslog.Completion {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second+requestTimeout)
	defer cancel()
	got, err := harness.WaitCompletions[accesslog.Completion](ctx, s, id, want, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	byLeg := map[accesslog.Leg]accesslog.Completion{}
	for _, c := range got {
		byLeg[c.Leg] = c
	}
	return byLeg
}
