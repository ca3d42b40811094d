package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/harness"
)

// The two pools of TestPools: a PD pool of SGLang-flavoured engines with DP
// ranks, and an aggregated pool of vLLM-flavoured engines that, like vLLM,
// answer 404 to a model they do not serve.
const (
	pdModel, pdAlias   = "deepseek-ai/DeepSeek-V3", "deepseek"
	aggModel, aggAlias = "Qwen/Qwen3-8B", "qwen"
)

// poolsStack is duet with two pools behind the Envoy bootstrap `duet
// envoy-config` renders for them.
type poolsStack struct {
	envoyURL, adminURL string
	prefill, decode    *harness.Sim   // the PD pool
	agg                []*harness.Sim // the aggregated pool
	duet               *harness.Process
}

func startPoolsStack(t *testing.T, ctx context.Context) *poolsStack {
	return startPoolsStackWith(t, ctx, "")
}

// startPoolsStackWith is startPoolsStack with extra appended to duet's
// configuration (top-level sections).
func startPoolsStackWith(t *testing.T, ctx context.Context, extra string) *poolsStack {
	t.Helper()
	tools, err := harness.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	var procs []*harness.Process
	t.Cleanup(func() {
		for _, p := range procs {
			if t.Failed() {
				t.Logf("%s log:\n%s", p.Name, p.Tail(4000))
			}
			p.Stop(5 * time.Second)
		}
	})
	sim := func(name, mode string, args ...string) *harness.Sim {
		s, err := harness.StartSim(ctx, dir, name, mode, harness.SimSpec{DPSize: 2, Args: args})
		if s != nil {
			procs = append(procs, s.Process)
		}
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	st := &poolsStack{
		prefill: sim("pd-prefill", "prefill", "--model", pdModel),
		decode:  sim("pd-decode", "decode", "--model", pdModel),
	}
	for i := range 2 {
		st.agg = append(st.agg, sim(fmt.Sprintf("agg-%d", i), "null", "--flavor", "vllm", "--model", aggModel))
	}
	ports, err := harness.FreePorts(4)
	if err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`listen: {grpc: "127.0.0.1:%d", admin: "127.0.0.1:%d"}
discovery: {interval: 1s}
load: {interval: 200ms}
health: {interval: 200ms, timeout: 200ms}
envoy: {listen: "127.0.0.1:%d", admin: "127.0.0.1:%d"}
pools:
- name: deepseek
  models: [%q]
  aliases: [%q]
  prefill: [{url: %q}]
  decode: [{url: %q}]
- name: qwen
  models: [%q]
  aliases: [%q]
  # vLLM serves no /server_info: its DP size is configured.
  decode: [{url: %q, dp_size: 2}, {url: %q, dp_size: 2}]
  policy: {decode: least_tokens}
`, ports[0], ports[1], ports[2], ports[3], pdModel, pdAlias, st.prefill.URL, st.decode.URL, aggModel, aggAlias, st.agg[0].URL, st.agg[1].URL) + extra
	cfgPath := filepath.Join(dir, "duet.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	rendered, err := exec.Command(tools.Duet, "envoy-config", "-config", cfgPath).Output()
	if err != nil {
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			err = fmt.Errorf("%w: %s", err, exit.Stderr)
		}
		t.Fatalf("duet envoy-config: %v", err)
	}
	envoyPath := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(envoyPath, rendered, 0o644); err != nil {
		t.Fatal(err)
	}
	duet, err := harness.StartProcess(dir, "duet", tools.Duet, "-config", cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	procs = append(procs, duet)
	st.duet = duet
	st.adminURL = fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	if err := harness.WaitHTTP(ctx, duet, st.adminURL+"/readyz"); err != nil {
		t.Fatal(err)
	}
	envoy, err := harness.StartEnvoy(ctx, dir, envoyPath, fmt.Sprintf("http://127.0.0.1:%d", ports[3]))
	if err != nil {
		t.Fatal(err)
	}
	procs = append(procs, envoy)
	st.envoyURL = fmt.Sprintf("http://127.0.0.1:%d", ports[2])
	return st
}

// chat posts body to /v1/chat/completions through Envoy with x-request-id
// id and the headers hdr, and fails the test if no response comes.
func (st *poolsStack) chat(t *testing.T, ctx context.Context, id string, body []byte, hdr map[string]string) (*http.Response, []byte) {
	t.Helper()
	h := map[string]string{"x-request-id": id}
	for k, v := range hdr {
		h[k] = v
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	resp, body, err := harness.Send(rctx, st.envoyURL, http.MethodPost, "/v1/chat/completions", h, body)
	if err != nil {
		t.Fatalf("request %s: %v", id, err)
	}
	return resp, body
}

// modelChat is a chat body for model.
func modelChat(model string, stream bool) []byte {
	return []byte(fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Which pool am I in?"}],"max_tokens":4,"stream":%v,"stream_options":{"include_usage":%v}}`,
		model, stream, stream))
}

// TestPools runs two pools behind one Envoy and one duet: each model's
// requests, streamed or not, reach only its pool (the PD pool's through
// both legs, with ranks); an alias is rewritten to the name the engines
// serve; GET /v1/models lists both; an unknown or missing model is
// answered 404 by duet, and no engine sees it; spoofed routing headers
// choose nothing; and with every engine of one pool dead, that pool's
// requests fail fast with 503 while the other pool serves on.
func TestPools(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	st := startPoolsStack(t, ctx)
	post := func(id string, body []byte, hdr map[string]string) (*http.Response, []byte) {
		t.Helper()
		return st.chat(t, ctx, id, body, hdr)
	}
	aggAddrs := []string{st.agg[0].Address, st.agg[1].Address}
	everySim := append([]*harness.Sim{st.prefill, st.decode}, st.agg...)

	t.Run("each model to its pool", func(t *testing.T) {
		for i, tc := range []struct {
			model  string
			stream bool
			pd     bool
		}{
			{pdModel, false, true}, {pdModel, true, true}, {pdAlias, false, true},
			{aggModel, false, false}, {aggModel, true, false},
			// vLLM answers 404 to a name it does not serve: duet rewrote it.
			{aggAlias, false, false},
		} {
			id := requestID(t, i)
			resp, body := post(id, modelChat(tc.model, tc.stream), nil)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("%s (stream %v): %d %s", tc.model, tc.stream, resp.StatusCode, body)
			}
			server := resp.Header.Get("X-Sim-Server")
			if tc.pd {
				if server != st.decode.Address {
					t.Errorf("%s served by %s, want the PD pool's decode %s", tc.model, server, st.decode.Address)
				}
				found := legs(t, []*harness.Sim{st.prefill, st.decode}, id, 2)
				for s, recs := range found {
					if len(recs) != 1 || recs[0].DPRank == nil {
						t.Errorf("%s: %s recorded %+v, want one leg on a DP rank", tc.model, s.Name, recs)
					}
				}
				// The engines see the name they serve, never the alias.
				if !strings.Contains(string(body), pdModel) {
					t.Errorf("%s: response names no %s: %.300s", tc.model, pdModel, body)
				}
			} else if !slices.Contains(aggAddrs, server) {
				t.Errorf("%s served by %q, want one of the aggregated pool %v", tc.model, server, aggAddrs)
			}
		}
	})

	t.Run("models list", func(t *testing.T) {
		var list struct {
			Object string `json:"object"`
			Data   []struct {
				ID, Object, OwnedBy string
			} `json:"data"`
		}
		if err := harness.GetJSON(ctx, st.envoyURL+"/v1/models", &list); err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range list.Data {
			ids = append(ids, m.ID)
		}
		if list.Object != "list" || !slices.Equal(ids, []string{pdModel, aggModel}) {
			t.Errorf("GET /v1/models = %+v, want a list of %s and %s", list, pdModel, aggModel)
		}
	})

	t.Run("a request without a body to the first pool", func(t *testing.T) {
		rctx, cancel := context.WithTimeout(ctx, requestTimeout)
		defer cancel()
		// SGLang's /server_info names its served model; vLLM serves none.
		resp, body, err := harness.Send(rctx, st.envoyURL, http.MethodGet, "/server_info", nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), pdModel) {
			t.Errorf("GET /server_info: %d %.300s, want the first pool's engine", resp.StatusCode, body)
		}
	})

	t.Run("unknown or missing model", func(t *testing.T) {
		before := simRequests(t, ctx, everySim)
		for i, body := range [][]byte{modelChat("gpt-17", false), []byte(`{"messages":[{"role":"user","content":"hi"}]}`)} {
			start := time.Now()
			resp, out := post(requestID(t, i), body, nil)
			took := time.Since(start)
			var e struct {
				Error struct {
					Message, Type, Param, Code string
				} `json:"error"`
			}
			if resp.StatusCode != http.StatusNotFound || json.Unmarshal(out, &e) != nil || e.Error.Code != "model_not_found" || e.Error.Param != "model" {
				t.Errorf("got %d %s, want 404 with code model_not_found", resp.StatusCode, out)
			}
			t.Logf("%d answered in %v: %s", resp.StatusCode, took, out)
			// Far below any timeout: duet answers at once.
			if took > time.Second {
				t.Errorf("the 404 took %v", took)
			}
		}
		if after := simRequests(t, ctx, everySim); after != before {
			t.Errorf("engines recorded %d requests before, %d after: an unknown model reached one", before, after)
		}
	})

	t.Run("spoofed headers choose nothing", func(t *testing.T) {
		id := requestID(t, 0)
		resp, body := post(id, modelChat(aggModel, false), map[string]string{
			"x-duet-pool": "deepseek", "x-duet-decode-endpoint": st.decode.Address, "x-duet-mirror": "duet_deepseek_prefill",
			"x-data-parallel-rank": "1",
		})
		if resp.StatusCode != http.StatusOK || !slices.Contains(aggAddrs, resp.Header.Get("X-Sim-Server")) {
			t.Fatalf("a spoofed request for %s: %d from %q %s, want 200 from the aggregated pool", aggModel, resp.StatusCode, resp.Header.Get("X-Sim-Server"), body)
		}
		if recs, err := st.prefill.Requests(ctx); err != nil || slices.ContainsFunc(recs, func(r harness.Record) bool { return r.RequestID() == id }) {
			t.Errorf("the spoofed mirror reached the PD prefill engine (%v)", err)
		}
	})

	t.Run("a dead pool fails fast alone", func(t *testing.T) {
		for _, s := range st.agg {
			s.Kill()
		}
		deadline := time.Now().Add(20 * time.Second)
		var last string
		for i := 0; ; i++ {
			start := time.Now()
			resp, body := post(requestID(t, i), modelChat(aggModel, false), nil)
			if took := time.Since(start); took > 5*time.Second {
				t.Fatalf("a request to the dead pool took %v", took)
			}
			if resp.StatusCode == http.StatusOK {
				t.Fatalf("the dead pool served: %s", body)
			}
			last = fmt.Sprintf("%d %s", resp.StatusCode, body)
			if resp.StatusCode == http.StatusServiceUnavailable && strings.Contains(string(body), "pool qwen") {
				break // duet ejected the engines: its own fast 503
			}
			if time.Now().After(deadline) {
				t.Fatalf("the dead pool still answers %s", last)
			}
			time.Sleep(100 * time.Millisecond)
		}
		t.Logf("dead pool: %s", last)
		for i, stream := range []bool{false, true} {
			if resp, body := post(requestID(t, i), modelChat(pdModel, stream), nil); resp.StatusCode != http.StatusOK {
				t.Errorf("the PD pool, with the other pool dead: %d %s", resp.StatusCode, body)
			}
		}
		if resp, err := http.Get(st.adminURL + "/readyz"); err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("duet not ready with one pool dead: %v %v", resp, err)
		}
	})

	t.Run("metrics carry the pool", func(t *testing.T) {
		mfs, err := harness.ScrapeMetrics(ctx, nil, st.adminURL+"/metrics")
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range []struct {
			name  string
			match map[string]string
		}{
			{"duet_extproc_requests_total", map[string]string{"pool": "deepseek", "outcome": "routed"}},
			{"duet_extproc_requests_total", map[string]string{"pool": "qwen", "outcome": "routed"}},
			{"duet_extproc_requests_total", map[string]string{"pool": "", "outcome": "model_not_found"}},
			{"duet_picks_total", map[string]string{"pool": "deepseek", "role": "prefill"}},
			{"duet_picks_total", map[string]string{"pool": "qwen", "role": "decode"}},
		} {
			if harness.SumMetric(mfs, want.name, want.match) == 0 {
				t.Errorf("no %s%v", want.name, want.match)
			}
		}
	})
}

// simRequests counts the requests the engines recorded.
func simRequests(t *testing.T, ctx context.Context, sims []*harness.Sim) int {
	t.Helper()
	n := 0
	for _, s := range sims {
		recs, err := s.Requests(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n += len(recs)
	}
	return n
}
