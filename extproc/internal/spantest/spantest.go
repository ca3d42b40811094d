// Package spantest checks the OpenTelemetry spans that duet's tests record
// with the SDK's tracetest.SpanRecorder.
package spantest

import (
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// Attrs returns attributes by key, each value as its String.
func Attrs(kvs []attribute.KeyValue) map[string]string {
	out := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		out[string(kv.Key)] = kv.Value.String()
	}
	return out
}

// Check reports, as errors of t, each attribute of s that differs from
// want, each key of absent that s has, and a status other than wantErr's:
// Error with that description, or Unset when wantErr is empty. It returns
// s's attributes.
func Check(t testing.TB, s sdktrace.ReadOnlySpan, want map[string]string, absent []string, wantErr string) map[string]string {
	t.Helper()
	got := Attrs(s.Attributes())
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %s = %q, want %q", s.Name(), k, got[k], v)
		}
	}
	for _, k := range absent {
		if v, ok := got[k]; ok {
			t.Errorf("%s: %s = %q, want it absent", s.Name(), k, v)
		}
	}
	wantCode := codes.Unset
	if wantErr != "" {
		wantCode = codes.Error
	}
	if st := s.Status(); st.Code != wantCode || st.Description != wantErr {
		t.Errorf("%s: status %v %q, want %v %q", s.Name(), st.Code, st.Description, wantCode, wantErr)
	}
	return got
}
