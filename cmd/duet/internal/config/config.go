// Package config loads and validates duet's YAML configuration: the engines of
// each role, the policies that pick among them, the addresses duet serves on,
// and the parameters of the Envoy bootstrap that `duet envoy-config` renders.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"time"

	"gopkg.in/yaml.v3"
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
	// Policy names the scheduling policy of each role.
	Policy Policy `yaml:"policy"`
	// Discovery tunes how engines are asked for their DP size and bootstrap port.
	Discovery Discovery `yaml:"discovery"`
	// Request bounds what duet accepts from clients.
	Request Request `yaml:"request"`
	// Envoy parameterises the bootstrap rendered by `duet envoy-config`.
	Envoy Envoy `yaml:"envoy"`
}

// Listen holds duet's own addresses.
type Listen struct {
	// GRPC serves the Envoy ext_proc API (and, later, the access-log service).
	GRPC string `yaml:"grpc"`
	// Admin serves /healthz, /readyz and /metrics.
	Admin string `yaml:"admin"`
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

// Policy names the policy of each role.
type Policy struct {
	Prefill string `yaml:"prefill"`
	Decode  string `yaml:"decode"`
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
	// listen.grpc (with an unspecified host replaced by 127.0.0.1).
	Duet string `yaml:"duet"`
	// MessageTimeout bounds each ext_proc exchange.
	MessageTimeout time.Duration `yaml:"message_timeout"`
	// StreamIdleTimeout closes client streams idle for this long.
	StreamIdleTimeout time.Duration `yaml:"stream_idle_timeout"`
}

// Defaults used where the file is silent.
const (
	DefaultGRPC              = "127.0.0.1:9002"
	DefaultAdmin             = "127.0.0.1:9003"
	DefaultPolicy            = "round_robin"
	DefaultMaxBodyBytes      = 32 << 20
	DefaultEnvoyListen       = "127.0.0.1:8080"
	DefaultEnvoyAdmin        = "127.0.0.1:9901"
	DefaultMessageTimeout    = 2 * time.Second
	DefaultStreamIdleTimeout = 15 * time.Minute
	DefaultDiscoveryInterval = 10 * time.Second
	DefaultDiscoveryTimeout  = 2 * time.Second
)

// Load reads, defaults and validates the configuration file at path.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// Parse decodes YAML (unknown fields are errors), applies defaults and validates.
func Parse(data []byte) (*Config, error) {
	var cfg Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&cfg); err != nil {
		return nil, fmt.Errorf("parse yaml: %w", err)
	}
	cfg.applyDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &cfg, nil
}

func (c *Config) applyDefaults() {
	setDefault(&c.Listen.GRPC, DefaultGRPC)
	setDefault(&c.Listen.Admin, DefaultAdmin)
	setDefault(&c.LogLevel, "info")
	setDefault(&c.Policy.Prefill, DefaultPolicy)
	setDefault(&c.Policy.Decode, DefaultPolicy)
	setDefault(&c.Envoy.Listen, DefaultEnvoyListen)
	setDefault(&c.Envoy.Admin, DefaultEnvoyAdmin)
	if c.Envoy.Duet == "" {
		c.Envoy.Duet = dialable(c.Listen.GRPC)
	}
	if c.Request.MaxBodyBytes == 0 {
		c.Request.MaxBodyBytes = DefaultMaxBodyBytes
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
func (c *Config) Validate() error {
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
	check("envoy.duet", validateHostPort(c.Envoy.Duet))
	if len(c.Decode) == 0 {
		errs = append(errs, errors.New("decode: at least one endpoint is required"))
	}
	seen := map[string]string{}
	for _, pool := range []struct {
		role string
		list []Endpoint
	}{{"prefill", c.Prefill}, {"decode", c.Decode}} {
		role := pool.role
		for i, ep := range pool.list {
			field := fmt.Sprintf("%s[%d]", role, i)
			check(field+".url", validateURL(ep.URL))
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
	if c.Request.MaxBodyBytes < 1024 {
		errs = append(errs, fmt.Errorf("request.max_body_bytes: %d is below the 1024-byte minimum", c.Request.MaxBodyBytes))
	}
	if c.Envoy.MessageTimeout < 0 {
		errs = append(errs, errors.New("envoy.message_timeout: must be positive"))
	}
	if c.Discovery.Interval < 0 || c.Discovery.Timeout < 0 {
		errs = append(errs, errors.New("discovery: interval and timeout must be positive"))
	}
	switch c.LogLevel {
	case "debug", "info", "warn", "error":
	default:
		errs = append(errs, fmt.Errorf("log_level: %q is not one of debug, info, warn, error", c.LogLevel))
	}
	return errors.Join(errs...)
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
		return errors.New("is required")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("%q: %w", raw, err)
	}
	if u.Scheme != "http" {
		return fmt.Errorf("%q: scheme must be http (Envoy speaks plain HTTP/1.1 to engines)", raw)
	}
	if u.Hostname() == "" {
		return fmt.Errorf("%q has no host", raw)
	}
	if u.Path != "" && u.Path != "/" {
		return fmt.Errorf("%q: a base URL must not have a path", raw)
	}
	return nil
}
