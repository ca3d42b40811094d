package extproc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc/metadata"

	"github.com/duet-router/duet/envoy/contract"
	"github.com/duet-router/duet/scheduler/admit"
)

// envoyLimits are how long the Envoy on an ext_proc stream waits for
// duet's answer to a message: its filter's message_timeout, and the
// longest override_message_timeout it honours (max_message_timeout). Envoy
// ignores an override above that maximum altogether: the message_timeout
// then applies, and a request duet still holds gets Envoy's 504.
type envoyLimits struct {
	// message is the filter's message_timeout.
	message time.Duration
	// held is the longest Envoy waits when duet asks it to (its
	// max_message_timeout, or message without one); 0 when the stream did
	// not say (a bootstrap duet did not render: Envoy Gateway's, Istio's,
	// one written by hand, or one an older duet rendered).
	held time.Duration
}

// known reports whether the stream said how long its Envoy waits.
func (l envoyLimits) known() bool { return l.held > 0 }

// maxWait is the longest duet may hold a request queued on this stream so
// that its answer (a 429 at the latest) reaches Envoy in time: held less
// HoldMargin, at least a millisecond; 0 (no cap) when unknown.
func (l envoyLimits) maxWait() time.Duration {
	if !l.known() {
		return 0
	}
	return max(l.held-HoldMargin, time.Millisecond)
}

// holdFor is the override_message_timeout to send for a request queued
// with the given wait limit, and whether to send one at all: the limit
// plus HoldMargin, no more than Envoy honours. Without a
// max_message_timeout Envoy honours none, and nothing is sent.
func (l envoyLimits) holdFor(limit time.Duration) (time.Duration, bool) {
	d := limit + HoldMargin
	if !l.known() {
		return d, true
	}
	if l.held <= l.message {
		return 0, false
	}
	return min(d, l.held), true
}

// seenLimits is the last envoyLimits parsed, by their metadata values.
type seenLimits struct {
	message, held string
	limits        envoyLimits
}

// envoyLimitsBook remembers the limits the streams last carried, so that
// each stream's values are parsed, and checked against the admission
// classes, only when they change.
type envoyLimitsBook struct {
	last atomic.Pointer[seenLimits]
	mu   sync.Mutex // serializes checks
}

// envoyLimits returns the limits of the Envoy on ctx's stream, read from
// the metadata the rendered bootstrap sends (contract.MetadataMessageTimeout,
// contract.MetadataMaxMessageTimeout). When they are new, it checks every
// pool's admission classes against them and warns of each class that
// Envoy would cut short.
func (s *Server) envoyLimits(ctx context.Context) envoyLimits {
	message := first(metadata.ValueFromIncomingContext(ctx, contract.MetadataMessageTimeout))
	held := first(metadata.ValueFromIncomingContext(ctx, contract.MetadataMaxMessageTimeout))
	if last := s.limits.last.Load(); last != nil && last.message == message && last.held == held {
		return last.limits
	}
	s.limits.mu.Lock()
	defer s.limits.mu.Unlock()
	if last := s.limits.last.Load(); last != nil && last.message == message && last.held == held {
		return last.limits
	}
	l, err := parseEnvoyLimits(message, held)
	if err != nil {
		s.log.Warn("Envoy's ext_proc timeouts in the stream metadata are unreadable; admission assumes duet's own envoy.message_timeout",
			zap.String(contract.MetadataMessageTimeout, message), zap.String(contract.MetadataMaxMessageTimeout, held), zap.Error(err))
	}
	s.limits.last.Store(&seenLimits{message: message, held: held, limits: l})
	if l.known() {
		s.checkWaitLimits(l)
	}
	return l
}

// first is the first of values, or "".
func first(values []string) string {
	if len(values) == 0 {
		return ""
	}
	return values[0]
}

