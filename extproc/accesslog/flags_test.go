package accesslog

import (
	"testing"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
)

func TestFlagString(t *testing.T) {
	tests := []struct {
		name   string
		flags  *accesslogdatav3.ResponseFlags
		short  string
		failed bool
	}{
		{"none", nil, "", false},
		{"empty", &accesslogdatav3.ResponseFlags{}, "", false},
		{"connection failure", &accesslogdatav3.ResponseFlags{UpstreamConnectionFailure: true}, "UF", true},
		{"retries exhausted after a failure, in field order",
			&accesslogdatav3.ResponseFlags{UpstreamRetryLimitExceeded: true, UpstreamConnectionFailure: true}, "UF,URX", true},
		{"overflow", &accesslogdatav3.ResponseFlags{UpstreamOverflow: true}, "UO", true},
		{"timeout", &accesslogdatav3.ResponseFlags{UpstreamRequestTimeout: true}, "UT", true},
		{"remote reset", &accesslogdatav3.ResponseFlags{UpstreamRemoteReset: true}, "UR", true},
		{"connection termination", &accesslogdatav3.ResponseFlags{UpstreamConnectionTermination: true}, "UC", true},
		{"no healthy upstream", &accesslogdatav3.ResponseFlags{NoHealthyUpstream: true}, "UH", true},
		{"no route", &accesslogdatav3.ResponseFlags{NoRouteFound: true}, "NR", true},
		{"no cluster", &accesslogdatav3.ResponseFlags{NoClusterFound: true}, "NC", true},
		{"downstream termination", &accesslogdatav3.ResponseFlags{DownstreamConnectionTermination: true}, "DC", true},
		{"downstream reset", &accesslogdatav3.ResponseFlags{DownstreamRemoteReset: true}, "DR", true},
		{"stream idle timeout", &accesslogdatav3.ResponseFlags{StreamIdleTimeout: true}, "SI", true},
		{"rate limited", &accesslogdatav3.ResponseFlags{RateLimited: true}, "RL", false},
		{"unauthorized", &accesslogdatav3.ResponseFlags{UnauthorizedDetails: &accesslogdatav3.ResponseFlags_Unauthorized{}}, "UAEX", false},
		{"fault injected", &accesslogdatav3.ResponseFlags{FaultInjected: true, DelayInjected: true}, "DI,FI", false},
		{"policy and failure", &accesslogdatav3.ResponseFlags{RateLimited: true, LocalReset: true}, "LR,RL", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			short, failed := flagString(tt.flags)
			if short != tt.short || failed != tt.failed {
				t.Errorf("flagString() = %q, %v, want %q, %v", short, failed, tt.short, tt.failed)
			}
		})
	}
}

// Every field of the ALS ResponseFlags message has a short name, so a flag
// added by a newer Envoy is noticed here rather than silently dropped.
func TestEveryResponseFlagIsKnown(t *testing.T) {
	fields := (&accesslogdatav3.ResponseFlags{}).ProtoReflect().Descriptor().Fields()
	if fields.Len() != len(responseFlags) {
		t.Errorf("ResponseFlags has %d fields, responseFlags lists %d", fields.Len(), len(responseFlags))
	}
}

func TestLegFailed(t *testing.T) {
	for _, tt := range []struct {
		status      int
		flagsFailed bool
		want        bool
	}{
		{0, false, true}, {200, false, false}, {200, true, true}, {404, false, false},
		{499, false, false}, {500, false, true}, {503, false, true},
	} {
		if got := legFailed(tt.status, tt.flagsFailed); got != tt.want {
			t.Errorf("legFailed(%d, %v) = %v, want %v", tt.status, tt.flagsFailed, got, tt.want)
		}
	}
}
