// Package config loads and validates duet's YAML configuration: the engines of
// each role, the policies that pick among them, the addresses duet serves on,
// and the parameters of the Envoy bootstrap that `duet envoy-config` renders.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/scheduler"
)

// Config is the whole of duet's configuration file.
type Config struct {
	// Listen holds the addresses duet serves on.
	Listen Listen `yaml:"listen"`
	// LogLevel is a zap level name: debug, info, warn, error.
	LogLevel string `yaml:"log_level"`
	// Prefill lists the prefill engines. Empty means aggregated (non-PD) mode:
	// the decode list is then the one pool and nothing is mirrored.
	Prefill []Endpoint `yaml:"prefill"`
	// Decode lists the decode engines (or the aggregated pool).
	Decode []Endpoint `yaml:"decode"`
	// Kubernetes, when set, discovers the engines of both roles from
	// Kubernetes EndpointSlices; Prefill and Decode must then be empty.
	Kubernetes *Kubernetes `yaml:"kubernetes"`
	// Policy names the scheduling policy of each role.
	Policy Policy `yaml:"policy"`
	// EngineRanks makes duet choose engines only and leave DP ranks to the
	// engines (SGLang's own dispatch): the baseline for measuring duet's
	// rank-aware scheduling.
	EngineRanks bool `yaml:"engine_ranks"`
	// Discovery tunes how engines are asked for their DP size and bootstrap port.
	Discovery Discovery `yaml:"discovery"`
	// Load tunes load scraping and reservations.
	Load LoadOptions `yaml:"load"`
	// Health tunes health checks and the ejection of unhealthy engines.
	Health HealthOptions `yaml:"health"`
	// Prefix tunes the prefix index.
	Prefix PrefixOptions `yaml:"prefix"`
	// Tokenizer, when set, is the model's tokenizer for a configuration
	// without a pools section (each pool names its own): duet then routes
	// on token ids (docs/tokenizer.md). Off by default.
	Tokenizer *Tokenizer `yaml:"tokenizer"`
	// KVEvents configures following the engines' KV cache events
	// (docs/kv-events.md).
	KVEvents KVEventsOptions `yaml:"kv_events"`
	// Tokens tunes the token estimate.
	Tokens TokenOptions `yaml:"tokens"`
	// Request bounds what duet accepts from clients.
	Request Request `yaml:"request"`
	// Envoy parameterises the bootstrap rendered by `duet envoy-config`.
	Envoy Envoy `yaml:"envoy"`
	// Auth says who may call duet's gRPC port and read its status pages
	// (docs/security.md).
	Auth Auth `yaml:"auth"`
	// Pools, when set, are the models duet routes to, each with its own
	// engines, policies and clusters; the top-level prefill, decode and
	// kubernetes services must then be empty (docs/pools.md). Without it,
	// the top-level lists are one pool that serves every model.
	Pools []Pool `yaml:"pools"`
	// Sync, when set, makes duet one of several replicas that share their
	// view of the cluster over NATS (docs/replicas.md).
	Sync *Sync `yaml:"sync"`
	// Admission configures the queue that holds requests while a pool's
	// engines are saturated: priority classes, tenants, bounds.
	Admission Admission `yaml:"admission"`
	// OTLP, when set, turns on OpenTelemetry tracing: Envoy's spans and
	// duet's decision spans, exported over OTLP/gRPC (docs/tracing.md).
	OTLP *OTLP `yaml:"otlp"`
}

// Auth authenticates duet's callers. On the gRPC port, TLS and a token may
// be combined (both are then required); a gRPC port bound beyond loopback
// needs one of them, or Unauthenticated where something else (a mesh)
// authenticates.
type Auth struct {
	// TLS requires mutual TLS on the gRPC port.
	TLS *AuthTLS `yaml:"tls"`
	// TokenFile holds the accepted bearer tokens, one per line (blank lines
	// and lines starting with # are skipped). Envoy sends the first as
	// "authorization: Bearer <token>" gRPC metadata. Read again on SIGHUP.
	TokenFile string `yaml:"token_file"`
	// Unauthenticated accepts any caller on a gRPC port reachable from the
	// network: only where a mesh or network policy admits Envoy alone.
	Unauthenticated bool `yaml:"unauthenticated"`
	// AdminTokenFile holds the token that opens /status, /status.json,
	// /debug/* and pprof on an admin port bound beyond loopback. Read again
	// on SIGHUP.
	AdminTokenFile string `yaml:"admin_token_file"`
}

