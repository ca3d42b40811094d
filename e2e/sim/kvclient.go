package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"
)

// Decode-side handshake parameters.
const (
	// prefillInfoAttempts is how many times decode tries GET /route before
	// giving up, as SGLang's _ensure_prefill_info does.
	prefillInfoAttempts  = 3
	prefillInfoBackoff   = 50 * time.Millisecond
	bootstrapHTTPTimeout = 2 * time.Second
	// kvLongPoll is how long one GET /sim/kv may wait for the room.
	kvLongPoll = 500 * time.Millisecond
)

// kvClient is a decode server's view of prefill bootstrap servers: it
// fetches their parallel info and polls their KV state.
type kvClient struct {
	http      *http.Client
	pollEvery time.Duration

	mu    sync.Mutex
	infos map[string]prefillInfo // successful GET /route answers by address
}

// newKVClient returns a client polling every pollEvery.
func newKVClient(pollEvery time.Duration) *kvClient {
	// Many decode items poll the same prefill concurrently; keep enough
	// idle connections to avoid churning through ephemeral ports.
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = 1024
	tr.MaxIdleConnsPerHost = 256
	return &kvClient{
		http:      &http.Client{Timeout: bootstrapHTTPTimeout, Transport: tr},
		pollEvery: pollEvery,
		infos:     make(map[string]prefillInfo),
	}
}

// prefillInfo returns the parallel info of the prefill whose bootstrap
// server is at addr, fetching it on first use. Only successes are cached.
func (c *kvClient) prefillInfo(ctx context.Context, addr string) (prefillInfo, error) {
	c.mu.Lock()
	info, ok := c.infos[addr]
	c.mu.Unlock()
	if ok {
		return info, nil
	}
	var lastErr error
	for attempt := 0; attempt < prefillInfoAttempts; attempt++ {
		if attempt > 0 {
			if err := sleepCtx(ctx, prefillInfoBackoff); err != nil {
				return prefillInfo{}, err
			}
		}
		info, lastErr = c.fetchRoute(ctx, addr)
		if lastErr == nil {
			c.mu.Lock()
			c.infos[addr] = info
			c.mu.Unlock()
			return info, nil
		}
		if ctx.Err() != nil {
			return prefillInfo{}, ctx.Err()
		}
	}
	return prefillInfo{}, &apiError{
		status: http.StatusInternalServerError,
		msg:    fmt.Sprintf("Could not fetch prefill parallel info from %s after %d attempts", addr, prefillInfoAttempts),
	}
}

// fetchRoute does one GET /route.
func (c *kvClient) fetchRoute(ctx context.Context, addr string) (prefillInfo, error) {
	var info prefillInfo
	code, body, err := c.get(ctx, "http://"+addr+"/route")
	if err != nil {
		return info, err
	}
	if code != http.StatusOK {
		return info, fmt.Errorf("GET /route on %s: status %d", addr, code)
	}
	if err := json.Unmarshal(body, &info); err != nil {
		return info, fmt.Errorf("decode /route from %s: %w", addr, err)
	}
	if info.DPSize < 1 {
		return info, fmt.Errorf("/route from %s: invalid dp_size %d", addr, info.DPSize)
	}
	return info, nil
}

// roomStatus asks the prefill's bootstrap server for the KV state of room,
// waiting up to wait (rounded down to ms) for it to be done or failed.
func (c *kvClient) roomStatus(ctx context.Context, addr string, room int64, wait time.Duration) (RoomStatus, error) {
	u := "http://" + addr + "/sim/kv?room=" + url.QueryEscape(strconv.FormatInt(room, 10))
	if ms := wait.Milliseconds(); ms > 0 {
		u += "&wait_ms=" + strconv.FormatInt(ms, 10)
	}
	code, body, err := c.get(ctx, u)
	if err != nil {
		return RoomStatus{}, err
	}
	if code != http.StatusOK && code != http.StatusNotFound {
		return RoomStatus{}, fmt.Errorf("GET /sim/kv on %s: status %d", addr, code)
	}
	var st RoomStatus
	if err := json.Unmarshal(body, &st); err != nil {
		return RoomStatus{}, fmt.Errorf("decode /sim/kv from %s: %w", addr, err)
	}
	return st, nil
}

// get performs a GET and returns status and body.
func (c *kvClient) get(ctx context.Context, u string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, nil, fmt.Errorf("build request %s: %w", u, err)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("GET %s: %w", u, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return 0, nil, fmt.Errorf("read %s: %w", u, err)
	}
	return resp.StatusCode, body, nil
}

// kvWait describes what a decode item waits for.
type kvWait struct {
	addr        string
	room        int64
	prefillRank *int // nil: accept the KV from any rank
	decodeRank  int
	timeout     time.Duration // wall time
	// toModel converts wall time to model time for the timeout message;
	// nil means identity.
	toModel func(time.Duration) time.Duration
}

// waitKV polls until the room's KV is done on the expected prefill rank
// and returns the room's final status. A room done on another rank, or
// never seen, never satisfies the wait: the KV does not arrive and the
// wait times out like SGLang's KVPoll.WaitingForInput. A room that failed
// on the expected rank fails the transfer. Each poll is a long poll (the
// prefill answers as soon as the room is done), so the KV is seen when it
// arrives, not at the next tick.
func (c *kvClient) waitKV(ctx context.Context, w kvWait) (RoomStatus, error) {
	start := time.Now()
	deadline := time.NewTimer(w.timeout)
	defer deadline.Stop()
	tick := time.NewTicker(c.pollEvery)
	defer tick.Stop()
	for {
		wait := min(kvLongPoll, w.timeout-time.Since(start))
		st, err := c.roomStatus(ctx, w.addr, w.room, wait)
		if err == nil && st.DPRank != nil && (w.prefillRank == nil || *st.DPRank == *w.prefillRank) {
			switch st.State {
			case RoomDone:
				return st, nil
			case RoomFailed:
				return st, internalErrorf("Decode transfer failed for request rank=%d bootstrap_room=%d", w.decodeRank, w.room)
			}
		}
		if err != nil && errors.Is(err, context.Canceled) && ctx.Err() != nil {
			return st, ctx.Err()
		}
		if err == nil && wait > 0 && (st.State == RoomPending || st.State == RoomUnknown) {
			// The poll itself waited; poll again at once.
			select {
			case <-ctx.Done():
				return st, ctx.Err()
			case <-deadline.C:
				return st, c.timeoutErr(w, start)
			default:
				continue
			}
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-deadline.C:
			return st, c.timeoutErr(w, start)
		case <-tick.C:
		}
	}
}

// timeoutErr is SGLang's KV wait timeout, with the elapsed model time.
func (c *kvClient) timeoutErr(w kvWait, start time.Time) error {
	elapsed := time.Since(start)
	if w.toModel != nil {
		elapsed = w.toModel(elapsed)
	}
	return internalErrorf("Request %d timed out after %.1fs in KVPoll.WaitingForInput", w.room, elapsed.Seconds())
}

// sleepCtx sleeps for d or until ctx is done.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
