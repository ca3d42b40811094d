package envoy

import (
	_ "embed"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/duet-router/duet/envoy/contract"
)

// Cluster names used in the rendered bootstrap.
const (
	ClusterDuet = "duet_extproc"
	// ClusterFeedback reaches duet too, for the access-log streams only:
	// those streams live as long as Envoy, and on ClusterDuet they would
	// count against its circuit breaker, which sheds ext_proc streams
	// (Params.MaxRoutingRequests).
	ClusterFeedback = "duet_feedback"
	// ClusterOTLP reaches the OpenTelemetry collector Envoy exports its
	// spans to (Params.Tracing).
	ClusterOTLP = "duet_otlp"
)

// LoggedRequestHeaders are the request headers every ALS entry carries:
// duet's request id (the join key), the client's, and the leg's DP rank.
// Nothing else: every header is a map entry that duet decodes on every
// entry, three per PD request (an upstream entry with five headers took
// 8.5 µs to decode, with three 6.5 µs; BenchmarkDecodeEntry in
// extproc/accesslog), and the endpoint duet chose for a leg is on its
// entry already (the upstream address). With Params.Tracing every entry
// also logs contract.HeaderTraceParent: on an upstream entry, that leg's
// own span, which duet's span of the leg's end joins.
var LoggedRequestHeaders = []string{contract.HeaderDuetRequestID, contract.HeaderRequestID, contract.HeaderDPRank}

// Address is a host (IP or DNS name) and port.
type Address struct {
	Host string
	Port int
}

// ParseAddress parses "host:port".
func ParseAddress(hostport string) (Address, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return Address{}, fmt.Errorf("parse address %q: %w", hostport, err)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return Address{}, fmt.Errorf("parse address %q: bad port", hostport)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return Address{Host: host, Port: n}, nil
}

// IsIP reports whether the host is a literal IP address.
func (a Address) IsIP() bool {
	_, err := netip.ParseAddr(a.Host)
	return err == nil
}

// Params are the inputs of the bootstrap.
type Params struct {
	// Listen is where Envoy accepts client traffic.
	Listen Address
	// Admin is Envoy's admin interface.
	Admin Address
	// Duet is duet's gRPC (ext_proc) address as Envoy dials it.
	Duet Address
	// DuetReplicas, when set, replaces Duet: each address is one duet
	// replica, a host of both clusters that reach duet.
	DuetReplicas []Address
	// MaxBodyBytes is the request buffer limit: larger bodies get 413.
	MaxBodyBytes int
	// MessageTimeout bounds each ext_proc exchange.
	MessageTimeout time.Duration
	// MaxMessageTimeout, when positive, lets duet extend MessageTimeout up
	// to it for one exchange (ext_proc's override_message_timeout): a
	// request duet's admission queue holds waits up to its class's wait
	// limit. It must be at least MessageTimeout.
	MaxMessageTimeout time.Duration
	// MaxRoutingRequests caps the open ext_proc streams to duet (the duet
	// cluster's circuit breaker): beyond it Envoy answers 503 at once.
	MaxRoutingRequests int
	// StreamIdleTimeout closes idle client and upstream streams.
	StreamIdleTimeout time.Duration
	// Prefill engines; empty renders an aggregated (mirror-free) bootstrap.
	Prefill []Address
	// Decode engines (or the aggregated pool).
	Decode []Address
	// DuetTLS, when set, makes Envoy reach duet over mutual TLS.
	DuetTLS *ClientTLS
	// DuetToken, when set, is the bearer token Envoy sends duet on every
	// ext_proc and access-log stream ("authorization" gRPC metadata). The
	// rendered bootstrap then holds a secret.
	DuetToken string
	// Pools, when set, replaces Prefill and Decode: each pool gets its own
	// clusters and a route that Envoy takes for the requests duet names
	// the pool of in contract.HeaderPool. Without it, Prefill and Decode
	// are the one pool, whose route takes every request.
	Pools []Pool
	// Tracing, when set, has Envoy trace requests with its OpenTelemetry
	// tracer and export the spans to a collector.
	Tracing *Tracing
	// Headless (without Pools; each Pool says it for itself) says that
	// Prefill and Decode are DNS names that resolve to
	// every engine of their pool (Kubernetes headless Services), not one
	// engine each: the engine clusters then take every address of both
	// families and re-resolve every DNSRefreshRate, so that override_host
	// finds an engine soon after it becomes ready.
	Headless bool
}

