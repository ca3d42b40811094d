package scheduler

import (
	"context"
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"testing"

	"go.uber.org/zap/zapcore"
)

// findEndpoint returns the endpoint with the given URL.
func findEndpoint(t *testing.T, s *Scheduler, url string) Endpoint {
	t.Helper()
	for _, ep := range s.Endpoints() {
		if ep.URL == url {
			return ep
		}
	}
	t.Fatalf("no endpoint %s in %+v", url, s.Endpoints())
	return Endpoint{}
}

func TestDiscover(t *testing.T) {
	fail500 := map[string]response{"/server_info": {status: http.StatusInternalServerError, body: "boom"}}
	notFound := map[string]response{}
	badJSON := map[string]response{"/server_info": ok(`{"dp_size":`)}

	tests := []struct {
		name   string
		role   Role
		spec   EndpointSpec // URL is filled in
		rounds []map[string]response
		// Expectations after the last round.
		wantErr       bool // Discover returned an error
		wantDP        int
		wantPort      int
		wantSource    string
		wantReady     bool
		wantLastError string // substring of LastError; "" means LastError is empty
	}{
		{
			name:       "server_info decode",
			role:       RoleDecode,
			rounds:     []map[string]response{serverInfo200(info(4, "decode", 8998))},
			wantDP:     4,
			wantSource: sourceServerInfo,
			wantReady:  true,
		},
		{
			name:       "server_info prefill",
			role:       RolePrefill,
			rounds:     []map[string]response{serverInfo200(info(2, "prefill", 9100))},
			wantDP:     2,
			wantPort:   9100,
			wantSource: sourceServerInfo,
			wantReady:  true,
		},
		{
			name:       "aggregated engine without disaggregation fields",
			role:       RoleDecode,
			rounds:     []map[string]response{serverInfo200(`{"dp_size":1}`)},
			wantDP:     1,
			wantSource: sourceServerInfo,
			wantReady:  true,
		},
		{
			name:       "fallback to get_server_info on 404",
			role:       RolePrefill,
			rounds:     []map[string]response{{"/get_server_info": ok(info(8, "prefill", 9000))}},
			wantDP:     8,
			wantPort:   9000,
			wantSource: sourceGetServerInfo,
			wantReady:  true,
		},
		{
			name: "no fallback to get_server_info on 500",
			role: RoleDecode,
			rounds: []map[string]response{{
				"/server_info":     {status: http.StatusInternalServerError},
				"/get_server_info": ok(info(2, "decode", -1)),
			}},
			wantErr:       true,
			wantLastError: "status 500",
		},
		{
			name:          "both fail, config DPSize",
			role:          RolePrefill,
			spec:          EndpointSpec{DPSize: 3, BootstrapPort: 9001},
			rounds:        []map[string]response{notFound},
			wantErr:       true,
			wantDP:        3,
			wantPort:      9001,
			wantSource:    sourceConfig,
			wantReady:     true,
			wantLastError: "get_server_info",
		},
		{
			name:          "both fail, config DPSize, default bootstrap port",
			role:          RolePrefill,
			spec:          EndpointSpec{DPSize: 1},
			rounds:        []map[string]response{badJSON},
			wantErr:       true,
			wantDP:        1,
			wantPort:      defaultBootstrapPort,
			wantSource:    sourceConfig,
			wantReady:     true,
			wantLastError: "invalid JSON",
		},
		{
			name:          "nothing known",
			role:          RoleDecode,
			rounds:        []map[string]response{badJSON},
			wantErr:       true,
			wantLastError: "invalid JSON",
		},
		{
			name:          "nothing known, config bootstrap port alone",
			role:          RolePrefill,
			spec:          EndpointSpec{BootstrapPort: 9001},
			rounds:        []map[string]response{fail500},
			wantErr:       true,
			wantLastError: "status 500",
		},
		{
			name:          "keep last known values after a failure",
			role:          RolePrefill,
			rounds:        []map[string]response{serverInfo200(info(2, "prefill", 9100)), fail500},
			wantErr:       true,
			wantDP:        2,
			wantPort:      9100,
			wantSource:    sourceServerInfo,
			wantReady:     true,
			wantLastError: "status 500",
		},
		{
			name:          "last known values win over config after a failure",
			role:          RoleDecode,
			spec:          EndpointSpec{DPSize: 4},
			rounds:        []map[string]response{serverInfo200(info(2, "decode", -1)), fail500},
			wantErr:       true,
			wantDP:        2,
			wantSource:    sourceServerInfo,
			wantReady:     true,
			wantLastError: "status 500",
		},
		{
			name:       "recovery after a failure",
			role:       RoleDecode,
			rounds:     []map[string]response{fail500, serverInfo200(info(2, "decode", -1))},
			wantDP:     2,
			wantSource: sourceServerInfo,
			wantReady:  true,
		},
		{
			name:       "bootstrap port defaults to 8998",
			role:       RolePrefill,
			rounds:     []map[string]response{serverInfo200(info(2, "prefill", -1))},
			wantDP:     2,
			wantPort:   8998,
			wantSource: sourceServerInfo,
			wantReady:  true,
		},
		{
			name:       "null bootstrap port falls back to config",
			role:       RolePrefill,
			spec:       EndpointSpec{BootstrapPort: 9005},
			rounds:     []map[string]response{serverInfo200(`{"dp_size":1,"disaggregation_bootstrap_port":null}`)},
			wantDP:     1,
			wantPort:   9005,
			wantSource: sourceServerInfo,
			wantReady:  true,
		},
		{
			name:       "discovered bootstrap port wins over config",
			role:       RolePrefill,
			spec:       EndpointSpec{BootstrapPort: 9005, DPSize: 4},
			rounds:     []map[string]response{serverInfo200(info(2, "prefill", 9100))},
			wantDP:     2,
			wantPort:   9100,
			wantSource: sourceServerInfo,
			wantReady:  true,
		},
		{
			name:       "decode endpoints have no bootstrap port",
			role:       RoleDecode,
			spec:       EndpointSpec{BootstrapPort: 9005},
			rounds:     []map[string]response{serverInfo200(info(1, "decode", 9100))},
			wantDP:     1,
			wantSource: sourceServerInfo,
			wantReady:  true,
		},
		{
			name:          "dp_size missing",
			role:          RoleDecode,
			rounds:        []map[string]response{serverInfo200(`{"tp_size":2}`)},
			wantErr:       true,
			wantLastError: "no dp_size",
		},
		{
			name:          "dp_size zero",
			role:          RoleDecode,
			rounds:        []map[string]response{serverInfo200(`{"dp_size":0}`)},
			wantErr:       true,
			wantLastError: "invalid dp_size",
		},
		{
			name:          "dp_size not an integer",
			role:          RoleDecode,
			rounds:        []map[string]response{serverInfo200(`{"dp_size":"2"}`)},
			wantErr:       true,
			wantLastError: "invalid dp_size",
		},
		{
			name:          "prefill bootstrap port out of range",
			role:          RolePrefill,
			rounds:        []map[string]response{serverInfo200(`{"dp_size":1,"disaggregation_bootstrap_port":70000}`)},
			wantErr:       true,
			wantLastError: "invalid disaggregation_bootstrap_port",
		},
		{
			name:          "not an object",
			role:          RoleDecode,
			rounds:        []map[string]response{serverInfo200(`[1,2]`)},
			wantErr:       true,
			wantLastError: "not a JSON object",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			engine := newFakeEngine(t, nil)
			spec := tt.spec
			spec.URL = engine.url()
			cfg := Config{}
			if tt.role == RolePrefill {
				cfg.Prefill = []EndpointSpec{spec}
				cfg.Decode = []EndpointSpec{{URL: newFakeEngine(t, serverInfo200(info(1, "decode", -1))).url()}}
			} else {
				cfg.Decode = []EndpointSpec{spec}
			}
			s := newTestScheduler(t, cfg, nil)
			var err error
			for _, round := range tt.rounds {
				engine.set(round)
				err = s.Discover(testContext(t))
			}
			if (err != nil) != tt.wantErr {
				t.Errorf("Discover error = %v, want error: %v", err, tt.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), spec.URL) {
				t.Errorf("Discover error %q does not name the endpoint %s", err, spec.URL)
			}
			got := findEndpoint(t, s, spec.URL)
			want := Endpoint{
				Role:          tt.role,
				URL:           spec.URL,
				Address:       engine.addr(),
				BootstrapHost: "127.0.0.1",
				BootstrapPort: tt.wantPort,
				DPSize:        tt.wantDP,
				Source:        tt.wantSource,
				Ready:         tt.wantReady,
			}
			gotLastError := got.LastError
			got.LastError = ""
			// TestDiscoverWrongMode covers the modes.
			got.Mode, got.ExpectedMode = "", ""
			if got != want {
				t.Errorf("endpoint =\n  %+v\nwant\n  %+v", got, want)
			}
			switch {
			case tt.wantLastError == "" && gotLastError != "":
				t.Errorf("LastError = %q, want none", gotLastError)
			case !strings.Contains(gotLastError, tt.wantLastError):
				t.Errorf("LastError = %q, want it to contain %q", gotLastError, tt.wantLastError)
			}
		})
	}
}

