package config

import (
	"fmt"
	"time"

	"github.com/duet-router/duet/scheduler/kvevents"
)

// The kv_events modes.
const (
	// KVEventsAuto follows the events of pools with a tokenizer: the
	// default.
	KVEventsAuto = "auto"
	// KVEventsOn follows the events of every pool (requests that carry
	// token ids, such as /generate with input_ids, need no tokenizer).
	KVEventsOn = "on"
	// KVEventsOff follows none.
	KVEventsOff = "off"
)

// KVEventsOptions configures following the engines' KV cache events
// (SGLang's --kv-events-config; docs/kv-events.md). duet subscribes to
// every rank of every engine that advertises its events in /server_info
// (kv_events), or that publishes on the ports configured here, and routes
// token-id requests on what the engines report they cache.
type KVEventsOptions struct {
	// Mode is auto (default: pools with a tokenizer), on (every pool) or
	// off.
	Mode string `yaml:"mode"`
	// Port is rank 0's PUB port of engines that do not advertise their
	// events (SGLang before kv_events in /server_info); rank r publishes on
	// Port+r. 0: only advertised events are followed.
	Port int `yaml:"port"`
	// ReplayPort is rank 0's replay (ROUTER) port of such engines; 0: none.
	ReplayPort int `yaml:"replay_port"`
	// Topic is such engines' topic (SGLang's default "").
	Topic string `yaml:"topic"`
	// MaxLag is how late a batch may arrive before its rank falls back to
	// the prefix estimate (default 5s; "-1s": never).
	MaxLag time.Duration `yaml:"max_lag"`
	// Warmup is how long a view that started mid-stream counts as partial
	// (default 1m).
	Warmup time.Duration `yaml:"warmup"`
	// ExpectFor is how long blocks routed to a rank count as cached there
	// before the engine reports them (default 30s).
	ExpectFor time.Duration `yaml:"expect_for"`
	// ProbeInterval is the time between TCP probes of each event port
	// (default 2s; "-1s": none).
	ProbeInterval time.Duration `yaml:"probe_interval"`
	// MaxPages bounds each rank's view, in engine pages (default 1048576).
	MaxPages int `yaml:"max_pages"`
}

// applyDefaults sets the defaults of the section's zero values.
func (k *KVEventsOptions) applyDefaults() {
	setDefault(&k.Mode, KVEventsAuto)
	for _, d := range []struct {
		field *time.Duration
		value time.Duration
	}{
		{&k.MaxLag, kvevents.DefaultMaxLag}, {&k.Warmup, kvevents.DefaultWarmup},
		{&k.ExpectFor, kvevents.DefaultExpectFor}, {&k.ProbeInterval, kvevents.DefaultProbeInterval},
	} {
		if *d.field == 0 {
			*d.field = d.value
		}
	}
	if k.MaxPages == 0 {
		k.MaxPages = kvevents.DefaultMaxPages
	}
}

// Enabled reports whether a pool follows its engines' events.
func (k KVEventsOptions) Enabled(p Pool) bool {
	switch k.Mode {
	case KVEventsOn:
		return true
	case KVEventsOff:
		return false
	}
	return p.Tokenizer != nil
}

// validate checks the section.
func (k KVEventsOptions) validate() []error {
	var errs []error
	switch k.Mode {
	case "", KVEventsAuto, KVEventsOn, KVEventsOff:
	default:
		errs = append(errs, fmt.Errorf("kv_events.mode: %q is not %s, %s or %s", k.Mode, KVEventsAuto, KVEventsOn, KVEventsOff))
	}
	for _, p := range []struct {
		field string
		port  int
	}{{"kv_events.port", k.Port}, {"kv_events.replay_port", k.ReplayPort}} {
		if p.port < 0 || p.port > 65535 {
			errs = append(errs, fmt.Errorf("%s: %d is not a port", p.field, p.port))
		}
	}
	if k.ReplayPort > 0 && k.Port == 0 {
		errs = append(errs, fmt.Errorf("kv_events.replay_port: set without kv_events.port"))
	}
	for _, d := range []struct {
		field string
		value time.Duration
	}{{"kv_events.warmup", k.Warmup}, {"kv_events.expect_for", k.ExpectFor}} {
		if d.value < 0 {
			errs = append(errs, fmt.Errorf("%s: %v must not be negative", d.field, d.value))
		}
	}
	if k.MaxPages < 0 {
		errs = append(errs, fmt.Errorf("kv_events.max_pages: %d must not be negative", k.MaxPages))
	}
	return errs
}