// AuthTLS is duet's side of mutual TLS on the gRPC port. The files are
// read again on SIGHUP.
type AuthTLS struct {
	// CertFile is duet's server certificate chain (PEM).
	CertFile string `yaml:"cert_file"`
	// KeyFile is its private key (PEM).
	KeyFile string `yaml:"key_file"`
	// ClientCAFile holds the CA certificates (PEM) a client certificate
	// must chain to.
	ClientCAFile string `yaml:"client_ca_file"`
	// ClientNames, when set, admits only client certificates one of whose
	// DNS or URI SANs, or whose common name, is listed.
	ClientNames []string `yaml:"client_names"`
}

// DuetTLS is Envoy's side of mutual TLS to duet, as `duet envoy-config`
// renders it on the clusters that reach duet.
type DuetTLS struct {
	// CertFile and KeyFile are Envoy's client certificate and key (PEM),
	// paths as Envoy sees them.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
	// CAFile holds the CA certificates that duet's server certificate
	// chains to.
	CAFile string `yaml:"ca_file"`
	// ServerName is sent as SNI and must be a DNS SAN of duet's
	// certificate.
	ServerName string `yaml:"server_name"`
}

// Listen holds duet's own addresses.
type Listen struct {
	// GRPC serves the Envoy ext_proc API (and, later, the access-log service).
	GRPC string `yaml:"grpc"`
	// Admin serves /healthz, /readyz, /metrics and the status page.
	Admin string `yaml:"admin"`
	// Pprof serves Go's profiles under /debug/pprof/ on the admin port. Off
	// by default: profiles show request data and cost CPU while taken.
	Pprof bool `yaml:"pprof"`
}

// Endpoint is one engine in the configuration.
type Endpoint struct {
	// URL is the engine's base URL, e.g. http://10.0.0.5:30000.
	URL string `yaml:"url"`
	// BootstrapPort is the prefill's disaggregation bootstrap port; 0 means
	// discover it from /server_info (falling back to SGLang's default 8998).
	BootstrapPort int `yaml:"bootstrap_port"`
	// DPSize is used only when discovery fails; 0 means discover.
	DPSize int `yaml:"dp_size"`
}

// Policy holds the policy of each role.
type Policy struct {
	Prefill PolicySpec `yaml:"prefill"`
	Decode  PolicySpec `yaml:"decode"`
}

// PolicySpec is a policy name with its parameters. In YAML it is either a
// bare name (`least_tokens`) or a mapping with a name and parameters.
type PolicySpec struct {
	// Name is the policy: round_robin, random, power_of_two, least_tokens,
	// prefix_hash, cache_aware, weighted or least_cost.
	Name string `yaml:"name"`
	// CacheThreshold (cache_aware): prefix-match fraction that pins a
	// request to the target caching it.
	CacheThreshold float64 `yaml:"cache_threshold"`
	// BalanceAbsTokens and BalanceRel (cache_aware): the imbalance past
	// which cache_aware balances by tokens instead.
	BalanceAbsTokens int64   `yaml:"balance_abs_tokens"`
	BalanceRel       float64 `yaml:"balance_rel"`
	// LoadFactor (prefix_hash): the bound on a target's load relative to the mean.
	LoadFactor float64 `yaml:"load_factor"`
	// Weights (weighted): scorer name (tokens, prefix, queue, kv) to weight.
	Weights map[string]float64 `yaml:"weights"`
	// Seed (random, power_of_two): 0 means random.
	Seed uint64 `yaml:"seed"`
	// IgnoreDecodeCache (least_cost, decode): price decode targets by load
	// alone, ignoring what a decode engine's radix cache holds.
	IgnoreDecodeCache bool `yaml:"ignore_decode_cache"`
}

// UnmarshalYAML accepts a bare policy name or a mapping; unknown keys in
// the mapping are errors.
func (p *PolicySpec) UnmarshalYAML(node *yaml.Node) error {
	if node.Kind == yaml.ScalarNode {
		p.Name = node.Value
		return nil
	}
	if node.Kind != yaml.MappingNode {
		return fmt.Errorf("line %d: a policy is a name or a mapping", node.Line)
	}
	known := map[string]bool{}
	t := reflect.TypeOf(*p)
	for i := range t.NumField() {
		known[strings.Split(t.Field(i).Tag.Get("yaml"), ",")[0]] = true
	}
	for i := 0; i < len(node.Content); i += 2 {
		if k := node.Content[i].Value; !known[k] {
			return fmt.Errorf("line %d: field %s not found in a policy", node.Content[i].Line, k)
		}
	}
	type plain PolicySpec // no UnmarshalYAML: avoids recursion
	return node.Decode((*plain)(p))
}

