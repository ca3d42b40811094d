package main

import (
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/duet-router/duet/cmd/duet/internal/config"
	"github.com/duet-router/duet/extproc"
	"github.com/duet-router/duet/scheduler"
	"github.com/duet-router/duet/scheduler/admit"
)

// kicker forwards a scheduler's OnRelease to its pool's Admitter, which is
// made after the scheduler (its gate is the scheduler's saturation).
type kicker struct {
	a atomic.Pointer[admit.Admitter]
}

// kick implements scheduler.Config.OnRelease.
func (k *kicker) kick() {
	if a := k.a.Load(); a != nil {
		a.Kick()
	}
}

// newAdmitter makes pool p's Admitter, gated by its scheduler's
// saturation, with its metrics on reg (nil: none).
func newAdmitter(a config.Admission, sched *scheduler.Scheduler, reg prometheus.Registerer) (*admit.Admitter, error) {
	var obs admit.Observer
	if reg != nil {
		m, err := admit.NewMetrics(reg)
		if err != nil {
			return nil, fmt.Errorf("admission metrics: %w", err)
		}
		obs = m
	}
	adm, err := admit.NewAdmitter(a.AdmitConfig(), func(share float64) bool { return !sched.SaturatedAt(share) }, obs)
	if err != nil {
		return nil, err
	}
	if reg != nil {
		if err := reg.Register(adm.Collector()); err != nil {
			return nil, fmt.Errorf("admission metrics: %w", err)
		}
	}
	return adm, nil
}

// admission is what extproc needs of pool p's admission; nil when it has
// none.
func (p *pool) admission(a config.Admission) (*extproc.Admission, error) {
	if p.admitter == nil {
		return nil, nil
	}
	cl, err := a.AdmitRules().Compile()
	if err != nil {
		return nil, fmt.Errorf("pool %s: admission: %w", p.cfg.Name, err)
	}
	names := a.ClassNames()
	return &extproc.Admission{
		Admitter: p.admitter, Classifier: cl, Cost: p.sched.Cost,
		EnginePriority: func(class int) (int, bool) { return enginePriority(a, names[class], p.sched) },
	}, nil
}

// enginePriorities is what enginePriority reads of a pool's scheduler.
type enginePriorities interface {
	EnginePriority() (scheduler.PriorityScheduling, bool)
}

// enginePriority is the priority field to write for a request of class,
// and whether to write it: where admission.engine_priority and the pool's
// engines say so. A class's default value (its priority) is negated for
// engines that serve low values first, so the order holds there too.
func enginePriority(a config.Admission, class string, sched enginePriorities) (int, bool) {
	ps, advertised := sched.EnginePriority()
	if !a.WritesEnginePriority(advertised) {
		return 0, false
	}
	return a.EnginePriority(class, ps.LowValuesFirst), true
}

// queueSharer is what the pools' admission queues share with the other
// replicas (replicas.Replicas).
type queueSharer interface {
	PublishQueue(pool string, h admit.Head)
	PeerQueue(pool string) (priority int, queued bool)
}

// shareQueues makes every pool's admission queue defer to the other
// replicas' queues of the pool and tell them of its own head: no replica
// lets a request through while another holds a more important one, nor
// passes one of equal rank that waits elsewhere.
func (ps poolSet) shareQueues(r queueSharer) {
	for _, p := range ps {
		if p.admitter == nil {
			continue
		}
		name := p.cfg.Name
		p.admitter.ShareWith(func() (int, bool) { return r.PeerQueue(name) }, func(h admit.Head) { r.PublishQueue(name, h) })
	}
}
