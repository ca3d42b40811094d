package scheduler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/netip"

	"github.com/tidwall/gjson"

	"github.com/duet-router/duet/scheduler/jsondepth"
	"go.uber.org/zap"
)

// maxServerInfoBytes bounds the /server_info response the scheduler reads.
const maxServerInfoBytes = 8 << 20

// maxServerInfoDepth bounds /server_info's JSON nesting (see package
// jsondepth); SGLang's nests a few levels.
const maxServerInfoDepth = 64

// maxDPSize bounds the DP size accepted from configuration or discovery, so
// that a corrupt value cannot make the scheduler build millions of targets.
const maxDPSize = 4096

// member is the scheduler's record of one configured endpoint. The fields
// below the blank line belong to discovery: only Discover touches them, with
// Scheduler.discoverMu held.
type member struct {
	role Role
	spec EndpointSpec
	url  parsedURL

	cur         Endpoint // state as last published
	known       bool     // a discovery has succeeded at least once
	knownDP     int      // values of the last successful discovery
	knownPort   int
	knownSource string
	knownCache  DecodeCache
	knownMode   string // disaggregation_mode of the last successful discovery
	// knownPriority is the last discovered priority scheduling.
	knownPriority PriorityScheduling
	knownEvents   KVEvents
	warnedDP      int    // discovered DP size already warned about
	warnedPort    int    // discovered bootstrap port already warned about
	warnedMode    string // disaggregation_mode already warned about
}

// serverInfo is the part of SGLang's /server_info the scheduler reads.
type serverInfo struct {
	dpSize        int
	bootstrapPort int    // 0 if not reported
	mode          string // disaggregation_mode; "" if not reported
	decodeCache   DecodeCache
	kvEvents      KVEvents // zero if not advertised
	priority      PriorityScheduling
}

// probe is what one discovery round learned about one endpoint, before it is
// merged with what was known.
type probe struct {
	addr       netip.Addr
	resolveErr error
	info       serverInfo
	source     string
	infoErr    error
}

// statusError is a non-2xx answer from an engine.
type statusError struct {
	code int
}

func (e *statusError) Error() string {
	return fmt.Sprintf("status %d %s", e.code, http.StatusText(e.code))
}

// probe resolves the endpoint's host and asks the engine about itself. It
// only reads immutable fields of m, so probes of different members run
// concurrently.
func (s *Scheduler) probe(ctx context.Context, m *member) probe {
	var p probe
	p.addr, p.resolveErr = s.resolve(ctx, m.url)
	p.info, p.source, p.infoErr = s.fetchServerInfo(ctx, m.url.base, m.role == RolePrefill)
	return p
}

// resolve returns the IP address Envoy knows the endpoint by: the URL's IP
// literal, or else the first IPv4 address (failing that, the first address)
// its hostname resolves to.
func (s *Scheduler) resolve(ctx context.Context, u parsedURL) (netip.Addr, error) {
	if u.ip.IsValid() {
		return u.ip, nil
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	addrs, err := s.lookup(ctx, u.host)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("resolve %s: %w", u.host, err)
	}
	if len(addrs) == 0 {
		return netip.Addr{}, fmt.Errorf("resolve %s: no addresses", u.host)
	}
	return preferIPv4(addrs), nil
}

// fetchServerInfo reads GET {base}/server_info, falling back to the older
// GET {base}/get_server_info when the first answers 404. It returns the
// source the information came from.
func (s *Scheduler) fetchServerInfo(ctx context.Context, base string, prefill bool) (serverInfo, string, error) {
	info, err := s.getServerInfo(ctx, base+"/server_info", prefill)
	if err == nil {
		return info, sourceServerInfo, nil
	}
	if se := (*statusError)(nil); !errors.As(err, &se) || se.code != http.StatusNotFound {
		return serverInfo{}, "", err
	}
	info, err2 := s.getServerInfo(ctx, base+"/get_server_info", prefill)
	if err2 != nil {
		return serverInfo{}, "", fmt.Errorf("%w; %w", err, err2)
	}
	return info, sourceGetServerInfo, nil
}