// parseEnvoyLimits reads the two metadata values; both empty is a stream
// that does not say (zero limits).
func parseEnvoyLimits(message, held string) (envoyLimits, error) {
	if message == "" && held == "" {
		return envoyLimits{}, nil
	}
	m, err := time.ParseDuration(message)
	if err != nil || m <= 0 {
		return envoyLimits{}, fmt.Errorf("%s: %q is not a positive duration", contract.MetadataMessageTimeout, message)
	}
	h, err := time.ParseDuration(held)
	if err != nil || h < m {
		return envoyLimits{}, fmt.Errorf("%s: %q is not a duration of at least %s", contract.MetadataMaxMessageTimeout, held, message)
	}
	return envoyLimits{message: m, held: h}, nil
}

// checkWaitLimits warns of every admission class whose wait limit the
// Envoy with limits l cuts short: its requests wait at most l.maxWait, and
// a re-rendered bootstrap would let them wait their limit.
func (s *Server) checkWaitLimits(l envoyLimits) {
	for _, p := range s.pools.list {
		if p.Admission == nil {
			continue
		}
		for _, c := range p.Admission.Admitter.Config().Classes {
			if c.WaitLimit <= l.maxWait() {
				continue
			}
			s.log.Warn("admission: Envoy's bootstrap cuts this class's wait limit short: its queued requests get a 429 after the shorter wait. Re-render Envoy's bootstrap (duet envoy-config) and restart Envoy to allow the whole limit",
				zap.String("pool", p.Name), zap.String("class", c.Name), zap.Duration("wait_limit", c.WaitLimit),
				zap.Duration("envoy_max_message_timeout", l.held), zap.Duration("waits_at_most", l.maxWait()),
				zap.Duration("needs_max_message_timeout", c.WaitLimit+HoldMargin+time.Second))
		}
	}
}

// holdWatch follows a request queued by admission, to tell, when its
// stream ends before duet answered, whether the client left or Envoy's
// message timer fired.
type holdWatch struct {
	arrived time.Time // when the message duet answers arrived
	limits  envoyLimits
	// fallback is the message_timeout assumed when limits are unknown.
	fallback time.Duration

	mu     sync.Mutex
	heldAt time.Time     // when duet asked Envoy to wait
	held   time.Duration // for how long; 0 when it did not ask
}

// hold records that duet asked Envoy, at now, to wait d.
func (w *holdWatch) hold(now time.Time, d time.Duration) {
	w.mu.Lock()
	w.heldAt, w.held = now, d
	w.mu.Unlock()
}

// Tolerances of envoyGaveUp around the moment Envoy's timer fires: duet
// measures from the message's arrival, a little after Envoy started its
// timer, and hears of the end a little after it fired.
const (
	timerEarly = 250 * time.Millisecond
	timerLate  = 500 * time.Millisecond
)

// envoyGaveUp reports whether a stream that ended at `at`, while duet
// still held its request, ended because Envoy's message timer fired
// rather than because the client went away: it ended when that timer
// would, give or take the tolerances. The timer runs from the message's
// arrival for message_timeout, unless Envoy honoured duet's override,
// which restarts it for the override's duration.
func (w *holdWatch) envoyGaveUp(at time.Time) bool {
	w.mu.Lock()
	heldAt, held := w.heldAt, w.held
	w.mu.Unlock()
	message := w.limits.message
	if message <= 0 {
		message = w.fallback
	}
	near := func(deadline time.Time) bool {
		return !at.Before(deadline.Add(-timerEarly)) && !at.After(deadline.Add(timerLate))
	}
	honoured := held > 0 && (!w.limits.known() || held <= w.limits.held)
	ignored := held == 0 || !w.limits.known() || held > w.limits.held
	if honoured && near(heldAt.Add(held)) {
		return true
	}
	return ignored && message > 0 && near(w.arrived.Add(message))
}

// watchEnvoy cancels, once ctx (the stream's) ends, what cancel belongs
// to: with the cause admit.ErrProxyTimeout when Envoy's timer ended the
// stream (w.envoyGaveUp), context.Canceled when the client did. It returns
// the function that stops the watch.
func watchEnvoy(ctx context.Context, w *holdWatch, cancel context.CancelCauseFunc) (stop func() bool) {
	return context.AfterFunc(ctx, func() {
		if w.envoyGaveUp(time.Now()) {
			cancel(admit.ErrProxyTimeout)
			return
		}
		cancel(context.Canceled)
	})
}
