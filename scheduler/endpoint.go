package scheduler

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// NoRank means the engine chooses the DP rank itself. A target with NoRank
// must not be pinned to a rank: it is never sent as rank 0.
const NoRank = -1

// defaultBootstrapPort is SGLang's default --disaggregation-bootstrap-port.
const defaultBootstrapPort = 8998

// Role is the part an engine plays in prefill/decode disaggregated serving.
type Role string

// The roles an endpoint can have. In aggregated mode every endpoint is a
// decode endpoint: it serves whole requests.
const (
	RolePrefill Role = "prefill"
	RoleDecode  Role = "decode"
)

// EndpointSpec is one configured engine.
type EndpointSpec struct {
	// URL is the engine's base URL, e.g. http://127.0.0.1:30000.
	URL string
	// BootstrapPort is the prefill engine's disaggregation bootstrap port.
	// It is used for prefill endpoints only; 0 means discover it.
	BootstrapPort int
	// DPSize is the engine's data-parallel size; 0 means discover it.
	DPSize int
	// KVEvents is where the engine publishes its KV cache events, for
	// engines whose /server_info does not say (SGLang before kv_events
	// was advertised); the zero value means none. What /server_info
	// advertises wins.
	KVEvents KVEvents
}

// KVEvents is where an engine publishes its KV cache events (SGLang's
// --kv-events-config, advertised as kv_events in /server_info): one ZMQ
// PUB socket per DP rank, rank r on Port+r, and optionally a ROUTER that
// replays missed batches, rank r on ReplayPort+r.
type KVEvents struct {
	// Host is the host to dial; empty (or a wildcard such as "*" or
	// "0.0.0.0", as the engine binds it) means the engine's own address.
	Host string
	// Port is rank 0's PUB port; 0 means the engine publishes none.
	Port int
	// ReplayPort is rank 0's replay port; 0 means none.
	ReplayPort int
	// Topic is the publisher's topic (SGLang's default is "").
	Topic string
	// BlockSize is the tokens per published block (the engine's page
	// size); 0 when unknown.
	BlockSize int
}

// Endpoint is an engine as the scheduler knows it. It is a value snapshot:
// later discovery rounds never modify an Endpoint that has been handed out.
type Endpoint struct {
	// Role is the pool the endpoint belongs to.
	Role Role
	// URL is the engine's base URL as configured, without a trailing slash.
	URL string
	// Address is "ip:port" exactly as Envoy's cluster names the host
	// (IPv6 as [ip]:port). Hostnames are resolved during discovery; the
	// field is empty until a hostname has been resolved once.
	Address string
	// BootstrapHost is the host part of URL: what a decode engine dials to
	// reach this prefill engine's bootstrap server.
	BootstrapHost string
	// BootstrapPort is the bootstrap server's port (prefill only).
	BootstrapPort int
	// DPSize is the engine's data-parallel size; 0 while unknown.
	DPSize int
	// Source says where DPSize and BootstrapPort came from: "server_info",
	// "get_server_info" or "config"; empty while unknown. After a failed
	// discovery round it still names the source of the values in use.
	Source string
	// DecodeCache is what the engine's own prefix cache holds for a decode
	// leg, as its /server_info reports it: the zero value (no cache) for
	// prefill engines and for decode engines started without SGLang's
	// --disaggregation-decode-enable-radix-cache.
	DecodeCache DecodeCache
	// KVEvents is where the engine publishes its KV cache events, as its
	// /server_info advertises them or, failing that, as configured.
	KVEvents KVEvents
	// Priority is the engine's priority scheduling, as its /server_info
	// reports it (SGLang's --enable-priority-scheduling).
	Priority PriorityScheduling
	// Mode is the disaggregation_mode the engine's /server_info last
	// reported ("prefill", "decode", "null"); empty while unknown or when
	// the engine does not report one.
	Mode string
	// ExpectedMode is the disaggregation_mode the endpoint's role needs:
	// "prefill" for a prefill endpoint, "decode" for a decode endpoint of a
	// PD pool, "null" for an engine of an aggregated pool.
	ExpectedMode string
	// WrongMode reports that Mode contradicts the role (see wrongMode): a
	// prefill engine listed as decode or the reverse. Such an endpoint is
	// not ready, whatever else discovery learned, until the engine reports
	// a mode that fits.
	WrongMode bool
	// Ready reports whether the endpoint may be scheduled.
	Ready bool
	// LastError is the error of the last discovery round, if any.
	LastError string
}

