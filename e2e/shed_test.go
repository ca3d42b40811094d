package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/harness"
)

// TestShedsPastMaxRoutingRequests: with envoy.max_routing_requests = 2 and
// two requests holding their streams to duet open (their bodies stalled
// half sent), a third request gets Envoy's 503 at once, in the OpenAI
// error envelope, and reaches no engine; once the stalled requests end, the
// next request is served. A backlog is shed, not queued until
// message_timeout.
func TestShedsPastMaxRoutingRequests(t *testing.T) {
	s := startStack(t, harness.Options{Decode: []harness.SimSpec{{}}, MaxRoutingRequests: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if resp, body := send(t, s, "POST", "/v1/chat/completions", nil, chatBody(false, "")); resp.StatusCode != 200 {
		t.Fatalf("before the backlog: %d %s", resp.StatusCode, body)
	}

	// Two uploads that send their headers and half their body, then stall:
	// Envoy holds an ext_proc stream to duet open for each.
	body := chatBody(false, "")
	var stalled []net.Conn
	for range 2 {
		stalled = append(stalled, stallUpload(t, s, body))
	}
	for {
		active, err := harness.EnvoyCounters(ctx, s.EnvoyAdminURL, `^cluster\.duet_extproc\.upstream_rq_active$`)
		if err != nil {
			t.Fatal(err)
		}
		if active["cluster.duet_extproc.upstream_rq_active"] == 2 {
			break
		}
		select {
		case <-ctx.Done():
			t.Fatalf("the stalled uploads never held 2 streams to duet: %v", active)
		case <-time.After(20 * time.Millisecond):
		}
	}

	_, dec0 := upstreamRequests(t, s)
	start := time.Now()
	resp, out := send(t, s, "POST", "/v1/chat/completions", nil, body)
	took := time.Since(start)
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("past the limit: status %d, want 503: %s", resp.StatusCode, out)
	}
	checkOpenAIError(t, resp, out, 503, "server_error")
	if took > time.Second {
		t.Errorf("the shed request took %s: it waited, it was not shed", took)
	}
	if overflows, err := harness.EnvoyCounters(ctx, s.EnvoyAdminURL, `^cluster\.duet_extproc\..*overflow$`); err != nil {
		t.Fatal(err)
	} else if n := overflows["cluster.duet_extproc.upstream_rq_active_overflow"]; n != 1 {
		t.Errorf("duet_extproc overflow counters %v: want upstream_rq_active_overflow 1, the shed request", overflows)
	}
	if _, dec1 := upstreamRequests(t, s); dec1 != dec0 {
		t.Errorf("the shed request reached an engine: decode requests %d -> %d", dec0, dec1)
	}

	// The stalled uploads complete and are served; the limit frees.
	for i, conn := range stalled {
		if _, err := conn.Write(body[len(body)/2:]); err != nil {
			t.Fatal(err)
		}
		conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		r, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("stalled upload %d: %v", i, err)
		}
		r.Body.Close()
		if r.StatusCode != http.StatusOK {
			t.Errorf("stalled upload %d, once complete: status %d", i, r.StatusCode)
		}
	}
	if resp, body := send(t, s, "POST", "/v1/chat/completions", nil, chatBody(false, "")); resp.StatusCode != 200 {
		t.Errorf("after the backlog: %d %s", resp.StatusCode, body)
	}
}

// stallUpload sends a chat request's headers and half of body to Envoy,
// then stalls: Envoy holds an ext_proc stream to duet open for it until the
// connection, closed when the test ends, goes.
func stallUpload(t *testing.T, s *harness.Stack, body []byte) net.Conn {
	t.Helper()
	conn, err := net.DialTimeout("tcp", strings.TrimPrefix(s.EnvoyURL, "http://"), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: duet\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		len(body), body[:len(body)/2])
	return conn
}
