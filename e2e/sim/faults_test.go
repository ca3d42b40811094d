package sim

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap/zaptest"
)

func TestFaultErrorRate(t *testing.T) {
	all := startTest(t, Config{Faults: Faults{ErrorRate: 1}})
	r := post(t, all.api.URL+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`)
	if r.status != 500 || !strings.Contains(string(r.body), `"type":"InternalServerError"`) {
		t.Fatalf("got %d %s", r.status, r.body)
	}
	if rec := lastRecord(t, all.sim); rec.Status != 500 || !strings.Contains(rec.Error, "simulated fault") {
		t.Fatalf("record %+v", rec)
	}
	g := post(t, all.api.URL+"/generate", `{"text":"hi"}`)
	if g.status != 500 || !strings.HasPrefix(string(g.body), `{"error":{"message":"Internal server error`) {
		t.Fatalf("generate got %d %s", g.status, g.body)
	}

	// Half the requests fail; the same seed fails the same ones.
	outcomes := func(seed uint64) string {
		ts := startTest(t, Config{Seed: seed, Faults: Faults{ErrorRate: 0.5}})
		var b strings.Builder
		for i := 0; i < 40; i++ {
			if post(t, ts.api.URL+"/generate", `{"text":"hi","sampling_params":{"max_new_tokens":1}}`).status == 500 {
				b.WriteByte('x')
			} else {
				b.WriteByte('.')
			}
		}
		return b.String()
	}
	a, b, c := outcomes(7), outcomes(7), outcomes(8)
	if a != b || a == c {
		t.Fatalf("seed 7: %s / %s, seed 8: %s", a, b, c)
	}
	if n := strings.Count(a, "x"); n < 8 || n > 32 {
		t.Fatalf("%d of 40 failed at rate 0.5: %s", n, a)
	}
}

func TestFaultSpike(t *testing.T) {
	ts := startTest(t, Config{Faults: Faults{SpikeProb: 1, Spike: 100 * time.Millisecond}})
	start := time.Now()
	if r := post(t, ts.api.URL+"/generate", `{"text":"hi","sampling_params":{"max_new_tokens":1}}`); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
	if d := time.Since(start); d < 100*time.Millisecond {
		t.Fatalf("spiked request took %v", d)
	}
	// The spike is model time: divided by the time scale.
	fast := startTest(t, Config{TimeScale: 20, Faults: Faults{SpikeProb: 1, Spike: time.Second}})
	start = time.Now()
	post(t, fast.api.URL+"/generate", `{"text":"hi","sampling_params":{"max_new_tokens":1}}`)
	if d := time.Since(start); d < 50*time.Millisecond || d > 500*time.Millisecond {
		t.Fatalf("1s spike at scale 20 took %v, want ~50ms", d)
	}
	none := startTest(t, Config{Faults: Faults{SpikeProb: 0, Spike: time.Hour}})
	if r := post(t, none.api.URL+"/generate", `{"text":"hi","sampling_params":{"max_new_tokens":1}}`); r.status != 200 {
		t.Fatalf("status %d", r.status)
	}
}

func TestFaultSlowScrape(t *testing.T) {
	ts := startTest(t, Config{DPSize: 2, Faults: Faults{SlowScrape: 80 * time.Millisecond}})
	for _, path := range []string{"/v1/loads", "/metrics"} {
		start := time.Now()
		if r := get(t, ts.api.URL+path); r.status != 200 {
			t.Fatalf("%s: %d", path, r.status)
		}
		if d := time.Since(start); d < 80*time.Millisecond {
			t.Fatalf("%s answered in %v", path, d)
		}
	}
	start := time.Now()
	get(t, ts.api.URL+"/health")
	if d := time.Since(start); d > 60*time.Millisecond {
		t.Fatalf("/health delayed %v", d)
	}
}

func TestFaultDieAfter(t *testing.T) {
	for _, profile := range []string{"", "dense-8b-h100"} {
		t.Run("profile="+profile, func(t *testing.T) {
			s, err := New(Config{Listen: "127.0.0.1:0", Profile: profile, TimeScale: 10, DecodePerToken: time.Millisecond,
				Faults: Faults{DieAfter: 2}}, zaptest.NewLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = s.Close() })
			url := "http://" + s.Addr().String()
			// A long request in flight when the server dies is cut.
			inflight := make(chan error, 1)
			go func() {
				resp, err := http.Post(url+"/generate", "application/json",
					strings.NewReader(`{"text":"hi","sampling_params":{"max_new_tokens":100000},"stream":true}`))
				if err == nil {
					_, err = io.ReadAll(resp.Body)
					resp.Body.Close()
				}
				inflight <- err
			}()
			eventually(t, "first request running", func() bool { return len(s.snapshot()) > 0 && s.snapshot()[0].running == 1 })
			if r := post(t, url+"/generate", `{"text":"hi","sampling_params":{"max_new_tokens":1}}`); r.status != 200 {
				t.Fatalf("second request: %d", r.status)
			}
			// The third request crashes the server.
			resp, err := http.Post(url+"/generate", "application/json", strings.NewReader(`{"text":"hi"}`))
			if err == nil {
				resp.Body.Close()
				t.Fatalf("third request answered %d", resp.StatusCode)
			}
			select {
			case err := <-s.Errors():
				if !errors.Is(err, ErrDied) {
					t.Fatalf("Errors() delivered %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("no ErrDied")
			}
			select {
			case err := <-inflight:
				if err == nil {
					t.Fatal("the request in flight completed after the crash")
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the request in flight was not cut")
			}
			eventually(t, "listener closed", func() bool {
				_, err := http.Get(url + "/health")
				return err != nil
			})
		})
	}
}
