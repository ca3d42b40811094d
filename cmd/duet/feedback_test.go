package main

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"go.uber.org/zap"

	"github.com/duet-router/duet/extproc/accesslog"
	"github.com/duet-router/duet/scheduler"
)

func TestToFeedback(t *testing.T) {
	tests := []struct {
		name string
		in   accesslog.Completion
		want scheduler.Feedback
	}{
		{"decode leg with a rank",
			accesslog.Completion{RequestID: "r", Leg: accesslog.LegDecode, Upstream: "10.0.0.2:30000", DPRank: 1, Status: 200},
			scheduler.Feedback{RequestID: "r", Role: scheduler.RoleDecode, Address: "10.0.0.2:30000", Rank: 1}},
		{"prefill leg failed",
			accesslog.Completion{RequestID: "r", Leg: accesslog.LegPrefill, Upstream: "10.0.0.1:30000", DPRank: 0, Failed: true},
			scheduler.Feedback{RequestID: "r", Role: scheduler.RolePrefill, Address: "10.0.0.1:30000", Rank: 0, Failed: true}},
		{"leg without a rank header",
			accesslog.Completion{RequestID: "r", Leg: accesslog.LegDecode, Upstream: "10.0.0.2:30000", DPRank: accesslog.NoRank},
			scheduler.Feedback{RequestID: "r", Role: scheduler.RoleDecode, Address: "10.0.0.2:30000", Rank: scheduler.NoRank}},
		{"leg that reached no host (no address: ignored for health)",
			accesslog.Completion{RequestID: "r", Leg: accesslog.LegPrefill, DPRank: 2, Failed: true},
			scheduler.Feedback{RequestID: "r", Role: scheduler.RolePrefill, Rank: 2, Failed: true}},
		{"whole request with usage",
			accesslog.Completion{RequestID: "r", Leg: accesslog.LegRequest, Upstream: "10.0.0.2:30000", DPRank: 1,
				DecodeTarget: "10.0.0.2:30000/dp1", PrefillTarget: "10.0.0.1:30000/dp0", PromptTokens: 9, CompletionTokens: 8},
			scheduler.Feedback{RequestID: "r", Rank: scheduler.NoRank, PromptTokens: 9, CompletionTokens: 8}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := toFeedback(tt.in); got != tt.want {
				t.Errorf("toFeedback() = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestFeedbackDebug(t *testing.T) {
	discard := fanout{} // delivers nowhere
	srv := accesslog.NewServer(discard, nil, zap.NewNop(), nil)
	fallback := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	h := withFeedbackDebug(fallback, srv)
	for _, tt := range []struct {
		method, target string
		code           int
	}{
		{"GET", "/debug/completions", http.StatusOK},
		{"GET", "/debug/completions?request_id=x", http.StatusOK},
		{"POST", "/debug/completions", http.StatusTeapot}, // not ours: the admin mux answers
		{"GET", "/metrics", http.StatusTeapot},
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(tt.method, tt.target, nil))
		if rec.Code != tt.code {
			t.Errorf("%s %s: %d, want %d", tt.method, tt.target, rec.Code, tt.code)
		}
		if tt.code == http.StatusOK {
			var got []accesslog.Completion
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || len(got) != 0 {
				t.Errorf("%s: %q (%v), want an empty list", tt.target, rec.Body, err)
			}
		}
	}
}
