package sim

import (
	"encoding/json"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
)

func TestServerInfoCacheArgs(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		path string
		want map[string]any
	}{
		{name: "decode with radix and host tier", path: "/server_info",
			cfg: Config{Mode: ModeDecode, Profile: "dense-8b-h100", DecodeRadixCache: true, HierarchicalCache: true, HiCacheRatio: 3},
			want: map[string]any{"disaggregation_decode_enable_radix_cache": true, "disable_radix_cache": false,
				"enable_hierarchical_cache": true, "hicache_ratio": 3.0, "page_size": 16.0}},
		{name: "decode without the flag", path: "/server_info", cfg: Config{Mode: ModeDecode, Profile: "dsv3-dp8-h100-node"},
			want: map[string]any{"disaggregation_decode_enable_radix_cache": false, "disable_radix_cache": true,
				"enable_hierarchical_cache": false, "hicache_ratio": 2.0, "page_size": 16.0}},
		{name: "prefill keeps its radix cache", path: "/server_info", cfg: Config{Mode: ModePrefill, Profile: "dense-8b-h100"},
			want: map[string]any{"disaggregation_decode_enable_radix_cache": false, "disable_radix_cache": false, "page_size": 16.0}},
		{name: "simple model decode with the flag", path: "/get_server_info", cfg: Config{Mode: ModeDecode, DecodeRadixCache: true},
			want: map[string]any{"disaggregation_decode_enable_radix_cache": true, "disable_radix_cache": false,
				"enable_hierarchical_cache": false, "hicache_ratio": 2.0, "page_size": 1.0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var fromServer map[string]any
			get(t, startTest(t, tc.cfg).api.URL+tc.path).json(t, &fromServer)
			sources := map[string]map[string]any{"server": fromServer}
			if tc.cfg.Profile != "" {
				m, err := NewModel(tc.cfg)
				if err != nil {
					t.Fatal(err)
				}
				body, err := m.ServerInfoJSON()
				if err != nil {
					t.Fatal(err)
				}
				var fromModel map[string]any
				if err := json.Unmarshal(body, &fromModel); err != nil {
					t.Fatal(err)
				}
				sources["model"] = fromModel
			}
			for src, info := range sources {
				for k, v := range tc.want {
					if info[k] != v {
						t.Errorf("%s: %s = %v, want %v", src, k, info[k], v)
					}
				}
			}
		})
	}
}

func TestCacheConfigValidation(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr string
	}{
		{name: "host tier without the decode radix cache", cfg: Config{Mode: ModeDecode, HierarchicalCache: true},
			wantErr: "--enable-hierarchical-cache requires --disaggregation-decode-enable-radix-cache"},
		{name: "negative ratio", cfg: Config{Mode: ModeDecode, DecodeRadixCache: true, HiCacheRatio: -1}, wantErr: "hicache-ratio"},
		{name: "negative load bandwidth", cfg: Config{HiCacheLoadGBps: -2}, wantErr: "hicache-load-gbps"},
		{name: "both flags", cfg: Config{Mode: ModeDecode, DecodeRadixCache: true, HierarchicalCache: true}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg, nil)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("err %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestReportedCachedTokens(t *testing.T) {
	// A decode whose prefill found 300 prompt tokens cached and which
	// matched 800 in its own radix cache.
	pr := progress{cached: 800, decodePrefix: 800}
	tests := []struct {
		name string
		cfg  Config
		pr   progress
		want int
	}{
		{name: "decode radix: the larger hit", cfg: Config{Mode: ModeDecode, DecodeRadixCache: true}, pr: pr, want: 800},
		{name: "decode radix, issue 25972: the sum", cfg: Config{Mode: ModeDecode, DecodeRadixCache: true, DoubleCountCachedTokens: true},
			pr: pr, want: 1100},
		{name: "decode radix, prefill hit larger", cfg: Config{Mode: ModeDecode, DecodeRadixCache: true},
			pr: progress{cached: 100, decodePrefix: 100}, want: 300},
		{name: "decode without the cache: as before", cfg: Config{Mode: ModeDecode, DoubleCountCachedTokens: true}, want: 0},
		{name: "prefill: its own hit", cfg: Config{Mode: ModePrefill, DecodeRadixCache: true}, pr: progress{cached: 64}, want: 64},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := reportedCached(tc.cfg, tc.pr, 300); got != tc.want {
				t.Fatalf("reported %d, want %d", got, tc.want)
			}
		})
	}
}

// radixPD is a prefill and a decode with the decode radix cache, both on
// the dense-8b-h100 engine model at 20× model time.
type radixPD struct {
	p, d     *testServer
	host     string
	port     int
	prefLogs *observer.ObservedLogs
}

