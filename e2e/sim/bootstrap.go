package sim

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// prefillInfo is the body of the bootstrap server's GET /route without
// query parameters (SGLang's PrefillServerInfo).
type prefillInfo struct {
	AttnTPSize          int    `json:"attn_tp_size"`
	AttnCPSize          int    `json:"attn_cp_size"`
	DPSize              int    `json:"dp_size"`
	PPSize              int    `json:"pp_size"`
	PageSize            int    `json:"page_size"`
	KVCacheDtype        string `json:"kv_cache_dtype"`
	FollowBootstrapRoom bool   `json:"follow_bootstrap_room"`
}

// bootstrapHandler builds the prefill bootstrap server's routes.
func (s *Server) bootstrapHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("OK"))
	})
	mux.HandleFunc("GET /route", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, prefillInfo{
			AttnTPSize:          1,
			AttnCPSize:          1,
			DPSize:              s.cfg.DPSize,
			PPSize:              1,
			PageSize:            1,
			KVCacheDtype:        "auto",
			FollowBootstrapRoom: true,
		})
	})
	// Rank registration by prefill schedulers; accepted and ignored, the
	// simulator's prefill never needs it.
	mux.HandleFunc("PUT /route", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("POST /query_dp_ranks", s.handleQueryDPRanks)
	mux.HandleFunc("GET /sim/kv", s.handleKVStatus)
	mux.HandleFunc("POST /sim/kv_prefix", s.handleKVPrefix)
	return mux
}

// maxKVLongPoll bounds GET /sim/kv's wait_ms.
const maxKVLongPoll = 2 * time.Second

// handleKVStatus serves GET /sim/kv?room=R[&wait_ms=N]. With wait_ms, a
// room that is not done or failed yet is waited for up to N ms.
func (s *Server) handleKVStatus(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	room, err := strconv.ParseInt(strings.TrimSpace(q.Get("room")), 10, 64)
	if err != nil {
		writeDetail(w, http.StatusBadRequest, "room must be an integer")
		return
	}
	var st RoomStatus
	if v := q.Get("wait_ms"); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms < 0 {
			writeDetail(w, http.StatusBadRequest, "wait_ms must be a non-negative integer")
			return
		}
		st = s.rooms.wait(r.Context(), room, min(time.Duration(ms)*time.Millisecond, maxKVLongPoll))
	} else {
		st = s.rooms.status(room)
	}
	code := http.StatusOK
	if st.State == RoomUnknown {
		code = http.StatusNotFound
	}
	if st.State == RoomDone {
		// The decode polling the room as done takes the KV.
		s.rooms.deliver(room)
	}
	writeJSON(w, code, st)
}

// handleQueryDPRanks serves POST /query_dp_ranks: {"bootstrap_rooms":[..]}
// → {"<room>": dp_rank} for the rooms this prefill has seen.
func (s *Server) handleQueryDPRanks(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Rooms []int64 `json:"bootstrap_rooms"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		writeDetail(w, http.StatusBadRequest, "invalid body: "+err.Error())
		return
	}
	out := make(map[string]int, len(req.Rooms))
	for _, room := range req.Rooms {
		if st := s.rooms.status(room); st.DPRank != nil {
			out[strconv.FormatInt(room, 10)] = *st.DPRank
		}
	}
	writeJSON(w, http.StatusOK, out)
}
