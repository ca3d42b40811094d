package accesslog

import (
	"strings"

	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
)

// responseFlag is one of Envoy's response flags: its short name (as in
// %RESPONSE_FLAGS%), whether it means the leg failed, and how to read it
// from the ALS proto.
type responseFlag struct {
	short  string
	failed bool
	set    func(*accesslogdatav3.ResponseFlags) bool
}

// responseFlags lists the flags in the ALS proto's field order. A flag
// "fails" a leg when the request did not get a complete answer from the
// engine: no host or connection (UH, UF, UO, NC, NR, DF), a timeout (UT, SI,
// UMSDR, DT), a reset or termination on either side (LR, UR, UC, DC, DR), a
// protocol error (UPE), exhausted retries (URX), overload (OM) or a failed
// local health check (LH). The others describe policy decisions (rate
// limits, faults, authorization, cache) or bad client requests and do not by
// themselves mean an engine failed; their status code says the rest.
var responseFlags = []responseFlag{
	{"LH", true, (*accesslogdatav3.ResponseFlags).GetFailedLocalHealthcheck},
	{"UH", true, (*accesslogdatav3.ResponseFlags).GetNoHealthyUpstream},
	{"UT", true, (*accesslogdatav3.ResponseFlags).GetUpstreamRequestTimeout},
	{"LR", true, (*accesslogdatav3.ResponseFlags).GetLocalReset},
	{"UR", true, (*accesslogdatav3.ResponseFlags).GetUpstreamRemoteReset},
	{"UF", true, (*accesslogdatav3.ResponseFlags).GetUpstreamConnectionFailure},
	{"UC", true, (*accesslogdatav3.ResponseFlags).GetUpstreamConnectionTermination},
	{"UO", true, (*accesslogdatav3.ResponseFlags).GetUpstreamOverflow},
	{"NR", true, (*accesslogdatav3.ResponseFlags).GetNoRouteFound},
	{"DI", false, (*accesslogdatav3.ResponseFlags).GetDelayInjected},
	{"FI", false, (*accesslogdatav3.ResponseFlags).GetFaultInjected},
	{"RL", false, (*accesslogdatav3.ResponseFlags).GetRateLimited},
	{"UAEX", false, func(f *accesslogdatav3.ResponseFlags) bool { return f.GetUnauthorizedDetails() != nil }},
	{"RLSE", false, (*accesslogdatav3.ResponseFlags).GetRateLimitServiceError},
	{"DC", true, (*accesslogdatav3.ResponseFlags).GetDownstreamConnectionTermination},
	{"URX", true, (*accesslogdatav3.ResponseFlags).GetUpstreamRetryLimitExceeded},
	{"SI", true, (*accesslogdatav3.ResponseFlags).GetStreamIdleTimeout},
	{"IH", false, (*accesslogdatav3.ResponseFlags).GetInvalidEnvoyRequestHeaders},
	{"DPE", false, (*accesslogdatav3.ResponseFlags).GetDownstreamProtocolError},
	{"UMSDR", true, (*accesslogdatav3.ResponseFlags).GetUpstreamMaxStreamDurationReached},
	{"RFCF", false, (*accesslogdatav3.ResponseFlags).GetResponseFromCacheFilter},
	{"NFCF", false, (*accesslogdatav3.ResponseFlags).GetNoFilterConfigFound},
	{"DT", true, (*accesslogdatav3.ResponseFlags).GetDurationTimeout},
	{"UPE", true, (*accesslogdatav3.ResponseFlags).GetUpstreamProtocolError},
	{"NC", true, (*accesslogdatav3.ResponseFlags).GetNoClusterFound},
	{"OM", true, (*accesslogdatav3.ResponseFlags).GetOverloadManager},
	{"DF", true, (*accesslogdatav3.ResponseFlags).GetDnsResolutionFailure},
	{"DR", true, (*accesslogdatav3.ResponseFlags).GetDownstreamRemoteReset},
}

// flagString returns the short names of the flags set in f, comma-separated
// in the proto's field order, and whether any of them fails the leg.
func flagString(f *accesslogdatav3.ResponseFlags) (short string, failed bool) {
	if f == nil {
		return "", false
	}
	var names []string
	for _, rf := range responseFlags {
		if rf.set(f) {
			names = append(names, rf.short)
			failed = failed || rf.failed
		}
	}
	return strings.Join(names, ","), failed
}

// legFailed reports whether a leg with this HTTP status and these flags
// failed: no response (status 0), a server error (5xx), or a failing
// response flag (see responseFlags).
func legFailed(status int, flagsFailed bool) bool {
	return status == 0 || status >= 500 || flagsFailed
}

// unreachable reports whether a leg never reached a working engine process:
// no response (status 0) because the connection failed (UF) or the cluster
// had no healthy host (UH). Resets and timeouts after the connection was
// made are failures of the engine, not of its reachability.
func unreachable(status int, f *accesslogdatav3.ResponseFlags) bool {
	return status == 0 && (f.GetUpstreamConnectionFailure() || f.GetNoHealthyUpstream())
}