// Pool is one model's engines and the names of their clusters.
type Pool struct {
	// Name is the value of contract.HeaderPool that selects the pool's
	// route.
	Name string
	// DecodeCluster and PrefillCluster name the pool's clusters.
	DecodeCluster, PrefillCluster string
	// Prefill engines; empty makes the pool aggregated (no mirror).
	Prefill []Address
	// Decode engines (or the aggregated ones).
	Decode []Address
	// Headless says that the pool's engines are headless Services' names
	// (see Params.Headless).
	Headless bool
}

// Tracing configures Envoy's OpenTelemetry tracer: the connection
// manager's span of each sampled request, a child span for each upstream
// request (the decode leg, and the mirror's own "mirror" span), and one
// for the ext_proc stream, whose context reaches duet as gRPC metadata.
type Tracing struct {
	// Collector is the OTLP/gRPC collector, as Envoy dials it.
	Collector Address
	// SamplingPercent is the share of requests Envoy starts a trace for
	// (random_sampling), 0 to 100.
	SamplingPercent float64
	// ServiceName is the service.name of Envoy's spans.
	ServiceName string
}

// PD reports whether the pool has prefill engines.
func (p Pool) PD() bool { return len(p.Prefill) > 0 }

// ClientTLS is Envoy's side of mutual TLS to duet: its client certificate
// and the CA and name it verifies duet's certificate by. Paths are as
// Envoy sees them.
type ClientTLS struct {
	CertFile, KeyFile, CAFile string
	// ServerName is sent as SNI and must be a DNS SAN of duet's certificate.
	ServerName string
}

// DNSRefreshRate is how often the engine clusters of a Headless bootstrap,
// and clusters to duet named by DNS, resolve their names again.
const DNSRefreshRate = time.Second

// How Envoy finds out that a duet replica is gone (both clusters to duet).
// Active gRPC health checks (grpc.health.v1, which duet serves without
// credentials) mark a replica unhealthy after DuetUnhealthyThreshold failed
// checks DuetHealthInterval apart, and healthy again after one success;
// outlier detection ejects a replica at the first connection it refuses, for
// DuetEjectionTime (or until a health check passes).
const (
	// DuetHealthInterval is the time between two health checks of a
	// replica, with traffic or without.
	DuetHealthInterval = 250 * time.Millisecond
	// DuetHealthTimeout bounds one health check.
	DuetHealthTimeout = time.Second
	// DuetUnhealthyThreshold is how many failed checks in a row make a
	// replica unhealthy.
	DuetUnhealthyThreshold = 2
	// DuetEjectionTime is how long a replica that refused a connection is
	// ejected, at first (each ejection in a row adds as much).
	DuetEjectionTime = time.Second
	// DuetStreamRetries is how often a stream to duet (ext_proc, or a new
	// access-log stream) that could not reach its replica is tried on
	// another one.
	DuetStreamRetries = 2
)

//go:embed bootstrap.yaml.tmpl
var bootstrapTemplate string

//go:embed bodyrank.lua
var bodyRankLua string

//go:embed errorenvelope.lua
var errorEnvelopeLua string

// ErrorEnvelopeLua returns the Lua source of the connection manager's
// filter that gives engines' JSON errors the OpenAI error envelope.
func ErrorEnvelopeLua() string { return errorEnvelopeLua }

