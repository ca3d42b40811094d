package sim

import (
	"maps"
	"net"
	"net/http"
	"strconv"
)

// loadBalanceMethod is the resolved --load-balance-method of the default
// "auto": follow_bootstrap_room on prefill, round_robin otherwise.
func (s *Server) loadBalanceMethod() string {
	if s.cfg.Mode == ModePrefill {
		return "follow_bootstrap_room"
	}
	return "round_robin"
}

// handleServerInfo serves GET /server_info and GET /get_server_info: a
// subset of SGLang's ServerArgs plus scheduler info and per-rank state.
func (s *Server) handleServerInfo(w http.ResponseWriter, _ *http.Request) {
	states := make([]map[string]any, 0, s.cfg.DPSize)
	for _, l := range s.snapshot() {
		states = append(states, map[string]any{
			"dp_rank":              l.dpRank,
			"last_gen_throughput":  l.genThroughput,
			"num_running_reqs":     l.running,
			"num_used_tokens":      l.usedTokens,
			"max_total_num_tokens": s.cfg.MaxTotalTokens,
		})
	}
	info := map[string]any{
		"model_path":                      s.cfg.Model,
		"tokenizer_path":                  s.tokenizerPath(),
		"served_model_name":               s.cfg.Model,
		"host":                            hostOf(s.listenAddr()),
		"port":                            portOf(s.listenAddr()),
		"dp_size":                         s.cfg.DPSize,
		"tp_size":                         1,
		"pp_size":                         1,
		"enable_dp_attention":             *s.cfg.DPAttention,
		"disaggregation_mode":             string(s.cfg.Mode),
		"disaggregation_bootstrap_port":   s.cfg.BootstrapPort,
		"disaggregation_transfer_backend": "mooncake",
		"load_balance_method":             s.loadBalanceMethod(),
		"max_running_requests":            s.cfg.MaxRunningRequests,
		"max_total_num_tokens":            s.cfg.MaxTotalTokens,
		"context_length":                  DefaultMaxModelLen,
		"enable_metrics":                  true,
		"internal_states":                 states,
		"version":                         Version,
	}
	maps.Copy(info, cacheServerArgs(s.cfg))
	maps.Copy(info, priorityServerArgs(s.cfg))
	if s.prof != nil {
		info["chunked_prefill_size"] = s.prof.ChunkedPrefillSize
		info["enable_cache_report"] = true
		info["sim_profile"] = s.prof.Name
		// Mean balance ratio of the steps so far (mean rank step time /
		// slowest rank step time; 1 when balanced), TRT-LLM's figure.
		info["sim_dp_balance_ratio"] = s.eng.balanceRatio()
	}
	if s.cfg.TimeScale != 1 {
		info["sim_time_scale"] = s.cfg.TimeScale
	}
	writeJSON(w, http.StatusOK, info)
}

// cacheServerArgs are the prefix-cache server args /server_info reports,
// as SGLang names them: the decode radix cache flag, disable_radix_cache
// (true on a decode without that flag, which runs without a radix cache),
// the hierarchical cache flag and ratio, page_size (the engine model's
// cache block; 1 in the simple model), and the KV event publisher's
// kv_events_config and kv_events.
func cacheServerArgs(cfg Config) map[string]any {
	args := map[string]any{
		"disaggregation_decode_enable_radix_cache": cfg.DecodeRadixCache,
		"disable_radix_cache":                      cfg.Mode == ModeDecode && !cfg.DecodeRadixCache,
		"enable_hierarchical_cache":                cfg.HierarchicalCache,
		"hicache_ratio":                            cfg.HiCacheRatio,
		"page_size":                                pageSize(cfg),
	}
	maps.Copy(args, kvEventsServerArgs(cfg))
	return args
}

// tokenizerPath is /server_info's tokenizer_path: the tokenizer directory
// when one is configured, else the model name.
func (s *Server) tokenizerPath() string {
	if s.cfg.Tokenizer != "" {
		return s.cfg.Tokenizer
	}
	return s.cfg.Model
}

// handleModels serves GET /v1/models.
func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []any{map[string]any{
			"id":            s.cfg.Model,
			"object":        "model",
			"created":       s.started.Unix(),
			"owned_by":      s.ownedBy(),
			"root":          s.cfg.Model,
			"max_model_len": DefaultMaxModelLen,
		}},
	})
}

// ownedBy is /v1/models' owned_by.
func (s *Server) ownedBy() string {
	if s.cfg.Flavor == FlavorVLLM {
		return "vllm"
	}
	return "sglang"
}

// listenAddr is the bound API address after Start, else the configured one.
func (s *Server) listenAddr() string {
	if a := s.Addr(); a != nil {
		return a.String()
	}
	return s.cfg.Listen
}

// hostOf returns the host part of a host:port address.
func hostOf(addr string) string {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return host
}

// portOf returns the port of a host:port address, 0 if it has none.
func portOf(addr string) int {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(port)
	return n
}
