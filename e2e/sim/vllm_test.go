package sim

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"
)

func TestVLLMFlavorRejectsPD(t *testing.T) {
	if _, err := New(Config{Flavor: FlavorVLLM, Mode: ModePrefill}, nil); err == nil || !strings.Contains(err.Error(), "aggregated") {
		t.Fatalf("err %v", err)
	}
	if _, err := New(Config{Flavor: "tgi"}, nil); err == nil {
		t.Fatal("unknown flavor accepted")
	}
}

func TestVLLMRankHeader(t *testing.T) {
	ts := startTest(t, Config{Flavor: FlavorVLLM, DPSize: 4})
	chat := `{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	tests := []struct {
		name       string
		path       string
		body       string
		headers    []string
		wantStatus int
		wantRank   int
		wantSource string
		wantBody   string
	}{
		{name: "header pins the rank", path: "/v1/chat/completions", body: chat,
			headers: []string{"X-data-parallel-rank", "2"}, wantStatus: 200, wantRank: 2, wantSource: "header"},
		{name: "header name is case-insensitive", path: "/v1/completions", body: `{"prompt":"hi","max_tokens":1}`,
			headers: []string{"x-DATA-parallel-RANK", "3"}, wantStatus: 200, wantRank: 3, wantSource: "header"},
		{name: "non-integer is ignored", path: "/v1/chat/completions", body: chat,
			headers: []string{"X-data-parallel-rank", "two"}, wantStatus: 200, wantRank: 0, wantSource: "least_loaded"},
		{name: "out of range", path: "/v1/chat/completions", body: chat,
			headers: []string{"X-data-parallel-rank", "4"}, wantStatus: 400,
			wantBody: `{"error":{"code":400,"message":"data_parallel_rank 4 is out of range [0, 4).","param":null,"type":"BadRequestError"}}`},
		{name: "negative", path: "/v1/completions", body: `{"prompt":"hi"}`,
			headers: []string{"X-data-parallel-rank", "-1"}, wantStatus: 400, wantBody: "data_parallel_rank -1 is out of range [0, 4)."},
		{name: "body rank and bootstrap fields are ignored", path: "/v1/chat/completions",
			body:       `{"messages":[{"role":"user","content":"hi"}],"routed_dp_rank":9,"bootstrap_room":"x","bootstrap_host":3}`,
			wantStatus: 200, wantRank: 0, wantSource: "least_loaded"},
		{name: "no /generate", path: "/generate", body: `{"text":"hi"}`, wantStatus: 404},
		{name: "a model it does not serve", path: "/v1/chat/completions",
			body:       `{"model":"other","messages":[{"role":"user","content":"hi"}]}`,
			wantStatus: 404, wantBody: `{"error":{"code":404,"message":"The model ` + "`other`" + ` does not exist.","param":null,"type":"NotFoundError"}}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := post(t, ts.api.URL+tc.path, tc.body, tc.headers...)
			if r.status != tc.wantStatus || !strings.Contains(string(r.body), tc.wantBody) {
				t.Fatalf("got %d %s, want %d containing %s", r.status, r.body, tc.wantStatus, tc.wantBody)
			}
			if tc.wantStatus != 200 {
				return
			}
			rec := lastRecord(t, ts.sim)
			if rec.DPRank == nil || *rec.DPRank != tc.wantRank || rec.Source() != tc.wantSource {
				t.Fatalf("record rank %v source %q", rec.DPRank, rec.Source())
			}
		})
	}
}

