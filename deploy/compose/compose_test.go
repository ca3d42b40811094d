// Package compose holds the Docker Compose demo stack (compose.yaml and the
// configuration files it mounts). Its tests validate the stack without a
// Docker engine: the compose file loads with the Compose Specification's
// own loader, every mounted file and Dockerfile exists, every service runs
// as a non-root user with a health check, no host port is published twice,
// and the configurations are those `make demo` runs, apart from the
// addresses and the replicas: two duets, both in Envoy's bootstrap, that
// share their state through a NATS (duet.yaml is rendered by
// harness.DuetConfig from harness.DemoOptions with the sync and kv_events
// sections added, envoy.yaml by `duet envoy-config` from duet.yaml), and
// the KV cache events that the SGLang-flavoured engines publish
// (--kv-events-config; TestKVEvents checks their ports). Envoy and duet
// authenticate each other with mutual TLS, and the duets to NATS with a
// token, with credentials that the one-shot service certs makes
// (TestCredentials runs its command; TestNATS runs NATS's configuration on
// a real nats-server).
//
// compose.pools.yaml, laid over compose.yaml, serves two models (a PD pool
// of the demo's engines and an aggregated pool of vLLM-flavoured ones):
// pools_test.go proves its files, and the tests that check the stack's
// services, ports, scrape targets, bootstrap and credentials run on both
// stacks (the variants).
//
// After changing the demo's options or an address in compose.yaml,
// regenerate the files with
//
//	go test ./deploy/compose -run 'TestConfigs|TestPoolsConfigs' -update
package compose

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/compose-spec/compose-go/v2/loader"
	"github.com/compose-spec/compose-go/v2/types"
	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/e2e/harness"
)

var update = flag.Bool("update", false, "rewrite duet.yaml and envoy.yaml from the demo's options")

// Ports inside the containers. The compose file, duet.yaml and
// prometheus.yml must agree with them (the tests check each).
const (
	duetGRPCPort   = 9002
	duetAdminPort  = 9003
	envoyPort      = 8080
	envoyAdminPort = 9901
	simPort        = 30000
	bootstrapPort  = 8998
	prometheusPort = 9090
	grafanaPort    = 3000
)

// Paths inside the containers.
const (
	duetConfigPath  = "/etc/duet/duet.yaml"
	envoyConfigPath = "/etc/envoy/envoy.yaml"
	// certsDir is where duet and Envoy mount the credentials volume (the
	// same path in both: duet's client CA is Envoy's server CA).
	certsDir = "/etc/duet/certs"
)

// The one-shot service that makes the credentials, and their volume.
const (
	certsService = "certs"
	certsVolume  = "duet-certs"
)

// networkName is the compose network every service is attached to.
const networkName = "duet"

// duetServices are the compose services of the duet replicas, each named
// by its POD_NAME among its peers.
var duetServices = []string{"duet-0", "duet-1"}

// NATS: its service, ports and paths inside its container.
const (
	natsService     = "nats"
	natsClientPort  = 4222
	natsMonitorPort = 8222
	natsConfigPath  = "/etc/nats/nats.conf"
	// natsVolumeDir is the directory of the credentials volume that NATS
	// mounts (a subpath): NATS's token, as an authorization block.
	natsVolumeDir = "nats"
)

// The ports of the engines' KV event sockets (SGLang's --kv-events-config,
// which duet-sim takes as SGLang does): DP rank r publishes on
// kvEventsPort + r and replays on kvReplayPort + r, inside each engine's
// container. The ranges must not overlap (SGLang's example replay port,
// 5558, is rank 1's PUB port) nor take simPort or bootstrapPort:
// TestKVEvents checks them for the stack's DP sizes.
const (
	kvEventsPort = 5557
	kvReplayPort = 5600
)

// kvEventsArgs are the flags the compose stack adds to the demo engines':
// every DP rank publishes its cache's KV events, on every interface of its
// container (the wildcard host), and duet-sim advertises them in
// /server_info, where duet finds them.
func kvEventsArgs() []string {
	return []string{"--kv-events-config",
		fmt.Sprintf(`{"publisher":"zmq","endpoint":"tcp://*:%d","replay_endpoint":"tcp://*:%d"}`, kvEventsPort, kvReplayPort)}
}

// kvEventsYAML is duet's kv_events section in the compose stack: the
// default mode, written out with why.
const kvEventsYAML = `# The engines publish their KV cache events (--kv-events-config in
# compose.yaml) and advertise the ports in /server_info, where duet finds
# them. duet follows them in pools with a tokenizer (mode auto): none here,
# as the stack ships no model files (compose.yaml's duet-0 says how to
# mount them; give the engines --tokenizer-path to the same files, so that
# they key text prompts by the same token ids). "on" follows them without
# a tokenizer too, for clients that send token ids (/generate input_ids).
kv_events:
  mode: auto
`

// admissionYAML is the compose stack's admission example: commented out,
// so the stack runs duet's default (one class). TestAdmissionExample
// loads it uncommented.
const admissionYAML = `# The admission queue (docs/configuration.md, "Admission") is on with one
# class: while every engine of a role is saturated, duet queues requests
# and answers 429 early what cannot start within 10s. Two classes, tenants
# that share fairly, chosen by headers the client sends (x-priority:
# interactive, x-tenant: team-a):
#   curl -H 'x-priority: interactive' -H 'x-tenant: team-a' ...
# A demo only: trust_client_headers lets any client pick its class. Behind
# a gateway, use x-duet-* headers that only the gateway's own filters set
# (duet's Envoy strips the clients' copies): examples in
# deploy/envoy-gateway/admission and deploy/istio/admission.
# admission:
#   classes:
#   - {name: interactive, priority: 10, wait_limit: 5s}
#   - {name: batch, priority: 0, wait_limit: 30s}
#   default_class: batch
#   class_header: x-priority
#   tenant_header: x-tenant
#   trust_client_headers: true
#   tenant_weights: {team-a: 2}
#   max_queued: 64
`

