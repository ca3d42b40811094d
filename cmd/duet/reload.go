package main

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/duet-router/duet/cmd/duet/internal/config"
	"github.com/duet-router/duet/scheduler"
)

// Outcomes of duet_config_reloads_total.
const (
	reloadOK      = "ok"
	reloadInvalid = "invalid"
)

// endpointSetter is what a reload (and Kubernetes discovery) needs from a
// pool's scheduler.
type endpointSetter interface {
	SetEndpoints(ctx context.Context, prefill, decode []scheduler.EndpointSpec) error
	// PD reports whether the pool disaggregates prefill and decode.
	PD() bool
}

// reloader applies the configuration file again on SIGHUP. Only the
// endpoint lists (top-level, or of each pool) change live; every other field keeps the value duet
// started with, and a reload that changes one is applied without it, with a
// warning naming the fields that need a restart. Its methods are not safe
// for concurrent use: serve calls them from one goroutine.
type reloader struct {
	path    string
	log     *zap.Logger
	scheds  map[string]endpointSetter // by pool name
	running *config.Config            // as started, with the endpoint lists last applied
	reloads *prometheus.CounterVec
}

// newReloader returns a reloader for the configuration file at path, whose
// running configuration is cfg (it is copied). reg may be nil.
func newReloader(path string, cfg *config.Config, scheds map[string]endpointSetter, log *zap.Logger, reg prometheus.Registerer) *reloader {
	running := *cfg
	running.Pools = slices.Clone(cfg.Pools)
	r := &reloader{
		path:    path,
		log:     log,
		scheds:  scheds,
		running: &running,
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_config_reloads_total",
			Help: "Configuration reloads (SIGHUP), by outcome: ok (the endpoint lists were applied) or invalid (the file was rejected and the running configuration kept).",
		}, []string{"outcome"}),
	}
	for _, o := range []string{reloadOK, reloadInvalid} {
		r.reloads.WithLabelValues(o)
	}
	if reg != nil {
		reg.MustRegister(r.reloads)
	}
	return r
}

// reload reads the configuration file and applies its endpoint lists. A
// file that does not load or validate, or whose lists the scheduler rejects
// (switching between PD and aggregated mode, two URLs naming one engine),
// changes nothing and is logged as an error. Fields that cannot change
// live are compared with the running configuration and, where they differ,
// named in a warning and left as they are. It returns the reload's outcome.
func (r *reloader) reload(ctx context.Context) string {
	log := r.log.With(zap.String("config", r.path))
	next, err := config.Load(r.path)
	if err != nil {
		return r.reject(log, err)
	}
	restart := restartFields(r.running, next)
	// The pools running, and their lists as the file now has them. A pool
	// added, removed or renamed needs a restart; the others get their lists.
	discovered := map[string]bool{}
	for _, p := range r.running.PoolList() {
		discovered[p.Name] = p.Kubernetes != nil
	}
	var apply []config.Pool
	for _, p := range next.PoolList() {
		if p.Kubernetes != nil || discovered[p.Name] {
			continue // Kubernetes discovery owns the pool's lists
		}
		sched, ok := r.scheds[p.Name]
		if !ok {
			continue
		}
		if sched.PD() != p.PD() {
			// Refused before any pool is changed (each scheduler refuses it
			// too, but only once the pools before it were applied).
			return r.reject(log, fmt.Errorf("pool %s: %w", p.Name, scheduler.ErrModeChange))
		}
		apply = append(apply, p)
	}
	for _, p := range apply {
		if err := r.scheds[p.Name].SetEndpoints(ctx, endpointSpecs(p.Prefill), endpointSpecs(p.Decode)); err != nil {
			if ctx.Err() == nil {
				return r.reject(log, fmt.Errorf("pool %s: %w", p.Name, err))
			}
			// Shutting down: the lists were applied, only the discovery of
			// the new endpoints was cut short.
		}
		log.Info("endpoints reloaded", zap.String("pool", p.Name),
			zap.Int("prefill_endpoints", len(p.Prefill)), zap.Int("decode_endpoints", len(p.Decode)))
	}
	r.running.Prefill, r.running.Decode = next.Prefill, next.Decode
	r.running.Pools = withLists(r.running.Pools, next.Pools)
	r.reloads.WithLabelValues(reloadOK).Inc()
	if len(restart) > 0 {
		log.Warn("configuration reloaded, except fields that need a restart: they keep their running values",
			zap.Strings("fields", restart))
	}
	if len(apply) == 0 {
		log.Info("configuration reloaded; the endpoints come from Kubernetes discovery")
	} else {
		log.Info("configuration reloaded")
	}
	return reloadOK
}

// withLists returns running's pools with the endpoint lists of next's pools
// of the same name at the same place.
func withLists(running, next []config.Pool) []config.Pool {
	out := slices.Clone(running)
	for i := range out {
		if i < len(next) && next[i].Name == out[i].Name {
			out[i].Prefill, out[i].Decode = next[i].Prefill, next[i].Decode
		}
	}
	return out
}

// reject logs a rejected reload and counts it.
func (r *reloader) reject(log *zap.Logger, err error) string {
	r.reloads.WithLabelValues(reloadInvalid).Inc()
	log.Error("configuration reload rejected: the running configuration stays in force", zap.Error(err))
	return reloadInvalid
}

// liveFields are the top-level fields a reload applies (YAML names).
var liveFields = map[string]bool{"prefill": true, "decode": true}

// restartFields names, by their YAML paths (e.g. "listen.grpc",
// "policy.decode.name"), the fields that differ between running and next
// and that only a restart applies: every field but the endpoint lists.
func restartFields(running, next *config.Config) []string {
	var out []string
	// Each pool's lists are live too: compare the rest of the pools.
	cmp := *next
	cmp.Pools = withLists(next.Pools, running.Pools)
	v, w := reflect.ValueOf(running).Elem(), reflect.ValueOf(&cmp).Elem()
	t := v.Type()
	for i := range t.NumField() {
		name := yamlName(t.Field(i))
		if liveFields[name] {
			continue
		}
		out = diffFields(name, v.Field(i), w.Field(i), out)
	}
	return out
}

// diffFields appends to out the paths under name where a and b differ:
// structs field by field, anything else as a whole.
func diffFields(name string, a, b reflect.Value, out []string) []string {
	if a.Kind() != reflect.Struct {
		if !reflect.DeepEqual(a.Interface(), b.Interface()) {
			out = append(out, name)
		}
		return out
	}
	t := a.Type()
	for i := range t.NumField() {
		out = diffFields(name+"."+yamlName(t.Field(i)), a.Field(i), b.Field(i), out)
	}
	return out
}

// yamlName returns a struct field's YAML key.
func yamlName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
	if name == "" {
		return strings.ToLower(f.Name)
	}
	return name
}
