package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"go.uber.org/zap"
)

// ErrModeChange is wrapped in the error SetEndpoints returns when the new
// lists would add or remove the prefill pool: PD and aggregated mode differ
// in Envoy's routes too, so switching needs a restart.
var ErrModeChange = errors.New("PD and aggregated mode cannot change without a restart")

// SetEndpoints replaces the configured endpoints of both roles, as New
// validates them: at least one decode endpoint (unless Config.EmptyPools),
// valid URLs and sizes, no two entries naming the same engine. The prefill
// list must stay empty or stay non-empty (with EmptyPools, a PD scheduler
// accepts an empty one): switching between PD and aggregated mode is an
// error wrapping ErrModeChange. On any error nothing changes.
//
// An endpoint is the same across the change when its role and its URL (as
// in Endpoint.URL) are: it keeps its discovered state, its health record,
// its targets' ledger entries (reservations included) and its prefix index
// entries; a changed DPSize or BootstrapPort only replaces the configured
// fallback values. A new endpoint starts undiscovered, like every endpoint
// after New, and is not schedulable until a discovery round finds it ready.
// A removed endpoint leaves the snapshot at once: picks that start after
// SetEndpoints returns never choose it, its reservations and prefix entries
// are dropped, and its health records are retired (late evidence about it
// is ignored). Requests already routed to it are not touched.
//
// When endpoints were added or their configured values changed,
// SetEndpoints runs a discovery round before it returns; its per-endpoint
// errors are not returned (the endpoints stay not ready and Run retries
// them with backoff, as at startup), only the context's if ctx ends. Each addition,
// removal and change is logged at info level.
func (s *Scheduler) SetEndpoints(ctx context.Context, prefill, decode []EndpointSpec) error {
	if len(decode) == 0 && !s.emptyPools {
		return errors.New("scheduler: no decode endpoint configured")
	}
	// With EmptyPools an empty prefill list leaves PD mode as it is.
	if pd := len(prefill) > 0; pd != s.pd && (pd || !s.emptyPools) {
		return fmt.Errorf("scheduler: a prefill pool is configured: %v, was %v: %w", pd, s.pd, ErrModeChange)
	}
	fresh, err := newMembers(prefill, decode)
	if err != nil {
		return err
	}

	s.discoverMu.Lock()
	type memberKey struct {
		role Role
		url  string
	}
	old := make(map[memberKey]*member, len(s.members))
	for _, m := range s.members {
		old[memberKey{m.role, m.cur.URL}] = m
	}
	members := make([]*member, len(fresh))
	var added []endpointRef
	var removed []string
	reconfigured := false
	for i, m := range fresh {
		k := memberKey{m.role, m.cur.URL}
		prev, ok := old[k]
		if !ok {
			members[i] = m
			added = append(added, endpointRef{role: m.role, url: m.cur.URL})
			s.log.Info("endpoint added", zap.String("role", string(m.role)), zap.String("url", m.cur.URL),
				zap.Int("dp_size", m.spec.DPSize), zap.Int("bootstrap_port", m.spec.BootstrapPort))
			continue
		}
		delete(old, k)
		if prev.spec.DPSize != m.spec.DPSize || prev.spec.BootstrapPort != m.spec.BootstrapPort {
			s.log.Info("endpoint configuration changed", zap.String("role", string(m.role)), zap.String("url", m.cur.URL),
				zap.Int("dp_size", m.spec.DPSize), zap.Int("was_dp_size", prev.spec.DPSize),
				zap.Int("bootstrap_port", m.spec.BootstrapPort), zap.Int("was_bootstrap_port", prev.spec.BootstrapPort))
			// Warn again if discovery disagrees with the new values.
			prev.warnedDP, prev.warnedPort = 0, 0
			reconfigured = true
		}
		prev.spec = m.spec
		members[i] = prev
	}
	for _, m := range s.members {
		if _, gone := old[memberKey{m.role, m.cur.URL}]; gone {
			removed = append(removed, m.cur.URL)
			s.log.Info("endpoint removed", zap.String("role", string(m.role)), zap.String("url", m.cur.URL),
				zap.String("address", m.cur.Address))
		}
	}
	if len(added) == 0 && len(removed) == 0 && !reconfigured && slices.Equal(members, s.members) {
		s.discoverMu.Unlock()
		return nil
	}
	// Records first: the new snapshot binds its targets to them, and readers
	// holding the old snapshot find removed endpoints' records gone.
	s.health.updateEndpoints(added, removed)
	s.members = members
	s.publish()
	s.discoverMu.Unlock()

	if len(added) == 0 && !reconfigured {
		return nil
	}
	if err := s.Discover(ctx); err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("scheduler: set endpoints: %w", ctx.Err())
		}
		s.log.Debug("discovery round after an endpoint change finished with errors", zap.Error(err))
	}
	if len(added) > 0 {
		// Run probes the new endpoints that are not ready yet soon.
		select {
		case s.pendingKick <- struct{}{}:
		default:
		}
	}
	return nil
}