// syncYAML is what the compose stack adds to the demo's configuration: the
// duets share their state through the nats service, with the token that
// the certs service writes.
const syncYAML = "sync:\n  nats:\n    url: nats://nats:4222\n    token_file: " + certsDir + "/nats-token\n"

// otlpYAML turns tracing on in the compose stack (docs/tracing.md): Envoy
// and the duets export their spans to the jaeger service, every request
// traced. TestTracing checks it against compose.yaml.
const otlpYAML = `# Tracing (docs/tracing.md): Envoy traces every request (sampling_percent
# 100, for a demo; busy deployments set 1 or less) and exports its
# spans, as service duet-envoy, and both duets theirs, as service duet, to
# the jaeger service over OTLP/gRPC. Its UI: http://127.0.0.1:16686.
otlp:
  endpoint: ` + jaegerService + `:4317
  sampling_percent: 100
`

// composeOptions are the demo's options (harness.DemoOptions) with the
// sync, otlp and kv_events sections and the admission example (commented
// out), and the demo's engines publishing their KV cache events
// (kvEventsArgs).
func composeOptions() harness.Options {
	opts := harness.DemoOptions()
	opts.DuetYAML += syncYAML + otlpYAML + kvEventsYAML + admissionYAML
	for _, specs := range [][]harness.SimSpec{opts.Prefill, opts.Decode} {
		for i := range specs {
			specs[i].Args = append(slices.Clone(specs[i].Args), kvEventsArgs()...)
		}
	}
	return opts
}

// variant is one way of running the stack: the compose files `docker
// compose -f ... -f ...` is given, in order.
type variant struct {
	name  string
	files []string
}

// variants are the stacks the tests check: compose.yaml alone (the demo),
// and with compose.pools.yaml laid over it (two models, pools_test.go).
var variants = []variant{
	{"demo", []string{"compose.yaml"}},
	{"pools", []string{"compose.yaml", "compose.pools.yaml"}},
}

// forEachVariant runs f on every variant's project, as a subtest.
func forEachVariant(t *testing.T, f func(t *testing.T, p *types.Project)) {
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) { f(t, loadProject(t, v.files...)) })
	}
}

// loadProject loads the compose files (default compose.yaml) as `docker
// compose` does, later files laid over earlier ones.
func loadProject(t *testing.T, files ...string) *types.Project {
	t.Helper()
	if len(files) == 0 {
		files = []string{"compose.yaml"}
	}
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range files {
		paths = append(paths, filepath.Join(dir, f))
	}
	ctx := context.Background()
	details, err := loader.LoadConfigFiles(ctx, paths, dir)
	if err != nil {
		t.Fatalf("%v: %v", files, err)
	}
	details.Environment = types.Mapping{} // the files must not depend on the caller's environment
	p, err := loader.LoadWithContext(ctx, *details)
	if err != nil {
		t.Fatalf("%v: %v", files, err)
	}
	return p
}

// service returns the named service or fails the test.
func service(t *testing.T, p *types.Project, name string) types.ServiceConfig {
	t.Helper()
	s, ok := p.Services[name]
	if !ok {
		t.Fatalf("compose.yaml: no service %q", name)
	}
	return s
}

// ipOf returns the service's fixed address on the duet network.
func ipOf(t *testing.T, p *types.Project, name string) string {
	t.Helper()
	n := service(t, p, name).Networks[networkName]
	if n == nil || n.Ipv4Address == "" {
		t.Fatalf("compose.yaml: service %s has no ipv4_address on network %s", name, networkName)
	}
	return n.Ipv4Address
}

func hostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

// engines returns the compose services of the demo's engines, in the order of
// harness.DemoOptions.
func engines(role string, n int) []string {
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("%s-%d", role, i)
	}
	return names
}

// demoAddresses places the demo's parts at their compose addresses: every
// server listens on all interfaces, Envoy reaches every duet replica, and
// the duets and Envoy reach the engines, at their fixed IPs.
func demoAddresses(t *testing.T, p *types.Project, opts harness.Options) harness.Addresses {
	a := harness.Addresses{
		DuetGRPC:    hostPort("0.0.0.0", duetGRPCPort),
		DuetAdmin:   hostPort("0.0.0.0", duetAdminPort),
		EnvoyListen: hostPort("0.0.0.0", envoyPort),
		EnvoyAdmin:  hostPort("0.0.0.0", envoyAdminPort),
		Credentials: harness.CredentialsIn(certsDir),
	}
	for _, name := range duetServices {
		a.EnvoyDuetReplicas = append(a.EnvoyDuetReplicas, hostPort(ipOf(t, p, name), duetGRPCPort))
	}
	for _, name := range engines("prefill", len(opts.Prefill)) {
		a.Prefill = append(a.Prefill, "http://"+hostPort(ipOf(t, p, name), simPort))
	}
	for _, name := range engines("decode", len(opts.Decode)) {
		a.Decode = append(a.Decode, "http://"+hostPort(ipOf(t, p, name), simPort))
	}
	return a
}

