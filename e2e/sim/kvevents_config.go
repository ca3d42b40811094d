package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
)

// KVEventsConfig is SGLang's --kv-events-config (KVEventsConfig in
// disaggregation/kv_events.py): a JSON object whose absent fields take
// SGLang's defaults and whose unknown fields SGLang ignores (pydantic's
// default). duet-sim reads it from Config.KVEventsConfig, and tests of a
// deployment's engine flags read it with ParseKVEventsConfig.
type KVEventsConfig struct {
	// Publisher is "null" (SGLang's default: events are recorded and
	// dropped) or "zmq".
	Publisher string `json:"publisher"`
	// Endpoint is rank 0's PUB address; rank r binds the port plus r.
	Endpoint string `json:"endpoint"`
	// Bind forces binding (true) or connecting (false) the PUB socket; nil
	// binds a wildcard host (*, 0.0.0.0, ::) and connects otherwise.
	Bind *bool `json:"bind"`
	// ReplayEndpoint is rank 0's replay ROUTER address (nil: no replay);
	// rank r binds the port plus r.
	ReplayEndpoint *string `json:"replay_endpoint"`
	// BufferSteps is how many batches each rank keeps for replay.
	BufferSteps int `json:"buffer_steps"`
	// HWM is the PUB socket's high-water mark (queued messages).
	HWM int `json:"hwm"`
	// MaxQueueSize bounds SGLang's publisher queue (accepted, unused:
	// duet-sim publishes synchronously).
	MaxQueueSize int `json:"max_queue_size"`
	// Topic is the first frame of every message.
	Topic string `json:"topic"`
	// Format is "default" or "dynamo" (they differ only for LoRA and
	// cache-salt namespaces, which duet-sim has not).
	Format string `json:"format"`
}

// ParseKVEventsConfig parses a --kv-events-config value, its absent fields
// taking SGLang's defaults; ok is false for "" (no KV events). Like SGLang
// it ignores unknown fields, unless strict: then an unknown field (a
// misspelt one, which SGLang would silently ignore) or anything after the
// JSON object is an error, as a test of a deployment's flags wants.
func ParseKVEventsConfig(raw string, strict bool) (cfg KVEventsConfig, ok bool, err error) {
	if strings.TrimSpace(raw) == "" {
		return KVEventsConfig{}, false, nil
	}
	cfg = KVEventsConfig{Publisher: "null", Endpoint: "tcp://*:5557", BufferSteps: 10000, HWM: 100000,
		MaxQueueSize: 100000, Format: "default"}
	if strict {
		dec := json.NewDecoder(strings.NewReader(raw))
		dec.DisallowUnknownFields()
		err = dec.Decode(&cfg)
		if err == nil {
			if _, tokErr := dec.Token(); tokErr != io.EOF {
				err = errors.New("data after the JSON object")
			}
		}
	} else {
		err = json.Unmarshal([]byte(raw), &cfg)
	}
	if err != nil {
		return KVEventsConfig{}, false, fmt.Errorf("kv-events-config is not a valid KVEventsConfig: %w", err)
	}
	return cfg, true, nil
}

// validateKVEvents checks Config.KVEventsConfig: the config itself
// (KVEventsConfig.validate) and what publishing needs besides the flag, the
// engine model (Profile). The simple latency model keeps no prefix cache,
// so a publisher beside it would send its start's AllBlocksCleared and
// nothing after: a subscriber's view would stay empty, and nothing would
// say why.
func (c Config) validateKVEvents() error {
	set, ok, err := ParseKVEventsConfig(c.KVEventsConfig, false)
	if err != nil || !ok {
		return err
	}
	errs := []error{set.validate(c.DPSize)}
	if set.Publishes() && c.Profile == "" {
		errs = append(errs, fmt.Errorf("--kv-events-config needs --profile: the events report the engine model's prefix cache, "+
			"and without --profile duet-sim runs the simple latency model, which has none (it would publish nothing). "+
			"Add --profile %s, and --tokenizer-path DIR (the tokenizer of duet's pool) so that text prompts are published too",
			strings.Join(ProfileNames(), " or ")))
	}
	return errors.Join(errs...)
}