// getServerInfo performs one GET of a server-info URL and parses the answer.
func (s *Scheduler) getServerInfo(ctx context.Context, url string, prefill bool) (serverInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return serverInfo{}, fmt.Errorf("GET %s: %w", url, err)
	}
	req.Header.Set("Accept", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		// The client's error already names the method and URL.
		return serverInfo{}, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxServerInfoBytes+1))
	if err != nil {
		return serverInfo{}, fmt.Errorf("GET %s: read body: %w", url, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return serverInfo{}, fmt.Errorf("GET %s: %w", url, &statusError{code: resp.StatusCode})
	}
	if len(body) > maxServerInfoBytes {
		return serverInfo{}, fmt.Errorf("GET %s: body larger than %d bytes", url, maxServerInfoBytes)
	}
	info, err := parseServerInfo(body, prefill)
	if err != nil {
		return serverInfo{}, fmt.Errorf("GET %s: %w", url, err)
	}
	return info, nil
}

// parseServerInfo extracts dp_size, disaggregation_mode and, for a prefill
// engine, disaggregation_bootstrap_port from a server-info body.
func parseServerInfo(body []byte, prefill bool) (serverInfo, error) {
	if err := jsondepth.Check(body, maxServerInfoDepth); err != nil {
		return serverInfo{}, err
	}
	if !gjson.ValidBytes(body) {
		return serverInfo{}, errors.New("invalid JSON")
	}
	root := gjson.ParseBytes(body)
	if !root.IsObject() {
		return serverInfo{}, errors.New("not a JSON object")
	}
	var info serverInfo
	dp := root.Get("dp_size")
	if !dp.Exists() {
		return serverInfo{}, errors.New("no dp_size")
	}
	n, ok := intValue(dp, 1, maxDPSize)
	if !ok {
		return serverInfo{}, fmt.Errorf("invalid dp_size %s", dp.Raw)
	}
	info.dpSize = n
	if mode := root.Get("disaggregation_mode"); mode.Type == gjson.String {
		info.mode = mode.Str
	}
	if port := root.Get("disaggregation_bootstrap_port"); prefill && port.Exists() && port.Type != gjson.Null {
		n, ok := intValue(port, 1, 65535)
		if !ok {
			return serverInfo{}, fmt.Errorf("invalid disaggregation_bootstrap_port %s", port.Raw)
		}
		info.bootstrapPort = n
	}
	if !prefill {
		info.decodeCache = parseDecodeCache(root)
	}
	info.kvEvents = parseKVEvents(root.Get("kv_events"))
	info.priority = PriorityScheduling{
		Enabled:        root.Get("enable_priority_scheduling").Type == gjson.True,
		LowValuesFirst: root.Get("schedule_low_priority_values_first").Type == gjson.True,
	}
	return info, nil
}

// parseKVEvents reads SGLang's kv_events descriptor in /server_info:
// {"publisher": "zmq", "endpoint_host", "endpoint_port_base", "topic",
// "block_size", "dp_size", "replay_endpoint_port_base"}. Anything else
// (absent, null, another publisher, a bad port) means no events.
func parseKVEvents(d gjson.Result) KVEvents {
	if !d.IsObject() || d.Get("publisher").Str != "zmq" {
		return KVEvents{}
	}
	port, ok := intValue(d.Get("endpoint_port_base"), 1, 65535)
	if !ok {
		return KVEvents{}
	}
	ev := KVEvents{Host: d.Get("endpoint_host").Str, Port: port, Topic: d.Get("topic").Str}
	if r, ok := intValue(d.Get("replay_endpoint_port_base"), 1, 65535); ok {
		ev.ReplayPort = r
	}
	if b, ok := intValue(d.Get("block_size"), 1, 1<<16); ok {
		ev.BlockSize = b
	}
	return ev
}

