package config

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"math"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/duet-router/duet/envoy/contract"
	"github.com/duet-router/duet/scheduler"
	"github.com/duet-router/duet/scheduler/admit"
)

// Admission configures the admission queue (package scheduler/admit): while
// every target of one of a pool's roles is saturated, duet holds requests
// in a queue of its own, strictly by priority class and fairly between the
// tenants of a class, and refuses early (429) what cannot start within its
// class's wait limit.
type Admission struct {
	// Enabled turns the queue on (default true). Off, duet routes every
	// request at once, however full the engines are.
	Enabled bool `yaml:"enabled"`
	// Classes are the priority classes; default one class named "default".
	Classes []AdmissionClass `yaml:"classes"`
	// DefaultClass is the class of a request no rule names; default the
	// lowest-priority class (the first listed of those).
	DefaultClass string `yaml:"default_class"`
	// ClassHeader names a request header whose value names the request's
	// class. It must start with x-duet- unless TrustClientHeaders.
	ClassHeader string `yaml:"class_header"`
	// TenantHeader names a request header whose value is the request's
	// tenant. It must start with x-duet- unless TrustClientHeaders.
	TenantHeader string `yaml:"tenant_header"`
	// TenantFromAPIKey makes the tenant the first 16 hex digits of the
	// SHA-256 of the request's bearer token where TenantHeader gives none.
	TenantFromAPIKey bool `yaml:"tenant_from_api_key"`
	// TrustClientHeaders allows ClassHeader and TenantHeader outside
	// x-duet-*, for a gateway in front of duet's Envoy that sets them and
	// strips the clients' own copies.
	TrustClientHeaders bool `yaml:"trust_client_headers"`
	// APIKeys maps the hex SHA-256 of a bearer token to a class name.
	APIKeys map[string]string `yaml:"api_keys"`
	// Models maps a model name, as clients send it, to a class name.
	Models map[string]string `yaml:"models"`
	// Pools maps a pool name to a class name.
	Pools map[string]string `yaml:"pools"`
	// TenantWeights are the tenants' shares inside a class; a tenant not
	// listed weighs 1.
	TenantWeights map[string]float64 `yaml:"tenant_weights"`
	// MaxQueued bounds the requests queued per pool, all classes together;
	// it must stay below envoy.max_routing_requests. Default
	// DefaultAdmissionMaxQueued, or half of envoy.max_routing_requests
	// where that is less.
	MaxQueued int `yaml:"max_queued"`
	// MaxQueuedTokens bounds the tokens queued per pool.
	MaxQueuedTokens int64 `yaml:"max_queued_tokens"`
	// EnginePriorityMode says when duet writes SGLang's `priority` request
	// field (AdmissionClass.EnginePriority): auto, on or off.
	EnginePriorityMode string `yaml:"engine_priority"`
	// Saturation says when a target counts as saturated.
	Saturation Saturation `yaml:"saturation"`
}

// AdmissionClass is one priority class.
type AdmissionClass struct {
	// Name names the class in the class header, the rules and metrics.
	Name string `yaml:"name"`
	// Priority orders the classes: a higher class is always let through
	// first, and a full queue sheds lower classes first.
	Priority int `yaml:"priority"`
	// WaitLimit is the longest a request of the class waits in the queue
	// (default DefaultAdmissionWaitLimit, at most MaxAdmissionWaitLimit).
	WaitLimit time.Duration `yaml:"wait_limit"`
	// EnginePriority is the `priority` field written into the class's
	// requests where the engines schedule by priority; nil means Priority.
	EnginePriority *int `yaml:"engine_priority"`
	// SaturationShare scales the saturation thresholds for the class, in
	// (0, 1]; 0 (unset) means 1. A class below 1 stops going through
	// while the engines still have room for the classes above it.
	SaturationShare float64 `yaml:"saturation_share"`
}