// LoadOptions configures load scraping and the reservation ledger.
type LoadOptions struct {
	// Interval between load scrapes of every engine; "-1s" disables them.
	Interval time.Duration `yaml:"interval"`
	// Timeout bounds one scrape.
	Timeout time.Duration `yaml:"timeout"`
	// Concurrency bounds the scrapes in flight.
	Concurrency int `yaml:"concurrency"`
	// StaleAfter is the age past which scraped numbers are not used.
	StaleAfter time.Duration `yaml:"stale_after"`
	// CoverDelay is the time for a request to reach its engine; a scrape
	// started later covers duet's reservation for it.
	CoverDelay time.Duration `yaml:"cover_delay"`
	// ReservationTTL ends reservations whose completion was never reported.
	ReservationTTL time.Duration `yaml:"reservation_ttl"`
	// PrefillAccounting is how prefill ranks are loaded: "in_flight" (the
	// prompt tokens of the prefill legs duet has in flight there, each
	// until its leg ends) or "covered" (reservations end at the first
	// covering scrape, as on decode). See docs/scheduling.md.
	PrefillAccounting string `yaml:"prefill_accounting"`
}

// Prefill accounting modes (LoadOptions.PrefillAccounting).
const (
	PrefillInFlight = "in_flight"
	PrefillCovered  = "covered"
)

// HealthOptions configures health checking and ejection (see
// docs/scheduling.md, "Health and ejection").
type HealthOptions struct {
	// Interval between active probes of every engine; "-1s" disables them.
	Interval time.Duration `yaml:"interval"`
	// Timeout bounds one probe.
	Timeout time.Duration `yaml:"timeout"`
	// Path is probed with GET on every engine; a 200 is healthy.
	Path string `yaml:"path"`
	// UnreachableToEject is how many legs in a row that got no response
	// from an engine's host eject the engine; -1 never.
	UnreachableToEject int `yaml:"unreachable_to_eject"`
	// FailuresToEject is how many failed legs in a row (5xx, reset,
	// timeout) eject one (engine, DP rank) target; -1 never.
	FailuresToEject int `yaml:"failures_to_eject"`
	// ProbeFailures is how many failed probes in a row, or load scrapes in
	// a row whose connection failed (not timed out), eject the engine; -1 never.
	ProbeFailures int `yaml:"probe_failures"`
	// BaseEjection is the first ejection's duration; each ejection in a row
	// doubles it.
	BaseEjection time.Duration `yaml:"base_ejection"`
	// MaxEjection caps the ejection duration.
	MaxEjection time.Duration `yaml:"max_ejection"`
}

// PrefixOptions configures the prefix index.
type PrefixOptions struct {
	// BlockBytes is the size of a hashed text block.
	BlockBytes int `yaml:"block_bytes"`
	// BlockTokens is the size of a hashed token-id block.
	BlockTokens int `yaml:"block_tokens"`
	// MaxBlocksPerTarget bounds the index's memory per (engine, rank).
	MaxBlocksPerTarget int `yaml:"max_blocks_per_target"`
}

// TokenOptions configures the token estimate.
type TokenOptions struct {
	// CharsPerToken is the starting ratio; engine-reported usage corrects it.
	CharsPerToken float64 `yaml:"chars_per_token"`
	// DefaultMaxTokens is the expected output per sequence in decode
	// reservations, and the cap of a requested max_tokens.
	DefaultMaxTokens int `yaml:"default_max_tokens"`
}

// Discovery tunes engine discovery.
type Discovery struct {
	// Interval between discovery rounds.
	Interval time.Duration `yaml:"interval"`
	// Timeout of one discovery HTTP call.
	Timeout time.Duration `yaml:"timeout"`
}

// Request bounds client requests.
type Request struct {
	// MaxBodyBytes is the largest request body accepted. Envoy's buffer limit
	// and duet's gRPC receive limit are derived from it.
	MaxBodyBytes int `yaml:"max_body_bytes"`
}