// parseDecodeCache reads a decode engine's radix cache settings: SGLang's
// server_info lists its server arguments, among them
// disaggregation_decode_enable_radix_cache and, for the host tier,
// enable_hierarchical_cache with hicache_ratio (SGLang's default 2). Values
// of other types, or absent, mean no cache.
func parseDecodeCache(root gjson.Result) DecodeCache {
	if root.Get("disaggregation_decode_enable_radix_cache").Type != gjson.True {
		return DecodeCache{}
	}
	dc := DecodeCache{Radix: true}
	if root.Get("enable_hierarchical_cache").Type == gjson.True {
		dc.HostRatio = defaultHostRatio
		if r := root.Get("hicache_ratio"); r.Type == gjson.Number && r.Num > 0 && r.Num <= maxHostRatio {
			dc.HostRatio = r.Num
		}
	}
	return dc
}

// Host tier ratios: SGLang's default --hicache-ratio, and the largest ratio
// believed (a larger one would only grow the prefix index's bound).
const (
	defaultHostRatio = 2
	maxHostRatio     = 64
)

// intValue returns r as an int if it is a JSON number holding an integer in
// [lo, hi].
func intValue(r gjson.Result, lo, hi int) (int, bool) {
	if r.Type != gjson.Number || r.Num != math.Trunc(r.Num) || r.Num < float64(lo) || r.Num > float64(hi) {
		return 0, false
	}
	return int(r.Num), true
}

// apply merges a probe into what is known about m and returns the endpoint's
// new state, together with the round's error for m, if any. It logs changes
// and warnings; it does not set m.cur.
//
// Precedence for DP size and bootstrap port: this round's discovery, else
// the last successful discovery, else the configuration. An endpoint whose DP
// size is known from none of them, or whose hostname does not resolve, is
// not ready.
func (s *Scheduler) apply(m *member, p probe) (Endpoint, error) {
	old := m.cur
	ep := old
	log := s.log.With(zap.String("role", string(m.role)), zap.String("url", m.url.base))

	var errs []error
	if p.resolveErr != nil {
		errs = append(errs, p.resolveErr)
	} else {
		ep.Address = address(p.addr, m.url.port)
	}

	var dp, port int
	var source string
	var cache DecodeCache
	var priority PriorityScheduling
	events := m.spec.KVEvents
	if events.Port == 0 {
		events = s.kvEvents
	}
	switch {
	case p.infoErr == nil:
		s.checkDiscovered(log, m, p.info)
		m.known = true
		m.knownDP, m.knownPort, m.knownSource, m.knownCache = p.info.dpSize, p.info.bootstrapPort, p.source, p.info.decodeCache
		dp, port, source, cache = p.info.dpSize, p.info.bootstrapPort, p.source, p.info.decodeCache
		m.knownEvents = p.info.kvEvents
		m.knownMode = p.info.mode
		m.knownPriority, priority = p.info.priority, p.info.priority
		if p.info.kvEvents.Port > 0 {
			events = p.info.kvEvents
		}
	case m.known:
		errs = append(errs, p.infoErr)
		dp, port, source, cache = m.knownDP, m.knownPort, m.knownSource, m.knownCache
		priority = m.knownPriority
		if m.knownEvents.Port > 0 {
			events = m.knownEvents
		}
	case m.spec.DPSize > 0:
		errs = append(errs, p.infoErr)
		dp, source = m.spec.DPSize, sourceConfig
	default:
		errs = append(errs, p.infoErr)
	}
	if m.role == RolePrefill && dp > 0 {
		if port == 0 {
			port = m.spec.BootstrapPort
		}
		if port == 0 {
			port = defaultBootstrapPort
		}
	} else {
		port = 0
	}
	ep.DPSize, ep.BootstrapPort, ep.Source, ep.DecodeCache, ep.KVEvents = dp, port, source, cache, events
	ep.Priority = priority
	ep.Mode, ep.ExpectedMode = m.knownMode, expectedMode(m.role, s.pd)
	ep.WrongMode = wrongMode(m.role, m.knownMode)
	ep.Ready = dp > 0 && p.resolveErr == nil && !ep.WrongMode
	err := errors.Join(errs...)
	ep.LastError = ""
	if err != nil {
		ep.LastError = err.Error()
	}

	s.logTransition(log, old, ep)
	if err != nil {
		return ep, fmt.Errorf("scheduler: discover %s endpoint %s: %w", m.role, m.url.base, err)
	}
	return ep, nil
}

