package e2e

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/envoy/contract"
)

// Claim (issue 19): only Envoy may feed duet facts, and only facts about
// requests duet started count. Under steady traffic through the real Envoy,
// a process on the network that is not Envoy:
//   - sends the one access-log message that used to take the gateway down:
//     16 entries saying every decode engine refused a connection, for
//     made-up request ids;
//   - sends failure entries for real, in-flight request ids, which would
//     make duet abort their surviving legs;
//   - opens an ext_proc stream of its own;
//   - reads /status on an admin port bound beyond loopback without the token.
//
// With auth on (mTLS, or the token) every attempt is refused at the door
// and counted; with auth off the access-log entries are accepted on the
// wire but not believed, and counted. Either way: no ejection, no abort,
// every legitimate request served, and every legitimate entry believed.
func TestRedTeam(t *testing.T) {
	for _, mode := range []harness.Auth{harness.AuthMTLS, harness.AuthToken, harness.AuthNone} {
		t.Run(mode.String(), func(t *testing.T) { redTeam(t, mode) })
	}
}

func redTeam(t *testing.T, mode harness.Auth) {
	s := startStack(t, harness.Options{
		Prefill:            []harness.SimSpec{{DPSize: 2}, {DPSize: 2}},
		Decode:             []harness.SimSpec{{DPSize: 2}, {DPSize: 2}},
		DecodeMsPerToken:   5,
		LogLevel:           "info",
		Auth:               mode,
		AdminAllInterfaces: true,
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	client := &http.Client{Timeout: requestTimeout}

	// Steady traffic: four clients, short requests, streamed and not.
	traffic, stopTraffic := context.WithCancel(ctx)
	var mu sync.Mutex
	var results []harness.Result
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; traffic.Err() == nil; i++ {
				r := harness.Chat(ctx, client, s.EnvoyURL, 1000*w+i, i%2 == 0, 40)
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
			}
		})
	}
	// Long requests, whose ids the attacker will know while they run.
	longDone := make(chan harness.Result, 4)
	for i := range 4 {
		go func() { longDone <- harness.Chat(ctx, client, s.EnvoyURL, 9000+i, i%2 == 0, 600) }()
	}
	victims := inFlightLegs(t, s, 4)

	a := newAttacker(t, s, mode)
	// 1. The forged message of the issue: every decode engine "unreachable".
	var decodes []string
	for _, d := range s.Decode {
		decodes = append(decodes, d.Address)
	}
	forged := harness.UnreachableDecodes(decodes, 16)
	a.sendLogs(t, forged)
	// 2. Failure entries for real in-flight ids. Without auth the attacker
	// does not see duet's choices, so it names the other engine of each
	// role; with auth it names exactly what duet chose, and is refused at
	// the door anyway.
	forged = nil
	for _, v := range victims {
		prefill, decode, prefillRank := v.prefill, v.decode, v.prefillRank
		if mode == harness.AuthNone {
			prefill, decode = otherSim(s.Prefill, prefill), otherSim(s.Decode, decode)
		}
		forged = append(forged,
			harness.ForgedEntry(v.id, contract.ClusterPrefill, prefill, prefillRank, 503, false),
			harness.ForgedEntry(v.id, contract.ClusterDecode, decode, v.decodeRank, 500, false))
	}
	a.sendLogs(t, forged)
	// 3. An ext_proc stream of the attacker's own.
	a.openExtProc(t)
	// 4. The status page without the admin token.
	adminPages(t, s, mode)

	time.Sleep(500 * time.Millisecond) // traffic goes on after the attacks
	stopTraffic()
	wg.Wait()
	for range 4 {
		results = append(results, <-longDone)
	}
	for _, r := range results {
		if r.Outcome != harness.OutcomeServed {
			t.Errorf("legitimate request %s: %s (status %d) after %v: %s", r.ID, r.Outcome, r.Status, r.Wait, r.Detail)
		}
	}
	t.Logf("%s: %d legitimate requests, all checked; %d in-flight victims", mode, len(results), len(victims))

	for _, m := range []string{"duet_ejections_total", "duet_leg_aborts_total"} {
		if n := duetMetricSum(t, s, m, nil); n != 0 {
			t.Errorf("%s = %v: forged entries took effect", m, n)
		}
	}
	refused := duetMetricSum(t, s, "duet_auth_refused_total", map[string]string{"service": "access_log"}) +
		duetMetricSum(t, s, "duet_auth_refused_total", map[string]string{"service": "ext_proc"})
	untrusted := duetMetricSum(t, s, "duet_feedback_untrusted_total", nil)
	switch mode {
	case harness.AuthNone:
		if refused != 0 {
			t.Errorf("duet_auth_refused_total{service=access_log|ext_proc} = %v without auth", refused)
		}
		want := float64(16 + 2*len(victims))
		if untrusted != want {
			t.Errorf("duet_feedback_untrusted_total = %v, want the %v forged entries", untrusted, want)
		}
	default:
		for _, service := range []string{"access_log", "ext_proc"} {
			if n := duetMetricSum(t, s, "duet_auth_refused_total", map[string]string{"service": service}); n == 0 {
				t.Errorf("no refusal of the %s service counted", service)
			}
		}
		if untrusted != 0 {
			t.Errorf("duet_feedback_untrusted_total = %v: a legitimate entry was not believed", untrusted)
		}
	}
	if n := duetMetricSum(t, s, "duet_auth_refused_total", map[string]string{"service": "admin"}); n == 0 {
		t.Error("the refused /status was not counted")
	}
	// Every legitimate reservation ends with its feedback.
	harness.WaitFor(t, 5*time.Second, "reserved tokens back to 0", func() bool {
		return duetMetricSum(t, s, "duet_target_tokens", map[string]string{"kind": "reserved"}) == 0
	})
}

