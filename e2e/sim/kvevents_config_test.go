package sim

import (
	"reflect"
	"strings"
	"testing"
)

// ParseKVEventsConfig fills SGLang's defaults and ignores unknown fields,
// unless strict; RankPorts offsets each endpoint's port by the rank;
// ReachablePorts also wants zmq, a replay endpoint and wildcard hosts.
func TestParseKVEventsConfig(t *testing.T) {
	if _, ok, err := ParseKVEventsConfig(" ", true); ok || err != nil {
		t.Fatalf("blank: ok %v, err %v; want no KV events", ok, err)
	}
	cfg, ok, err := ParseKVEventsConfig(`{"publisher": "zmq", "replay_endpoint": "tcp://*:5600"}`, true)
	if !ok || err != nil {
		t.Fatalf("ok %v, err %v", ok, err)
	}
	if !cfg.Publishes() || cfg.Endpoint != "tcp://*:5557" || cfg.BufferSteps != 10000 || cfg.Format != "default" {
		t.Fatalf("%+v: want zmq with SGLang's defaults", cfg)
	}
	ports, err := cfg.RankPorts(3)
	if want := []KVEventsRankPorts{{5557, 5600}, {5558, 5601}, {5559, 5602}}; err != nil || !reflect.DeepEqual(ports, want) {
		t.Fatalf("RankPorts(3) = %v, %v; want %v", ports, err, want)
	}
	if reachable, err := cfg.ReachablePorts(3); err != nil || !reflect.DeepEqual(reachable, ports) {
		t.Fatalf("ReachablePorts(3) = %v, %v; want %v", reachable, err, ports)
	}

	// A misspelt field: ignored, as SGLang ignores it, unless strict.
	for _, strict := range []bool{false, true} {
		if _, _, err := ParseKVEventsConfig(`{"publisher": "zmq", "topc": "kv"}`, strict); (err != nil) != strict {
			t.Errorf("unknown field, strict %v: err %v", strict, err)
		}
		if _, _, err := ParseKVEventsConfig(`{"publisher": "zmq"} {}`, strict); err == nil {
			t.Errorf("data after the object, strict %v: no error", strict)
		}
	}

	for raw, want := range map[string]string{
		`{"endpoint": "tcp://*:65535"}`:                   "run past 65535",
		`{"replay_endpoint": "ipc:///tmp/replay"}`:        "replay_endpoint",
		`{"endpoint": "tcp://*:0", "replay_endpoint": 1}`: "not a valid KVEventsConfig",
	} {
		cfg, _, err := ParseKVEventsConfig(raw, true)
		if err == nil {
			_, err = cfg.RankPorts(2)
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err %v, want %q", raw, err, want)
		}
	}
	if _, err := cfg.RankPorts(0); err == nil {
		t.Error("RankPorts(0): no error")
	}

	for raw, want := range map[string]string{
		`{"publisher": "zmq", "endpoint": "tcp://0.0.0.0:1", "replay_endpoint": "tcp://[::]:2"}`:             "",
		`{"endpoint": "tcp://*:1", "replay_endpoint": "tcp://*:2"}`:                                          "publishes nothing",
		`{"publisher": "zmq", "endpoint": "tcp://*:1"}`:                                                      "no replay_endpoint",
		`{"publisher": "zmq", "endpoint": "tcp://*:1", "replay_endpoint": "tcp://*:2", "bind": false}`:       "not bound on every interface",
		`{"publisher": "zmq", "endpoint": "tcp://10.0.0.1:1", "replay_endpoint": "tcp://*:2", "bind": true}`: "not bound",
		`{"publisher": "zmq", "endpoint": "tcp://*:1", "replay_endpoint": "tcp://127.0.0.1:2"}`:              "not bound",
	} {
		cfg, _, err := ParseKVEventsConfig(raw, true)
		if err == nil {
			_, err = cfg.ReachablePorts(2)
		}
		if (err == nil) != (want == "") || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("%s: ReachablePorts: %v, want %q", raw, err, want)
		}
	}
}
