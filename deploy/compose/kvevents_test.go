package compose

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/types"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/e2e/sim"
)

// engineEvents is what an engine's command says of its sockets.
type engineEvents struct {
	// flag is --kv-events-config's value; "" when the engine publishes no
	// events.
	flag string
	// dp is --dp-size; pub and replay the first port of rank 0's PUB and
	// replay sockets (rank r: port + r).
	dp, pub, replay int
	// listen and bootstrap are the engine's HTTP and bootstrap ports.
	listen, bootstrap int
}

// ports returns every port the engine binds, each DP rank's sockets
// included.
func (e engineEvents) ports() []int {
	out := []int{e.listen, e.bootstrap}
	for r := range e.dp {
		out = append(out, e.pub+r, e.replay+r)
	}
	return out
}

// parseEngineEvents reads a duet-sim command's ports and KV event
// publisher.
func parseEngineEvents(t *testing.T, name string, cmd []string) engineEvents {
	t.Helper()
	ev := engineEvents{dp: 1}
	for i := 0; i+1 < len(cmd); i++ {
		v := cmd[i+1]
		var err error
		switch cmd[i] {
		case "--kv-events-config":
			ev.flag = v
		case "--dp-size":
			ev.dp, err = strconv.Atoi(v)
		case "--bootstrap-port":
			ev.bootstrap, err = strconv.Atoi(v)
		case "--listen":
			var p string
			if _, p, err = net.SplitHostPort(v); err == nil {
				ev.listen, err = strconv.Atoi(p)
			}
		}
		if err != nil {
			t.Fatalf("%s: %s %s: %v", name, cmd[i], v, err)
		}
	}
	if ev.flag == "" {
		return ev
	}
	cfg, _, err := sim.ParseKVEventsConfig(ev.flag, true)
	if err != nil {
		t.Fatalf("%s: --kv-events-config %s: %v", name, ev.flag, err)
	}
	ranks, err := cfg.ReachablePorts(ev.dp)
	if err != nil {
		t.Fatalf("%s: --kv-events-config %s: %v", name, ev.flag, err)
	}
	ev.pub, ev.replay = ranks[0].PUB, ranks[0].Replay
	return ev
}

// TestKVEvents checks the engines' KV event sockets in both stacks. Every
// SGLang-flavoured engine (prefill-*, decode-*) publishes them
// (--kv-events-config: zmq, with a replay socket), bound on every
// interface of its container, so on its address on the duet network,
// which every duet shares: duet, which reads the ports from /server_info,
// dials them there. Within each engine, its HTTP and bootstrap ports and
// every DP rank's PUB and replay ports are distinct (the engines are
// containers of their own, so engines may repeat each other's ports), and
// none is published to the host (TestPorts: only the HTTP port is). The
// vLLM-flavoured engines publish none: they have no /server_info to
// advertise them in. duet's configuration in each stack has the
// kv_events section, in mode auto: no tokenizer is configured, so duet
// follows no pool's events until one is, and no ports, since the engines
// advertise theirs.
func TestKVEvents(t *testing.T) { forEachVariant(t, testKVEvents) }

func testKVEvents(t *testing.T, p *types.Project) {
	var publishers int
	for _, name := range p.ServiceNames() {
		if !isEngine(name) {
			continue
		}
		s := service(t, p, name)
		ev := parseEngineEvents(t, name, s.Command)
		vllm := slices.Contains(s.Command, "vllm")
		if vllm != (ev.flag == "") {
			t.Errorf("%s: --kv-events-config %q; want it on every SGLang-flavoured engine and on no vLLM one", name, ev.flag)
		}
		if ev.flag == "" {
			continue
		}
		publishers++
		if ev.flag != kvEventsArgs()[1] {
			t.Errorf("%s: --kv-events-config %s, want %s", name, ev.flag, kvEventsArgs()[1])
		}
		seen := map[int]bool{}
		for _, port := range ev.ports() {
			if seen[port] {
				t.Errorf("%s: port %d twice among its HTTP %d, bootstrap %d, PUB %d+r and replay %d+r ports (%d ranks)",
					name, port, ev.listen, ev.bootstrap, ev.pub, ev.replay, ev.dp)
			}
			seen[port] = true
		}
		if _, ok := s.Networks[networkName]; !ok {
			t.Errorf("%s is not on the network %s, where duet reaches its event ports", name, networkName)
		}
		for _, pp := range s.Ports {
			if int(pp.Target) != simPort {
				t.Errorf("%s publishes its port %d to the host; duet reaches the engines on the compose network", name, pp.Target)
			}
		}
	}
	if publishers == 0 {
		t.Fatal("no engine publishes KV events")
	}
	for _, name := range duetServices {
		if _, ok := service(t, p, name).Networks[networkName]; !ok {
			t.Errorf("%s is not on the network %s, where the engines publish", name, networkName)
		}
	}
	var cfg struct {
		Tokenizer any
		Pools     []struct{ Tokenizer any }
		KVEvents  *struct {
			Mode       string
			Port       int
			ReplayPort int `yaml:"replay_port"`
		} `yaml:"kv_events"`
	}
	file := mountedFile(t, p, duetServices[0], duetConfigPath)
	readYAML(t, file, &cfg)
	tokenizer := cfg.Tokenizer != nil
	for _, pool := range cfg.Pools {
		tokenizer = tokenizer || pool.Tokenizer != nil
	}
	switch k := cfg.KVEvents; {
	case k == nil:
		t.Errorf("%s has no kv_events section", file)
	case k.Mode != "auto" || tokenizer:
		t.Errorf("%s: kv_events.mode %q with a tokenizer %v; want auto and none (the stack's clients send text)", file, k.Mode, tokenizer)
	case k.Port != 0 || k.ReplayPort != 0:
		t.Errorf("%s: kv_events.port %d, replay_port %d; want none: the engines advertise theirs", file, k.Port, k.ReplayPort)
	}
}

