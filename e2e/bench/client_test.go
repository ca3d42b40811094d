package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// sseServer answers every request with status and the given SSE body.
func sseServer(t *testing.T, status int, body string, check func(map[string]any)) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			t.Errorf("request body: %v", err)
		}
		if check != nil {
			check(req)
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv
}

const (
	roleChunk  = `data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}` + "\n\n"
	tokenChunk = `data: {"choices":[{"index":0,"delta":{"content":"tok"}}]}` + "\n\n"
	usageChunk = `data: {"choices":[],"usage":{"prompt_tokens":120,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":64}}}` + "\n\n"
	doneChunk  = "data: [DONE]\n\n"
)

func TestSend(t *testing.T) {
	tests := []struct {
		name       string
		status     int
		body       string
		ok         bool
		chunks     int
		tokens     int
		cached     int
		hasCached  bool
		errContain string
	}{
		{"complete", 200, roleChunk + tokenChunk + tokenChunk + tokenChunk + usageChunk + doneChunk, true, 3, 3, 64, true, ""},
		{"no cached tokens", 200, tokenChunk + `data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1}}` + "\n\n" + doneChunk,
			true, 1, 1, 0, false, ""},
		{"no usage", 200, tokenChunk + tokenChunk + doneChunk, true, 2, 2, 0, false, ""},
		{"crlf lines", 200, strings.ReplaceAll(tokenChunk+doneChunk, "\n", "\r\n"), true, 1, 1, 0, false, ""},
		{"http error", 503, `{"error":{"message":"no engine is ready"}}`, false, 0, 0, 0, false, "status 503"},
		{"in-stream error", 200, tokenChunk + `data: {"error":{"message":"KV transfer failed"}}` + "\n\n" + doneChunk,
			false, 1, 1, 0, false, "engine error: KV transfer failed"},
		{"cut short", 200, tokenChunk, false, 1, 1, 0, false, "before [DONE]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := sseServer(t, tc.status, tc.body, func(req map[string]any) {
				if req["stream"] != true || req["max_tokens"] != float64(3) || req["model"] != "m" {
					t.Errorf("request = %v", req)
				}
				if opts, _ := req["stream_options"].(map[string]any); opts["include_usage"] != true {
					t.Errorf("stream_options = %v", req["stream_options"])
				}
			})
			o := Send(context.Background(), srv.Client(), srv.URL, ChatRequest{Model: "m", MaxTokens: 3, Stream: true,
				Messages: []Message{{Role: "user", Content: "hi"}}})
			if o.OK() != tc.ok {
				t.Fatalf("OK = %v, err %q", o.OK(), o.Err)
			}
			if tc.errContain != "" && !strings.Contains(o.Err, tc.errContain) {
				t.Fatalf("err = %q, want %q", o.Err, tc.errContain)
			}
			if o.Chunks != tc.chunks || o.Tokens() != tc.tokens {
				t.Fatalf("chunks %d tokens %d, want %d %d", o.Chunks, o.Tokens(), tc.chunks, tc.tokens)
			}
			if tc.chunks > 0 && (o.First.IsZero() || o.Last.Before(o.First) || o.First.Before(o.Sent)) {
				t.Fatalf("times: sent %v first %v last %v", o.Sent, o.First, o.Last)
			}
			cached, has := 0, false
			if o.Usage != nil {
				cached, has = o.Usage.CachedTokens, o.Usage.HasCached
			}
			if cached != tc.cached || has != tc.hasCached {
				t.Fatalf("cached %d (%v), want %d (%v)", cached, has, tc.cached, tc.hasCached)
			}
		})
	}
}

// A request that is not streamed reads usage from its JSON body and has no
// first-token time.
func TestSendNotStreamed(t *testing.T) {
	tests := []struct {
		name   string
		status int
		body   string
		ok     bool
		tokens int
		err    string
	}{
		{"complete", 200, `{"choices":[{"message":{"content":"tok0 tok1"}}],"usage":{"prompt_tokens":9,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":4}}}`, true, 2, ""},
		{"error body", 200, `{"error":{"message":"boom"}}`, false, 0, "engine error: boom"},
		{"not JSON", 200, `oops`, false, 0, "invalid JSON"},
		{"http error", 400, `{"error":{"message":"bad"}}`, false, 0, "status 400"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv := sseServer(t, tc.status, tc.body, func(req map[string]any) {
				if req["stream"] != false || req["stream_options"] != nil {
					t.Errorf("request = %v", req)
				}
			})
			o := Send(context.Background(), srv.Client(), srv.URL, ChatRequest{Model: "m", MaxTokens: 2,
				Messages: []Message{{Role: "user", Content: "hi"}}})
			if o.OK() != tc.ok || o.Stream || !o.First.IsZero() || o.Tokens() != tc.tokens || !strings.Contains(o.Err, tc.err) {
				t.Fatalf("outcome = %+v", o)
			}
			if tc.ok && (o.Usage == nil || o.Usage.CachedTokens != 4 || o.Done.Before(o.Sent)) {
				t.Fatalf("outcome = %+v", o)
			}
		})
	}
}