// Saturation configures when a target is saturated
// (scheduler.SaturationConfig); -1 turns a measure off.
type Saturation struct {
	// PrefillTokens: pending prompt tokens of a prefill target.
	PrefillTokens int64 `yaml:"prefill_tokens"`
	// KVFraction: a decode target's token load as a share of its KV
	// capacity.
	KVFraction float64 `yaml:"kv_fraction"`
	// Waiting: requests an engine reports waiting.
	Waiting int `yaml:"waiting"`
}

// The engine_priority modes.
const (
	// EnginePriorityAuto writes the field to a pool's engines when every
	// one of them advertises enable_priority_scheduling in /server_info:
	// the default.
	EnginePriorityAuto = "auto"
	// EnginePriorityOn always writes it.
	EnginePriorityOn = "on"
	// EnginePriorityOff never writes it.
	EnginePriorityOff = "off"
)

// Defaults and bounds of the admission section.
const (
	// DefaultAdmissionClass names the one class of a section that lists
	// none.
	DefaultAdmissionClass = "default"
	// DefaultAdmissionWaitLimit is a class's wait limit when unset.
	DefaultAdmissionWaitLimit = 10 * time.Second
	// MaxAdmissionWaitLimit bounds every class's wait limit: a queued
	// request holds its client, its ext_proc stream and Envoy's patience.
	MaxAdmissionWaitLimit = 5 * time.Minute
	// DefaultAdmissionMaxQueued is max_queued's default where
	// envoy.max_routing_requests leaves room for it.
	DefaultAdmissionMaxQueued = 128
	// DefaultAdmissionMaxQueuedTokens is max_queued_tokens' default.
	DefaultAdmissionMaxQueuedTokens = 4 << 20
	// SaturationOff turns a saturation measure off.
	SaturationOff = -1
)

// className is a class name: safe in a header value, a metric label and
// a URL.
var className = regexp.MustCompile(`^[A-Za-z0-9][-_.A-Za-z0-9]{0,62}$`)

// headerName is an HTTP header name (RFC 9110 token characters).
var headerName = regexp.MustCompile("^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")

// prepareAdmissionDefaults sets the defaults that an absent section must
// still get before decoding: a section's zero value cannot tell an unset
// enabled from false.
func (c *Config) prepareAdmissionDefaults() { c.Admission.Enabled = true }

// applyDefaults sets the defaults of the section's zero values;
// maxRouting is envoy.max_routing_requests, after its own default.
func (a *Admission) applyDefaults(maxRouting int) {
	if len(a.Classes) == 0 {
		a.Classes = []AdmissionClass{{Name: DefaultAdmissionClass}}
	}
	for i := range a.Classes {
		if a.Classes[i].WaitLimit == 0 {
			a.Classes[i].WaitLimit = DefaultAdmissionWaitLimit
		}
	}
	setDefault(&a.DefaultClass, a.lowestClass())
	setDefault(&a.EnginePriorityMode, EnginePriorityAuto)
	if a.MaxQueued == 0 {
		a.MaxQueued = max(min(DefaultAdmissionMaxQueued, maxRouting/2), 1)
	}
	if a.MaxQueuedTokens == 0 {
		a.MaxQueuedTokens = DefaultAdmissionMaxQueuedTokens
	}
	s := &a.Saturation
	if s.PrefillTokens == 0 {
		s.PrefillTokens = scheduler.DefaultSaturationPrefillTokens
	}
	if s.KVFraction == 0 {
		s.KVFraction = scheduler.DefaultSaturationKVFraction
	}
	if s.Waiting == 0 {
		s.Waiting = scheduler.DefaultSaturationWaiting
	}
}

// lowestClass names the first listed of the lowest-priority classes.
func (a *Admission) lowestClass() string {
	low := -1
	for i, c := range a.Classes {
		if low < 0 || c.Priority < a.Classes[low].Priority {
			low = i
		}
	}
	if low < 0 {
		return ""
	}
	return a.Classes[low].Name
}

