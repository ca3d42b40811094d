package sim

import (
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// loadSections are the valid values of /v1/loads?include=.
var loadSections = []string{"core", "memory", "spec", "lora", "disagg", "queues", "all"}

// parseInclude parses the include query parameter (default all).
func parseInclude(q string) (map[string]bool, *apiError) {
	out := map[string]bool{}
	if strings.TrimSpace(q) == "" {
		q = "all"
	}
	var bad []string
	for _, part := range strings.Split(q, ",") {
		part = strings.TrimSpace(strings.ToLower(part))
		if part == "" {
			continue
		}
		if !slices.Contains(loadSections, part) {
			bad = append(bad, part)
			continue
		}
		out[part] = true
	}
	if len(bad) > 0 {
		return nil, badRequestf("Invalid include section(s): %s. Valid options: %s",
			strings.Join(bad, ", "), strings.Join(loadSections, ", "))
	}
	if out["all"] {
		for _, s := range loadSections {
			out[s] = true
		}
	}
	return out, nil
}

// rankLoadJSON renders one rank of /v1/loads. Core fields are always
// present; spec and lora are dropped (None in SGLang without speculative
// decoding or LoRA).
func (s *Server) rankLoadJSON(l rankSnapshot, include map[string]bool) map[string]any {
	return rankLoadJSON(s.cfg, l, include)
}

// rankLoadJSON renders one rank of /v1/loads for a server configured by
// cfg (see Server.rankLoadJSON).
func rankLoadJSON(cfg Config, l rankSnapshot, include map[string]bool) map[string]any {
	usage := float64(l.usedTokens) / float64(cfg.MaxTotalTokens)
	m := map[string]any{
		"dp_rank":              l.dpRank,
		"num_running_reqs":     l.running,
		"num_waiting_reqs":     l.waiting,
		"num_used_tokens":      l.usedTokens,
		"num_total_tokens":     l.totalTokens,
		"max_total_num_tokens": cfg.MaxTotalTokens,
		"token_usage":          usage,
		"gen_throughput":       l.genThroughput,
		"cache_hit_rate":       l.cacheHitRate,
		"utilization":          usage,
		"max_running_requests": cfg.MaxRunningRequests,
		"num_total_reqs":       l.running + l.waiting + l.transfer + l.bootstrap,
	}
	if include["memory"] {
		m["memory"] = map[string]any{
			"weight_gb": 0.0, "kv_cache_gb": 0.0, "graph_gb": 0.0, "token_capacity": cfg.MaxTotalTokens,
		}
	}
	if include["disagg"] {
		d := map[string]any{
			"mode":                        string(cfg.Mode),
			"prefill_prealloc_queue_reqs": 0,
			"prefill_inflight_queue_reqs": 0,
			"decode_prealloc_queue_reqs":  0,
			"decode_transfer_queue_reqs":  0,
			"decode_retracted_queue_reqs": 0,
			"kv_transfer_speed_gb_s":      l.xferGBps,
			"kv_transfer_latency_ms":      l.xferMS,
		}
		switch cfg.Mode {
		case ModePrefill:
			d["prefill_prealloc_queue_reqs"] = l.bootstrap
			d["prefill_inflight_queue_reqs"] = l.transfer
		case ModeDecode:
			d["decode_prealloc_queue_reqs"] = l.waiting
			d["decode_transfer_queue_reqs"] = l.transfer
		}
		m["disaggregation"] = d
	}
	if include["queues"] {
		m["queues"] = map[string]any{"waiting": l.waiting, "grammar": 0, "paused": 0, "retracted": 0}
	}
	return m
}

// handleLoads serves GET /v1/loads.
func (s *Server) handleLoads(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	include, aerr := parseInclude(q.Get("include"))
	if aerr != nil {
		writeDetail(w, aerr.status, aerr.msg)
		return
	}
	filter := -1
	if v := q.Get("dp_rank"); v != "" {
		var err error
		filter, err = strconv.Atoi(v)
		if err != nil {
			writeDetail(w, http.StatusBadRequest, fmt.Sprintf("dp_rank must be an integer, got %q", v))
			return
		}
	}
	var snaps []rankSnapshot
	for _, l := range s.snapshot() {
		if filter < 0 || l.dpRank == filter {
			snaps = append(snaps, l)
		}
	}
	if q.Get("format") == "prometheus" {
		s.writeLoadsPrometheus(w, snaps)
		return
	}
	writeJSON(w, http.StatusOK, loadsAnswer(s.cfg, snaps, include, time.Now()))
}

// loadsAnswer is the /v1/loads answer of a server configured by cfg whose
// ranks are snaps, at time at.
func loadsAnswer(cfg Config, snaps []rankSnapshot, include map[string]bool, at time.Time) map[string]any {
	loads := make([]map[string]any, len(snaps))
	for i, l := range snaps {
		loads[i] = rankLoadJSON(cfg, l, include)
	}
	return map[string]any{
		"timestamp":     at.UTC().Format("2006-01-02T15:04:05.000000-07:00"),
		"version":       Version,
		"dp_rank_count": len(loads),
		"loads":         loads,
		"aggregate":     aggregateLoads(cfg, snaps),
	}
}

// aggregateLoads computes the /v1/loads aggregate over snaps of a server
// configured by cfg.
func aggregateLoads(cfg Config, snaps []rankSnapshot) map[string]any {
	var running, waiting, total int
	var usage, tput float64
	for _, l := range snaps {
		running += l.running
		waiting += l.waiting
		total += l.running + l.waiting + l.transfer
		usage += float64(l.usedTokens) / float64(cfg.MaxTotalTokens)
		tput += l.genThroughput
	}
	avg := func(x float64) float64 {
		if len(snaps) == 0 {
			return 0
		}
		return x / float64(len(snaps))
	}
	return map[string]any{
		"total_running_reqs": running,
		"total_waiting_reqs": waiting,
		"total_reqs":         total,
		"avg_token_usage":    avg(usage),
		"avg_throughput":     avg(tput),
		"avg_utilization":    avg(usage),
	}
}

// writeLoadsPrometheus serves /v1/loads?format=prometheus: one
// sglang_<field>{dp_rank="N"} sample per numeric core field.
func (s *Server) writeLoadsPrometheus(w http.ResponseWriter, snaps []rankSnapshot) {
	var b strings.Builder
	for _, l := range snaps {
		m := s.rankLoadJSON(l, nil)
		keys := make([]string, 0, len(m))
		for k := range m {
			if k != "dp_rank" {
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(&b, "sglang_%s{dp_rank=\"%d\"} %v\n", k, l.dpRank, m[k])
		}
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}
