package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/duet-router/duet/cmd/duet/internal/config"
	"github.com/duet-router/duet/cmd/duet/internal/status"
	"github.com/duet-router/duet/extproc"
	"github.com/duet-router/duet/extproc/accesslog"
	"github.com/duet-router/duet/extproc/legtrace"
	"github.com/duet-router/duet/extproc/tokenize"
	"github.com/duet-router/duet/scheduler"
	"github.com/duet-router/duet/scheduler/admit"
	"github.com/duet-router/duet/scheduler/kvevents"
)

// pool is one pool as serve runs it: its configuration and its scheduler,
// whose load, health and prefix state are its own.
type pool struct {
	cfg   config.Pool
	sched *scheduler.Scheduler
	// tokenizer is the pool's model tokenizer; nil without one.
	tokenizer *tokenize.Model
	// events follows the pool's engines' KV events; nil when the pool
	// does not (kv_events.mode).
	events *kvevents.Tracker[scheduler.TargetKey]
	// admitter queues the pool's requests while its engines are
	// saturated; nil when admission is off.
	admitter *admit.Admitter
	// ext is the pool as extproc routes to it.
	ext extproc.Pool
}

// poolSet is every pool, in configuration order.
type poolSet []*pool

// newPools makes a scheduler per pool of cfg, each from base (the settings
// every pool shares: callbacks) with the pool's engines and policies. The
// schedulers' metrics carry the label pool, and their logs the field pool.
// A pool's tokenizer files are loaded here: one that is missing or that
// duet cannot reproduce stops the start, naming the file and the reason.
func newPools(cfg *config.Config, base scheduler.Config, log *zap.Logger, reg prometheus.Registerer) (poolSet, error) {
	var out poolSet
	for _, pc := range cfg.PoolList() {
		tok, err := loadTokenizer(pc.Tokenizer)
		if err != nil {
			return nil, fmt.Errorf("pool %s: %w", pc.Name, err)
		}
		if tok != nil {
			log.Info("tokenizer loaded", zap.String("pool", pc.Name), zap.String("file", pc.Tokenizer.File),
				zap.Bool("chat_template", tok.Chat != nil), zap.Int("block_tokens", pc.Tokenizer.BlockTokens(cfg.Prefix.BlockTokens)))
		}
		scfg := schedulerConfig(cfg, pc)
		scfg.Pool = pc.Name
		scfg.OnPicked, scfg.OnEject = base.OnPicked, base.OnEject
		scfg.Registerer = poolRegisterer(reg, pc.Name)
		plog := log.With(zap.String("pool", pc.Name))
		var events *kvevents.Tracker[scheduler.TargetKey]
		if cfg.KVEvents.Enabled(pc) {
			events = newTracker(cfg, pc, plog)
			scfg.CacheView = events
			if scfg.Registerer != nil {
				scfg.Registerer.MustRegister(events.Collector())
			}
		}
		k := &kicker{}
		if cfg.Admission.Enabled {
			scfg.Saturation = cfg.Admission.SaturationConfig()
			scfg.OnRelease = k.kick
		}
		sched, err := scheduler.New(scfg, plog)
		if err != nil {
			return nil, fmt.Errorf("scheduler of pool %s: %w", pc.Name, err)
		}
		p := &pool{cfg: pc, sched: sched, tokenizer: tok, events: events}
		if cfg.Admission.Enabled {
			if p.admitter, err = newAdmitter(cfg.Admission, sched, scfg.Registerer); err != nil {
				return nil, fmt.Errorf("pool %s: %w", pc.Name, err)
			}
			k.a.Store(p.admitter)
		}
		if p.ext, err = p.extproc(cfg.Admission); err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, nil
}

// newTracker returns the follower of pool p's KV events.
func newTracker(cfg *config.Config, p config.Pool, log *zap.Logger) *kvevents.Tracker[scheduler.TargetKey] {
	k := cfg.KVEvents
	return kvevents.NewTracker[scheduler.TargetKey](kvevents.TrackerConfig{
		BlockTokens:   blockTokens(cfg, p),
		MaxPages:      k.MaxPages,
		ExpectFor:     k.ExpectFor,
		MaxLag:        k.MaxLag,
		Warmup:        k.Warmup,
		ProbeInterval: k.ProbeInterval,
	}, log)
}

// loadTokenizer loads a pool's tokenizer files; nil without a tokenizer
// section.
func loadTokenizer(t *config.Tokenizer) (*tokenize.Model, error) {
	if t == nil {
		return nil, nil
	}
	return tokenize.LoadModel(t.File, t.Config, t.ChatTemplate)
}

// poolRegisterer registers a pool's metrics with reg under the label
// pool=name.
func poolRegisterer(reg prometheus.Registerer, name string) prometheus.Registerer {
	return prometheus.WrapRegistererWith(prometheus.Labels{"pool": name}, reg)
}

// byName returns the pool named name, or nil.
func (ps poolSet) byName(name string) *pool {
	for _, p := range ps {
		if p.cfg.Name == name {
			return p
		}
	}
	return nil
}

// run runs every pool's scheduler until ctx ends.
func (ps poolSet) run(ctx context.Context) {
	for _, p := range ps {
		go p.sched.Run(ctx)
		if p.events != nil {
			go p.events.Run(ctx)
		}
	}
}

// Ready implements readiness. One pool is ready as its scheduler is; of
// several, duet is ready once every scheduler has settled (first discovery
// and load scrape) and one of them can serve: a pool without a ready engine
// answers its own requests with fast 503s, which must not take the other
// pools down with it.
func (ps poolSet) Ready() bool {
	if len(ps) == 1 {
		return ps[0].sched.Ready()
	}
	serving := false
	for _, p := range ps {
		if !p.sched.Settled() {
			return false
		}
		serving = serving || p.sched.Ready()
	}
	return serving
}

// Why implements readiness: each pool's scheduler.Readiness, its lines
// prefixed with "pool <name>: " when there are several pools. The reason
// joins the reasons of the pools that are not ready with "; ".
func (ps poolSet) Why() (string, []string) {
	var reasons, excluded []string
	for _, p := range ps {
		r := p.sched.Readiness()
		prefix := ""
		if len(ps) > 1 {
			prefix = "pool " + p.cfg.Name + ": "
		}
		if r.Reason != "" {
			reasons = append(reasons, prefix+r.Reason)
		}
		for _, e := range r.NotReady {
			excluded = append(excluded, prefix+e)
		}
	}
	return strings.Join(reasons, "; "), excluded
}

// extproc returns the pools as the ext_proc server routes to them. A
// configuration without a pools section is one pool that serves every
// model.
func (ps poolSet) extproc() []extproc.Pool {
	out := make([]extproc.Pool, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.ext)
	}
	return out
}