func TestDiscoverUnreachableFallsBackToConfig(t *testing.T) {
	engine := newFakeEngine(t, nil)
	url := engine.url()
	engine.srv.Close()
	s := newTestScheduler(t, Config{Decode: []EndpointSpec{{URL: url, DPSize: 2}}}, nil)
	if err := s.Discover(testContext(t)); err == nil {
		t.Fatal("Discover of a closed server: no error")
	}
	ep := findEndpoint(t, s, url)
	if !ep.Ready || ep.DPSize != 2 || ep.Source != sourceConfig || ep.LastError == "" {
		t.Errorf("endpoint = %+v, want ready from config with LastError", ep)
	}
}

func TestDiscoverCalls(t *testing.T) {
	tests := []struct {
		name      string
		responses map[string]response
		wantNew   int // hits on /server_info
		wantOld   int // hits on /get_server_info
	}{
		{"new only", serverInfo200(info(1, "", -1)), 1, 0},
		{"old after 404", map[string]response{"/get_server_info": ok(info(1, "", -1))}, 1, 1},
		{"no old after 503", map[string]response{"/server_info": {status: http.StatusServiceUnavailable}}, 1, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			engine := newFakeEngine(t, tt.responses)
			s := newTestScheduler(t, Config{Decode: []EndpointSpec{{URL: engine.url() + "/"}}}, nil)
			_ = s.Discover(testContext(t))
			if got := engine.hitCount("/server_info"); got != tt.wantNew {
				t.Errorf("/server_info hits = %d, want %d", got, tt.wantNew)
			}
			if got := engine.hitCount("/get_server_info"); got != tt.wantOld {
				t.Errorf("/get_server_info hits = %d, want %d", got, tt.wantOld)
			}
		})
	}
}

