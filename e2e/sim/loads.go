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
		m["disaggregation"] = disaggLoadJSON(cfg.Mode, l)
	}
	if include["queues"] {
		m["queues"] = map[string]any{"waiting": l.waiting, "grammar": 0, "paused": 0, "retracted": 0}
	}
	return m
}

// pdQueues are the sizes of a rank's PD queues, as SGLang 0.5.23 reports
// them (/v1/loads' disaggregation section, load_inquirer.py get_loads;
// the sglang:num_*_queue_reqs gauges, metrics_collector.py). A queue of the
// other mode, or of an aggregated server, is 0.
type pdQueues struct {
	// prefillBootstrap: prefill requests waiting for their decode's
	// bootstrap handshake and KV preallocation (PrefillBootstrapQueue).
	prefillBootstrap int
	// prefillInflight: prefill requests whose KV is being sent.
	prefillInflight int
	// decodePrealloc: decode requests waiting for KV memory
	// (DecodePreallocQueue).
	decodePrealloc int
	// decodeTransfer: decode requests preallocated and receiving their KV
	// (DecodeTransferQueue).
	decodeTransfer int
	// decodeRetracted: decode requests retracted to free KV; always 0, as
	// the simulator never retracts.
	decodeRetracted int
}

// rankPDQueues returns the PD queues of rank snapshot l on a server in
// mode.
func rankPDQueues(mode Mode, l rankSnapshot) pdQueues {
	switch mode {
	case ModePrefill:
		return pdQueues{prefillBootstrap: l.bootstrap, prefillInflight: l.transfer}
	case ModeDecode:
		return pdQueues{decodePrealloc: l.waiting, decodeTransfer: l.transfer}
	}
	return pdQueues{}
}

// disaggLoadJSON renders the disaggregation section of one rank of
// /v1/loads. As in SGLang 0.5.23 (load_snapshot.py DisaggregationMetrics)
// every field is there in every mode, "null" included, the queues of the
// other mode being 0.
func disaggLoadJSON(mode Mode, l rankSnapshot) map[string]any {
	q := rankPDQueues(mode, l)
	return map[string]any{
		"mode":                         string(mode),
		"prefill_bootstrap_queue_reqs": q.prefillBootstrap,
		"prefill_inflight_queue_reqs":  q.prefillInflight,
		"decode_prealloc_queue_reqs":   q.decodePrealloc,
		"decode_transfer_queue_reqs":   q.decodeTransfer,
		"decode_retracted_queue_reqs":  q.decodeRetracted,
		"kv_transfer_speed_gb_s":       l.xferGBps,
		"kv_transfer_latency_ms":       l.xferMS,
	}
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
		s.writeLoadsPrometheus(w, snaps, include)
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

// loadsPromPrefix is the metric name prefix of a /v1/loads section in
// /v1/loads?format=prometheus (v1_loads.py _format_loads_prometheus): the
// section's name, but disagg for disaggregation (and spec for speculative,
// a section duet-sim never reports).
var loadsPromPrefix = map[string]string{"disaggregation": "disagg"}

// writeLoadsPrometheus serves /v1/loads?format=prometheus as SGLang 0.5.23
// does: one gauge per numeric field, sglang_<field> for a core field and
// sglang_<section>_<field> for a field of an included section (so
// sglang_disagg_prefill_bootstrap_queue_reqs), with one
// sglang_...{dp_rank="N"} sample per rank under each.
func (s *Server) writeLoadsPrometheus(w http.ResponseWriter, snaps []rankSnapshot, include map[string]bool) {
	samples := map[string][]string{}
	add := func(name string, rank int, v any) {
		switch v.(type) {
		case int, float64:
			samples[name] = append(samples[name], fmt.Sprintf("%s{dp_rank=\"%d\"} %v", name, rank, v))
		}
	}
	for _, l := range snaps {
		for k, v := range s.rankLoadJSON(l, include) {
			if k == "dp_rank" {
				continue
			}
			section, ok := v.(map[string]any)
			if !ok {
				add("sglang_"+k, l.dpRank, v)
				continue
			}
			prefix := k
			if p, ok := loadsPromPrefix[k]; ok {
				prefix = p
			}
			for sk, sv := range section {
				add("sglang_"+prefix+"_"+sk, l.dpRank, sv)
			}
		}
	}
	names := make([]string, 0, len(samples))
	for n := range samples {
		names = append(names, n)
	}
	sort.Strings(names)
	var b strings.Builder
	for _, n := range names {
		fmt.Fprintf(&b, "# TYPE %s gauge\n", n)
		for _, line := range samples[n] {
			b.WriteString(line + "\n")
		}
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}
