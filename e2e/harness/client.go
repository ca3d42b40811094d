package harness

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Client helpers for tests that run a stack: they send with
// http.DefaultClient, so ctx bounds each exchange, reading the body included.

// Send sends a request to the stack's Envoy at path, with the headers hdr
// and body (none when nil; a body is sent as application/json unless hdr
// sets content-type), and returns the response with its whole body, already
// read and closed.
func (s *Stack) Send(ctx context.Context, method, path string, hdr map[string]string, body []byte) (*http.Response, []byte, error) {
	return Send(ctx, s.EnvoyURL, method, path, hdr, body)
}

// Send sends a request to the Envoy at baseURL, as [Stack.Send] does, for
// tests that run their own Envoy rather than a Stack.
func Send(ctx context.Context, baseURL, method, path string, hdr map[string]string, body []byte) (*http.Response, []byte, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, baseURL+path, rd)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("content-type", "application/json")
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp, data, fmt.Errorf("%s %s: read response: %w", method, path, err)
	}
	return resp, data, nil
}

// GetJSON fetches url and decodes its JSON body, which must come with
// status 200, into v.
func GetJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}

// maxMetricsBytes bounds a scraped exposition.
const maxMetricsBytes = 8 << 20

// ScrapeMetrics reads the Prometheus text exposition at url (status 200,
// at most 8 MiB) with client (nil: http.DefaultClient) and returns its
// metric families by name.
func ScrapeMetrics(ctx context.Context, client *http.Client, url string) (map[string]*dto.MetricFamily, error) {
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(io.LimitReader(resp.Body, maxMetricsBytes))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return families, nil
}

// EnvoyCounters reads the counters of Envoy's admin `/stats` whose names
// match the regular expression filter, by name. A matching line whose value
// is not an integer (a histogram) is an error.
func EnvoyCounters(ctx context.Context, adminURL, filter string) (map[string]int64, error) {
	u := adminURL + "/stats?filter=" + url.QueryEscape(filter)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("envoy stats: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: status %d", u, resp.StatusCode)
	}
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("envoy stats: %w", err)
	}
	return parseEnvoyCounters(string(body))
}

// parseEnvoyCounters parses Envoy's plain-text stats ("name: value" lines;
// other lines are skipped).
func parseEnvoyCounters(text string) (map[string]int64, error) {
	out := map[string]int64{}
	for line := range strings.SplitSeq(text, "\n") {
		k, v, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("envoy stat %s = %q is not a counter", strings.TrimSpace(k), v)
		}
		out[strings.TrimSpace(k)] = n
	}
	return out, nil
}

// DuetMetrics scrapes duet's /metrics.
func (s *Stack) DuetMetrics(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	return ScrapeMetrics(ctx, nil, s.DuetAdminURL+"/metrics")
}

// WaitCompletions asks duet's /debug/completions for what its access-log
// service has recorded of the request with the client's x-request-id id
// until the answer holds at least want entries or within has passed (the
// legs' entries arrive on separate access-log streams, in any order, after
// the client has its response). It returns the last answer, with an error
// unless it holds exactly want. Entries decode into E, which is
// accesslog.Completion: harness cannot import package accesslog, because
// accesslog imports package envoy, whose tests import harness.
func WaitCompletions[E any](ctx context.Context, s *Stack, id string, want int, within time.Duration) ([]E, error) {
	endpoint := s.DuetAdminURL + "/debug/completions?request_id=" + url.QueryEscape(id)
	deadline := time.Now().Add(within)
	for {
		var got []E
		if err := GetJSON(ctx, endpoint, &got); err != nil {
			return nil, fmt.Errorf("completions of request %s: %w", id, err)
		}
		if len(got) >= want || time.Now().After(deadline) {
			if len(got) != want {
				return got, fmt.Errorf("request %s: %d completions, want %d: %+v", id, len(got), want, got)
			}
			return got, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// WaitRecords asks the engines for their records of the request with the
// client's x-request-id id until they hold at least want or within has
// passed (a mirror may end after the client's response). It returns the
// records by engine, with an error unless they are exactly want.
func WaitRecords(ctx context.Context, sims []*Sim, id string, want int, within time.Duration) (map[*Sim][]Record, error) {
	deadline := time.Now().Add(within)
	for {
		found, n := map[*Sim][]Record{}, 0
		for _, sim := range sims {
			recs, err := sim.Requests(ctx)
			if err != nil {
				return nil, err
			}
			for _, r := range recs {
				if r.RequestID() == id {
					found[sim] = append(found[sim], r)
					n++
				}
			}
		}
		if n >= want || time.Now().After(deadline) {
			if n != want {
				return found, fmt.Errorf("request %s: %d engine records, want %d: %v", id, n, want, found)
			}
			return found, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// OnlyRecord returns the engine and record of found, which must hold one
// record on one engine.
func OnlyRecord(found map[*Sim][]Record) (*Sim, Record, error) {
	if len(found) != 1 {
		return nil, Record{}, fmt.Errorf("records on %d engines, want 1: %v", len(found), found)
	}
	var sim *Sim
	var recs []Record
	for sim, recs = range found { // the one entry
	}
	if len(recs) != 1 {
		return nil, Record{}, fmt.Errorf("%d records on %s, want 1", len(recs), sim.Name)
	}
	return sim, recs[0], nil
}