// freeRange returns the first of n consecutive loopback ports that are
// free now.
func freeRange(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		ports, err := harness.FreePorts(1)
		if err != nil {
			t.Fatal(err)
		}
		base := ports[0]
		var lns []net.Listener
		for i := range n {
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(base+i)))
			if err != nil {
				break
			}
			lns = append(lns, ln)
		}
		for _, ln := range lns {
			ln.Close()
		}
		if len(lns) == n {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}

// TestKVEventsAdvertised runs duet-sim with the flags of the stack's
// engines (one of each mode), on free ports instead of the containers'
// (its HTTP and bootstrap ports as harness.StartSim picks them, the event
// ports moved in --kv-events-config, nothing else changed): duet-sim
// accepts them, advertises the publisher in /server_info as SGLang does
// (kv_events, which duet reads: zmq, the wildcard host, the two port
// bases, the DP size), and every rank's PUB and replay sockets accept
// connections.
func TestKVEventsAdvertised(t *testing.T) {
	p := loadProject(t)
	opts := composeOptions()
	for _, engine := range []struct{ name, mode string }{{"prefill-0", "prefill"}, {"decode-0", "decode"}} {
		t.Run(engine.name, func(t *testing.T) {
			cmd := service(t, p, engine.name).Command
			ev := parseEngineEvents(t, engine.name, cmd)
			// The engine's own flags: what follows the demo's common ones.
			common := harness.SimArgs(engine.mode, harness.SimSpec{DPSize: ev.dp}, hostPort("0.0.0.0", simPort), bootstrapPort, opts)
			if !slices.Equal(cmd[:min(len(common), len(cmd))], common) {
				t.Fatalf("%s: command %q does not start with the demo's %q", engine.name, cmd, common)
			}
			args := slices.Clone(cmd[len(common):])
			pub, replay := freeRange(t, ev.dp), freeRange(t, ev.dp)
			i := slices.Index(args, "--kv-events-config")
			args[i+1] = strings.NewReplacer(fmt.Sprintf("*:%d", ev.pub), fmt.Sprintf("*:%d", pub),
				fmt.Sprintf("*:%d", ev.replay), fmt.Sprintf("*:%d", replay)).Replace(args[i+1])
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			proc, err := harness.StartSim(ctx, t.TempDir(), engine.name, engine.mode, harness.SimSpec{DPSize: ev.dp, Args: args})
			if proc != nil {
				defer proc.Stop(5 * time.Second)
			}
			if err != nil {
				t.Fatalf("duet-sim %q: %v", args, err)
			}
			resp, err := http.Get(proc.URL + "/server_info")
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var info struct {
				KVEvents *struct {
					Publisher  string `json:"publisher"`
					Host       string `json:"endpoint_host"`
					Port       int    `json:"endpoint_port_base"`
					ReplayPort int    `json:"replay_endpoint_port_base"`
					DPSize     int    `json:"dp_size"`
				} `json:"kv_events"`
			}
			var body bytes.Buffer
			if _, err := body.ReadFrom(resp.Body); err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(body.Bytes(), &info); err != nil {
				t.Fatalf("/server_info: %v", err)
			}
			k := info.KVEvents
			if k == nil || k.Publisher != "zmq" || k.Host != "*" || k.Port != pub || k.ReplayPort != replay || k.DPSize != ev.dp {
				t.Fatalf("/server_info kv_events = %+v; want zmq on *, ports %d and %d, dp_size %d", k, pub, replay, ev.dp)
			}
			for r := range ev.dp {
				for _, port := range []int{pub + r, replay + r} {
					c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), 2*time.Second)
					if err != nil {
						t.Errorf("rank %d: %v", r, err)
						continue
					}
					c.Close()
				}
			}
		})
	}
}