func TestDiscoverResolvesHostnames(t *testing.T) {
	errNX := errors.New("no such host")
	tests := []struct {
		name      string
		addrs     []netip.Addr
		err       error
		wantAddr  string
		wantReady bool
	}{
		{
			name:      "first IPv4 preferred",
			addrs:     []netip.Addr{netip.MustParseAddr("2001:db8::7"), netip.MustParseAddr("10.0.0.7"), netip.MustParseAddr("10.0.0.8")},
			wantAddr:  "10.0.0.7:30000",
			wantReady: true,
		},
		{
			name:      "IPv4-mapped IPv6 counts as IPv4",
			addrs:     []netip.Addr{netip.MustParseAddr("::ffff:10.0.0.9")},
			wantAddr:  "10.0.0.9:30000",
			wantReady: true,
		},
		{
			name:      "IPv6 only",
			addrs:     []netip.Addr{netip.MustParseAddr("2001:db8::7")},
			wantAddr:  "[2001:db8::7]:30000",
			wantReady: true,
		},
		{name: "lookup fails", err: errNX},
		{name: "no addresses"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			engine := newFakeEngine(t, serverInfo200(info(2, "prefill", 9000)))
			const url = "http://prefill-0.engines.test:30000"
			s := newTestScheduler(t, Config{
				Prefill:    []EndpointSpec{{URL: url}},
				Decode:     []EndpointSpec{{URL: "http://127.0.0.1:1", DPSize: 1}},
				HTTPClient: dialTo(engine.addr()),
			}, nil)
			var looked []string
			s.lookup = func(_ context.Context, host string) ([]netip.Addr, error) {
				looked = append(looked, host)
				return tt.addrs, tt.err
			}
			err := s.Discover(testContext(t))
			ep := findEndpoint(t, s, url)
			if len(looked) != 1 || looked[0] != "prefill-0.engines.test" {
				t.Errorf("looked up %q, want [prefill-0.engines.test]", looked)
			}
			if ep.Address != tt.wantAddr || ep.Ready != tt.wantReady {
				t.Errorf("Address, Ready = %q, %v; want %q, %v", ep.Address, ep.Ready, tt.wantAddr, tt.wantReady)
			}
			if ep.BootstrapHost != "prefill-0.engines.test" || ep.DPSize != 2 || ep.BootstrapPort != 9000 {
				t.Errorf("endpoint = %+v, want bootstrap host prefill-0.engines.test, dp 2, port 9000", ep)
			}
			if !tt.wantReady {
				if err == nil || !strings.Contains(err.Error(), "resolve prefill-0.engines.test") {
					t.Errorf("Discover error = %v, want a resolution error", err)
				}
				if !strings.Contains(ep.LastError, "resolve") {
					t.Errorf("LastError = %q, want a resolution error", ep.LastError)
				}
			}
		})
	}
}