// The messages of Envoy's own error replies (its local_reply_config), in
// the OpenAI error envelope that duet's replies have. They say what
// happened in words a client can act on; what Envoy knows besides (its
// response code details: the gRPC status of a failed ext_proc stream, an
// engine's reset reason) goes to its access logs only, the stdout line and
// the gRPC entry's response_code_details.
const (
	// MessageRouterUnavailable answers a request whose ext_proc stream
	// failed (503, ext_proc's status_on_error): duet is down or
	// unreachable, refused Envoy's credentials, or the stream was shed
	// past envoy.max_routing_requests or cut.
	MessageRouterUnavailable = "the router (duet) is unavailable; retry later"
	// MessageRouterTimeout answers a request that duet did not answer
	// within the ext_proc filter's message timeout (504).
	MessageRouterTimeout = "the router (duet) did not answer in time; retry later"
	// MessageNoRoute answers a request that matches no route (404): with a
	// pools section, one that duet named no pool for.
	MessageNoRoute = "no route for this request"
	// MessageEngineFailed answers a request whose engine could not be
	// reached, or failed before it answered (the router's 5xx, which
	// carries a response flag: UF, URX, UH, UO, UC, ...).
	MessageEngineFailed = "the inference engine could not be reached, or failed before it answered; retry later"
)

// Response code details of the ext_proc filter's own replies on Envoy 1.40,
// as its access logs show them (spaces become underscores).
const (
	// DetailsExtProcTimeout is the per-message timeout's (504).
	DetailsExtProcTimeout = "ext_proc_error_per-message_timeout_exceeded"
	// DetailsExtProcPrefix starts every ext_proc error's details, e.g.
	// ext_proc_error_gRPC_error_14{...} for a stream that could not reach
	// duet (503).
	DetailsExtProcPrefix = "ext_proc_error"
	// DetailsResponseTooLarge is a JSON response above the buffer limit,
	// which json_to_metadata buffers to read its token usage (500).
	DetailsResponseTooLarge = "response_payload_too_large"
)

// ResponseTooLargeMessage answers a request whose engine's JSON response
// was above the buffer limit of maxBodyBytes (500): the token-usage filter
// buffers JSON responses whole, and streamed ones not at all.
func ResponseTooLargeMessage(maxBodyBytes int) string {
	return fmt.Sprintf("the engine's JSON response exceeds the %d-byte buffer limit (duet's request.max_body_bytes); send \"stream\": true, or raise the limit", maxBodyBytes)
}

// localReply is what the template needs to render local_reply_config.
type localReply struct {
	// Namespace is the dynamic metadata namespace of duet's replies.
	Namespace string
	// DetailsTimeout, DetailsResponseTooLarge and DetailsExtProc are
	// matched against the response code details: the first two exactly,
	// the last as a prefix.
	DetailsTimeout, DetailsResponseTooLarge, DetailsExtProc string
	// The messages of each kind of reply.
	RouterTimeout, RouterUnavailable, BodyTooLarge, ResponseTooLarge, NoRoute, EngineFailed string
}

// newLocalReply returns the local replies of a bootstrap for p.
func newLocalReply(p Params) localReply {
	return localReply{
		Namespace:      contract.MetadataNamespace,
		DetailsTimeout: DetailsExtProcTimeout, DetailsExtProc: DetailsExtProcPrefix, DetailsResponseTooLarge: DetailsResponseTooLarge,
		RouterTimeout: MessageRouterTimeout, RouterUnavailable: MessageRouterUnavailable,
		BodyTooLarge: contract.BodyTooLargeMessage(p.MaxBodyBytes), ResponseTooLarge: ResponseTooLargeMessage(p.MaxBodyBytes),
		NoRoute: MessageNoRoute, EngineFailed: MessageEngineFailed,
	}
}

// BodyRankLua returns the Lua source of the decode cluster's upstream filter
// that writes the decode rank of a PD /generate request into that leg's
// body (see docs/scheduling.md).
func BodyRankLua() string {
	return strings.ReplaceAll(bodyRankLua, "HEADER", contract.HeaderDecodeBodyRank)
}

