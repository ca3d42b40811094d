package sim

import (
	"fmt"
	"net/http"
)

// apiHandler builds the main HTTP API.
func (s *Server) apiHandler() (http.Handler, error) {
	if s.cfg.Flavor == FlavorVLLM {
		return s.vllmHandler()
	}
	metrics, err := s.metricsHandler()
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.handleHealth)
	mux.HandleFunc("GET /health_generate", s.handleHealth)
	if !s.cfg.LegacyServerInfo {
		mux.HandleFunc("GET /server_info", s.schedulerCall(s.handleServerInfo))
	}
	mux.HandleFunc("GET /get_server_info", s.schedulerCall(s.handleServerInfo))
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.Handle("GET /v1/loads", s.scrapeFaults(http.HandlerFunc(s.handleLoads)))
	mux.Handle("GET /metrics", s.scrapeFaults(metrics))
	mux.HandleFunc("POST /abort_request", s.handleAbort)
	mux.HandleFunc("GET /flush_cache", s.schedulerCall(s.handleFlushCache))
	mux.HandleFunc("POST /flush_cache", s.schedulerCall(s.handleFlushCache))
	mux.HandleFunc("GET /sim/kv_events", s.handleKVEventStats)

	for _, route := range []routeKind{routeChat, routeCompletions, routeGenerate, routeResponses} {
		mux.HandleFunc("POST "+route.path(), s.inferHandler(route))
	}

	s.addCommonRoutes(mux)
	return mux, nil
}

// addCommonRoutes adds what both flavours serve last: the test-inspection
// API and, for unknown paths, FastAPI's 404.
func (s *Server) addCommonRoutes(mux *http.ServeMux) {
	mux.HandleFunc("GET /sim/requests", s.records.handleList)
	mux.HandleFunc("DELETE /sim/requests", s.records.handleClear)
	mux.HandleFunc("GET /sim/faults", s.handleGetFaults)
	mux.HandleFunc("POST /sim/faults", s.handleSetFaults)
	mux.HandleFunc("GET /sim/stats", s.handleStats)
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeDetail(w, http.StatusNotFound, "Not Found")
	})
}