func TestVLLMLeastLoadedBalancing(t *testing.T) {
	// vLLM's internal balancer: lowest waiting×4 + running.
	ts := startTest(t, Config{Flavor: FlavorVLLM, DPSize: 3, DecodePerToken: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	send := func(headers ...string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			postCtx(ctx, t, ts.api.URL+"/v1/completions", `{"prompt":"hi","max_tokens":1}`, headers...)
		}()
	}
	send("X-data-parallel-rank", "0")
	send("X-data-parallel-rank", "2")
	eventually(t, "ranks 0 and 2 busy", func() bool {
		fams := scrape(t, ts)
		busy := map[string]float64{}
		for _, smp := range fams["vllm:num_requests_running"].samples {
			busy[string(smp.Metric["engine"])] = float64(smp.Value)
		}
		return busy["0"] == 1 && busy["2"] == 1
	})
	send()
	eventually(t, "third request on rank 1", func() bool {
		fams := scrape(t, ts)
		for _, smp := range fams["vllm:num_requests_running"].samples {
			if smp.Metric["engine"] == "1" && smp.Value == 1 {
				return true
			}
		}
		return false
	})
}

func TestVLLMEndpointsAndMetrics(t *testing.T) {
	ts := startTest(t, Config{Flavor: FlavorVLLM, DPSize: 2, Model: "m-v", Profile: "dense-8b-h100", TimeScale: 20})
	for path, want := range map[string]int{"/v1/loads": 404, "/server_info": 404, "/get_server_info": 404, "/health": 200, "/version": 200, "/v1/models": 200} {
		if r := get(t, ts.api.URL+path); r.status != want {
			t.Fatalf("GET %s: %d, want %d", path, r.status, want)
		}
	}
	if r := get(t, ts.api.URL+"/version"); string(r.body) != `{"version":"`+VLLMVersion+`"}` {
		t.Fatalf("version %s", r.body)
	}
	if r := get(t, ts.api.URL+"/v1/models"); !strings.Contains(string(r.body), `"owned_by":"vllm"`) {
		t.Fatalf("models %s", r.body)
	}
	prompt := `{"prompt":"` + words(2, 500) + `","max_tokens":3}`
	for i := 0; i < 2; i++ {
		r := post(t, ts.api.URL+"/v1/completions", prompt, "X-data-parallel-rank", "1")
		if r.status != 200 {
			t.Fatalf("status %d %s", r.status, r.body)
		}
		if i == 1 && !strings.Contains(string(r.body), `"prompt_tokens_details":{"cached_tokens":496}`) {
			t.Fatalf("usage %s", r.body)
		}
	}
	fams := scrape(t, ts)
	want := map[string]string{
		"vllm:num_requests_running":       "GAUGE",
		"vllm:num_requests_waiting":       "GAUGE",
		"vllm:kv_cache_usage_perc":        "GAUGE",
		"vllm:prefix_cache_queries_total": "COUNTER",
		"vllm:prefix_cache_hits_total":    "COUNTER",
		"vllm:prompt_tokens_total":        "COUNTER",
		"vllm:generation_tokens_total":    "COUNTER",
	}
	for name, typ := range want {
		f, ok := fams[name]
		if !ok || f.typ != typ || len(f.samples) != 2 {
			t.Fatalf("%s: %+v", name, f)
		}
		for _, smp := range f.samples {
			if smp.Metric["model_name"] != "m-v" || (smp.Metric["engine"] != "0" && smp.Metric["engine"] != "1") || len(smp.Metric) != 3 {
				t.Fatalf("%s labels %v", name, smp.Metric)
			}
		}
	}
	for name := range fams {
		if !strings.HasPrefix(name, "vllm:") {
			t.Fatalf("unexpected family %s", name)
		}
	}
	value := func(name, engine string) float64 {
		for _, smp := range fams[name].samples {
			if string(smp.Metric["engine"]) == engine {
				return float64(smp.Value)
			}
		}
		return -1
	}
	if value("vllm:prefix_cache_queries_total", "1") != 1000 || value("vllm:prefix_cache_hits_total", "1") != 496 ||
		value("vllm:generation_tokens_total", "1") != 6 || value("vllm:prefix_cache_queries_total", "0") != 0 {
		t.Fatalf("counters: queries %v hits %v gen %v",
			value("vllm:prefix_cache_queries_total", "1"), value("vllm:prefix_cache_hits_total", "1"), value("vllm:generation_tokens_total", "1"))
	}
}

func TestVLLMErrorShape(t *testing.T) {
	ts := startTest(t, Config{Flavor: FlavorVLLM, Faults: Faults{ErrorRate: 1}})
	r := post(t, ts.api.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`)
	if r.status != 500 || !strings.HasPrefix(string(r.body), `{"error":{"code":500,"message":"Internal server error`) {
		t.Fatalf("got %d %s", r.status, r.body)
	}
}