// TestConfigs proves that the compose stack runs what `make demo` runs: the
// same duet configuration, engine flags and Envoy flags, with the addresses
// changed, Envoy's bootstrap listing both duet replicas
// (envoy.duet_replicas, where the demo's single duet is envoy.duet), the
// sync and kv_events sections added and the engines publishing their KV
// events (composeOptions); and an Envoy bootstrap that is exactly duet's
// rendering of duet.yaml. Both duets run duet.yaml, each under its own
// name, and duet.yaml's NATS is the nats service.
func TestConfigs(t *testing.T) {
	p := loadProject(t)
	opts := composeOptions()

	wantDuet := harness.DuetConfig(opts, demoAddresses(t, p, opts))
	if *update {
		if err := os.WriteFile("duet.yaml", []byte(duetYAMLHeader+wantDuet), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile("duet.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != duetYAMLHeader+wantDuet {
		t.Errorf("duet.yaml is not the demo's configuration at the compose addresses; run `go test ./deploy/compose -run TestConfigs -update`.\ngot:\n%s\nwant:\n%s", got, duetYAMLHeader+wantDuet)
	}

	wantEnvoy := renderEnvoy(t, "duet.yaml")
	if *update {
		if err := os.WriteFile("envoy.yaml", wantEnvoy, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := os.ReadFile("envoy.yaml"); err != nil {
		t.Fatal(err)
	} else if !bytes.Equal(got, wantEnvoy) {
		t.Errorf("envoy.yaml differs from `duet envoy-config -config duet.yaml`; run `go test ./deploy/compose -run TestConfigs -update`")
	}

	for i, spec := range opts.Prefill {
		name := fmt.Sprintf("prefill-%d", i)
		want := harness.SimArgs("prefill", spec, hostPort("0.0.0.0", simPort), bootstrapPort, opts)
		if got := service(t, p, name).Command; !slices.Equal(got, want) {
			t.Errorf("%s: command %q, want the demo's %q", name, got, want)
		}
	}
	for i, spec := range opts.Decode {
		name := fmt.Sprintf("decode-%d", i)
		want := harness.SimArgs("decode", spec, hostPort("0.0.0.0", simPort), bootstrapPort, opts)
		if got := service(t, p, name).Command; !slices.Equal(got, want) {
			t.Errorf("%s: command %q, want the demo's %q", name, got, want)
		}
	}
	var prefills, decodes int
	for _, name := range p.ServiceNames() {
		switch {
		case strings.HasPrefix(name, "prefill-"):
			prefills++
		case strings.HasPrefix(name, "decode-"):
			decodes++
		}
	}
	if prefills != len(opts.Prefill) || decodes != len(opts.Decode) {
		t.Errorf("compose.yaml runs %d prefill and %d decode engines, the demo %d and %d",
			prefills, decodes, len(opts.Prefill), len(opts.Decode))
	}

	envoy := service(t, p, "envoy")
	if want := harness.EnvoyArgs(envoyConfigPath); !slices.Equal(envoy.Command, want) {
		t.Errorf("envoy: command %q, want the demo's %q", envoy.Command, want)
	}
	var duets []string
	for _, name := range p.ServiceNames() {
		if strings.HasPrefix(name, "duet") {
			duets = append(duets, name)
		}
	}
	if !slices.Equal(duets, duetServices) {
		t.Errorf("compose.yaml runs the duets %v, want %v", duets, duetServices)
	}
	mounts := map[string]map[string]string{
		"envoy":     {envoyConfigPath: "envoy.yaml"},
		natsService: {natsConfigPath: "nats.conf"},
	}
	names := map[string]bool{}
	for _, name := range duetServices {
		duet := service(t, p, name)
		if want := []string{"serve", "-config", duetConfigPath}; !slices.Equal(duet.Command, want) {
			t.Errorf("%s: command %q, want %q", name, duet.Command, want)
		}
		mounts[name] = map[string]string{duetConfigPath: "duet.yaml"}
		// The replica's name among its peers (sync.name is left empty).
		pod := ""
		if v := duet.Environment["POD_NAME"]; v != nil {
			pod = *v
		}
		if pod != name || names[pod] {
			t.Errorf("%s: POD_NAME %q, want %s (each replica its own name)", name, pod, name)
		}
		names[pod] = true
	}
	for svc, m := range mounts {
		for target, source := range m {
			if got := mountSource(service(t, p, svc), target); filepath.Base(got) != source {
				t.Errorf("%s: %s is mounted from %q, want %s", svc, target, got, source)
			}
		}
	}
	nats := service(t, p, natsService)
	if want := []string{"--config", natsConfigPath}; !slices.Equal(nats.Command, want) || !slices.Equal(nats.Entrypoint, []string{"/usr/local/bin/nats-server"}) {
		t.Errorf("nats: entrypoint %q command %q, want nats-server %q", nats.Entrypoint, nats.Command, want)
	}
	var cfg struct {
		Sync struct {
			NATS struct{ URL string } `yaml:"nats"`
			Name string
		}
	}
	readYAML(t, "duet.yaml", &cfg)
	if want := "nats://" + hostPort(natsService, natsClientPort); cfg.Sync.NATS.URL != want || cfg.Sync.Name != "" {
		t.Errorf("duet.yaml: sync.nats.url %q, sync.name %q; want %s and no name", cfg.Sync.NATS.URL, cfg.Sync.Name, want)
	}
}

// duetYAMLHeader opens the generated duet.yaml.
const duetYAMLHeader = `# duet's configuration in the compose stack, for both replicas (duet-0 and
# duet-1): the one ` + "`make demo`" + ` runs (harness.DemoOptions), at the compose
# network's addresses, with both replicas in Envoy's bootstrap
# (envoy.duet_replicas), a sync section (they share their state through
# the nats service), tracing to the jaeger service (otlp), a kv_events
# section and an admission example.
# Generated by ` + "`go test ./deploy/compose -run TestConfigs -update`" + `;
# envoy.yaml is ` + "`duet envoy-config -config duet.yaml`" + `.
`

// renderEnvoy runs the real `duet envoy-config` on the file at path.
func renderEnvoy(t *testing.T, path string) []byte {
	t.Helper()
	tools, err := harness.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd := exec.Command(tools.Duet, "envoy-config", "-config", path)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("duet envoy-config: %v: %s", err, stderr.String())
	}
	return out
}

// mountedFile returns the file (relative to this directory) that the
// service mounts at target, or fails the test.
func mountedFile(t *testing.T, p *types.Project, svc, target string) string {
	t.Helper()
	src := mountSource(service(t, p, svc), target)
	if src == "" {
		t.Fatalf("%s mounts nothing at %s", svc, target)
	}
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	rel, err := filepath.Rel(dir, src)
	if err != nil || strings.HasPrefix(rel, "..") {
		t.Fatalf("%s mounts %s at %s, outside %s", svc, src, target, dir)
	}
	return rel
}

// isEngine reports whether the compose service is a simulated engine.
func isEngine(name string) bool {
	return strings.HasPrefix(name, "prefill-") || strings.HasPrefix(name, "decode-") || strings.HasPrefix(name, "vllm-")
}

// mountSource returns the host path mounted at target, or "".
func mountSource(s types.ServiceConfig, target string) string {
	for _, v := range s.Volumes {
		if v.Target == target {
			return v.Source
		}
	}
	return ""
}

// TestServices checks each service on its own: images pinned or built from
// an existing Dockerfile, a non-root user, a health check, bind mounts that
// exist and are read-only, a fixed address inside the subnet. A one-shot
// service (restart "no", see oneShot) has no health check and no network;
// the services that wait for it wait for its successful completion.
func TestServices(t *testing.T) { forEachVariant(t, testServices) }

func testServices(t *testing.T, p *types.Project) {
	subnet := projectSubnet(t, p)
	ips := map[string]string{}
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		t.Run(name, func(t *testing.T) {
			switch {
			case s.Build != nil:
				df := filepath.Join(s.Build.Context, s.Build.Dockerfile)
				if _, err := os.Stat(df); err != nil {
					t.Errorf("build: %v", err)
				}
				if !strings.HasPrefix(s.Image, "duet") || strings.HasSuffix(s.Image, ":latest") {
					t.Errorf("image %q: a built image is named duet* with a tag other than latest", s.Image)
				}
			case s.Image == "":
				t.Error("neither image nor build")
			default:
				ref, tag, ok := strings.Cut(s.Image, ":")
				if !ok || tag == "latest" || !strings.ContainsAny(tag, "0123456789") || ref == "" {
					t.Errorf("image %q is not pinned to a version", s.Image)
				}
			}
			if user, _, _ := strings.Cut(s.User, ":"); user == "" || user == "0" || user == "root" {
				t.Errorf("user %q: every service runs as a non-root user", s.User)
			}
			for dep, d := range s.DependsOn {
				want := types.ServiceConditionHealthy
				if oneShot(p.Services[dep]) {
					want = types.ServiceConditionCompletedSuccessfully
				}
				if d.Condition != want {
					t.Errorf("depends_on %s: condition %q, want %s", dep, d.Condition, want)
				}
			}
			for _, v := range s.Volumes {
				if v.Type != types.VolumeTypeBind {
					continue
				}
				if _, err := os.Stat(v.Source); err != nil {
					t.Errorf("mount %s: %v", v.Target, err)
				}
				if !v.ReadOnly {
					t.Errorf("mount %s: configuration is mounted read-only", v.Target)
				}
			}
			if oneShot(s) {
				if s.NetworkMode != "none" || len(s.Networks) > 0 || len(s.Ports) > 0 {
					t.Errorf("one-shot service: network_mode %q, networks %v, ports %v; want network_mode none and nothing else", s.NetworkMode, s.Networks, s.Ports)
				}
				return
			}
			if s.HealthCheck == nil || s.HealthCheck.Disable || len(s.HealthCheck.Test) < 2 {
				t.Errorf("no health check")
			}
			ip := ipOf(t, p, name)
			addr, err := netip.ParseAddr(ip)
			if err != nil || !subnet.Contains(addr) || addr == subnet.Addr().Next() {
				t.Errorf("ipv4_address %s is not a host address of %s", ip, subnet)
			}
			if other, dup := ips[ip]; dup {
				t.Errorf("ipv4_address %s is also %s's", ip, other)
			}
			ips[ip] = name
		})
	}
}

// oneShot reports whether s runs once and exits (restart "no"), as the
// certs service does, rather than serving.
func oneShot(s types.ServiceConfig) bool { return s.Restart == types.RestartPolicyNo }

// projectSubnet returns the duet network's subnet.
func projectSubnet(t *testing.T, p *types.Project) netip.Prefix {
	t.Helper()
	n, ok := p.Networks[networkName]
	if !ok || len(n.Ipam.Config) != 1 {
		t.Fatalf("compose.yaml: network %s needs exactly one ipam subnet", networkName)
	}
	prefix, err := netip.ParsePrefix(n.Ipam.Config[0].Subnet)
	if err != nil {
		t.Fatalf("compose.yaml: network %s: %v", networkName, err)
	}
	return prefix
}

// TestPorts checks that no host port is published twice, that only loopback
// is published to, and that each published port and health check names the
// port its service really listens on.
func TestPorts(t *testing.T) { forEachVariant(t, testPorts) }

func testPorts(t *testing.T, p *types.Project) {
	listens := map[string][]int{
		"envoy":       {envoyPort, envoyAdminPort},
		"prometheus":  {prometheusPort},
		"grafana":     {grafanaPort},
		natsService:   {natsClientPort, natsMonitorPort},
		jaegerService: {jaegerOTLPPort, jaegerUIPort, jaegerHealthPort},
	}
	for _, name := range duetServices {
		listens[name] = []int{duetAdminPort}
	}
	for _, name := range p.ServiceNames() {
		if isEngine(name) {
			listens[name] = []int{simPort}
		}
	}
	published := map[string]string{}
	for _, name := range p.ServiceNames() {
		s := p.Services[name]
		for _, port := range s.Ports {
			key := port.HostIP + ":" + port.Published + "/" + port.Protocol
			if other, dup := published[key]; dup {
				t.Errorf("%s publishes %s, as %s does", name, key, other)
			}
			published[key] = name
			if port.HostIP != "127.0.0.1" {
				t.Errorf("%s publishes port %s on %q, want 127.0.0.1", name, port.Published, port.HostIP)
			}
			if !slices.Contains(listens[name], int(port.Target)) {
				t.Errorf("%s publishes container port %d, which it does not listen on (%v)", name, port.Target, listens[name])
			}
		}
		if s.HealthCheck != nil {
			check := strings.Join(s.HealthCheck.Test, " ")
			found := false
			for _, port := range listens[name] {
				found = found || strings.Contains(check, "127.0.0.1:"+strconv.Itoa(port)+"/") ||
					strings.Contains(check, "127.0.0.1/"+strconv.Itoa(port)+" ")
			}
			if !found {
				t.Errorf("%s: health check %q probes none of its ports %v", name, check, listens[name])
			}
		}
	}
	// duet.yaml must serve where the compose file expects.
	var cfg struct {
		Listen struct{ GRPC, Admin string }
		Envoy  struct{ Listen, Admin string }
	}
	duetYAML := mountedFile(t, p, duetServices[0], duetConfigPath)
	data, err := os.ReadFile(duetYAML)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		t.Fatalf("%s: %v", duetYAML, err)
	}
	for field, got := range map[string]string{
		"listen.grpc": cfg.Listen.GRPC, "listen.admin": cfg.Listen.Admin,
		"envoy.listen": cfg.Envoy.Listen, "envoy.admin": cfg.Envoy.Admin,
	} {
		want := map[string]int{"listen.grpc": duetGRPCPort, "listen.admin": duetAdminPort,
			"envoy.listen": envoyPort, "envoy.admin": envoyAdminPort}[field]
		if _, port, _ := net.SplitHostPort(got); port != strconv.Itoa(want) {
			t.Errorf("%s %s = %q, want port %d", duetYAML, field, got, want)
		}
	}
}

// TestEnvoyImageVersion checks that the compose stack runs the Envoy
// version the end-to-end tests prove the bootstrap on.
func TestEnvoyImageVersion(t *testing.T) {
	version, err := harness.FindEnvoyVersion()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := service(t, loadProject(t), "envoy").Image, "envoyproxy/envoy:v"+version; got != want {
		t.Errorf("envoy image %q, want %q (the Envoy the tests run)", got, want)
	}
}

// TestPrometheusTargets checks that Prometheus scrapes duet and every engine
// at the addresses and ports where they serve /metrics, and Envoy's stats.
func TestPrometheusTargets(t *testing.T) { forEachVariant(t, testPrometheusTargets) }

func testPrometheusTargets(t *testing.T, p *types.Project) {
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			MetricsPath   string `yaml:"metrics_path"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	file := mountedFile(t, p, "prometheus", "/etc/prometheus/prometheus.yml")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	want := map[string]string{ // target -> metrics path
		hostPort("envoy", envoyAdminPort): "/stats/prometheus",
	}
	for _, name := range duetServices {
		want[hostPort(name, duetAdminPort)] = ""
	}
	for _, name := range p.ServiceNames() {
		if isEngine(name) {
			want[hostPort(name, simPort)] = ""
		}
	}
	got := map[string]string{}
	for _, sc := range cfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			for _, target := range st.Targets {
				if _, dup := got[target]; dup {
					t.Errorf("%s scrapes %s twice", file, target)
				}
				got[target] = sc.MetricsPath
			}
		}
	}
	for target, path := range want {
		if gotPath, ok := got[target]; !ok {
			t.Errorf("%s does not scrape %s", file, target)
		} else if gotPath != path {
			t.Errorf("%s scrapes %s at metrics_path %q, want %q", file, target, gotPath, path)
		}
	}
	for target := range got {
		if _, ok := want[target]; !ok {
			t.Errorf("%s scrapes %s, which is not a compose service's metrics port", file, target)
		}
	}
}

// TestEnvoyHealthCheck runs the envoy service's health check command (the
// image has no curl or wget, so it speaks HTTP through bash) against a real
// Envoy admin port, moved to a free loopback port.
func TestEnvoyHealthCheck(t *testing.T) {
	check := service(t, loadProject(t), "envoy").HealthCheck.Test
	if len(check) != 4 || check[0] != "CMD" || check[1] != "bash" || check[2] != "-c" {
		t.Fatalf("envoy health check %q: want [CMD bash -c <script>]", check)
	}
	ports, err := harness.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	script := strings.ReplaceAll(check[3], "/"+strconv.Itoa(envoyAdminPort), "/"+strconv.Itoa(ports[0]))
	if script == check[3] {
		t.Fatalf("envoy health check %q does not name the admin port %d", check[3], envoyAdminPort)
	}
	dir := t.TempDir()
	bootstrap := filepath.Join(dir, "envoy.yaml")
	adminOnly := fmt.Sprintf("admin:\n  address: {socket_address: {address: 127.0.0.1, port_value: %d}}\n", ports[0])
	if err := os.WriteFile(bootstrap, []byte(adminOnly), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		out, err := exec.CommandContext(ctx, "bash", "-c", script).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%w: %s", err, out)
		}
		return nil
	}
	if err := run(); err == nil {
		t.Fatal("the health check passed with no Envoy running")
	}
	envoy, err := harness.StartEnvoy(context.Background(), dir, bootstrap, "http://"+hostPort("127.0.0.1", ports[0]))
	if err != nil {
		t.Fatal(err)
	}
	defer envoy.Stop(5 * time.Second)
	if err := run(); err != nil {
		t.Fatalf("health check against a ready Envoy: %v", err)
	}
	// Draining: /ready answers 503 DRAINING, which must fail the check.
	resp, err := http.Post("http://"+hostPort("127.0.0.1", ports[0])+"/healthcheck/fail", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := run(); err == nil {
		t.Error("the health check passed on an Envoy that fails its health checks")
	}
}

// TestEnvoyValidates runs the Envoy the tests prove (the image's version,
// see TestEnvoyImageVersion) in validate mode on the compose bootstrap.
// Envoy loads the certificate files the bootstrap names, so it validates a
// copy whose credentials directory (certsDir in the containers) is one that
// `duet certs` has just filled; nothing else differs.
func TestEnvoyValidates(t *testing.T) { forEachVariant(t, testEnvoyValidates) }

func testEnvoyValidates(t *testing.T, p *types.Project) {
	tools, err := harness.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	file := mountedFile(t, p, "envoy", envoyConfigPath)
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(data, []byte(certsDir+"/")) {
		t.Fatalf("%s names no file in %s: Envoy does not authenticate to duet", file, certsDir)
	}
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := harness.MakeCredentials(ctx, tools.Duet, filepath.Join(dir, "certs")); err != nil {
		t.Fatal(err)
	}
	bootstrap := filepath.Join(dir, "envoy.yaml")
	data = bytes.ReplaceAll(data, []byte(certsDir+"/"), []byte(filepath.Join(dir, "certs")+"/"))
	if err := os.WriteFile(bootstrap, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.CommandContext(ctx, tools.Envoy, "--mode", "validate", "-c", bootstrap).CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("OK")) {
		t.Fatalf("envoy --mode validate: %v\n%s", err, out)
	}
}

// TestGrafanaProvisioning checks that Grafana gets Prometheus as its default
// data source and Jaeger as another (traces in Explore), and loads the
// dashboard from where compose.yaml mounts it.
func TestGrafanaProvisioning(t *testing.T) {
	grafana := service(t, loadProject(t), "grafana")
	var dashboard string
	for _, v := range grafana.Volumes {
		if filepath.Base(v.Source) == "duet-dashboard.json" {
			dashboard = v.Target
			if want, _ := filepath.Abs("../grafana/duet-dashboard.json"); v.Source != want {
				t.Errorf("dashboard mounted from %s, want %s", v.Source, want)
			}
		}
	}
	if dashboard == "" {
		t.Fatal("grafana: duet-dashboard.json is not mounted")
	}
	if got := grafana.Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]; got == nil || *got != dashboard {
		t.Errorf("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH = %v, want %s", got, dashboard)
	}
	if got := mountSource(grafana, "/etc/grafana/provisioning"); got == "" {
		t.Error("grafana: the provisioning directory is not mounted at /etc/grafana/provisioning")
	}

	var providers struct {
		Providers []struct {
			Type    string
			Options struct{ Path string }
		}
	}
	readYAML(t, "grafana/provisioning/dashboards/duet.yaml", &providers)
	if len(providers.Providers) != 1 || providers.Providers[0].Type != "file" || providers.Providers[0].Options.Path != filepath.Dir(dashboard) {
		t.Errorf("dashboard providers %+v: want one file provider of %s", providers.Providers, filepath.Dir(dashboard))
	}

	var sources struct {
		Datasources []struct {
			Type, URL string
			IsDefault bool `yaml:"isDefault"`
		}
	}
	readYAML(t, "grafana/provisioning/datasources/prometheus.yaml", &sources)
	want := "http://" + hostPort("prometheus", prometheusPort)
	if len(sources.Datasources) != 1 || sources.Datasources[0].Type != "prometheus" || sources.Datasources[0].URL != want || !sources.Datasources[0].IsDefault {
		t.Errorf("datasources %+v: want one default prometheus at %s", sources.Datasources, want)
	}
	// Traces in Explore: the jaeger service's query API, not the default.
	sources.Datasources = nil
	readYAML(t, "grafana/provisioning/datasources/jaeger.yaml", &sources)
	want = "http://" + hostPort(jaegerService, jaegerUIPort)
	if len(sources.Datasources) != 1 || sources.Datasources[0].Type != "jaeger" || sources.Datasources[0].URL != want || sources.Datasources[0].IsDefault {
		t.Errorf("datasources %+v: want one jaeger at %s, not the default", sources.Datasources, want)
	}
}

// readYAML decodes the YAML file at path into v.
func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(data, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// TestCredentials proves the stack's mutual TLS and NATS token without
// Docker: the certs service runs duet's image as duet's user and without a
// network; the duets and Envoy mount its volume read-only where duet.yaml
// names the files, and NATS only its own directory of it; and its command,
// run here on bin/duet, makes credentials that each service can read (and
// Envoy and NATS no more than their own), certificates that chain to one CA
// under the names duet.yaml verifies, one NATS token for the duets and the
// server, and keeps them all on a second run.
func TestCredentials(t *testing.T) { forEachVariant(t, testCredentials) }

func testCredentials(t *testing.T, p *types.Project) {
	certs, duet, envoy, nats := service(t, p, certsService), service(t, p, duetServices[0]), service(t, p, "envoy"), service(t, p, natsService)
	if !oneShot(certs) || certs.Image != duet.Image || certs.User != duet.User {
		t.Errorf("certs: restart %q, image %q, user %q; want a one-shot run of duet's image %q as duet's user %q",
			certs.Restart, certs.Image, certs.User, duet.Image, duet.User)
	}
	out := volumeMount(t, certs, certsVolume)
	if out.ReadOnly {
		t.Errorf("certs mounts %s read-only: it writes the credentials", certsVolume)
	}
	readers := []types.ServiceConfig{envoy}
	for _, name := range duetServices {
		readers = append(readers, service(t, p, name))
	}
	for _, s := range readers {
		if m := volumeMount(t, s, certsVolume); m.Target != certsDir || !m.ReadOnly || (m.Volume != nil && m.Volume.Subpath != "") {
			t.Errorf("%s mounts %s at %s (read-only %v), want all of it read-only at %s", s.Name, certsVolume, m.Target, m.ReadOnly, certsDir)
		}
	}
	natsMount := volumeMount(t, nats, certsVolume)
	if !natsMount.ReadOnly || natsMount.Volume == nil || natsMount.Volume.Subpath != natsVolumeDir {
		t.Errorf("nats mounts %s (read-only %v, %+v), want only its subpath %s, read-only", certsVolume, natsMount.ReadOnly, natsMount.Volume, natsVolumeDir)
	}
	for _, s := range append(readers, nats) {
		if d, ok := s.DependsOn[certsService]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
			t.Errorf("%s does not wait for %s to complete", s.Name, certsService)
		}
	}

	// The files duet.yaml names: duet's, and Envoy's (envoy.duet_tls).
	var cfg struct {
		Auth struct {
			TLS struct {
				CertFile     string   `yaml:"cert_file"`
				KeyFile      string   `yaml:"key_file"`
				ClientCAFile string   `yaml:"client_ca_file"`
				ClientNames  []string `yaml:"client_names"`
			}
			TokenFile      string `yaml:"token_file"`
			AdminTokenFile string `yaml:"admin_token_file"`
		}
		Envoy struct {
			DuetTLS struct {
				CertFile   string `yaml:"cert_file"`
				KeyFile    string `yaml:"key_file"`
				CAFile     string `yaml:"ca_file"`
				ServerName string `yaml:"server_name"`
			} `yaml:"duet_tls"`
		}
		Sync struct {
			NATS struct {
				TokenFile string `yaml:"token_file"`
			} `yaml:"nats"`
		}
	}
	readYAML(t, mountedFile(t, p, duetServices[0], duetConfigPath), &cfg)
	a, e := cfg.Auth, cfg.Envoy.DuetTLS
	natsToken := cfg.Sync.NATS.TokenFile
	duetFiles := []string{a.TLS.CertFile, a.TLS.KeyFile, a.TLS.ClientCAFile, a.AdminTokenFile, natsToken}
	envoyFiles := []string{e.CertFile, e.KeyFile, e.CAFile}
	if slices.Contains(duetFiles, "") || slices.Contains(envoyFiles, "") || e.CAFile != a.TLS.ClientCAFile {
		t.Fatalf("duet.yaml: auth %+v, envoy.duet_tls %+v, sync.nats.token_file %q: want mutual TLS, an admin token, one CA and a NATS token", a, e, natsToken)
	}

	// Run the command as the container would, twice.
	dir, run := certsCommand(t, certs)
	run()
	local := func(path string) string {
		rest, ok := strings.CutPrefix(path, certsDir+"/")
		if !ok {
			t.Fatalf("%s is not in the credentials volume (%s)", path, certsDir)
		}
		return filepath.Join(dir, rest)
	}
	// NATS's files, as its mount shows them: nats.conf includes every file
	// of its directory of the volume.
	natsFiles, err := filepath.Glob(filepath.Join(dir, natsVolumeDir, "*"))
	if err != nil || len(natsFiles) == 0 {
		t.Fatalf("the certs command writes nothing into %s/ (%v)", natsVolumeDir, err)
	}
	firstCA, err := os.ReadFile(local(e.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	firstToken := natsTokens(t, local(natsToken), natsFiles)

	// Who reads what: the files belong to the certs service's user and group.
	owner, group := splitUser(t, certs.User)
	secret := map[string]bool{local(a.TLS.KeyFile): true, local(a.AdminTokenFile): true, local(natsToken): true}
	if a.TokenFile != "" {
		secret[local(a.TokenFile)] = true
		duetFiles = append(duetFiles, a.TokenFile)
	}
	for _, f := range natsFiles {
		secret[f] = true
	}
	for _, c := range []struct {
		svc   types.ServiceConfig
		files []string
	}{
		{duet, mapPaths(duetFiles, local)},
		{envoy, mapPaths(envoyFiles, local)},
		{nats, natsFiles},
	} {
		uid, gid := splitUser(t, c.svc.User)
		for _, f := range c.files {
			info, err := os.Stat(f)
			if err != nil {
				t.Fatalf("%s needs %s, which the certs command does not make: %v", c.svc.Name, f, err)
			}
			if !canRead(info.Mode(), uid, gid, owner, group) {
				t.Errorf("%s (user %s) cannot read %s (mode %v, owner %s)", c.svc.Name, c.svc.User, f, info.Mode(), certs.User)
			}
		}
	}
	uid, gid := splitUser(t, envoy.User)
	for f := range secret {
		if info, err := os.Stat(f); err != nil {
			t.Fatal(err)
		} else if canRead(info.Mode(), uid, gid, owner, group) && uid != owner {
			t.Errorf("envoy (user %s) can read the secret %s (mode %v)", envoy.User, f, info.Mode())
		}
	}

	// One CA; duet's certificate has the name Envoy verifies, Envoy's one
	// duet admits.
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(firstCA)
	for _, c := range []struct {
		file  string
		usage x509.ExtKeyUsage
		names []string
	}{
		{a.TLS.CertFile, x509.ExtKeyUsageServerAuth, []string{e.ServerName}},
		{e.CertFile, x509.ExtKeyUsageClientAuth, a.TLS.ClientNames},
	} {
		cert := readCert(t, local(c.file))
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{c.usage}}); err != nil {
			t.Errorf("%s does not chain to %s: %v", c.file, e.CAFile, err)
		}
		if len(c.names) > 0 && !slices.ContainsFunc(c.names, func(n string) bool {
			return cert.Subject.CommonName == n || slices.Contains(cert.DNSNames, n)
		}) {
			t.Errorf("%s is for %q %v, none of %v", c.file, cert.Subject.CommonName, cert.DNSNames, c.names)
		}
	}
	if err := readCert(t, local(a.TLS.CertFile)).VerifyHostname(e.ServerName); err != nil {
		t.Errorf("duet's certificate: %v", err)
	}

	// A second `docker compose up` keeps the credentials.
	run()
	if again, err := os.ReadFile(local(e.CAFile)); err != nil || !bytes.Equal(again, firstCA) {
		t.Errorf("a second run of the certs command replaced the CA (%v)", err)
	}
	if again := natsTokens(t, local(natsToken), natsFiles); again != firstToken {
		t.Error("a second run of the certs command replaced NATS's token")
	}
}

// certsCommand returns a directory standing for the credentials volume and
// a function that runs the certs service's command into it, as the
// container would: with bin/duet for the image's duet.
func certsCommand(t *testing.T, certs types.ServiceConfig) (string, func()) {
	t.Helper()
	if !slices.Equal(certs.Entrypoint, []string{"/bin/sh", "-c"}) || len(certs.Command) != 1 {
		t.Fatalf("certs: entrypoint %q command %q, want [/bin/sh -c] and one script", certs.Entrypoint, certs.Command)
	}
	tools, err := harness.FindTools()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	script := strings.NewReplacer("/usr/local/bin/duet", tools.Duet, volumeMount(t, certs, certsVolume).Target, dir).Replace(certs.Command[0])
	return dir, func() {
		t.Helper()
		if out, err := exec.Command("sh", "-c", script).CombinedOutput(); err != nil {
			t.Fatalf("certs command: %v: %s", err, out)
		}
	}
}

// natsTokens returns the token of the duets' token file, and checks that
// NATS's files require exactly that token (an authorization block).
func natsTokens(t *testing.T, duetFile string, natsFiles []string) string {
	t.Helper()
	data, err := os.ReadFile(duetFile)
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(data))
	if len(token) < 32 {
		t.Fatalf("NATS token %q: want at least 32 characters", token)
	}
	var conf []byte
	for _, f := range natsFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		conf = append(conf, b...)
	}
	if want := fmt.Sprintf("authorization { token: %q }", token); strings.TrimSpace(string(conf)) != want {
		t.Errorf("NATS's files hold %q, want %q", conf, want)
	}
	return token
}

// mapPaths applies f to every path.
func mapPaths(paths []string, f func(string) string) []string {
	out := make([]string, len(paths))
	for i, p := range paths {
		out[i] = f(p)
	}
	return out
}

// volumeMount returns s's mount of the named volume or fails the test.
func volumeMount(t *testing.T, s types.ServiceConfig, volume string) types.ServiceVolumeConfig {
	t.Helper()
	for _, v := range s.Volumes {
		if v.Type == types.VolumeTypeVolume && v.Source == volume {
			return v
		}
	}
	t.Fatalf("%s does not mount the volume %s", s.Name, volume)
	return types.ServiceVolumeConfig{}
}

// splitUser parses a compose "uid:gid".
func splitUser(t *testing.T, user string) (uid, gid int) {
	t.Helper()
	u, g, ok := strings.Cut(user, ":")
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if !ok || err1 != nil || err2 != nil {
		t.Fatalf("user %q: want numeric uid:gid", user)
	}
	return uid, gid
}

// canRead reports whether uid:gid may read a file of the given mode owned
// by owner:group, as the kernel decides (no capabilities: every service is
// non-root).
func canRead(mode os.FileMode, uid, gid, owner, group int) bool {
	switch {
	case uid == owner:
		return mode&0o400 != 0
	case gid == group:
		return mode&0o040 != 0
	}
	return mode&0o004 != 0
}

// readCert parses the first PEM certificate in the file at path.
func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(data)
	if block == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return cert
}
