package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Jaeger is a running Jaeger v2 (the real binary, built from its Go
// module; see FindJaeger) with in-memory storage: an OTLP/gRPC receiver
// that Envoy and duet export their spans to, and the query API (and UI,
// when assets are given) that tests read traces back from.
type Jaeger struct {
	*Process
	// OTLPAddr is the OTLP/gRPC receiver, 127.0.0.1:<port>.
	OTLPAddr string
	// QueryURL is the query service's HTTP root: its API under /api, its
	// UI at / (a placeholder page unless UIAssets was given).
	QueryURL string
}

// FindJaeger locates the jaeger binary: DUET_JAEGER_BIN (set by the
// Makefile), else the one `make jaeger` builds into .tools/. A missing
// binary is an error telling how to get it.
func FindJaeger() (string, error) {
	if p := os.Getenv("DUET_JAEGER_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("jaeger %s: %w: run `make jaeger`", p, err)
		}
		return p, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	found, _ := filepath.Glob(filepath.Join(root, ".tools", "jaeger-*", "jaeger"))
	if len(found) == 0 {
		return "", fmt.Errorf("no jaeger in %s/.tools: run `make jaeger`", root)
	}
	return found[len(found)-1], nil
}

// jaegerConfig is Jaeger's configuration: OTLP/gRPC in, memory storage,
// the query service; no telemetry ports of its own (they would clash
// between tests). Its arguments: the OTLP port, the query HTTP and gRPC
// ports, and the UI assets line.
const jaegerConfig = `service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_storage:
    backends:
      memstore:
        memory:
          max_traces: 10000
  jaeger_query:
    storage:
      traces: memstore
    http:
      endpoint: 127.0.0.1:%d
    grpc:
      endpoint: 127.0.0.1:%d
%s
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:%d
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: memstore
`

// JaegerOptions tune StartJaeger.
type JaegerOptions struct {
	// UIAssets is a directory of built Jaeger UI assets (index.html and
	// static/), served at QueryURL; empty serves Jaeger's placeholder.
	UIAssets string
	// Taskset, when set, pins Jaeger to these CPUs (taskset's list), e.g.
	// off the CPUs of the servers a benchmark measures.
	Taskset string
}

// StartJaeger runs Jaeger on free loopback ports, with its configuration
// and log in dir, and waits until its query API answers.
func StartJaeger(ctx context.Context, dir string, opts JaegerOptions) (*Jaeger, error) {
	bin, err := FindJaeger()
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	ui := ""
	if opts.UIAssets != "" {
		ui = fmt.Sprintf("    ui:\n      assets_path: %q", opts.UIAssets)
	}
	path := filepath.Join(dir, "jaeger.yaml")
	conf := fmt.Sprintf(jaegerConfig, ports[0], ports[1], ui, ports[2])
	if err := os.WriteFile(path, []byte(conf), 0o644); err != nil {
		return nil, fmt.Errorf("jaeger config: %w", err)
	}
	argv := []string{bin, "--config", path}
	if opts.Taskset != "" {
		argv = append([]string{"taskset", "-c", opts.Taskset}, argv...)
	}
	p, err := startProcess(dir, "jaeger", argv...)
	if err != nil {
		return nil, err
	}
	j := &Jaeger{Process: p, OTLPAddr: hostPort(ports[2]), QueryURL: "http://" + hostPort(ports[0])}
	if err := waitHTTP(ctx, p, j.QueryURL+"/api/services"); err != nil {
		p.Stop(0)
		return nil, err
	}
	return j, nil
}

// TraceSpan is one span of a trace as Jaeger's query API returns it.
type TraceSpan struct {
	SpanID, Operation, Service string
	// ParentID is the span's CHILD_OF reference; empty for a root span.
	ParentID string
	Start    time.Time
	Duration time.Duration
	// Tags are the span's attributes (and Jaeger's span.kind, otel.status_code,
	// error), each value as Jaeger's JSON has it (string, number, bool).
	Tags map[string]any
	// Events are the names of the span's events (the "event" field of each
	// Jaeger log).
	Events []string
}

// Kind is the span's kind: server, client, internal, producer or consumer.
func (s TraceSpan) Kind() string { v, _ := s.Tags["span.kind"].(string); return v }

// Failed reports whether the span is marked as an error: Jaeger's error
// tag, or an OpenTelemetry status of ERROR.
func (s TraceSpan) Failed() bool {
	return s.Tags["error"] == true || s.Tags["otel.status_code"] == "ERROR"
}

// Tag returns a tag's value formatted as text ("" when absent).
func (s TraceSpan) Tag(key string) string {
	v, ok := s.Tags[key]
	if !ok {
		return ""
	}
	return fmt.Sprint(v)
}

// ErrTraceNotFound is returned by Trace for a trace Jaeger does not hold (yet).
var ErrTraceNotFound = errors.New("trace not found")

// Trace returns the spans Jaeger holds for a trace (32 hex digits).
func (j *Jaeger) Trace(ctx context.Context, traceID string) ([]TraceSpan, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, j.QueryURL+"/api/traces/"+traceID, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("jaeger trace %s: %w", traceID, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, fmt.Errorf("jaeger trace %s: %w", traceID, ErrTraceNotFound)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("jaeger trace %s: status %d", traceID, resp.StatusCode)
	}
	var body struct {
		Data []struct {
			Spans []struct {
				SpanID        string `json:"spanID"`
				OperationName string `json:"operationName"`
				References    []struct {
					RefType string `json:"refType"`
					SpanID  string `json:"spanID"`
				} `json:"references"`
				StartTime int64 `json:"startTime"` // µs since the epoch
				Duration  int64 `json:"duration"`  // µs
				Tags      []struct {
					Key   string `json:"key"`
					Value any    `json:"value"`
				} `json:"tags"`
				Logs []struct {
					Fields []struct {
						Key   string `json:"key"`
						Value any    `json:"value"`
					} `json:"fields"`
				} `json:"logs"`
				ProcessID string `json:"processID"`
			} `json:"spans"`
			Processes map[string]struct {
				ServiceName string `json:"serviceName"`
			} `json:"processes"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return nil, fmt.Errorf("jaeger trace %s: %w", traceID, err)
	}
	if len(body.Data) == 0 {
		return nil, fmt.Errorf("jaeger trace %s: %w", traceID, ErrTraceNotFound)
	}
	var out []TraceSpan
	for _, d := range body.Data {
		for _, s := range d.Spans {
			ts := TraceSpan{SpanID: s.SpanID, Operation: s.OperationName, Service: d.Processes[s.ProcessID].ServiceName,
				Start: time.UnixMicro(s.StartTime), Duration: time.Duration(s.Duration) * time.Microsecond, Tags: map[string]any{}}
			for _, r := range s.References {
				if r.RefType == "CHILD_OF" {
					ts.ParentID = r.SpanID
				}
			}
			for _, t := range s.Tags {
				ts.Tags[t.Key] = t.Value
			}
			for _, l := range s.Logs {
				for _, f := range l.Fields {
					if f.Key == "event" {
						ts.Events = append(ts.Events, fmt.Sprint(f.Value))
					}
				}
			}
			out = append(out, ts)
		}
	}
	return out, nil
}

// TraceID returns the trace id of a W3C traceparent header
// (version-traceid-spanid-flags), or "" when it is malformed.
func TraceID(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) != 4 || len(parts[1]) != 32 {
		return ""
	}
	return parts[1]
}

// ParentSpanID returns the span id of a W3C traceparent header, or "".
func ParentSpanID(traceparent string) string {
	parts := strings.Split(traceparent, "-")
	if len(parts) != 4 || len(parts[2]) != 16 {
		return ""
	}
	return parts[2]
}