// Envoy parameterises the rendered Envoy bootstrap.
type Envoy struct {
	// Listen is the address Envoy accepts client traffic on.
	Listen string `yaml:"listen"`
	// Admin is Envoy's admin address.
	Admin string `yaml:"admin"`
	// Duet is the address at which Envoy reaches duet's gRPC port; defaults to
	// listen.grpc (with an unspecified host replaced by 127.0.0.1), unless
	// DuetReplicas is set.
	Duet string `yaml:"duet"`
	// DuetReplicas lists the gRPC addresses (host:port) of several duet
	// replicas: each becomes a host of both clusters that reach duet, which
	// Envoy health-checks and balances over. Not together with Duet.
	DuetReplicas []string `yaml:"duet_replicas"`
	// MessageTimeout bounds each ext_proc exchange.
	MessageTimeout time.Duration `yaml:"message_timeout"`
	// MaxRoutingRequests caps the requests Envoy may have in duet's hands
	// at once (open ext_proc streams: from a request's headers until duet
	// has answered its body). Beyond it Envoy sheds: an immediate 503,
	// rather than a queue that ends in message_timeout.
	MaxRoutingRequests int `yaml:"max_routing_requests"`
	// StreamIdleTimeout closes client streams idle for this long.
	StreamIdleTimeout time.Duration `yaml:"stream_idle_timeout"`
	// Clusters names the engine pools' clusters in Envoy's configuration.
	Clusters EnvoyClusters `yaml:"clusters"`
	// DuetTLS is Envoy's client certificate and the CA it trusts for duet,
	// required by `duet envoy-config` when auth.tls is set.
	DuetTLS *DuetTLS `yaml:"duet_tls"`
}

// EnvoyClusters names the clusters of the engine pools. `duet envoy-config`
// renders the defaults; a gateway that names clusters itself (Envoy Gateway
// names them after the HTTPRoute) needs its own names here.
type EnvoyClusters struct {
	// Decode is the decode (or aggregated) pool's cluster: duet tells the
	// decode leg's access-log entries by it.
	Decode string `yaml:"decode"`
	// Prefill is the prefill pool's cluster: duet names it in x-duet-mirror
	// and tells the prefill leg's access-log entries by it.
	Prefill string `yaml:"prefill"`
}

// Defaults used where the file is silent.
const (
	DefaultGRPC           = "127.0.0.1:9002"
	DefaultAdmin          = "127.0.0.1:9003"
	DefaultPrefillPolicy  = scheduler.DefaultPrefillPolicy
	DefaultDecodePolicy   = scheduler.DefaultDecodePolicy
	DefaultMaxBodyBytes   = 32 << 20
	DefaultEnvoyListen    = "127.0.0.1:8080"
	DefaultEnvoyAdmin     = "127.0.0.1:9901"
	DefaultMessageTimeout = 2 * time.Second
	// DefaultMaxRoutingRequests: see docs/configuration.md.
	DefaultMaxRoutingRequests = 256
	DefaultStreamIdleTimeout  = 15 * time.Minute
	DefaultDecodeCluster      = "duet_decode"
	DefaultPrefillCluster     = "duet_prefill"
	DefaultDiscoveryInterval  = 10 * time.Second
	DefaultDiscoveryTimeout   = 2 * time.Second

	DefaultHealthInterval     = 5 * time.Second
	DefaultHealthTimeout      = time.Second
	DefaultHealthPath         = "/health"
	DefaultUnreachableToEject = 1
	DefaultFailuresToEject    = 5
	DefaultProbeFailures      = 2
	DefaultBaseEjection       = 5 * time.Second
	DefaultMaxEjection        = 2 * time.Minute
	// DefaultDuetServerName is envoy.duet_tls.server_name's default, a SAN
	// of the server certificate `duet certs` makes.
	DefaultDuetServerName = "duet"
)

// Load reads, defaults and validates the configuration file at path. The
// relative paths of the files duet reads (auth, sync.nats, the tokenizers,
// kubernetes.kubeconfig) are made relative to the file's directory;
// envoy.duet_tls names Envoy's files, as Envoy sees them, and stays as
// written.
func Load(path string) (*Config, error) {
	cfg, _, err := load(path)
	return cfg, err
}

// LoadServing is Load for a duet that serves: it also checks that the
// files duet reads exist, naming each missing one's key and line.
func LoadServing(path string) (*Config, error) {
	cfg, pos, err := load(path)
	if err != nil {
		return nil, err
	}
	if errs := cfg.checkFiles(filepath.Dir(path)); len(errs) > 0 {
		return nil, fmt.Errorf("config %s: %w", path, errors.Join(pos.annotate(errs)...))
	}
	return cfg, nil
}

