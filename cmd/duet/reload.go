package main

import (
	"context"
	"reflect"
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

// endpointSetter is what a reload needs from the scheduler.
type endpointSetter interface {
	SetEndpoints(ctx context.Context, prefill, decode []scheduler.EndpointSpec) error
}

// reloader applies the configuration file again on SIGHUP. Only the
// endpoint lists change live; every other field keeps the value duet
// started with, and a reload that changes one is applied without it, with a
// warning naming the fields that need a restart. Its methods are not safe
// for concurrent use: serve calls them from one goroutine.
type reloader struct {
	path    string
	log     *zap.Logger
	sched   endpointSetter
	running *config.Config // as started, with the endpoint lists last applied
	reloads *prometheus.CounterVec
}

// newReloader returns a reloader for the configuration file at path, whose
// running configuration is cfg (it is copied). reg may be nil.
func newReloader(path string, cfg *config.Config, sched endpointSetter, log *zap.Logger, reg prometheus.Registerer) *reloader {
	running := *cfg
	r := &reloader{
		path:    path,
		log:     log,
		sched:   sched,
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
	if r.running.Kubernetes != nil {
		// Kubernetes discovery owns the endpoint lists.
		r.reloads.WithLabelValues(reloadOK).Inc()
		if len(restart) > 0 {
			log.Warn("configuration reloaded, except fields that need a restart: they keep their running values",
				zap.Strings("fields", restart))
		}
		log.Info("configuration reloaded; the endpoints come from Kubernetes discovery")
		return reloadOK
	}
	if err := r.sched.SetEndpoints(ctx, endpointSpecs(next.Prefill), endpointSpecs(next.Decode)); err != nil {
		if ctx.Err() == nil {
			return r.reject(log, err)
		}
		// Shutting down: the lists were applied, only the discovery of the
		// new endpoints was cut short.
	}
	r.running.Prefill, r.running.Decode = next.Prefill, next.Decode
	r.reloads.WithLabelValues(reloadOK).Inc()
	if len(restart) > 0 {
		log.Warn("configuration reloaded, except fields that need a restart: they keep their running values",
			zap.Strings("fields", restart))
	}
	log.Info("configuration reloaded",
		zap.Int("prefill_endpoints", len(next.Prefill)), zap.Int("decode_endpoints", len(next.Decode)))
	return reloadOK
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
	v, w := reflect.ValueOf(running).Elem(), reflect.ValueOf(next).Elem()
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