// checkDiscovered warns, once per distinct value, when discovery disagrees
// with the configuration or the engine runs in an unexpected
// disaggregation mode.
func (s *Scheduler) checkDiscovered(log *zap.Logger, m *member, info serverInfo) {
	if m.spec.DPSize > 0 && info.dpSize != m.spec.DPSize && info.dpSize != m.warnedDP {
		m.warnedDP = info.dpSize
		log.Warn("configured dp_size differs from the engine's; using the engine's",
			zap.Int("configured", m.spec.DPSize), zap.Int("discovered", info.dpSize))
	}
	if m.role == RolePrefill && m.spec.BootstrapPort > 0 && info.bootstrapPort > 0 &&
		info.bootstrapPort != m.spec.BootstrapPort && info.bootstrapPort != m.warnedPort {
		m.warnedPort = info.bootstrapPort
		log.Warn("configured bootstrap port differs from the engine's; using the engine's",
			zap.Int("configured", m.spec.BootstrapPort), zap.Int("discovered", info.bootstrapPort))
	}
	switch {
	case !wrongMode(m.role, info.mode):
		m.warnedMode = ""
	case info.mode != m.warnedMode:
		m.warnedMode = info.mode
		log.Warn("engine reports an unexpected disaggregation_mode for its role; it is not scheduled until it reports the expected one",
			zap.String("disaggregation_mode", info.mode), zap.String("expected", expectedMode(m.role, s.pd)))
	}
}

// wrongMode reports whether an engine that reports disaggregation_mode mode
// cannot serve role: a prefill endpoint must run in prefill mode, and a
// decode endpoint must not. An engine that reports no mode (older SGLang,
// other engines) is taken at its word. A decode endpoint in "null" mode is
// accepted: that is an aggregated pool's engine.
func wrongMode(role Role, mode string) bool {
	if mode == "" {
		return false
	}
	if role == RolePrefill {
		return mode != "prefill"
	}
	return mode == "prefill"
}

// expectedMode is the disaggregation_mode role needs, in a PD pool (pd) or
// an aggregated one.
func expectedMode(role Role, pd bool) string {
	switch {
	case role == RolePrefill:
		return "prefill"
	case pd:
		return "decode"
	default:
		return "null"
	}
}

// logTransition logs what changed between two states of an endpoint.
func (s *Scheduler) logTransition(log *zap.Logger, old, ep Endpoint) {
	fields := []zap.Field{
		zap.String("address", ep.Address),
		zap.Int("dp_size", ep.DPSize),
		zap.String("source", ep.Source),
	}
	if ep.Role == RolePrefill {
		fields = append(fields, zap.Int("bootstrap_port", ep.BootstrapPort))
	}
	if ep.DecodeCache.Radix {
		fields = append(fields, zap.Bool("decode_radix_cache", true), zap.Float64("host_cache_ratio", ep.DecodeCache.HostRatio))
	}
	if ep.KVEvents.Port > 0 {
		fields = append(fields, zap.Int("kv_events_port", ep.KVEvents.Port), zap.Int("kv_events_replay_port", ep.KVEvents.ReplayPort))
	}
	if ep.LastError != "" {
		fields = append(fields, zap.String("error", ep.LastError))
	}
	if ep.WrongMode {
		fields = append(fields, zap.String("disaggregation_mode", ep.Mode), zap.String("expected_mode", ep.ExpectedMode))
	}
	switch {
	case !old.Ready && ep.Ready:
		log.Info("endpoint ready", fields...)
	case old.Ready && !ep.Ready:
		log.Warn("endpoint not ready", fields...)
	case ep.LastError != "" && ep.LastError != old.LastError:
		log.Warn("endpoint discovery failed", fields...)
	case ep.Ready && (ep.Address != old.Address || ep.DPSize != old.DPSize || ep.BootstrapPort != old.BootstrapPort || ep.DecodeCache != old.DecodeCache || ep.KVEvents != old.KVEvents):
		log.Info("endpoint changed", fields...)
	case ep.LastError == "" && old.LastError != "":
		log.Info("endpoint discovery recovered", fields...)
	}
}
