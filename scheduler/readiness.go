package scheduler

import (
	"fmt"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons an endpoint is not ready, as in the reason label of
// duet_endpoints_not_ready.
const (
	// NotReadyWrongMode: the engine reports a disaggregation_mode that
	// contradicts its role (Endpoint.WrongMode).
	NotReadyWrongMode = "wrong_mode"
	// NotReadyPending: discovery has not reached the engine yet (down,
	// unreachable, no DP size known, or its hostname does not resolve).
	NotReadyPending = "pending"
)

// Readiness is Ready in words, for /readyz.
type Readiness struct {
	// Ready is Scheduler.Ready.
	Ready bool
	// Reason says why the scheduler is not ready, naming what it waits
	// for; empty when Ready. See Scheduler.Readiness.
	Reason string
	// NotReady describes every endpoint that is not ready
	// (Endpoint.NotReadyReason), prefill first, then decode, each in
	// configuration order, whether or not the scheduler is ready.
	NotReady []string
}

// Readiness returns Ready with its reasons. Reason is one of
// "first discovery round pending", "first load scrape pending", or, for
// each role that has no ready endpoint, "no usable <role> engine: " and
// the NotReadyReason of each of its endpoints joined by "; " (or "no
// <role> engine listed" when the role has none), roles joined by "; ".
func (s *Scheduler) Readiness() Readiness {
	snap := s.snap.Load()
	r := Readiness{Ready: s.Ready()}
	for _, ep := range snap.endpoints {
		if why := ep.NotReadyReason(); why != "" {
			r.NotReady = append(r.NotReady, why)
		}
	}
	if r.Ready {
		return r
	}
	switch {
	case !s.discovered.Load():
		r.Reason = "first discovery round pending"
	case !s.Settled():
		r.Reason = "first load scrape pending"
	default:
		var parts []string
		if s.pd && len(snap.prefill.targets) == 0 {
			parts = append(parts, noUsable(snap.endpoints, RolePrefill))
		}
		if len(snap.decode.targets) == 0 {
			parts = append(parts, noUsable(snap.endpoints, RoleDecode))
		}
		r.Reason = strings.Join(parts, "; ")
	}
	return r
}

// noUsable says why role has no ready endpoint among eps.
func noUsable(eps []Endpoint, role Role) string {
	var whys []string
	for _, ep := range eps {
		if ep.Role == role {
			whys = append(whys, ep.NotReadyReason())
		}
	}
	if len(whys) == 0 {
		return fmt.Sprintf("no %s engine listed", role)
	}
	return fmt.Sprintf("no usable %s engine: %s", role, strings.Join(whys, "; "))
}

// unavailable says, for the error of a pick that found no ready endpoint
// of role, what the role's endpoints are doing, without naming them (the
// error reaches clients; /readyz names them): e.g. `1 of 1 prefill engines
// report a disaggregation_mode other than "prefill" (see duet's /readyz)`.
func unavailable(eps []Endpoint, role Role) string {
	var listed, wrong int
	expected := ""
	for _, ep := range eps {
		if ep.Role != role {
			continue
		}
		listed++
		if ep.WrongMode {
			wrong++
			expected = ep.ExpectedMode
		}
	}
	if listed == 0 {
		return fmt.Sprintf("no %s engine listed", role)
	}
	var parts []string
	if wrong > 0 {
		parts = append(parts, fmt.Sprintf("%d of %d %s engines report a disaggregation_mode other than %q", wrong, listed, role, expected))
	}
	if pending := listed - wrong; pending > 0 {
		parts = append(parts, fmt.Sprintf("%d of %d %s engines not reached by discovery yet", pending, listed, role))
	}
	return strings.Join(parts, ", ") + " (see duet's /readyz)"
}

// pendingCount counts the endpoints that are not ready.
func (s *Scheduler) pendingCount() int {
	n := 0
	for _, ep := range s.snap.Load().endpoints {
		if !ep.Ready {
			n++
		}
	}
	return n
}

// retryBackoff paces Run's extra rounds over the endpoints that are not
// ready: the first comes base after a round that left one not ready, each
// later one twice as long after the one before, until the delay reaches
// limit (the discovery interval, whose regular rounds then suffice).
type retryBackoff struct {
	base, limit time.Duration
	delay       time.Duration // the next delay; 0 while nothing is pending
}

// next returns the delay before the next retry round and true, or false
// when none is due: nothing is pending (which starts the backoff over), or
// the delay has reached the limit.
func (b *retryBackoff) next(pending bool) (time.Duration, bool) {
	if !pending {
		b.delay = 0
		return 0, false
	}
	if b.delay == 0 {
		b.delay = b.base
	}
	if b.delay >= b.limit {
		return 0, false
	}
	return b.delay, true
}

// fired records that a retry round ran: the next waits twice as long.
func (b *retryBackoff) fired() { b.delay *= 2 }

// reset starts the backoff over.
func (b *retryBackoff) reset() { b.delay = 0 }

// notReadyDesc describes duet_endpoints_not_ready.
var notReadyDesc = prometheus.NewDesc("duet_endpoints_not_ready",
	"Configured endpoints that picks cannot choose because discovery has not made them ready, by role and reason: "+
		"pending (not reached yet) or wrong_mode (the engine reports a disaggregation_mode that contradicts its role).",
	[]string{"role", "reason"}, nil)

// readinessCollector reports duet_endpoints_not_ready at scrape time.
type readinessCollector struct{ s *Scheduler }

// Describe implements prometheus.Collector.
func (readinessCollector) Describe(ch chan<- *prometheus.Desc) { ch <- notReadyDesc }

// Collect implements prometheus.Collector. Every role the scheduler serves
// gets both reasons, 0 included.
func (c readinessCollector) Collect(ch chan<- prometheus.Metric) {
	roles := []Role{RoleDecode}
	if c.s.pd {
		roles = []Role{RolePrefill, RoleDecode}
	}
	counts := map[Role]map[string]int{RolePrefill: {}, RoleDecode: {}}
	for _, ep := range c.s.snap.Load().endpoints {
		switch {
		case ep.Ready:
		case ep.WrongMode:
			counts[ep.Role][NotReadyWrongMode]++
		default:
			counts[ep.Role][NotReadyPending]++
		}
	}
	for _, role := range roles {
		for _, reason := range []string{NotReadyPending, NotReadyWrongMode} {
			ch <- prometheus.MustNewConstMetric(notReadyDesc, prometheus.GaugeValue, float64(counts[role][reason]), string(role), reason)
		}
	}
}
