package auth

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestAdmin: open paths for everyone; protected paths on loopback, or with
// the admin token as bearer or Basic password, else refused and counted.
func TestAdmin(t *testing.T) {
	tokenFile := filepath.Join(t.TempDir(), "admin-token")
	const tok = "admin-token-0123456789"
	if err := os.WriteFile(tokenFile, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	type req struct {
		path   string
		header map[string]string
		basic  string // Basic password, "" for none
		want   int
		reason string
	}
	tests := []struct {
		name      string
		loopback  bool
		tokenFile string
		reqs      []req
	}{
		{"loopback, no token", true, "", []req{
			{path: "/status", want: 200}, {path: "/debug/completions", want: 200}, {path: "/metrics", want: 200},
		}},
		{"beyond loopback, no token configured", false, "", []req{
			{path: "/metrics", want: 200}, {path: "/healthz", want: 200}, {path: "/readyz", want: 200},
			{path: "/status", want: 403, reason: ReasonNoAdminToken},
			{path: "/status.json", want: 403, reason: ReasonNoAdminToken},
			{path: "/debug/pprof/", want: 403, reason: ReasonNoAdminToken},
		}},
		{"beyond loopback, token", false, tokenFile, []req{
			{path: "/metrics", want: 200},
			{path: "/status", want: 401, reason: ReasonNoToken},
			{path: "/status", header: map[string]string{"Authorization": "Bearer " + tok}, want: 200},
			{path: "/status", header: map[string]string{"Authorization": "bearer " + tok}, want: 200},
			{path: "/debug/completions", basic: tok, want: 200},
			{path: "/status.json", header: map[string]string{"Authorization": "Bearer wrong-token-0123456"}, want: 401, reason: ReasonBadToken},
			{path: "/status", basic: "wrong", want: 401, reason: ReasonBadToken},
			{path: "/new-page-nobody-listed", want: 401, reason: ReasonNoToken},
		}},
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(200) })
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			refusals := NewRefusals(nil, prometheus.NewRegistry())
			a, err := NewAdmin(tt.loopback, tt.tokenFile, refusals)
			if err != nil {
				t.Fatal(err)
			}
			h := a.Handler(ok)
			for _, r := range tt.reqs {
				hr := httptest.NewRequest("GET", r.path, nil)
				for k, v := range r.header {
					hr.Header.Set(k, v)
				}
				if r.basic != "" {
					hr.SetBasicAuth("me", r.basic)
				}
				var before float64
				if r.reason != "" {
					before = testutil.ToFloat64(refusals.counter.WithLabelValues(ServiceAdmin, r.reason))
				}
				w := httptest.NewRecorder()
				h.ServeHTTP(w, hr)
				if w.Code != r.want {
					t.Errorf("%s %v: %d, want %d", r.path, r.header, w.Code, r.want)
				}
				if w.Code == 401 && w.Header().Get("WWW-Authenticate") == "" {
					t.Errorf("%s: 401 without WWW-Authenticate: browsers would not prompt", r.path)
				}
				if r.reason != "" && testutil.ToFloat64(refusals.counter.WithLabelValues(ServiceAdmin, r.reason)) != before+1 {
					t.Errorf("%s: refusal %s not counted", r.path, r.reason)
				}
			}
		})
	}
}
