package clustersim

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/duet-router/duet/e2e/sim"
	"github.com/duet-router/duet/scheduler"
)

// Cluster is the simulated engines. With no prefill engine the decode
// engines serve whole requests (aggregated).
type Cluster struct {
	Prefill []Engine
	Decode  []Engine
}

// Engine is one simulated SGLang server.
type Engine struct {
	// Profile names the engine model (sim.ProfileNames).
	Profile string
	// DPSize is the number of DP ranks; 0 takes the profile's.
	DPSize int
	// MaxTotalTokens is each rank's KV capacity; 0 takes the profile's.
	MaxTotalTokens int
	// DecodeRadixCache runs a decode engine with SGLang's decode radix
	// cache (--disaggregation-decode-enable-radix-cache), and
	// HierarchicalCache adds its host-memory tier
	// (--enable-hierarchical-cache); both are ignored on other engines.
	DecodeRadixCache, HierarchicalCache bool
	// KVTransferGBps is the prefill engines' KV transfer bandwidth; 0
	// takes the profile's.
	KVTransferGBps float64
}

// Uniform returns a cluster of p prefill and d decode engines of profile,
// each with dp ranks.
func Uniform(profile string, p, d, dp int) Cluster {
	var c Cluster
	for range p {
		c.Prefill = append(c.Prefill, Engine{Profile: profile, DPSize: dp})
	}
	for range d {
		c.Decode = append(c.Decode, Engine{Profile: profile, DPSize: dp})
	}
	return c
}

// String describes the cluster, e.g. "2 prefill × dp 4, 2 decode × dp 4".
func (c Cluster) String() string {
	part := func(role string, es []Engine) string {
		if len(es) == 0 {
			return ""
		}
		var dps []string
		same := true
		for _, e := range es {
			dps = append(dps, fmt.Sprint(e.DPSize))
			same = same && e.DPSize == es[0].DPSize
		}
		extra := ""
		if es[0].DecodeRadixCache && role == "decode" {
			extra += ", decode radix cache"
			if es[0].HierarchicalCache {
				extra += " with host tier"
			}
		}
		if es[0].KVTransferGBps > 0 && role == "prefill" {
			extra += fmt.Sprintf(", KV transfer %g GB/s", es[0].KVTransferGBps)
		}
		if same {
			return fmt.Sprintf("%d %s × dp %d%s", len(es), role, es[0].DPSize, extra)
		}
		return fmt.Sprintf("%d %s (dp %s)%s", len(es), role, strings.Join(dps, ", "), extra)
	}
	if len(c.Prefill) == 0 {
		return part("aggregated", c.Decode)
	}
	return part("prefill", c.Prefill) + ", " + part("decode", c.Decode)
}

// engine is one simulated server in a run.
type engine struct {
	role  scheduler.Role
	index int
	url   string // http://10.<role>.0.<index+1>:30000
	addr  string // the host:port Envoy would reach
	model *sim.Model
	dp    int
	// rr is the engine's own round robin over its ranks, for requests
	// that arrive without a rank (engine_default's decode legs).
	rr int
	// blockTokens is the model's prefix-cache block size.
	blockTokens int
}

// newEngine builds engine i of role; aggregated makes a decode engine
// serve whole requests.
func newEngine(role scheduler.Role, i int, spec Engine, aggregated, priority bool) (*engine, error) {
	mode := sim.ModeDecode
	octet := 1
	switch {
	case role == scheduler.RolePrefill:
		mode, octet = sim.ModePrefill, 0
	case aggregated:
		mode = sim.ModeNull
	}
	cfg := sim.Config{Mode: mode, Profile: spec.Profile, DPSize: spec.DPSize, MaxTotalTokens: spec.MaxTotalTokens, KVTransferGBps: spec.KVTransferGBps,
		EnablePriorityScheduling: priority}
	if mode == sim.ModeDecode {
		cfg.DecodeRadixCache, cfg.HierarchicalCache = spec.DecodeRadixCache, spec.HierarchicalCache
	}
	m, err := sim.NewModel(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s engine %d: %w", role, i, err)
	}
	prof, _ := sim.LookupProfile(spec.Profile)
	host := fmt.Sprintf("10.%d.0.%d", octet, i+1)
	return &engine{
		role: role, index: i, model: m, dp: m.Config().DPSize,
		url: "http://" + host + ":30000", addr: host + ":30000",
		blockTokens: prof.BlockSize,
	}, nil
}

// transport answers the scheduler's discovery and scrape requests from the
// engine models, in process, at the run's current time.
type transport struct {
	byHost map[string]*engine
	now    func() time.Duration
}

// RoundTrip serves GET /server_info and GET /v1/loads; anything else is a
// 404, as an SGLang server answers unknown paths.
func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	e, ok := t.byHost[req.URL.Host]
	if !ok {
		return nil, fmt.Errorf("clustersim: no engine at %s", req.URL.Host)
	}
	var body []byte
	var err error
	status := http.StatusOK
	switch req.URL.Path {
	case "/server_info":
		body, err = e.model.ServerInfoJSON()
	case "/v1/loads":
		body, err = e.model.LoadsJSON(t.now())
	default:
		status = http.StatusNotFound
		body = []byte(`{"detail":"Not Found"}`)
	}
	if err != nil {
		return nil, fmt.Errorf("clustersim: %s %s: %w", req.Method, req.URL, err)
	}
	return &http.Response{
		StatusCode:    status,
		Status:        fmt.Sprintf("%d %s", status, http.StatusText(status)),
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        http.Header{"Content-Type": []string{"application/json"}},
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Request:       req,
	}, nil
}