// extproc returns the pool as extproc routes to it.
func (p *pool) extproc(a config.Admission) (extproc.Pool, error) {
	ep := extproc.Pool{Name: p.cfg.Name, Picker: p.sched, Fallbacks: p.sched, PrefillCluster: p.cfg.Clusters.Prefill,
		Tokenizer: p.tokenizer}
	if !p.cfg.Implicit() {
		ep.Models, ep.Aliases = p.cfg.Models, p.cfg.Aliases
	}
	var err error
	ep.Admission, err = p.admission(a)
	return ep, err
}

// closeAdmission refuses every queued request with 503 (duet is shutting
// down), and every later one.
func (ps poolSet) closeAdmission() {
	for _, p := range ps {
		if p.admitter != nil {
			p.admitter.Close()
		}
	}
}

// feedbackClusters names every pool's engine clusters, whose upstream
// access-log entries are legs, as the configuration names them.
func feedbackClusters(cfg *config.Config) accesslog.ClusterSet {
	var out accesslog.ClusterSet
	for _, p := range cfg.PoolList() {
		out = append(out, accesslog.Clusters{Decode: p.Clusters.Decode, Prefill: p.Clusters.Prefill})
	}
	return out
}

// status returns the pools as the status page shows them.
func (ps poolSet) status() []status.Pool {
	out := make([]status.Pool, 0, len(ps))
	for _, p := range ps {
		sp := status.Pool{Name: p.cfg.Name, Models: p.cfg.Models, Source: p.sched}
		if p.admitter != nil {
			sp.Admission = p.admitter
		}
		out = append(out, sp)
	}
	return out
}

// Complete delivers believed feedback (accesslog.Completion.Pool set by
// the route record) to its pool's scheduler; feedback about no known pool
// is dropped. The ejections the leg causes become events of its span in
// ctx, when it is traced (package legtrace).
func (ps poolSet) Complete(ctx context.Context, c accesslog.Completion) {
	if p := ps.byName(c.Pool); p != nil {
		for _, e := range p.sched.Complete(toFeedback(c)) {
			legtrace.Ejected(ctx, e, abortsPartners(e.Role, e.Reason))
		}
	}
}

// ApplyPicked applies a peer's pick to the scheduler of its pool.
func (ps poolSet) ApplyPicked(pk scheduler.Picked) {
	if p := ps.byName(pk.Pool); p != nil {
		p.sched.ApplyPicked(pk)
	}
}

// names lists the pools' names.
func (ps poolSet) names() []string {
	out := make([]string, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.cfg.Name)
	}
	return out
}

// setters maps each pool's name to its scheduler, for reloads and
// Kubernetes discovery.
func (ps poolSet) setters() map[string]endpointSetter {
	out := make(map[string]endpointSetter, len(ps))
	for _, p := range ps {
		out[p.cfg.Name] = p.sched
	}
	return out
}