// A request ended by its context is unfinished, not failed.
func TestSendCanceled(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		fmt.Fprint(w, tokenChunk)
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	o := Send(ctx, srv.Client(), srv.URL, ChatRequest{Model: "m", MaxTokens: 5, Stream: true, Messages: []Message{{Role: "user", Content: "x"}}})
	if !o.Canceled || o.Err != "" || o.OK() || o.Chunks != 1 {
		t.Fatalf("outcome = %+v", o)
	}
}

func TestParseLoads(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		tokens []float64
		hit    []float64
		err    bool
	}{
		{"total tokens", `{"loads":[{"dp_rank":0,"num_total_tokens":10,"num_used_tokens":4,"cache_hit_rate":0.5},{"dp_rank":1,"num_total_tokens":3}]}`,
			[]float64{10, 3}, []float64{0.5, 0}, false},
		{"used tokens fallback", `{"loads":[{"dp_rank":1,"num_used_tokens":7}]}`, []float64{0, 7}, []float64{0, 0}, false},
		{"duplicates summed", `{"loads":[{"dp_rank":0,"num_total_tokens":1},{"dp_rank":0,"num_total_tokens":2}]}`, []float64{3, 0}, []float64{0, 0}, false},
		{"rank out of range", `{"loads":[{"dp_rank":2,"num_total_tokens":1}]}`, nil, nil, true},
		{"no loads", `{}`, nil, nil, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := parseLoads([]byte(tc.body), 2)
			if (got.err != nil) != tc.err {
				t.Fatalf("err = %v", got.err)
			}
			if tc.err {
				return
			}
			if fmt.Sprint(got.tokens) != fmt.Sprint(tc.tokens) || fmt.Sprint(got.hit) != fmt.Sprint(tc.hit) {
				t.Fatalf("tokens %v hit %v, want %v %v", got.tokens, got.hit, tc.tokens, tc.hit)
			}
		})
	}
}

// The sampler keeps complete polls in model time and labels ranks in
// engine order.
func TestSampler(t *testing.T) {
	mk := func(tokens int) *httptest.Server {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/loads" {
				http.NotFound(w, r)
				return
			}
			fmt.Fprintf(w, `{"loads":[{"dp_rank":0,"num_total_tokens":%d},{"dp_rank":1,"num_total_tokens":0}]}`, tokens)
		}))
		t.Cleanup(srv.Close)
		return srv
	}
	p, d := mk(4), mk(8)
	s := NewSampler([]Engine{
		{Role: RolePrefill, Name: "prefill-0", URL: p.URL, DPSize: 2},
		{Role: RoleDecode, Name: "decode-0", URL: d.URL, DPSize: 2},
	}, 10*time.Millisecond, 10)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	s.Run(ctx, start)
	polls := s.Polls()
	if len(polls) < 3 {
		t.Fatalf("%d polls", len(polls))
	}
	last := polls[len(polls)-1]
	if fmt.Sprint(last.Tokens[RolePrefill]) != "[4 0]" || fmt.Sprint(last.Tokens[RoleDecode]) != "[8 0]" {
		t.Fatalf("last poll = %v", last.Tokens)
	}
	// Model time is ten times the wall time elapsed.
	if last.At < 500*time.Millisecond || last.At > 2*time.Second {
		t.Fatalf("last poll at %s model time", last.At)
	}
	if got := fmt.Sprint(s.Labels(RoleDecode)); got != "[decode-0/dp0 decode-0/dp1]" {
		t.Fatalf("labels = %s", got)
	}
	if got := Imbalance(polls, RoleDecode, 0, time.Hour); !near(got, 2) {
		t.Fatalf("imbalance = %g", got)
	}
}