// validate checks what SGLang checks when it starts its publishers, and
// what duet-sim supports (TCP endpoints that it binds).
func (k KVEventsConfig) validate(dpSize int) error {
	var errs []error
	switch k.Format {
	case "default", "dynamo":
	default:
		errs = append(errs, fmt.Errorf("kv-events-config: format must be \"default\" or \"dynamo\", got %q", k.Format))
	}
	switch k.Publisher {
	case "null":
		return errors.Join(errs...)
	case "zmq":
	default:
		return errors.Join(append(errs, fmt.Errorf("kv-events-config: Unknown event publisher '%s'", k.Publisher))...)
	}
	if k.BufferSteps < 0 || k.HWM < 0 || k.MaxQueueSize < 0 {
		errs = append(errs, errors.New("kv-events-config: buffer_steps, hwm and max_queue_size must not be negative"))
	}
	if !k.binds() {
		errs = append(errs, fmt.Errorf("kv-events-config: duet-sim binds its PUB sockets only, and SGLang would connect to %s: "+
			"use a wildcard host (tcp://*:PORT) or \"bind\": true", k.Endpoint))
	}
	if _, err := k.RankPorts(max(dpSize, 1)); err != nil { // Config.validate reports a DP size below 1
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// Publishes reports whether the config publishes anything (publisher
// "zmq").
func (k KVEventsConfig) Publishes() bool { return k.Publisher == "zmq" }

// binds reports whether the PUB socket binds, as SGLang decides: the
// bind field, else a wildcard host.
func (k KVEventsConfig) binds() bool {
	if k.Bind != nil {
		return *k.Bind
	}
	ep := k.Endpoint
	return strings.Contains(ep, "*") || strings.Contains(ep, "::") || strings.Contains(ep, "0.0.0.0") ||
		strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://")
}

// bindsEveryInterface reports whether every DP rank's PUB socket, and its
// replay socket if any, is bound on every interface (a tcp:// endpoint
// with a wildcard host: *, 0.0.0.0 or ::), where a subscriber can reach it
// at the engine's address (its container's, its pod's). SGLang connects
// the PUB socket instead when bind is false, and a socket bound to one
// host is reachable there only.
func (k KVEventsConfig) bindsEveryInterface() bool {
	wildcard := func(ep string) bool {
		host, _, err := splitTCP(ep)
		return err == nil && (host == "*" || host == "0.0.0.0" || host == "::")
	}
	return k.binds() && wildcard(k.Endpoint) && (k.ReplayEndpoint == nil || wildcard(*k.ReplayEndpoint))
}

// ReachablePorts returns each of dpSize DP ranks' ports, as RankPorts
// does, if a subscriber on another host (duet, beside the engine) can
// follow every rank's events and ask for the batches it missed: the
// publisher is "zmq", there is a replay endpoint, and every rank's sockets
// are bound on every interface (tcp://*:PORT), where the subscriber
// reaches them at the engine's address. Otherwise its error says what
// falls short.
func (k KVEventsConfig) ReachablePorts(dpSize int) ([]KVEventsRankPorts, error) {
	var errs []error
	if !k.Publishes() {
		errs = append(errs, fmt.Errorf("publisher %q publishes nothing; want zmq", k.Publisher))
	}
	if k.ReplayEndpoint == nil {
		errs = append(errs, errors.New("no replay_endpoint: a subscriber could not ask for the batches it missed"))
	}
	ports, err := k.RankPorts(dpSize)
	if err != nil {
		errs = append(errs, err)
	} else if !k.bindsEveryInterface() {
		errs = append(errs, errors.New("the sockets are not bound on every interface (want tcp://*:PORT and no \"bind\": false): "+
			"a subscriber could not reach them at the engine's address"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return ports, nil
}

// KVEventsRankPorts are one DP rank's KV event ports.
type KVEventsRankPorts struct {
	// PUB is the rank's PUB socket's port, Replay its replay ROUTER's (0
	// without a replay endpoint).
	PUB, Replay int
}

// RankPorts returns the KV event ports of each of dpSize DP ranks: rank
// r's are the endpoints' ports plus r, as SGLang's offset_endpoint_port
// offsets them. It fails for an endpoint that is not tcp://HOST:PORT and
// for ports that run past 65535.
func (k KVEventsConfig) RankPorts(dpSize int) ([]KVEventsRankPorts, error) {
	if dpSize < 1 {
		return nil, fmt.Errorf("kv-events-config: %d DP ranks, want at least one", dpSize)
	}
	pub, pubErr := portBase("endpoint", &k.Endpoint, dpSize)
	replay, replayErr := portBase("replay_endpoint", k.ReplayEndpoint, dpSize)
	if err := errors.Join(pubErr, replayErr); err != nil {
		return nil, err
	}
	ports := make([]KVEventsRankPorts, dpSize)
	for r := range ports {
		ports[r].PUB = pub + r
		if replay > 0 {
			ports[r].Replay = replay + r
		}
	}
	return ports, nil
}

// portBase returns rank 0's port of the endpoint ep (0 for nil), the
// field name, if dpSize ranks' ports fit below 65536.
func portBase(name string, ep *string, dpSize int) (int, error) {
	if ep == nil {
		return 0, nil
	}
	_, port, err := splitTCP(*ep)
	if err != nil {
		return 0, fmt.Errorf("kv-events-config: %s: %w", name, err)
	}
	if port+dpSize-1 > 65535 {
		return 0, fmt.Errorf("kv-events-config: %s: ports %d to %d (one per DP rank) run past 65535", name, port, port+dpSize-1)
	}
	return port, nil
}

// rankEndpoint is ep with its port offset by rank, as SGLang's
// offset_endpoint_port does for TCP.
func rankEndpoint(ep string, rank int) string {
	if rank == 0 {
		return ep
	}
	i := strings.LastIndexByte(ep, ':')
	if i < 0 {
		return ep
	}
	port, err := strconv.Atoi(ep[i+1:])
	if err != nil {
		return ep
	}
	return ep[:i+1] + strconv.Itoa(port+rank)
}

// splitTCP returns the host and port of a tcp://host:port endpoint.
func splitTCP(ep string) (string, int, error) {
	rest, ok := strings.CutPrefix(ep, "tcp://")
	if !ok {
		return "", 0, fmt.Errorf("%q: duet-sim publishes KV events over tcp:// only", ep)
	}
	host, p, err := net.SplitHostPort(rest)
	if err != nil {
		return "", 0, fmt.Errorf("%q: %w", ep, err)
	}
	port, err := strconv.Atoi(p)
	if err != nil || port < 1 || port > 65535 {
		return "", 0, fmt.Errorf("%q: port must be 1 to 65535", ep)
	}
	return host, port, nil
}

// kvEventsServerArgs are what /server_info says of KV events, as SGLang
// 0.5.23 does: kv_events_config, the flag's raw value (null when unset),
// and kv_events, the publisher's descriptor (runtime_context.py's
// describe_kv_events_publisher) or null when nothing is published.
func kvEventsServerArgs(cfg Config) map[string]any {
	out := map[string]any{"kv_events_config": nil, "kv_events": nil}
	if cfg.KVEventsConfig == "" {
		return out
	}
	out["kv_events_config"] = cfg.KVEventsConfig
	set, ok, err := ParseKVEventsConfig(cfg.KVEventsConfig, false)
	if err != nil || !ok || !set.Publishes() || set.Endpoint == "" {
		return out
	}
	host, port, err := splitTCP(set.Endpoint)
	if err != nil || host == "" {
		return out
	}
	desc := map[string]any{
		"publisher":          set.Publisher,
		"endpoint_host":      advertisedHost(host),
		"endpoint_port_base": port,
		"topic":              set.Topic,
		"block_size":         pageSize(cfg),
		"dp_size":            cfg.DPSize,
	}
	if set.ReplayEndpoint != nil {
		if h, p, err := splitTCP(*set.ReplayEndpoint); err == nil && h != "" {
			desc["replay_endpoint_port_base"] = p
		}
	}
	out["kv_events"] = desc
	return out
}

// advertisedHost brackets an IPv6 host, as SGLang advertises it.
func advertisedHost(host string) string {
	if strings.Contains(host, ":") {
		return "[" + host + "]"
	}
	return host
}

// pageSize is the page size /server_info reports: the engine model's
// cache block, 1 in the simple model.
func pageSize(cfg Config) int {
	if p, err := LookupProfile(cfg.Profile); err == nil && p.BlockSize > 0 {
		return p.BlockSize
	}
	return 1
}