func TestDiscoverWarnings(t *testing.T) {
	tests := []struct {
		name    string
		role    Role
		spec    EndpointSpec
		body    string
		wantMsg string // "" means no warning at all
	}{
		{"config dp_size differs", RoleDecode, EndpointSpec{DPSize: 4}, info(2, "decode", -1), "configured dp_size differs"},
		{"config bootstrap port differs", RolePrefill, EndpointSpec{BootstrapPort: 9000}, info(1, "prefill", 9100), "configured bootstrap port differs"},
		{"prefill engine not in prefill mode", RolePrefill, EndpointSpec{}, info(1, "null", 8998), "unexpected disaggregation_mode"},
		{"decode engine in prefill mode", RoleDecode, EndpointSpec{}, info(1, "prefill", 8998), "unexpected disaggregation_mode"},
		{"decode engine in decode mode", RoleDecode, EndpointSpec{}, info(1, "decode", 8998), ""},
		{"aggregated engine", RoleDecode, EndpointSpec{}, info(1, "null", 8998), ""},
		{"config agrees", RolePrefill, EndpointSpec{DPSize: 2, BootstrapPort: 9100}, info(2, "prefill", 9100), ""},
		{"mode not reported", RolePrefill, EndpointSpec{}, `{"dp_size":1}`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			engine := newFakeEngine(t, serverInfo200(tt.body))
			spec := tt.spec
			spec.URL = engine.url()
			cfg := Config{Decode: []EndpointSpec{spec}}
			if tt.role == RolePrefill {
				cfg = Config{Prefill: []EndpointSpec{spec}, Decode: []EndpointSpec{{URL: "http://127.0.0.1:1", DPSize: 1}}}
			}
			log, logs := observedLogger()
			s := newTestScheduler(t, cfg, log)
			for range 3 {
				_ = s.Discover(testContext(t))
			}
			var warnings []string
			for _, e := range logs.All() {
				if e.Level >= zapcore.WarnLevel && e.ContextMap()["url"] == spec.URL {
					warnings = append(warnings, e.Message)
				}
			}
			if tt.wantMsg == "" {
				if len(warnings) != 0 {
					t.Errorf("warnings = %q, want none", warnings)
				}
				return
			}
			if len(warnings) != 1 || !strings.Contains(warnings[0], tt.wantMsg) {
				t.Errorf("warnings over 3 rounds = %q, want exactly one containing %q", warnings, tt.wantMsg)
			}
		})
	}
}

func TestDiscoverCanceled(t *testing.T) {
	engine := newFakeEngine(t, serverInfo200(info(2, "decode", -1)))
	s := newTestScheduler(t, Config{Decode: []EndpointSpec{{URL: engine.url()}}}, nil)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := s.Discover(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Discover(canceled) = %v, want context.Canceled", err)
	}
	if ep := findEndpoint(t, s, engine.url()); ep.Ready || ep.LastError != "" {
		t.Errorf("a canceled round changed the endpoint: %+v", ep)
	}
}

// TestParseDecodeCache checks which server_info fields turn on duet's
// decode-cache affinity: SGLang's decode radix cache flag, and the host
// tier's ratio with enable_hierarchical_cache.
func TestParseDecodeCache(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		prefill bool
		want    DecodeCache
	}{
		{"absent", `{"dp_size":2}`, false, DecodeCache{}},
		{"off", `{"dp_size":2,"disaggregation_decode_enable_radix_cache":false}`, false, DecodeCache{}},
		{"a string is not a flag", `{"dp_size":2,"disaggregation_decode_enable_radix_cache":"true"}`, false, DecodeCache{}},
		{"on", `{"dp_size":2,"disaggregation_decode_enable_radix_cache":true,"enable_hierarchical_cache":false,"hicache_ratio":2.0}`, false, DecodeCache{Radix: true}},
		{"host tier, SGLang's default ratio", `{"dp_size":2,"disaggregation_decode_enable_radix_cache":true,"enable_hierarchical_cache":true}`, false, DecodeCache{Radix: true, HostRatio: 2}},
		{"host tier, its ratio", `{"dp_size":2,"disaggregation_decode_enable_radix_cache":true,"enable_hierarchical_cache":true,"hicache_ratio":4}`, false, DecodeCache{Radix: true, HostRatio: 4}},
		{"host tier, absurd ratio", `{"dp_size":2,"disaggregation_decode_enable_radix_cache":true,"enable_hierarchical_cache":true,"hicache_ratio":1e9}`, false, DecodeCache{Radix: true, HostRatio: 2}},
		{"host tier without the radix cache", `{"dp_size":2,"enable_hierarchical_cache":true}`, false, DecodeCache{}},
		{"prefill engines have none", `{"dp_size":2,"disaggregation_decode_enable_radix_cache":true}`, true, DecodeCache{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info, err := parseServerInfo([]byte(tt.body), tt.prefill)
			if err != nil {
				t.Fatalf("parseServerInfo: %v", err)
			}
			if info.decodeCache != tt.want {
				t.Errorf("decode cache = %+v, want %+v", info.decodeCache, tt.want)
			}
		})
	}
}