// validateAdmission checks the admission section against the rest of the
// configuration (its pools, envoy.max_routing_requests), naming each field.
func (c *Config) validateAdmission() []error {
	a := &c.Admission
	errs := a.validateClasses()
	errs = append(errs, a.validateRules(c.PoolList())...)
	errs = append(errs, a.validateHeaders()...)
	errs = append(errs, a.validateBounds(c.Envoy.MaxRoutingRequests)...)
	return append(errs, a.Saturation.validate()...)
}

// validateClasses checks the classes and the default class.
func (a *Admission) validateClasses() []error {
	var errs []error
	seen := map[string]int{}
	for i, cl := range a.Classes {
		field := fmt.Sprintf("admission.classes[%d]", i)
		switch j, dup := seen[cl.Name]; {
		case !className.MatchString(cl.Name):
			errs = append(errs, fmt.Errorf("%s.name: %q is not a class name (letters, digits, '-', '_' and '.', at most 63, starting with a letter or digit)", field, cl.Name))
		case dup:
			errs = append(errs, fmt.Errorf("%s.name: %q is also admission.classes[%d].name", field, cl.Name, j))
		}
		seen[cl.Name] = i
		if cl.WaitLimit <= 0 || cl.WaitLimit > MaxAdmissionWaitLimit {
			errs = append(errs, fmt.Errorf("%s.wait_limit: %v is not in (0, %v]", field, cl.WaitLimit, MaxAdmissionWaitLimit))
		}
		if !(cl.SaturationShare >= 0 && cl.SaturationShare <= 1) {
			errs = append(errs, fmt.Errorf("%s.saturation_share: %v is not in (0, 1]", field, cl.SaturationShare))
		}
	}
	if err := a.checkClass("admission.default_class", a.DefaultClass); err != nil {
		errs = append(errs, err)
	}
	return errs
}

// checkClass reports a field that names no defined class.
func (a *Admission) checkClass(field, name string) error {
	if slices.ContainsFunc(a.Classes, func(c AdmissionClass) bool { return c.Name == name }) {
		return nil
	}
	return fmt.Errorf("%s: %q is not a class of admission.classes (%s)", field, name, strings.Join(a.ClassNames(), ", "))
}

// validateRules checks the api_keys, models and pools rules and the tenant
// weights; pools are the configuration's pools.
func (a *Admission) validateRules(pools []Pool) []error {
	var errs []error
	hashes := map[string]string{}
	for _, k := range sortedKeys(a.APIKeys) {
		field := "admission.api_keys." + k
		if b, err := hex.DecodeString(k); err != nil || len(b) != sha256.Size {
			errs = append(errs, fmt.Errorf("%s: the key is not the hex SHA-256 of a token (64 hex digits: printf %%s \"$KEY\" | sha256sum)", field))
		} else if prev, dup := hashes[strings.ToLower(k)]; dup {
			errs = append(errs, fmt.Errorf("%s: the same hash as admission.api_keys.%s", field, prev))
		}
		hashes[strings.ToLower(k)] = k
		if err := a.checkClass(field, a.APIKeys[k]); err != nil {
			errs = append(errs, err)
		}
	}
	served, names := poolModels(pools)
	for _, m := range sortedKeys(a.Models) {
		field := "admission.models." + m
		if m == "" || (served != nil && !served[m]) {
			errs = append(errs, fmt.Errorf("%s: %q is not a model or alias of any pool", field, m))
		}
		if err := a.checkClass(field, a.Models[m]); err != nil {
			errs = append(errs, err)
		}
	}
	for _, p := range sortedKeys(a.Pools) {
		field := "admission.pools." + p
		if !slices.Contains(names, p) {
			errs = append(errs, fmt.Errorf("%s: %q is not a pool (%s)", field, p, strings.Join(names, ", ")))
		}
		if err := a.checkClass(field, a.Pools[p]); err != nil {
			errs = append(errs, err)
		}
	}
	for _, t := range sortedKeys(a.TenantWeights) {
		if w := a.TenantWeights[t]; !(w > 0) || math.IsInf(w, 0) {
			errs = append(errs, fmt.Errorf("admission.tenant_weights.%s: %v is not a positive weight", t, w))
		}
	}
	return errs
}