var tmpl = template.Must(template.New("bootstrap").Funcs(template.FuncMap{
	"quote":    strconv.Quote,
	"duration": func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s" },
	"list":     func(a Address) []Address { return []Address{a} },
	"join":     strings.Join,
	"grpcLog": func(indent, name string, d templateData) grpcLog {
		headers := LoggedRequestHeaders
		if d.Tracing != nil {
			headers = append(headers[:len(headers):len(headers)], contract.HeaderTraceParent)
		}
		return grpcLog{Indent: indent, Name: name, Cluster: d.ClusterFeedback, Headers: headers, Token: d.DuetToken}
	},
	"duetCluster": func(name string, shed bool, d templateData) duetCluster {
		c := duetCluster{Name: name, Hosts: d.duetHosts(), TLS: d.DuetTLS,
			HealthInterval: DuetHealthInterval, HealthTimeout: DuetHealthTimeout,
			UnhealthyThreshold: DuetUnhealthyThreshold, EjectionTime: DuetEjectionTime}
		if clusterType(c.Hosts) == "STRICT_DNS" {
			c.DNSRefreshRate = DNSRefreshRate
		}
		if shed {
			c.MaxRequests = d.MaxRoutingRequests
		}
		return c
	},
	"duetRetry": func(indent, on string) duetRetry {
		return duetRetry{Indent: indent, On: on, Retries: DuetStreamRetries}
	},
	"usageRules": func(indent string, sse bool, d templateData) usageRules {
		if sse {
			return usageRules{Indent: indent, Wrap: true, Namespace: d.MetadataNamespace, Rules: openAIUsage}
		}
		return usageRules{Indent: indent, Namespace: d.MetadataNamespace, Rules: jsonUsage}
	},
	"engine": func(pool Pool, prefill bool, p Params) engineCluster {
		c := engineCluster{Name: pool.DecodeCluster, Hosts: pool.Decode, Header: contract.HeaderDecodeEndpoint,
			MaxBodyBytes: p.MaxBodyBytes, StreamIdleTimeout: p.StreamIdleTimeout}
		if prefill {
			c.Name, c.Hosts, c.Header = pool.PrefillCluster, pool.Prefill, contract.HeaderPrefillEndpoint
		} else if pool.PD() {
			c.BodyRankLua = BodyRankLua()
		}
		if pool.Headless {
			c.DNSRefreshRate = DNSRefreshRate
		}
		return c
	},
	"indent": func(n int, text string) string {
		pad := strings.Repeat(" ", n)
		return pad + strings.ReplaceAll(strings.TrimRight(text, "\n"), "\n", "\n"+pad)
	},
	"clusterType": clusterType,
	"percent":     func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) },
	"perMillion":  func(pct float64) int64 { return int64(math.Round(pct * 1e4)) },
	"localReply":  newLocalReply,
}).Parse(bootstrapTemplate))

// clusterType is STRICT_DNS when any address is a DNS name, else STATIC.
func clusterType(addrs []Address) string {
	for _, a := range addrs {
		if !a.IsIP() {
			return "STRICT_DNS"
		}
	}
	return "STATIC"
}

// HeldMessageTimeout is the longest Envoy waits for one ext_proc answer
// when duet asks it to (override_message_timeout): MaxMessageTimeout, or
// MessageTimeout without one (Envoy then ignores every override).
func (p Params) HeldMessageTimeout() time.Duration {
	return max(p.MaxMessageTimeout, p.MessageTimeout)
}

// duetHosts are the addresses of duet's replicas: DuetReplicas, or Duet.
func (p Params) duetHosts() []Address {
	if len(p.DuetReplicas) > 0 {
		return p.DuetReplicas
	}
	return []Address{p.Duet}
}

// engineCluster is what the template needs to render one role's cluster.
type engineCluster struct {
	Name              string
	Hosts             []Address
	Header            string
	MaxBodyBytes      int
	StreamIdleTimeout time.Duration
	// BodyRankLua, when set, is the upstream Lua filter of the PD decode cluster.
	BodyRankLua string
	// DNSRefreshRate, when set, makes Hosts headless Services (see
	// Params.Headless).
	DNSRefreshRate time.Duration
}

// grpcLog is what the template needs to render one gRPC access logger.
type grpcLog struct {
	Indent, Name, Cluster string
	Headers               []string
	// Token, when set, is sent as a bearer token on the stream.
	Token string
}

// duetCluster is what the template needs to render one cluster to duet.
type duetCluster struct {
	Name string
	// Hosts are duet's replicas (one address, possibly a DNS name that
	// resolves to several).
	Hosts []Address
	TLS   *ClientTLS
	// MaxRequests, when positive, is the cluster's circuit breaker.
	MaxRequests int
	// DNSRefreshRate, when set, makes Hosts DNS names resolved to every
	// address.
	DNSRefreshRate time.Duration
	// HealthInterval, HealthTimeout, UnhealthyThreshold and EjectionTime
	// tune the health checks and outlier detection (see DuetHealthInterval).
	HealthInterval, HealthTimeout time.Duration
	UnhealthyThreshold            int
	EjectionTime                  time.Duration
}