// startRadixPD starts the pair; double sets DoubleCountCachedTokens.
func startRadixPD(t *testing.T, double bool) *radixPD {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	ps, err := New(Config{Mode: ModePrefill, Profile: "dense-8b-h100", TimeScale: 20}, zap.New(core))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ps.Close() })
	p := &testServer{sim: ps, api: httptest.NewServer(ps.Handler()), boot: httptest.NewServer(ps.BootstrapHandler())}
	t.Cleanup(p.api.Close)
	t.Cleanup(p.boot.Close)
	host, port := p.bootHostPort(t)
	d := startTest(t, Config{Mode: ModeDecode, Profile: "dense-8b-h100", TimeScale: 20, BootstrapPort: port,
		KVTimeout: 100 * time.Second, DecodeRadixCache: true, DoubleCountCachedTokens: double})
	return &radixPD{p: p, d: d, host: host, port: port, prefLogs: logs}
}

// chatOut is the part of a chat completion the test reads.
type chatOut struct {
	Choices []struct {
		Message struct{ Content string }
	}
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	}
}

// turn sends one chat turn as a router would, the decode leg first: the
// prefill leg is sent once the decode told the prefill its cached prefix.
// It returns both answers and both records.
func (pd *radixPD) turn(t *testing.T, room int64, messages string) (pre, dec chatOut, preRec, decRec Record) {
	t.Helper()
	body := fmt.Sprintf(`{"messages":[%s],"max_tokens":40,"seed":11,"bootstrap_host":%q,"bootstrap_port":%d,"bootstrap_room":%d}`,
		messages, pd.host, pd.port, room)
	done := make(chan response, 1)
	go func() { done <- post(t, pd.d.api.URL+"/v1/chat/completions", body) }()
	eventually(t, "the decode's prefix at the prefill", func() bool { return pd.p.sim.prefixes.pendingCount() == 1 })
	pr := post(t, pd.p.api.URL+"/v1/chat/completions", body)
	dr := <-done
	if pr.status != 200 || dr.status != 200 {
		t.Fatalf("prefill %d %s, decode %d %s", pr.status, pr.body, dr.status, dr.body)
	}
	pr.json(t, &pre)
	dr.json(t, &dec)
	return pre, dec, lastRecord(t, pd.p.sim), lastRecord(t, pd.d.sim)
}

func TestDecodeRadixCacheOverHTTP(t *testing.T) {
	tests := []struct {
		name   string
		double bool
	}{
		{name: "fixed cached_tokens"},
		{name: "double-counted cached_tokens (issue 25972)", double: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pd := startRadixPD(t, tc.double)
			first := fmt.Sprintf(`{"role":"system","content":%q},{"role":"user","content":%q}`,
				strings.Repeat("you are a helpful simulated assistant ", 20), "tell me about prefix caches")
			_, dec1, preRec, decRec := pd.turn(t, 101, first)
			answer := dec1.Choices[0].Message.Content
			if answer != ReplyText(11, 40) {
				t.Fatalf("seeded answer %q, want ReplyText(11, 40)", answer)
			}
			p1 := dec1.Usage.PromptTokens
			if fmt.Sprint(decRec.DecodePrefixLen, preRec.TransferredTokens) != fmt.Sprint([]int{0}, []int{p1}) {
				t.Fatalf("first turn: decode_prefix_len %v, transferred %v; want [0] and [%d]",
					decRec.DecodePrefixLen, preRec.TransferredTokens, p1)
			}

			second := first + fmt.Sprintf(`,{"role":"assistant","content":%q},{"role":"user","content":"and the decode side?"}`, answer)
			pre2, dec2, preRec, decRec := pd.turn(t, 102, second)
			p2 := dec2.Usage.PromptTokens
			if len(decRec.DecodePrefixLen) != 1 || decRec.DecodePrefixLen[0] <= p1 {
				t.Fatalf("second turn decode_prefix_len %v, want beyond the first prompt's %d tokens (the answer hits)",
					decRec.DecodePrefixLen, p1)
			}
			n := decRec.DecodePrefixLen[0]
			if len(preRec.TransferredTokens) != 1 || preRec.TransferredTokens[0] != p2-n {
				t.Fatalf("prefill transferred %v, want [%d] = prompt %d - decode_prefix_len %d", preRec.TransferredTokens, p2-n, p2, n)
			}
			pc := pre2.Usage.PromptTokensDetails.CachedTokens
			if pc <= 0 || pc >= n {
				t.Fatalf("prefill hit %d, want some of the first prompt (decode matched %d)", pc, n)
			}
			want := n
			if tc.double {
				want = pc + n
			}
			got := dec2.Usage.PromptTokensDetails.CachedTokens
			if got != want {
				t.Fatalf("decode cached_tokens %d, want %d (prefill hit %d, decode match %d)", got, want, pc, n)
			}
			if tc.double != (got > p2) {
				t.Fatalf("decode cached_tokens %d against %d prompt tokens: only the double count exceeds the prompt", got, p2)
			}
			logs := pd.prefLogs.FilterMessageSnippet("decode's cached prefix").FilterField(zap.Int64("room", 102)).All()
			if len(logs) != 1 || logs[0].ContextMap()["tokens_sent"] != int64(p2-n) {
				t.Fatalf("prefill log lines for room 102: %v", logs)
			}
		})
	}
}