// poolModels returns the model names (and aliases) the pools serve, nil
// for the implicit pool (which serves every model), and the pools' names.
func poolModels(pools []Pool) (served map[string]bool, names []string) {
	for _, p := range pools {
		names = append(names, p.Name)
		if p.Implicit() {
			continue
		}
		if served == nil {
			served = map[string]bool{}
		}
		for _, m := range slices.Concat(p.Models, p.Aliases) {
			served[m] = true
		}
	}
	return served, names
}

// sortedKeys returns m's keys in order, so that errors come out stable.
func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// validateHeaders checks the class and tenant headers: names duet's Envoy
// strips from clients (x-duet-*), so that only the gateway's own filters
// can set them, unless the clients' headers are trusted.
func (a *Admission) validateHeaders() []error {
	var errs []error
	for _, h := range []struct{ field, name string }{
		{"admission.class_header", a.ClassHeader}, {"admission.tenant_header", a.TenantHeader},
	} {
		if h.name == "" {
			continue
		}
		if err := checkAdmissionHeader(h.name, a.TrustClientHeaders); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", h.field, err))
		}
	}
	if a.ClassHeader != "" && strings.EqualFold(a.ClassHeader, a.TenantHeader) {
		errs = append(errs, fmt.Errorf("admission.tenant_header: %q is also admission.class_header", a.TenantHeader))
	}
	return errs
}

// checkAdmissionHeader checks one header name.
func checkAdmissionHeader(name string, trusted bool) error {
	lower := strings.ToLower(name)
	switch {
	case !headerName.MatchString(name):
		return fmt.Errorf("%q is not a header name", name)
	case lower == "authorization":
		return errors.New(`"authorization" carries the client's token: name keys in api_keys, or set tenant_from_api_key`)
	case slices.Contains(duetHeaders, lower):
		return fmt.Errorf("%q is one of duet's own routing headers", name)
	case !trusted && !strings.HasPrefix(lower, contract.HeaderPrefix):
		return fmt.Errorf("%q does not start with %s: duet's Envoy strips every client-sent %s* header, so only the gateway's own filters "+
			"(a JWT filter's claim_to_headers, ext_authz, Lua, Envoy Gateway's SecurityPolicy, Istio's outputClaimToHeaders) can set one; "+
			"any other header is the client's word. Set admission.trust_client_headers where a gateway in front sets it and strips the clients' copies",
			name, contract.HeaderPrefix, contract.HeaderPrefix)
	}
	return nil
}

// duetHeaders are the headers duet and its Envoy set themselves.
var duetHeaders = []string{
	contract.HeaderDecodeEndpoint, contract.HeaderPrefillEndpoint, contract.HeaderMirror, contract.HeaderPrefillRank,
	contract.HeaderDPRank, contract.HeaderDecodeBodyRank, contract.HeaderRequestID, contract.HeaderDuetRequestID, contract.HeaderPool,
}

// validateBounds checks the queue's bounds and the engine_priority mode;
// maxRouting is envoy.max_routing_requests.
func (a *Admission) validateBounds(maxRouting int) []error {
	var errs []error
	switch {
	case a.MaxQueued <= 0:
		errs = append(errs, fmt.Errorf("admission.max_queued: %d must be positive", a.MaxQueued))
	case a.MaxQueued >= maxRouting:
		errs = append(errs, fmt.Errorf("admission.max_queued: %d is not below envoy.max_routing_requests %d: each queued request holds its ext_proc stream, "+
			"so Envoy would shed 503 at its own limit before duet could shed by class (429); lower admission.max_queued or raise envoy.max_routing_requests",
			a.MaxQueued, maxRouting))
	}
	if a.MaxQueuedTokens <= 0 {
		errs = append(errs, fmt.Errorf("admission.max_queued_tokens: %d must be positive", a.MaxQueuedTokens))
	}
	switch a.EnginePriorityMode {
	case EnginePriorityAuto, EnginePriorityOn, EnginePriorityOff:
	default:
		errs = append(errs, fmt.Errorf("admission.engine_priority: %q is not %s, %s or %s", a.EnginePriorityMode, EnginePriorityAuto, EnginePriorityOn, EnginePriorityOff))
	}
	return errs
}