// duetRetry is what the template needs to render the retry policy of a
// gRPC service on a cluster to duet: retry_on is On, each retry on another
// replica.
type duetRetry struct {
	Indent, On string
	Retries    int
}

// usageRule copies the number at Object.Field of a response into Key.
type usageRule struct{ Object, Field, Key string }

// openAIUsage finds the token usage of the OpenAI routes: the "usage" object
// of a JSON response, or of the SSE event that include_usage adds.
var openAIUsage = []usageRule{
	{"usage", "prompt_tokens", contract.MetadataPromptTokens},
	{"usage", "completion_tokens", contract.MetadataCompletionTokens},
}

// jsonUsage finds the token usage in JSON responses: OpenAI's "usage", or
// the "meta_info" of a single (non-batch) /generate. SSE responses use
// openAIUsage only: /generate stream events repeat the whole text so far, so
// parsing them costs quadratic time, and sse_to_metadata skips events above
// max_event_size, which would leave a stale, too-small count.
var jsonUsage = []usageRule{
	{"usage", "prompt_tokens", contract.MetadataPromptTokens},
	{"usage", "completion_tokens", contract.MetadataCompletionTokens},
	{"meta_info", "prompt_tokens", contract.MetadataPromptTokens},
	{"meta_info", "completion_tokens", contract.MetadataCompletionTokens},
}

// usageRules is what the template needs to render token rules, either as
// json_to_metadata rules or (Wrap) as JSON content-parser rules.
type usageRules struct {
	Indent    string
	Wrap      bool
	Namespace string
	Rules     []usageRule
}

// templateData is what the template sees.
type templateData struct {
	Params
	ClusterDecode, ClusterPrefill, ClusterDuet    string
	ClusterFeedback, ClusterOTLP                  string
	HeaderDecodeEndpoint, HeaderPrefillEndpoint   string
	HeaderMirror, HeaderPrefillRank, HeaderDPRank string
	HeaderPrefix, MetadataNamespace               string
	LogDownstream, LogUpstream                    string
	ErrorEnvelopeLua                              string
	HeaderPool                                    string
	// MetadataMessageTimeout and MetadataMaxMessageTimeout name the
	// ext_proc stream's metadata that tell duet the filter's timeouts.
	MetadataMessageTimeout, MetadataMaxMessageTimeout string
	// EnginePools are Params.Pools, or the one pool of Params.Prefill and
	// Params.Decode.
	EnginePools []Pool
	// RouteByPool renders one route per pool, chosen by HeaderPool.
	RouteByPool bool
}

// enginePools returns p's pools: Pools, or the one made of Prefill and
// Decode under the default cluster names.
func (p Params) enginePools() []Pool {
	if len(p.Pools) > 0 {
		return p.Pools
	}
	return []Pool{{DecodeCluster: contract.ClusterDecode, PrefillCluster: contract.ClusterPrefill, Prefill: p.Prefill, Decode: p.Decode,
		Headless: p.Headless}}
}

// plainName reports whether a pool or cluster name is non-empty and can
// stand unquoted in the bootstrap's YAML (flow mappings included).
func plainName(s string) bool { return s != "" && !strings.ContainsAny(s, " \"'\n{}[]#:,") }

