package sim

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// kvEventsSettings is SGLang's --kv-events-config (KVEventsConfig in
// disaggregation/kv_events.py): a JSON object whose absent fields take
// SGLang's defaults and whose unknown fields are ignored (pydantic's
// default).
type kvEventsSettings struct {
	// Publisher is "null" (SGLang's default: events are recorded and
	// dropped) or "zmq".
	Publisher string `json:"publisher"`
	// Endpoint is rank 0's PUB address; rank r binds the port plus r.
	Endpoint string `json:"endpoint"`
	// Bind forces binding (true) or connecting (false) the PUB socket; nil
	// binds a wildcard host (*, 0.0.0.0, ::) and connects otherwise.
	Bind *bool `json:"bind"`
	// ReplayEndpoint is rank 0's replay ROUTER address (nil: no replay).
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

// parseKVEventsConfig parses a --kv-events-config value with SGLang's
// defaults; ok is false for "" (no KV events).
func parseKVEventsConfig(raw string) (set kvEventsSettings, ok bool, err error) {
	if strings.TrimSpace(raw) == "" {
		return kvEventsSettings{}, false, nil
	}
	set = kvEventsSettings{Publisher: "null", Endpoint: "tcp://*:5557", BufferSteps: 10000, HWM: 100000,
		MaxQueueSize: 100000, Format: "default"}
	if err := json.Unmarshal([]byte(raw), &set); err != nil {
		return kvEventsSettings{}, false, fmt.Errorf("kv-events-config is not a valid KVEventsConfig: %w", err)
	}
	return set, true, nil
}

// validate checks what SGLang checks when it starts its publishers, and
// what duet-sim supports (TCP endpoints that it binds).
func (k kvEventsSettings) validate(dpSize int) error {
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
	for name, ep := range map[string]*string{"endpoint": &k.Endpoint, "replay_endpoint": k.ReplayEndpoint} {
		if ep == nil {
			continue
		}
		if _, port, err := splitTCP(*ep); err != nil {
			errs = append(errs, fmt.Errorf("kv-events-config: %s: %w", name, err))
		} else if port+dpSize-1 > 65535 {
			errs = append(errs, fmt.Errorf("kv-events-config: %s: ports %d to %d (one per DP rank) run past 65535", name, port, port+dpSize-1))
		}
	}
	return errors.Join(errs...)
}

// publishes reports whether the settings publish anything.
func (k kvEventsSettings) publishes() bool { return k.Publisher == "zmq" }

// binds reports whether the PUB socket binds, as SGLang decides: the
// bind field, else a wildcard host.
func (k kvEventsSettings) binds() bool {
	if k.Bind != nil {
		return *k.Bind
	}
	ep := k.Endpoint
	return strings.Contains(ep, "*") || strings.Contains(ep, "::") || strings.Contains(ep, "0.0.0.0") ||
		strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://")
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
	set, ok, err := parseKVEventsConfig(cfg.KVEventsConfig)
	if err != nil || !ok || !set.publishes() || set.Endpoint == "" {
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