// load is Load, also returning the keys' lines.
func load(path string) (*Config, positions, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read config: %w", err)
	}
	cfg, pos, err := parse(data)
	if err != nil {
		return nil, nil, fmt.Errorf("config %s: %w", path, err)
	}
	cfg.resolvePaths(filepath.Dir(path))
	return cfg, pos, nil
}

// Parse decodes YAML (unknown fields are errors), applies defaults and
// validates. Each error names its key and, where the file has it, the
// key's line; an unknown key comes with the nearest valid one.
func Parse(data []byte) (*Config, error) {
	cfg, _, err := parse(data)
	return cfg, err
}

// parse is Parse, also returning the keys' lines.
func parse(data []byte) (*Config, positions, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		return nil, nil, fmt.Errorf("parse yaml: %w", err)
	}
	pos := positions{}
	if len(root.Content) > 0 {
		if errs := checkNode(root.Content[0], reflect.TypeFor[Config](), "", pos); len(errs) > 0 {
			return nil, nil, errors.Join(errs...)
		}
	}
	var cfg Config
	cfg.prepareAdmissionDefaults()
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
		return nil, nil, fmt.Errorf("parse yaml: %w", nameDecodeErrors(err, pos))
	}
	cfg.applyDefaults()
	if errs := cfg.validate(); len(errs) > 0 {
		return nil, nil, errors.Join(pos.annotate(errs)...)
	}
	return &cfg, pos, nil
}