// inFlightLeg is what duet chose for one running PD request, as its decode
// engine received it.
type inFlightLeg struct {
	id                      string
	decode, prefill         string
	decodeRank, prefillRank int
}

// inFlightLegs waits for n requests of at least 600 tokens (the long ones)
// to reach their decode engines and returns their routing.
func inFlightLegs(t *testing.T, s *harness.Stack, n int) []inFlightLeg {
	t.Helper()
	var out []inFlightLeg
	harness.WaitFor(t, 10*time.Second, "the long requests on their decode engines", func() bool {
		out = out[:0]
		for _, sim := range s.Decode {
			recs, err := sim.Requests(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				if !strings.Contains(string(r.Body), `"max_tokens":600`) {
					continue
				}
				rank := func(h string) int {
					v, err := strconv.Atoi(r.Headers[h])
					if err != nil {
						return -1
					}
					return v
				}
				out = append(out, inFlightLeg{id: r.Headers[contract.HeaderDuetRequestID], decode: sim.Address,
					prefill: r.Headers[contract.HeaderPrefillEndpoint], decodeRank: rank(contract.HeaderDPRank),
					prefillRank: rank(contract.HeaderPrefillRank)})
			}
		}
		return len(out) >= n
	})
	return out
}

// otherSim returns the address of a sim of sims other than addr.
func otherSim(sims []*harness.Sim, addr string) string {
	for _, s := range sims {
		if s.Address != addr {
			return s.Address
		}
	}
	return addr
}

// attacker is a client of duet's gRPC port that is not Envoy: it has no
// client certificate and no token, only what anyone on the network has.
type attacker struct {
	s    *harness.Stack
	mode harness.Auth
	// dials are the ways it tries: plaintext, and under mTLS also TLS
	// (trusting duet's CA, which is public) without a client certificate.
	dials []grpc.DialOption
}

func newAttacker(t *testing.T, s *harness.Stack, mode harness.Auth) *attacker {
	a := &attacker{s: s, mode: mode, dials: []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}}
	if mode.TLS() {
		pem, err := os.ReadFile(s.Credentials.CAFile)
		if err != nil {
			t.Fatal(err)
		}
		pool := x509.NewCertPool()
		pool.AppendCertsFromPEM(pem)
		a.dials = append(a.dials, grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: pool, ServerName: "duet"})))
	}
	return a
}

// context carries a guessed token under the token mode, none otherwise.
func (a *attacker) context(ctx context.Context) context.Context {
	if a.mode.UsesToken() {
		return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer guessed-token-0123456789")
	}
	return ctx
}

// refused checks that a call ended as duet refuses strangers: gRPC
// Unauthenticated, or a failed TLS handshake (Unavailable) for plaintext
// on a TLS port.
func (a *attacker) refused(t *testing.T, what string, err error) {
	t.Helper()
	if a.mode == harness.AuthNone {
		if err != nil {
			t.Errorf("%s without auth: %v (the stream is accepted, its entries not believed)", what, err)
		}
		return
	}
	if c := status.Code(err); c != codes.Unauthenticated && c != codes.Unavailable {
		t.Errorf("%s: %v, want Unauthenticated (or a failed TLS handshake)", what, err)
	}
}

// try runs call once per way of dialling (once without auth, where one
// accepted copy is enough) and checks that duet refused each.
func (a *attacker) try(t *testing.T, what string, call func(ctx context.Context, conn *grpc.ClientConn) error) {
	t.Helper()
	for _, dial := range a.dials {
		conn, err := grpc.NewClient(a.s.DuetGRPC, dial)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(a.context(context.Background()), 5*time.Second)
		a.refused(t, what, call(ctx, conn))
		cancel()
		conn.Close()
		if a.mode == harness.AuthNone {
			return
		}
	}
}

// sendLogs sends entries as one access-log message of the upstream log.
func (a *attacker) sendLogs(t *testing.T, entries []*accesslogdatav3.HTTPAccessLogEntry) {
	t.Helper()
	a.try(t, "access-log stream", func(ctx context.Context, conn *grpc.ClientConn) error {
		return harness.SendAccessLogs(ctx, conn, entries)
	})
}

// openExtProc opens an ext_proc stream and asks duet to route a request.
func (a *attacker) openExtProc(t *testing.T) {
	t.Helper()
	if a.mode == harness.AuthNone {
		return // duet would route it: without auth anyone on loopback is Envoy
	}
	a.try(t, "ext_proc stream", harness.AskRoute)
}

// adminPages: on an admin port bound beyond loopback the status page needs
// the admin token (403 where none is configured); the metrics stay open to
// scrapers.
func adminPages(t *testing.T, s *harness.Stack, mode harness.Auth) {
	t.Helper()
	get := func(path, token string) int {
		req, err := http.NewRequest(http.MethodGet, s.DuetAdminURL+path, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	type page struct {
		path, token string
		want        int
	}
	pages := []page{{"/status", "", 401}, {"/status.json", "", 401}, {"/debug/completions", "guessed-token-0123456789", 401},
		{"/status.json", s.Credentials.AdminToken, 200}, {"/metrics", "", 200}, {"/readyz", "", 200}}
	if mode == harness.AuthNone { // no admin token configured
		pages = []page{{"/status", "", 403}, {"/debug/completions", "guessed-token-0123456789", 403}, {"/metrics", "", 200}}
	}
	for _, c := range pages {
		if got := get(c.path, c.token); got != c.want {
			t.Errorf("GET %s (token %v): %d, want %d", c.path, c.token != "", got, c.want)
		}
	}
}