// NotReadyReason says in words why the endpoint is not scheduled, naming
// its role and URL; "" when it is ready. A WrongMode endpoint gives
// `<role> engine <url> reports disaggregation_mode "<mode>", expected
// "<expected>"`; any other gives `waiting for <role> engine <url>`, followed
// by the last discovery error, or by "(not discovered yet)" without one.
func (e Endpoint) NotReadyReason() string {
	switch {
	case e.Ready:
		return ""
	case e.WrongMode:
		return fmt.Sprintf("%s engine %s reports disaggregation_mode %q, expected %q", e.Role, e.URL, e.Mode, e.ExpectedMode)
	case e.LastError != "":
		return fmt.Sprintf("waiting for %s engine %s: %s", e.Role, e.URL, e.LastError)
	default:
		return fmt.Sprintf("waiting for %s engine %s (not discovered yet)", e.Role, e.URL)
	}
}

// DecodeCache describes a decode engine's radix cache (SGLang's decode-side
// radix cache). With it, each DP rank matches a request against the prompts
// and answers it served before, allocates only the pages beyond the match,
// and has the prefill engine send only those: a decode leg on the rank that
// served the conversation's last turn receives a small delta instead of the
// whole history's KV.
type DecodeCache struct {
	// Radix reports that the engine runs the decode radix cache
	// (disaggregation_decode_enable_radix_cache).
	Radix bool
	// HostRatio is the size of the host-memory tier (hierarchical cache:
	// enable_hierarchical_cache with the radix cache) as a multiple of the
	// GPU pool (hicache_ratio); 0 without one.
	HostRatio float64
}

// Target is one (endpoint, DP rank) pair: the unit the policies choose.
// Endpoint points into an immutable snapshot and must not be modified.
type Target struct {
	Endpoint *Endpoint
	// Rank is the DP rank to pin, or NoRank when the engine picks.
	Rank int
}

// String returns the target as address/rank, e.g. "127.0.0.1:30001/dp1",
// or "127.0.0.1:30001/dp-" when the engine picks the rank. An endpoint whose
// hostname has not been resolved yet shows its URL instead of the address.
func (t Target) String() string {
	host := "<nil>"
	if t.Endpoint != nil {
		host = t.Endpoint.Address
		if host == "" {
			host = t.Endpoint.URL
		}
	}
	return targetName(host, t.Rank)
}

// targetName is Target.String for a host and a rank.
func targetName(host string, rank int) string {
	if rank == NoRank {
		return host + "/dp-"
	}
	return host + "/dp" + strconv.Itoa(rank)
}

// Source values for Endpoint.Source.
const (
	sourceServerInfo    = "server_info"
	sourceGetServerInfo = "get_server_info"
	sourceConfig        = "config"
)

// parsedURL is what the scheduler needs from an endpoint's base URL.
type parsedURL struct {
	base string     // normalized base URL, no trailing slash
	key  string     // identity used to detect duplicates
	host string     // host without brackets or port
	port string     // explicit port, or the scheme's default
	ip   netip.Addr // valid when host is an IP literal
}

// parseEndpointURL validates an engine base URL and splits it into the parts
// the scheduler uses.
func parseEndpointURL(raw string) (parsedURL, error) {
	if raw == "" {
		return parsedURL{}, errors.New("empty URL")
	}
	u, err := url.Parse(raw)
	if err != nil {
		return parsedURL{}, err
	}
	scheme := strings.ToLower(u.Scheme)
	var defaultPort string
	switch scheme {
	case "http":
		defaultPort = "80"
	case "https":
		defaultPort = "443"
	default:
		return parsedURL{}, fmt.Errorf("scheme %q is not http or https", u.Scheme)
	}
	if u.Opaque != "" || u.Host == "" || u.Hostname() == "" {
		return parsedURL{}, errors.New("no host")
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return parsedURL{}, errors.New("a base URL takes no user info, query or fragment")
	}
	port := u.Port()
	if port == "" {
		port = defaultPort
	} else if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return parsedURL{}, fmt.Errorf("invalid port %q", port)
	}
	host := u.Hostname()
	p := parsedURL{
		base: strings.TrimRight(raw, "/"),
		host: host,
		port: port,
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		p.ip = ip
		host = ip.String()
	} else {
		host = strings.ToLower(host)
	}
	p.key = scheme + "://" + net.JoinHostPort(host, port) + strings.TrimRight(u.EscapedPath(), "/")
	return p, nil
}

// address formats ip and port the way Envoy names a host: ip:port, with
// IPv6 addresses in brackets.
func address(ip netip.Addr, port string) string {
	return net.JoinHostPort(ip.String(), port)
}

// preferIPv4 returns the first IPv4 address in addrs, or else the first
// address. addrs must not be empty.
func preferIPv4(addrs []netip.Addr) netip.Addr {
	for _, a := range addrs {
		if a = a.Unmap(); a.Is4() {
			return a
		}
	}
	return addrs[0]
}

// PriorityScheduling is whether an engine schedules by a request's
// `priority` field (SGLang's --enable-priority-scheduling), and in which
// order (--schedule-low-priority-values-first).
type PriorityScheduling struct {
	Enabled bool
	// LowValuesFirst: a smaller value is served first; otherwise a larger.
	LowValuesFirst bool
}