func (c *Config) applyDefaults() {
	setDefault(&c.Listen.GRPC, DefaultGRPC)
	setDefault(&c.Listen.Admin, DefaultAdmin)
	setDefault(&c.LogLevel, "info")
	setDefault(&c.Policy.Prefill.Name, DefaultPrefillPolicy)
	setDefault(&c.Policy.Decode.Name, DefaultDecodePolicy)
	setDefault(&c.Envoy.Listen, DefaultEnvoyListen)
	setDefault(&c.Load.PrefillAccounting, PrefillInFlight)
	setDefault(&c.Envoy.Admin, DefaultEnvoyAdmin)
	setDefault(&c.Envoy.Clusters.Decode, DefaultDecodeCluster)
	setDefault(&c.Envoy.Clusters.Prefill, DefaultPrefillCluster)
	if c.Envoy.Duet == "" && len(c.Envoy.DuetReplicas) == 0 {
		c.Envoy.Duet = dialable(c.Listen.GRPC)
	}
	if c.Request.MaxBodyBytes == 0 {
		c.Request.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.Envoy.MaxRoutingRequests == 0 {
		c.Envoy.MaxRoutingRequests = DefaultMaxRoutingRequests
	}
	if c.Envoy.MessageTimeout == 0 {
		c.Envoy.MessageTimeout = DefaultMessageTimeout
	}
	if c.Envoy.StreamIdleTimeout == 0 {
		c.Envoy.StreamIdleTimeout = DefaultStreamIdleTimeout
	}
	if c.Discovery.Interval == 0 {
		c.Discovery.Interval = DefaultDiscoveryInterval
	}
	if c.Discovery.Timeout == 0 {
		c.Discovery.Timeout = DefaultDiscoveryTimeout
	}
	c.Health.applyDefaults()
	c.KVEvents.applyDefaults()
	c.Admission.applyDefaults(c.Envoy.MaxRoutingRequests)
	if t := c.Envoy.DuetTLS; t != nil {
		setDefault(&t.ServerName, DefaultDuetServerName)
	}
	if c.Sync != nil {
		c.Sync.applyDefaults()
	}
	if c.OTLP != nil {
		c.OTLP.applyDefaults()
	}
	if c.Kubernetes != nil {
		c.Kubernetes.applyDefaults()
	}
	c.applyPoolDefaults()
}

func (h *HealthOptions) applyDefaults() {
	setDefault(&h.Path, DefaultHealthPath)
	for _, d := range []struct {
		field *time.Duration
		value time.Duration
	}{
		{&h.Interval, DefaultHealthInterval}, {&h.Timeout, DefaultHealthTimeout},
		{&h.BaseEjection, DefaultBaseEjection}, {&h.MaxEjection, DefaultMaxEjection},
	} {
		if *d.field == 0 {
			*d.field = d.value
		}
	}
	for _, n := range []struct {
		field *int
		value int
	}{
		{&h.UnreachableToEject, DefaultUnreachableToEject}, {&h.FailuresToEject, DefaultFailuresToEject},
		{&h.ProbeFailures, DefaultProbeFailures},
	} {
		if *n.field == 0 {
			*n.field = n.value
		}
	}
}

func setDefault(field *string, value string) {
	if *field == "" {
		*field = value
	}
}

// dialable turns a listen address such as ":9002" or "0.0.0.0:9002" into one
// a client on the same host can dial.
func dialable(listen string) string {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return listen
	}
	if ip, err := netip.ParseAddr(host); host == "" || (err == nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// Validate reports every problem found, each naming its field.
func (c *Config) Validate() error { return errors.Join(c.validate()...) }

// validate is Validate, one error per problem.
func (c *Config) validate() []error {
	var errs []error
	check := func(field string, err error) {
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field, err))
		}
	}
	check("listen.grpc", validateHostPort(c.Listen.GRPC))
	check("listen.admin", validateHostPort(c.Listen.Admin))
	check("envoy.listen", validateHostPort(c.Envoy.Listen))
	check("envoy.admin", validateHostPort(c.Envoy.Admin))
	errs = append(errs, c.Envoy.validateDuet()...)
	if c.Envoy.Clusters.Decode == c.Envoy.Clusters.Prefill {
		errs = append(errs, fmt.Errorf("envoy.clusters: decode and prefill are both %q", c.Envoy.Clusters.Decode))
	}
	if c.Kubernetes != nil {
		errs = append(errs, c.Kubernetes.validate(c)...)
	} else if len(c.Decode) == 0 && len(c.Pools) == 0 {
		errs = append(errs, errors.New("decode: at least one endpoint is required (or a kubernetes section, or a pools section)"))
	}
	errs = append(errs, validateEndpoints("", c.Prefill, c.Decode, map[string]string{})...)
	errs = append(errs, c.validatePolicies()...)
	errs = append(errs, c.validatePools()...)
	errs = append(errs, c.validateTokenizers()...)
	errs = append(errs, c.KVEvents.validate()...)
	errs = append(errs, c.validateAdmission()...)
	if c.Request.MaxBodyBytes < 1024 {
		errs = append(errs, fmt.Errorf("request.max_body_bytes: %d is below the 1024-byte minimum", c.Request.MaxBodyBytes))
	}
	if c.Envoy.MaxRoutingRequests < 0 {
		errs = append(errs, errors.New("envoy.max_routing_requests: must be positive"))
	}
	if c.Envoy.MessageTimeout < 0 {
		errs = append(errs, errors.New("envoy.message_timeout: must be positive"))
	}
	if c.Discovery.Interval < 0 || c.Discovery.Timeout < 0 {
		errs = append(errs, errors.New("discovery: interval and timeout must be positive"))
	}
	if a := c.Load.PrefillAccounting; a != PrefillInFlight && a != PrefillCovered {
		errs = append(errs, fmt.Errorf("load.prefill_accounting: %q is not %s or %s", a, PrefillInFlight, PrefillCovered))
	}
	for _, d := range []struct {
		field string
		value time.Duration
	}{
		{"load.timeout", c.Load.Timeout}, {"load.stale_after", c.Load.StaleAfter},
		{"load.cover_delay", c.Load.CoverDelay}, {"load.reservation_ttl", c.Load.ReservationTTL},
	} {
		if d.value < 0 {
			errs = append(errs, fmt.Errorf("%s: %v must not be negative", d.field, d.value))
		}
	}
	for _, n := range []struct {
		field string
		value int
	}{
		{"load.concurrency", c.Load.Concurrency}, {"prefix.block_bytes", c.Prefix.BlockBytes},
		{"prefix.block_tokens", c.Prefix.BlockTokens}, {"prefix.max_blocks_per_target", c.Prefix.MaxBlocksPerTarget},
		{"tokens.default_max_tokens", c.Tokens.DefaultMaxTokens},
	} {
		if n.value < 0 {
			errs = append(errs, fmt.Errorf("%s: %d must not be negative", n.field, n.value))
		}
	}
	errs = append(errs, c.Health.validate()...)
	errs = append(errs, c.validateAuth()...)
	if c.Sync != nil {
		errs = append(errs, c.Sync.validate()...)
	}
	if c.OTLP != nil {
		errs = append(errs, c.OTLP.validate()...)
	}
	if c.Tokens.CharsPerToken < 0 {
		errs = append(errs, fmt.Errorf("tokens.chars_per_token: %v must not be negative", c.Tokens.CharsPerToken))
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log_level: %q is not one of debug, info, warn, error", c.LogLevel))
	}
	return errs
}