// validate checks the saturation thresholds (after defaults).
func (s Saturation) validate() []error {
	var errs []error
	if s.PrefillTokens <= 0 && s.PrefillTokens != SaturationOff {
		errs = append(errs, fmt.Errorf("admission.saturation.prefill_tokens: %d is neither a token count nor -1 (off)", s.PrefillTokens))
	}
	if (!(s.KVFraction > 0) || s.KVFraction > 1) && s.KVFraction != SaturationOff {
		errs = append(errs, fmt.Errorf("admission.saturation.kv_fraction: %v is neither in (0, 1] nor -1 (off)", s.KVFraction))
	}
	if s.Waiting <= 0 && s.Waiting != SaturationOff {
		errs = append(errs, fmt.Errorf("admission.saturation.waiting: %d is neither a request count nor -1 (off)", s.Waiting))
	}
	return errs
}

// ClassNames returns the classes' names, in order.
func (a Admission) ClassNames() []string {
	names := make([]string, len(a.Classes))
	for i, c := range a.Classes {
		names[i] = c.Name
	}
	return names
}

// AdmitConfig returns the queue's configuration: the classes, in order,
// the bounds and the tenants' weights.
func (a Admission) AdmitConfig() admit.Config {
	cfg := admit.Config{MaxRequests: a.MaxQueued, MaxTokens: a.MaxQueuedTokens}
	for _, c := range a.Classes {
		cfg.Classes = append(cfg.Classes, admit.Class{Name: c.Name, Priority: c.Priority, WaitLimit: c.WaitLimit, Share: c.SaturationShare})
	}
	cfg.Weights = maps.Clone(a.TenantWeights)
	return cfg
}

// AdmitRules returns the classification rules; their Classes are in
// AdmitConfig's order.
func (a Admission) AdmitRules() admit.Rules {
	return admit.Rules{
		Classes: a.ClassNames(), Default: a.DefaultClass, ClassHeader: strings.ToLower(a.ClassHeader),
		APIKeys: maps.Clone(a.APIKeys), Models: maps.Clone(a.Models), Pools: maps.Clone(a.Pools),
		TenantHeader: strings.ToLower(a.TenantHeader), TenantFromAPIKey: a.TenantFromAPIKey,
	}
}

// SaturationConfig returns the saturation thresholds (a measure that is
// off is negative).
func (a Admission) SaturationConfig() scheduler.SaturationConfig {
	s := a.Saturation
	return scheduler.SaturationConfig{PrefillTokens: s.PrefillTokens, KVFraction: s.KVFraction, Waiting: s.Waiting}
}

// MaxWaitLimit is the longest wait limit of any class: how long Envoy must
// let a queued request's ext_proc exchange last.
func (a Admission) MaxWaitLimit() time.Duration {
	var longest time.Duration
	for _, c := range a.Classes {
		longest = max(longest, c.WaitLimit)
	}
	return longest
}

// EnginePriority is the SGLang `priority` value of class: its
// engine_priority as set, else its priority, negated for engines that
// serve low values first (lowValuesFirst) so that the classes' order
// holds there too; 0 for a class that is not defined.
func (a Admission) EnginePriority(class string, lowValuesFirst bool) int {
	for _, c := range a.Classes {
		if c.Name != class {
			continue
		}
		switch {
		case c.EnginePriority != nil:
			return *c.EnginePriority
		case lowValuesFirst:
			return -c.Priority
		}
		return c.Priority
	}
	return 0
}

// WritesEnginePriority reports whether duet writes the `priority` field
// into a pool's requests, given whether every engine of the pool
// advertises enable_priority_scheduling.
func (a Admission) WritesEnginePriority(advertised bool) bool {
	switch a.EnginePriorityMode {
	case EnginePriorityOn:
		return true
	case EnginePriorityOff:
		return false
	}
	return advertised
}
