package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/cache"

	"github.com/duet-router/duet/scheduler"
)

// DefaultDebounce is Options.Debounce's default.
const DefaultDebounce = 500 * time.Millisecond

// Outcomes of duet_discovery_updates_total.
const (
	outcomeApplied  = "applied"
	outcomeRejected = "rejected"
)

// States of duet_discovery_endpoints.
const (
	stateScheduled = "scheduled"
	stateJoining   = "joining"
)

// EndpointSetter is what discovery needs from the scheduler:
// *scheduler.Scheduler (created with EmptyPools) implements it.
type EndpointSetter interface {
	SetEndpoints(ctx context.Context, prefill, decode []scheduler.EndpointSpec) error
}

// Options configures a Discovery.
type Options struct {
	// Client reads EndpointSlices (NewClient's).
	Client SliceClient
	// Namespace is the Services' namespace.
	Namespace string
	// Prefill is the prefill pool's Service; nil means aggregated mode.
	Prefill *Pool
	// Decode is the decode (or aggregated) pool's Service.
	Decode Pool
	// Setter receives the endpoint lists.
	Setter EndpointSetter
	// Debounce gathers a burst of slice changes: they are applied this long
	// after the first one. Zero means DefaultDebounce.
	Debounce time.Duration
	// JoinDelay is how long an engine that appears after the first sync
	// waits before it is handed to Setter; zero hands it at once.
	JoinDelay time.Duration
	// Logger receives change and error logs; nil discards them.
	Logger *zap.Logger
	// Registerer receives the metrics; nil means none.
	Registerer prometheus.Registerer
}

// Discovery keeps a scheduler's endpoint lists equal to the ready
// endpoints of the configured Services. Create it with New, then call Run.
type Discovery struct {
	opts     Options
	log      *zap.Logger
	informer cache.SharedIndexInformer
	kick     chan struct{}
	synced   atomic.Bool
	metrics  metrics

	// State of the Run goroutine.
	applied   map[scheduler.Role][]scheduler.EndpointSpec
	firstSeen map[string]time.Time // role + " " + URL -> when first listed (join delay)
	problems  string               // last logged slice problems
}

// metrics are discovery's Prometheus metrics.
type metrics struct {
	updates     *prometheus.CounterVec
	endpoints   *prometheus.GaugeVec
	invalid     prometheus.Gauge
	watchErrors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, pd bool) metrics {
	m := metrics{
		updates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_discovery_updates_total",
			Help: "Endpoint list updates from Kubernetes discovery, by outcome: applied (the scheduler took the lists) or rejected (it refused them; the previous lists stay).",
		}, []string{"outcome"}),
		endpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "duet_discovery_endpoints",
			Help: "Ready engines found by Kubernetes discovery, by role and state: scheduled (handed to the scheduler) or joining (waiting for the join delay).",
		}, []string{"role", "state"}),
		invalid: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "duet_discovery_invalid_slices",
			Help: "EndpointSlices (or addresses in them) that Kubernetes discovery skips: no usable HTTP port, or an unsupported address type. The log names them.",
		}),
		watchErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "duet_discovery_watch_errors_total",
			Help: "Errors of the EndpointSlice list and watch calls (the informer retries with backoff).",
		}),
	}
	for _, o := range []string{outcomeApplied, outcomeRejected} {
		m.updates.WithLabelValues(o)
	}
	roles := []scheduler.Role{scheduler.RoleDecode}
	if pd {
		roles = append(roles, scheduler.RolePrefill)
	}
	for _, r := range roles {
		for _, s := range []string{stateScheduled, stateJoining} {
			m.endpoints.WithLabelValues(string(r), s)
		}
	}
	if reg != nil {
		reg.MustRegister(m.updates, m.endpoints, m.invalid, m.watchErrors)
	}
	return m
}