// Render writes the Envoy bootstrap YAML for p to w.
func Render(w io.Writer, p Params) error {
	if len(p.Pools) > 0 && (len(p.Prefill) > 0 || len(p.Decode) > 0 || p.Headless) {
		return errors.New("render envoy bootstrap: engines given both per pool and outside pools")
	}
	pools := p.enginePools()
	var engines []Address
	clusters := map[string]bool{ClusterDuet: true, ClusterFeedback: true, ClusterOTLP: true}
	for _, pool := range pools {
		if len(pool.Decode) == 0 {
			return fmt.Errorf("render envoy bootstrap: no decode endpoints in pool %q", pool.Name)
		}
		if len(p.Pools) > 0 && !plainName(pool.Name) {
			return fmt.Errorf("render envoy bootstrap: bad pool name %q", pool.Name)
		}
		for _, c := range []string{pool.DecodeCluster, pool.PrefillCluster} {
			if !plainName(c) || clusters[c] {
				return fmt.Errorf("render envoy bootstrap: pool %q: cluster name %q is empty, taken or not plain", pool.Name, c)
			}
			clusters[c] = true
		}
		engines = append(append(engines, pool.Prefill...), pool.Decode...)
		if pool.Headless {
			for _, a := range append(append([]Address(nil), pool.Prefill...), pool.Decode...) {
				if a.IsIP() {
					return fmt.Errorf("render envoy bootstrap: %s is an IP address, not a headless Service's name", a.Host)
				}
			}
		}
	}
	if p.MaxBodyBytes <= 0 || p.MessageTimeout <= 0 || p.StreamIdleTimeout <= 0 || p.MaxRoutingRequests <= 0 {
		return errors.New("render envoy bootstrap: body limit, routing request limit and timeouts must be positive")
	}
	if p.MaxMessageTimeout != 0 && p.MaxMessageTimeout < p.MessageTimeout {
		return errors.New("render envoy bootstrap: the max message timeout must be at least the message timeout")
	}
	addrs := append(append([]Address{p.Listen, p.Admin}, p.duetHosts()...), engines...)
	if t := p.Tracing; t != nil {
		if t.SamplingPercent < 0 || t.SamplingPercent > 100 {
			return fmt.Errorf("render envoy bootstrap: tracing sampling %v%% is not between 0 and 100", t.SamplingPercent)
		}
		if t.Collector.Port == 0 || !plainName(t.ServiceName) {
			return fmt.Errorf("render envoy bootstrap: tracing needs a collector port and a plain service name, got %d and %q", t.Collector.Port, t.ServiceName)
		}
		addrs = append(addrs, t.Collector)
	}
	for _, a := range addrs {
		if a.Host == "" || strings.ContainsAny(a.Host, " \"'\n{}[]#") {
			return fmt.Errorf("render envoy bootstrap: bad host %q", a.Host)
		}
	}
	if t := p.DuetTLS; t != nil {
		for _, f := range []string{t.CertFile, t.KeyFile, t.CAFile, t.ServerName} {
			if f == "" || strings.ContainsAny(f, "\"'\n") {
				return fmt.Errorf("render envoy bootstrap: duet TLS needs a client certificate, key, CA and server name without quotes or newlines, got %q", f)
			}
		}
	}
	if strings.ContainsAny(p.DuetToken, " \"'\\\n") {
		return errors.New("render envoy bootstrap: the duet token must not contain spaces, quotes, backslashes or newlines")
	}
	data := templateData{
		Params:                    p,
		ClusterDecode:             contract.ClusterDecode,
		ClusterPrefill:            contract.ClusterPrefill,
		ClusterDuet:               ClusterDuet,
		ClusterFeedback:           ClusterFeedback,
		ClusterOTLP:               ClusterOTLP,
		ErrorEnvelopeLua:          ErrorEnvelopeLua(),
		HeaderDecodeEndpoint:      contract.HeaderDecodeEndpoint,
		HeaderPrefillEndpoint:     contract.HeaderPrefillEndpoint,
		HeaderMirror:              contract.HeaderMirror,
		HeaderPrefillRank:         contract.HeaderPrefillRank,
		HeaderDPRank:              contract.HeaderDPRank,
		HeaderPrefix:              contract.HeaderPrefix,
		MetadataNamespace:         contract.MetadataNamespace,
		LogDownstream:             contract.LogDownstream,
		LogUpstream:               contract.LogUpstream,
		HeaderPool:                contract.HeaderPool,
		MetadataMessageTimeout:    contract.MetadataMessageTimeout,
		MetadataMaxMessageTimeout: contract.MetadataMaxMessageTimeout,
		EnginePools:               pools,
		RouteByPool:               len(p.Pools) > 0,
	}
	if err := tmpl.Execute(w, data); err != nil {
		return fmt.Errorf("render envoy bootstrap: %w", err)
	}
	return nil
}