// validateEndpoints checks one pool's engine lists, naming each field
// under prefix; seen maps the URLs already listed (in any pool) to their
// fields, and gains these.
func validateEndpoints(prefix string, prefill, decode []Endpoint, seen map[string]string) []error {
	var errs []error
	for _, pool := range []struct {
		role string
		list []Endpoint
	}{{"prefill", prefill}, {"decode", decode}} {
		role := pool.role
		for i, ep := range pool.list {
			field := fmt.Sprintf("%s%s[%d]", prefix, role, i)
			if err := validateURL(ep.URL); err != nil {
				errs = append(errs, fmt.Errorf("%s.url: %w", field, err))
			}
			if prev, dup := seen[ep.URL]; dup && ep.URL != "" {
				errs = append(errs, fmt.Errorf("%s.url: %q is already listed as %s", field, ep.URL, prev))
			}
			seen[ep.URL] = field
			if ep.BootstrapPort < 0 || ep.BootstrapPort > 65535 {
				errs = append(errs, fmt.Errorf("%s.bootstrap_port: %d is not a port", field, ep.BootstrapPort))
			}
			if ep.BootstrapPort != 0 && role == "decode" {
				errs = append(errs, fmt.Errorf("%s.bootstrap_port: only prefill endpoints have a bootstrap port", field))
			}
			if ep.DPSize < 0 {
				errs = append(errs, fmt.Errorf("%s.dp_size: %d must not be negative", field, ep.DPSize))
			}
		}
	}
	return errs
}

// validateDuet checks how Envoy reaches duet: envoy.duet, or every address
// of envoy.duet_replicas (each a distinct host:port naming a host), never
// both.
func (e *Envoy) validateDuet() []error {
	if len(e.DuetReplicas) == 0 {
		if err := validateHostPort(e.Duet); err != nil {
			return []error{fmt.Errorf("envoy.duet: %w", err)}
		}
		return nil
	}
	var errs []error
	if e.Duet != "" {
		errs = append(errs, fmt.Errorf("envoy.duet_replicas: set together with envoy.duet %q: list every replica in envoy.duet_replicas and drop envoy.duet", e.Duet))
	}
	seen := map[string]int{}
	for i, addr := range e.DuetReplicas {
		field := fmt.Sprintf("envoy.duet_replicas[%d]", i)
		if err := validateDialable(addr); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", field, err))
		}
		if j, dup := seen[addr]; dup {
			errs = append(errs, fmt.Errorf("%s: %q is already listed as envoy.duet_replicas[%d]", field, addr, j))
		}
		seen[addr] = i
	}
	return errs
}

// validateDialable checks an address another process dials: host:port with
// a host that is neither empty nor unspecified (0.0.0.0, ::) and a port
// other than 0.
func validateDialable(addr string) error {
	if err := validateHostPort(addr); err != nil {
		return err
	}
	host, port, _ := net.SplitHostPort(addr)
	if ip, err := netip.ParseAddr(host); host == "" || (err == nil && ip.IsUnspecified()) {
		return fmt.Errorf("%q names no host to dial", addr)
	}
	if n, _ := strconv.Atoi(port); n == 0 {
		return fmt.Errorf("%q: port 0 cannot be dialled", addr)
	}
	return nil
}

// validateAuth checks the auth section and envoy.duet_tls, naming each
// field. A gRPC port reachable beyond loopback must say how its callers
// are authenticated.
func (c *Config) validateAuth() []error {
	var errs []error
	a := c.Auth
	if t := a.TLS; t != nil {
		for _, f := range []struct{ field, value string }{
			{"auth.tls.cert_file", t.CertFile}, {"auth.tls.key_file", t.KeyFile}, {"auth.tls.client_ca_file", t.ClientCAFile},
		} {
			if f.value == "" {
				errs = append(errs, fmt.Errorf("%s: is required with auth.tls", f.field))
			}
		}
	}
	if t := c.Envoy.DuetTLS; t != nil {
		for _, f := range []struct{ field, value string }{
			{"envoy.duet_tls.cert_file", t.CertFile}, {"envoy.duet_tls.key_file", t.KeyFile}, {"envoy.duet_tls.ca_file", t.CAFile},
		} {
			if f.value == "" {
				errs = append(errs, fmt.Errorf("%s: is required with envoy.duet_tls", f.field))
			}
		}
		if a.TLS == nil {
			errs = append(errs, errors.New("envoy.duet_tls: set without auth.tls: duet would not speak TLS"))
		}
	}
	if a.Unauthenticated && (a.TLS != nil || a.TokenFile != "") {
		errs = append(errs, errors.New("auth.unauthenticated: set together with auth.tls or auth.token_file"))
	}
	if a.TLS == nil && a.TokenFile == "" && !a.Unauthenticated && !Loopback(c.Listen.GRPC) {
		errs = append(errs, fmt.Errorf("auth: listen.grpc %s is reachable beyond loopback and nothing authenticates its callers "+
			"(anyone who reaches it could eject engines and abort requests): set auth.tls or auth.token_file, "+
			"or auth.unauthenticated: true where a mesh admits only Envoy (docs/security.md)", c.Listen.GRPC))
	}
	return errs
}