// New validates opts and returns a Discovery for them.
func New(opts Options) (*Discovery, error) {
	if opts.Client == nil || opts.Setter == nil {
		return nil, errors.New("kubernetes discovery: a client and a setter are required")
	}
	if opts.Namespace == "" {
		return nil, errors.New("kubernetes discovery: no namespace")
	}
	if opts.Decode.Service == "" || (opts.Prefill != nil && opts.Prefill.Service == "") {
		return nil, errors.New("kubernetes discovery: a pool names no service")
	}
	services := []string{opts.Decode.Service}
	if opts.Prefill != nil {
		if opts.Prefill.Service == opts.Decode.Service {
			return nil, fmt.Errorf("kubernetes discovery: service %q is both prefill and decode", opts.Decode.Service)
		}
		services = append(services, opts.Prefill.Service)
	}
	req, err := labels.NewRequirement(LabelServiceName, selection.In, services)
	if err != nil {
		return nil, fmt.Errorf("kubernetes discovery: service names: %w", err)
	}
	selector := labels.NewSelector().Add(*req).String()
	if opts.Debounce <= 0 {
		opts.Debounce = DefaultDebounce
	}
	if opts.JoinDelay < 0 {
		opts.JoinDelay = 0
	}
	if opts.Logger == nil {
		opts.Logger = zap.NewNop()
	}
	d := &Discovery{
		opts:      opts,
		log:       opts.Logger.With(zap.String("namespace", opts.Namespace)),
		kick:      make(chan struct{}, 1),
		metrics:   newMetrics(opts.Registerer, opts.Prefill != nil),
		applied:   make(map[scheduler.Role][]scheduler.EndpointSpec),
		firstSeen: make(map[string]time.Time),
	}
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) {
			o.LabelSelector = selector
			return opts.Client.List(ctx, opts.Namespace, o)
		},
		WatchFuncWithContext: func(ctx context.Context, o metav1.ListOptions) (watch.Interface, error) {
			o.LabelSelector = selector
			return opts.Client.Watch(ctx, opts.Namespace, o)
		},
	}
	d.informer = cache.NewSharedIndexInformerWithOptions(cache.ToListWatcherWithWatchListSemantics(lw, opts.Client),
		&EndpointSlice{}, cache.SharedIndexInformerOptions{})
	notify := func() {
		select {
		case d.kick <- struct{}{}:
		default:
		}
	}
	if _, err := d.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { notify() },
		UpdateFunc: func(any, any) { notify() },
		DeleteFunc: func(any) { notify() },
	}); err != nil {
		return nil, fmt.Errorf("kubernetes discovery: %w", err)
	}
	if err := d.informer.SetWatchErrorHandlerWithContext(func(ctx context.Context, _ *cache.Reflector, err error) {
		if ctx.Err() != nil {
			return // stopping
		}
		d.metrics.watchErrors.Inc()
		d.log.Warn("listing or watching EndpointSlices failed; retrying", zap.Error(err))
	}); err != nil {
		return nil, fmt.Errorf("kubernetes discovery: %w", err)
	}
	return d, nil
}

// Synced reports whether the first complete list of slices has been
// handed to the setter (or refused by it).
func (d *Discovery) Synced() bool { return d.synced.Load() }

// Run watches the slices and updates the setter until ctx ends: once with
// the first complete list, then after every burst of changes, and when a
// joining engine's delay is over. It returns when ctx is done and the
// informer has stopped.
func (d *Discovery) Run(ctx context.Context) {
	var informer sync.WaitGroup
	defer informer.Wait()
	informer.Go(func() { d.informer.RunWithContext(ctx) })

	d.log.Info("watching EndpointSlices", zap.String("decode_service", d.opts.Decode.Service),
		zap.String("prefill_service", d.prefillService()))
	if !cache.WaitForCacheSync(ctx.Done(), d.informer.HasSynced) {
		return
	}
	next := d.update(ctx, true)
	d.synced.Store(true)

	timer := time.NewTimer(time.Hour)
	timer.Stop() // armed by arm
	defer timer.Stop()
	var deadline time.Time // when timer fires; zero while stopped
	arm := func(at time.Time) {
		if at.IsZero() || (!deadline.IsZero() && !at.Before(deadline)) {
			return
		}
		deadline = at
		timer.Reset(time.Until(at))
	}
	arm(next)
	for {
		select {
		case <-ctx.Done():
			return
		case <-d.kick:
			arm(time.Now().Add(d.opts.Debounce))
		case <-timer.C:
			deadline = time.Time{}
			arm(d.update(ctx, false))
		}
	}
}

func (d *Discovery) prefillService() string {
	if d.opts.Prefill == nil {
		return ""
	}
	return d.opts.Prefill.Service
}