// Loopback reports whether a listen address binds a loopback address only,
// so that only processes on the same host can connect. A host name counts
// only as "localhost".
func Loopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// validate checks the health section (after defaults), naming each field.
func (h *HealthOptions) validate() []error {
	var errs []error
	for _, d := range []struct {
		field string
		value time.Duration
	}{
		{"health.timeout", h.Timeout}, {"health.base_ejection", h.BaseEjection}, {"health.max_ejection", h.MaxEjection},
	} {
		if d.value < 0 {
			errs = append(errs, fmt.Errorf("%s: %v must not be negative", d.field, d.value))
		}
	}
	if h.BaseEjection > 0 && h.MaxEjection > 0 && h.MaxEjection < h.BaseEjection {
		errs = append(errs, fmt.Errorf("health.max_ejection: %v is below health.base_ejection %v", h.MaxEjection, h.BaseEjection))
	}
	if h.Interval > 0 && h.Timeout > h.Interval {
		errs = append(errs, fmt.Errorf("health.timeout: %v is longer than health.interval %v", h.Timeout, h.Interval))
	}
	if !strings.HasPrefix(h.Path, "/") || strings.ContainsAny(h.Path, "?# \t") {
		errs = append(errs, fmt.Errorf("health.path: %q must be a path starting with / (no query or fragment)", h.Path))
	}
	for _, n := range []struct {
		field string
		value int
	}{
		{"health.unreachable_to_eject", h.UnreachableToEject}, {"health.failures_to_eject", h.FailuresToEject},
		{"health.probe_failures", h.ProbeFailures},
	} {
		if n.value < -1 {
			errs = append(errs, fmt.Errorf("%s: %d is neither a count nor -1 (never)", n.field, n.value))
		}
	}
	return errs
}

func validateHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port: %w", addr, err)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		return fmt.Errorf("%q has no valid port", addr)
	}
	return nil
}

func validateURL(raw string) error {
	if raw == "" {
		return errors.New("is required, as http://host:port")
	}
	if !strings.Contains(raw, "://") {
		return fmt.Errorf("%q has no scheme: write http://host:port (here %q)", raw, "http://"+strings.TrimPrefix(raw, "//"))
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q: %w", raw, err)
	}
	if u.Scheme != "http" {
		return fmt.Errorf("%q: scheme must be http, as in http://host:port (Envoy speaks plain HTTP/1.1 to engines)", raw)
	}
	if u.Hostname() == "" {
		return fmt.Errorf("%q has no host", raw)
	}
	if u.Path != "" && u.Path != "/" {
		return fmt.Errorf("%q: a base URL must not have a path", raw)
	}
	return nil
}

// validatePolicies checks that each role names a policy duet has, at the
// top level and in each pool that names its own.
func (c *Config) validatePolicies() []error {
	var errs []error
	check := func(field, name string) {
		if slices.Contains(scheduler.PolicyNames(), name) {
			return
		}
		hint := ""
		if near := nearest(name, scheduler.PolicyNames()); near != "" {
			hint = fmt.Sprintf(": did you mean %q?", near)
		}
		errs = append(errs, fmt.Errorf("%s: %q is not a policy%s (valid: %s; docs/scheduling.md)",
			field, name, hint, strings.Join(scheduler.PolicyNames(), ", ")))
	}
	check("policy.prefill", c.Policy.Prefill.Name)
	check("policy.decode", c.Policy.Decode.Name)
	for i, p := range c.Pools {
		if p.Policy.Prefill.Name != c.Policy.Prefill.Name {
			check(fmt.Sprintf("pools[%d].policy.prefill", i), p.Policy.Prefill.Name)
		}
		if p.Policy.Decode.Name != c.Policy.Decode.Name {
			check(fmt.Sprintf("pools[%d].policy.decode", i), p.Policy.Decode.Name)
		}
	}
	return errs
}