// update reads the informer's slices and hands the resulting lists to the
// setter if they differ from the last ones it took. On the first sync
// (initial) every engine is handed at once; later, new engines wait for
// the join delay. It returns when the next joining engine is due, or zero.
func (d *Discovery) update(ctx context.Context, initial bool) time.Time {
	byService := make(map[string][]*EndpointSlice)
	for _, obj := range d.informer.GetStore().List() {
		if s, ok := obj.(*EndpointSlice); ok {
			svc := s.Labels[LabelServiceName]
			byService[svc] = append(byService[svc], s)
		}
	}
	now := time.Now()
	var problems []error
	var due time.Time
	want := make(map[scheduler.Role][]scheduler.EndpointSpec)
	joining := make(map[scheduler.Role]int)
	pools := []struct {
		role scheduler.Role
		pool *Pool
	}{{scheduler.RolePrefill, d.opts.Prefill}, {scheduler.RoleDecode, &d.opts.Decode}}
	listed := make(map[string]bool)
	for _, p := range pools {
		if p.pool == nil {
			continue
		}
		found, errs := specs(p.role, *p.pool, byService[p.pool.Service])
		problems = append(problems, errs...)
		var at time.Time
		want[p.role], joining[p.role], at = d.admit(p.role, found, now, initial, listed)
		if !at.IsZero() && (due.IsZero() || at.Before(due)) {
			due = at
		}
	}
	for k := range d.firstSeen {
		if !listed[k] {
			delete(d.firstSeen, k)
		}
	}
	d.reportProblems(problems)
	for _, p := range pools {
		if p.pool != nil {
			d.metrics.endpoints.WithLabelValues(string(p.role), stateJoining).Set(float64(joining[p.role]))
		}
	}

	prefill, decode := want[scheduler.RolePrefill], want[scheduler.RoleDecode]
	if !initial && slices.Equal(prefill, d.applied[scheduler.RolePrefill]) && slices.Equal(decode, d.applied[scheduler.RoleDecode]) {
		return due
	}
	if err := d.opts.Setter.SetEndpoints(ctx, prefill, decode); err != nil {
		if ctx.Err() != nil {
			return due
		}
		d.metrics.updates.WithLabelValues(outcomeRejected).Inc()
		d.log.Error("the scheduler refused the discovered endpoints; the previous lists stay", zap.Error(err),
			zap.Strings("prefill", urls(prefill)), zap.Strings("decode", urls(decode)))
		return due
	}
	d.metrics.updates.WithLabelValues(outcomeApplied).Inc()
	for _, p := range pools {
		if p.pool == nil {
			continue
		}
		added, removed := diff(d.applied[p.role], want[p.role])
		d.applied[p.role] = want[p.role]
		d.metrics.endpoints.WithLabelValues(string(p.role), stateScheduled).Set(float64(len(want[p.role])))
		if initial || len(added) > 0 || len(removed) > 0 {
			d.log.Info("discovered endpoints applied", zap.String("role", string(p.role)),
				zap.String("service", p.pool.Service), zap.Int("endpoints", len(want[p.role])),
				zap.Strings("added", added), zap.Strings("removed", removed), zap.Int("joining", joining[p.role]))
		}
	}
	return due
}

// admit returns the engines of found that may be handed to the setter now:
// those already handed, all of them on the first sync or without a join
// delay, and those listed for the join delay. It also returns how many wait
// and when the first of them is due (zero if none). It records in listed
// the keys of every found engine.
func (d *Discovery) admit(role scheduler.Role, found []scheduler.EndpointSpec, now time.Time, initial bool,
	listed map[string]bool) (admitted []scheduler.EndpointSpec, waiting int, due time.Time) {
	applied := make(map[string]bool, len(d.applied[role]))
	for _, s := range d.applied[role] {
		applied[s.URL] = true
	}
	for _, s := range found {
		key := string(role) + " " + s.URL
		listed[key] = true
		seen, ok := d.firstSeen[key]
		if !ok {
			seen = now
			d.firstSeen[key] = now
		}
		if applied[s.URL] || initial || d.opts.JoinDelay == 0 || now.Sub(seen) >= d.opts.JoinDelay {
			admitted = append(admitted, s)
			continue
		}
		if !ok {
			d.log.Info("engine ready; it is scheduled after the join delay", zap.String("role", string(role)),
				zap.String("url", s.URL), zap.Duration("join_delay", d.opts.JoinDelay))
		}
		waiting++
		if at := seen.Add(d.opts.JoinDelay); due.IsZero() || at.Before(due) {
			due = at
		}
	}
	return admitted, waiting, due
}

// reportProblems sets the invalid-slices gauge and logs the problems when
// they differ from the last ones logged.
func (d *Discovery) reportProblems(problems []error) {
	d.metrics.invalid.Set(float64(len(problems)))
	msgs := make([]string, len(problems))
	for i, p := range problems {
		msgs[i] = p.Error()
	}
	sort.Strings(msgs)
	joined := strings.Join(msgs, "\n")
	if joined == d.problems {
		return
	}
	d.problems = joined
	if len(msgs) > 0 {
		d.log.Warn("EndpointSlices skipped", zap.Strings("problems", msgs))
	} else {
		d.log.Info("no EndpointSlice is skipped any more")
	}
}

// diff returns the URLs in b and not in a (added) and in a and not in b
// (removed).
func diff(a, b []scheduler.EndpointSpec) (added, removed []string) {
	in := func(list []scheduler.EndpointSpec, url string) bool {
		return slices.ContainsFunc(list, func(s scheduler.EndpointSpec) bool { return s.URL == url })
	}
	for _, s := range b {
		if !in(a, s.URL) {
			added = append(added, s.URL)
		}
	}
	for _, s := range a {
		if !in(b, s.URL) {
			removed = append(removed, s.URL)
		}
	}
	return added, removed
}

// urls returns the specs' URLs.
func urls(specs []scheduler.EndpointSpec) []string {
	out := make([]string, len(specs))
	for i, s := range specs {
		out[i] = s.URL
	}
	return out
}
