package envoygateway

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/envoy"
)

// clustersToDuet maps the name of each cluster through which the gateway's
// listener dials duet to what dials it: "ext_proc", or the access log's
// name. Field names are protojson's.
func clustersToDuet(listener any) map[string]string {
	hcm := harness.Dig(listener, "defaultFilterChain", "filters", 0, "typedConfig")
	out := map[string]string{}
	for _, f := range list(harness.Dig(hcm, "httpFilters")) {
		if strings.HasPrefix(str(f, "name"), "envoy.filters.http.ext_proc/") {
			out[str(f, "typedConfig", "grpcService", "envoyGrpc", "clusterName")] = "ext_proc"
		}
		if str(f, "name") == "envoy.filters.http.router" {
			for _, a := range list(harness.Dig(f, "typedConfig", "upstreamLog")) {
				out[str(a, "typedConfig", "commonConfig", "grpcService", "envoyGrpc", "clusterName")] = str(a, "typedConfig", "commonConfig", "logName")
			}
		}
	}
	for _, a := range list(harness.Dig(hcm, "accessLog")) {
		out[str(a, "typedConfig", "commonConfig", "grpcService", "envoyGrpc", "clusterName")] = str(a, "typedConfig", "commonConfig", "logName")
	}
	delete(out, "")
	return out
}

// extProcFilter returns the listener's ext_proc filter configuration.
func extProcFilter(listener any) any {
	for _, f := range list(harness.Dig(listener, "defaultFilterChain", "filters", 0, "typedConfig", "httpFilters")) {
		if strings.HasPrefix(str(f, "name"), "envoy.filters.http.ext_proc/") {
			return harness.Dig(f, "typedConfig")
		}
	}
	return nil
}

// seconds reads a duration as protojson ("0.250s") or duet's bootstrap
// YAML ("0.25s") writes it; -1 if it is none.
func seconds(v any) time.Duration {
	s, _ := v.(string)
	d, err := time.ParseDuration(s)
	if err != nil {
		return -1
	}
	return d
}

// number reads a JSON or YAML number (or a protojson uint64 string).
func number(v any) float64 {
	switch n := v.(type) {
	case float64:
		return n
	case int:
		return float64(n)
	case string:
		f, err := strconv.ParseFloat(n, 64)
		if err == nil {
			return f
		}
	}
	return -1
}

// duetSettings are how a cluster to duet finds and skips a dead replica,
// and how a stream to duet is retried, as far as Envoy Gateway can say
// them.
type duetSettings struct {
	// Active gRPC health checks.
	GRPCCheck                            bool
	Interval, NoTrafficInterval, Timeout time.Duration
	Unhealthy, Healthy                   float64
	// Outlier detection (local-origin failures apart).
	Split         bool
	LocalOrigin   float64
	Ejection      time.Duration
	MaxEjectedPct float64
	// healthy_panic_threshold, connect_timeout.
	Panic   float64
	Connect time.Duration
}

// retrySettings are a gRPC service's retry policy.
type retrySettings struct {
	On                 string
	Retries            float64
	Predicate          string
	HostSelectAttempts float64
	BackOffBase        time.Duration
	BackOffMax         time.Duration
}

// clusterSettings reads duetSettings from a cluster; key maps a field's
// snake_case name to the spelling of c (protojson's camelCase, or as is).
func clusterSettings(c any, key func(string) string) duetSettings {
	g := func(v any, path ...string) any {
		var p []any
		for _, k := range path {
			p = append(p, key(k))
		}
		return harness.Dig(v, p...)
	}
	hc := harness.Dig(g(c, "health_checks"), 0)
	od := g(c, "outlier_detection")
	return duetSettings{
		GRPCCheck: g(hc, "grpc_health_check") != nil,
		Interval:  seconds(g(hc, "interval")), NoTrafficInterval: seconds(g(hc, "no_traffic_interval")), Timeout: seconds(g(hc, "timeout")),
		Unhealthy: number(g(hc, "unhealthy_threshold")), Healthy: number(g(hc, "healthy_threshold")),
		Split: g(od, "split_external_local_origin_errors") == true, LocalOrigin: number(g(od, "consecutive_local_origin_failure")),
		Ejection: seconds(g(od, "base_ejection_time")), MaxEjectedPct: number(g(od, "max_ejection_percent")),
		Panic: number(g(c, "common_lb_config", "healthy_panic_threshold", "value")), Connect: seconds(g(c, "connect_timeout")),
	}
}

// retryOf reads retrySettings from a retry policy, spelled as key says.
func retryOf(rp any, key func(string) string) retrySettings {
	g := func(path ...string) any {
		var p []any
		for _, k := range path {
			p = append(p, key(k))
		}
		return harness.Dig(rp, p...)
	}
	return retrySettings{
		On: str(g("retry_on")), Retries: number(g("num_retries")), Predicate: str(harness.Dig(g("retry_host_predicate"), 0), "name"),
		HostSelectAttempts: number(g("host_selection_retry_max_attempts")),
		BackOffBase:        seconds(g("retry_back_off", "base_interval")), BackOffMax: seconds(g("retry_back_off", "max_interval")),
	}
}

// camel turns a snake_case field name into protojson's camelCase.
func camel(k string) string {
	parts := strings.Split(k, "_")
	for i := 1; i < len(parts); i++ {
		if parts[i] != "" {
			parts[i] = strings.ToUpper(parts[i][:1]) + parts[i][1:]
		}
	}
	return strings.Join(parts, "")
}

func asIs(k string) string { return k }

// renderedSettings are the settings of the bootstrap that `duet
// envoy-config` renders (package envoy, proved on a real Envoy by e2e's
// replica tests): its cluster to duet for ext_proc, the ext_proc stream's
// retries and the access-log streams'.
func renderedSettings() (duetSettings, retrySettings, retrySettings, error) {
	var buf bytes.Buffer
	addr := func(h string, p int) envoy.Address { return envoy.Address{Host: h, Port: p} }
	if err := envoy.Render(&buf, envoy.Params{
		Listen: addr("127.0.0.1", 8080), Admin: addr("127.0.0.1", 9901), Duet: addr("127.0.0.1", 9002),
		MaxBodyBytes: 32 << 20, MessageTimeout: 2 * time.Second, StreamIdleTimeout: 15 * time.Minute, MaxRoutingRequests: 256,
		Prefill: []envoy.Address{addr("127.0.0.1", 30001)}, Decode: []envoy.Address{addr("127.0.0.1", 30002)},
	}); err != nil {
		return duetSettings{}, retrySettings{}, retrySettings{}, err
	}
	var boot object
	if err := yaml.Unmarshal(buf.Bytes(), &boot); err != nil {
		return duetSettings{}, retrySettings{}, retrySettings{}, err
	}
	var cluster, extProc, logs any
	for _, c := range list(harness.Dig(boot, "static_resources", "clusters")) {
		if str(c, "name") == envoy.ClusterDuet {
			cluster = c
		}
	}
	harness.Walk(boot, func(m map[string]any) {
		if gs, ok := m["grpc_service"].(map[string]any); ok {
			if _, isLog := m["log_name"]; isLog {
				logs = gs["retry_policy"]
			} else {
				extProc = gs["retry_policy"]
			}
		}
	})
	if cluster == nil || extProc == nil || logs == nil {
		return duetSettings{}, retrySettings{}, retrySettings{}, errors.New("the rendered bootstrap has no duet_extproc cluster or no retry policy on its gRPC services")
	}
	return clusterSettings(cluster, asIs), retryOf(extProc, asIs), retryOf(logs, asIs), nil
}

// replicaEffects lists what the gateway's xDS lacks for several duet
// replicas, on each cluster of the ext_proc filter and of the two access
// logs: its endpoints come from duet's Service by EDS (in a cluster, Envoy
// Gateway lists every ready duet pod there, from the Service's
// EndpointSlices; egctl, which routes to a Service's cluster IP, lists
// that), it skips a dead replica with the settings of the bootstrap that
// `duet envoy-config` renders (gRPC health checks, ejection at the first
// refused connection, panic only with no replica healthy, a 1 s connect
// timeout), and its TLS offers ALPN h2, without which duet refuses the
// health checks' connections. The ext_proc stream, and a new access-log
// stream, are retried on another replica as that bootstrap retries them.
// assignment holds the xDS's endpoints by cluster name. Field names are
// protojson's.
func replicaEffects(listener any, clusters []any, assignment map[string]any) []string {
	var missing []string
	need := func(ok bool, what string) {
		if !ok {
			missing = append(missing, what)
		}
	}
	want, wantExtProc, wantLogs, err := renderedSettings()
	if err != nil {
		return []string{err.Error()}
	}
	byName := map[string]any{}
	for _, c := range clusters {
		byName[str(c, "name")] = c
	}
	toDuet := clustersToDuet(listener)
	need(len(toDuet) == 3, fmt.Sprintf("three clusters to duet (ext_proc and two access logs), got %v", toDuet))
	service := net.JoinHostPort(duetClusterIP, strconv.Itoa(duetGRPCPort))
	for name, user := range toDuet {
		c := byName[name]
		what := fmt.Sprintf("cluster %s (%s): ", name, user)
		var addrs []string
		harness.Walk(assignment[name], func(m map[string]any) {
			if sa, ok := m["socketAddress"].(map[string]any); ok {
				addrs = append(addrs, net.JoinHostPort(str(sa, "address"), fmt.Sprint(harness.Dig(sa, "portValue"))))
			}
		})
		need(str(c, "type") == "EDS" && slices.Equal(addrs, []string{service}), fmt.Sprintf("%sendpoints of duet's Service by EDS (got type %s, %v)", what, str(c, "type"), addrs))
		got := clusterSettings(c, camel)
		need(got == want, fmt.Sprintf("%shealth checks and ejection as duet's bootstrap has them:\n    got  %+v\n    want %+v", what, got, want))
		for _, m := range list(harness.Dig(c, "transportSocketMatches")) {
			need(slices.Contains(list(harness.Dig(m, "transportSocket", "typedConfig", "commonTlsContext", "alpnProtocols")), any("h2")),
				what+"TLS offering ALPN h2 (for the health checks)")
		}
		if user == "ext_proc" {
			need(harness.Dig(c, "circuitBreakers", "thresholds", 0, "maxRetries") == harness.Dig(c, "circuitBreakers", "thresholds", 0, "maxRequests"),
				what+"as many concurrent retries as streams (circuit breaker max_retries)")
		}
	}
	if got := retryOf(harness.Dig(extProcFilter(listener), "grpcService", "retryPolicy"), camel); got != wantExtProc {
		missing = append(missing, fmt.Sprintf("ext_proc: retries as duet's bootstrap has them:\n    got  %+v\n    want %+v", got, wantExtProc))
	}
	hcm := harness.Dig(listener, "defaultFilterChain", "filters", 0, "typedConfig")
	var loggers []any
	loggers = append(loggers, list(harness.Dig(hcm, "accessLog"))...)
	for _, f := range list(harness.Dig(hcm, "httpFilters")) {
		if str(f, "name") == "envoy.filters.http.router" {
			loggers = append(loggers, list(harness.Dig(f, "typedConfig", "upstreamLog"))...)
		}
	}
	for _, a := range loggers {
		cc := harness.Dig(a, "typedConfig", "commonConfig")
		if got := retryOf(harness.Dig(cc, "grpcService", "retryPolicy"), camel); got != wantLogs {
			missing = append(missing, fmt.Sprintf("access log %s: new streams retried as duet's bootstrap has them:\n    got  %+v\n    want %+v", str(cc, "logName"), got, wantLogs))
		}
	}
	slices.Sort(missing)
	return missing
}

// duetReplicas replaces, in every cluster's load assignment, the endpoint
// at service (duet's Service) by one endpoint per address of replicas, as
// Envoy Gateway's default endpoint routing lists every ready pod of the
// Service. It returns the number of clusters changed.
func duetReplicas(clusters []any, service string, replicas []string) int {
	changed := 0
	harness.Walk(clusters, func(m map[string]any) {
		eps, ok := m["lbEndpoints"].([]any)
		if !ok {
			return
		}
		var out []any
		for _, ep := range eps {
			sa, _ := harness.Dig(ep, "endpoint", "address", "socketAddress").(map[string]any)
			if sa == nil || net.JoinHostPort(str(sa, "address"), fmt.Sprint(harness.Dig(sa, "portValue"))) != service {
				out = append(out, ep)
				continue
			}
			changed++
			for _, r := range replicas {
				host, port, _ := net.SplitHostPort(r)
				n, _ := strconv.Atoi(port)
				cp := deepCopy(ep).(map[string]any)
				a := harness.Dig(cp, "endpoint", "address", "socketAddress").(map[string]any)
				a["address"], a["portValue"] = host, n
				out = append(out, cp)
			}
		}
		m["lbEndpoints"] = out
	})
	return changed
}

// duetAddresses are the gRPC addresses of the stack's duet replicas.
func duetAddresses(addrs harness.Addresses) []string {
	if len(addrs.EnvoyDuetReplicas) > 0 {
		return addrs.EnvoyDuetReplicas
	}
	return []string{addrs.DuetGRPC}
}

// deepCopy copies a decoded JSON value.
func deepCopy(v any) any {
	b, _ := json.Marshal(v)
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

// natsServer is nats-server running the manifests' nats.conf.
type natsServer struct {
	url, tokenFile string
}

// startManifestNATS runs the nats-server that `make nats-server` builds
// with the nats.conf of ConfigMap nats (the manifests'), its ports moved to
// free loopback ones, and the token of Secret duet-nats in NATS_TOKEN as
// the Deployment sets it. The token also goes to a file, as duet's
// projected volume holds it. The test stops the server.
func startManifestNATS(t *testing.T, objs []object, dir string) natsServer {
	t.Helper()
	bin, err := harness.FindNATSServer()
	if err != nil {
		t.Fatal(err)
	}
	conf := str(find(objs, "ConfigMap", "nats"), "data", "nats.conf")
	ports, err := harness.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []struct {
		key  string
		port int
	}{{"port", ports[0]}, {"http_port", ports[1]}} {
		re := regexp.MustCompile(`(?m)^` + r.key + `: \d+$`)
		if !re.MatchString(conf) {
			t.Fatalf("ConfigMap nats: nats.conf sets no %s:\n%s", r.key, conf)
		}
		conf = re.ReplaceAllString(conf, r.key+": "+strconv.Itoa(r.port))
	}
	confPath := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(confPath, []byte("host: 127.0.0.1\n"+conf), 0o644); err != nil {
		t.Fatal(err)
	}
	token := "nats-token-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	n := natsServer{url: "nats://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])), tokenFile: filepath.Join(dir, "nats-token")}
	if err := os.WriteFile(n.tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	log, err := os.Create(filepath.Join(dir, "nats.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config", confPath)
	cmd.Env = append(os.Environ(), "NATS_TOKEN="+token)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		log.Close()
	})
	health := "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1])) + "/healthz"
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(health)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return n
			}
		}
		if time.Now().After(deadline) {
			out, _ := os.ReadFile(log.Name())
			t.Fatalf("nats-server with the manifests' nats.conf is not ready: %v\n%s", err, out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// manifestSync returns the sync section of duet's ConfigMap as duet.yaml
// text, with the server's URL and the token file of n in place of the
// cluster's.
func manifestSync(objs []object, n natsServer) (string, error) {
	var cfg struct {
		Sync map[string]any `yaml:"sync"`
	}
	if err := yaml.Unmarshal([]byte(str(find(objs, "ConfigMap", duetService), "data", "duet.yaml")), &cfg); err != nil {
		return "", err
	}
	nats, ok := cfg.Sync["nats"].(map[string]any)
	if !ok || nats["url"] == nil || nats["token_file"] == nil {
		return "", errors.New("ConfigMap duet: duet.yaml has no sync.nats.url and sync.nats.token_file")
	}
	nats["url"], nats["token_file"] = n.url, n.tokenFile
	out, err := yaml.Marshal(map[string]any{"sync": cfg.Sync})
	return string(out), err
}

// hostStates reads, for each cluster to duet, whether the Envoy at adminURL
// may pick each replica address (true: healthy).
func hostStates(t *testing.T, adminURL string, clusters []string) map[string]map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := harness.EnvoyHostsHealthy(ctx, adminURL, clusters...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// servedAll sends n chat requests, streamed and not, and fails the test on
// any that is not served.
func servedAll(t *testing.T, s *harness.Stack, from, n int) {
	t.Helper()
	client := &http.Client{Timeout: requestTimeout}
	for i := from; i < from+n; i++ {
		r := harness.Chat(context.Background(), client, s.EnvoyURL, i, i%2 == 0, 8)
		if r.Outcome != harness.OutcomeServed {
			t.Errorf("request %d: %s %d after %v: %s", i, r.Outcome, r.Status, r.Wait, r.Detail)
		}
	}
}

// Issue 17 on Envoy Gateway: the Envoy that Envoy Gateway's translation of
// deploy/envoy-gateway configures, in front of two duet replicas that share
// their state through a nats-server running the manifests' nats.conf (duet
// with the ConfigMap's sync section and the server's token, the server with
// the token in its environment, as the Deployments set them):
//   - the ext_proc cluster and both access-log clusters hold both replicas,
//     healthy, and both replicas route requests; every access-log entry is
//     believed, whichever replica receives it (the replicas hear each
//     other through NATS);
//   - replica 1 killed with SIGKILL is skipped on every cluster within a
//     second, and requests sent from the moment of the kill are all served;
//   - restarted, it is healthy on every cluster again and hears its peer.
//
// In a cluster Envoy Gateway lists duet's pods from the Service's
// EndpointSlices; egctl routes to the Service's cluster IP, which the test
// replaces by the replicas' addresses (duetReplicas).
func TestEnvoyGatewayReplicas(t *testing.T) {
	objs, err := loadManifests()
	if err != nil {
		t.Fatal(err)
	}
	dir := keptDir(t, "duet-envoygateway-replicas-")
	nats := startManifestNATS(t, objs, dir)
	sync, err := manifestSync(objs, nats)
	if err != nil {
		t.Fatal(err)
	}
	s, _ := startGatewayWith(t, dir, harness.Options{DuetReplicas: 2, DuetYAML: sync})
	clusters := clustersOfBootstrap(t, s.EnvoyConfig)

	for i := range s.Duets {
		harness.WaitFor(t, 10*time.Second, fmt.Sprintf("replica %d hears its peer through the manifests' NATS", i), func() bool {
			return s.ReplicaMetric(i, "duet_sync_peers", nil) == 1
		})
	}
	allHealthy := func(want []string) func() bool {
		return func() bool {
			for _, hosts := range hostStates(t, s.EnvoyAdminURL, clusters) {
				for _, addr := range want {
					if !hosts[addr] {
						return false
					}
				}
				if len(hosts) != len(s.DuetGRPCs) {
					return false
				}
			}
			return true
		}
	}
	harness.WaitFor(t, 10*time.Second, "every cluster to duet lists both replicas, healthy", allHealthy(s.DuetGRPCs))

	servedAll(t, s, 0, 16)
	for i := range s.Duets {
		if n := s.ReplicaMetric(i, "duet_extproc_requests_total", nil); n <= 0 {
			t.Errorf("replica %d routed no request: Envoy does not spread ext_proc streams over the replicas", i)
		}
		// Entries reach either replica; the one that did not route a
		// request knows its route from its peer.
		if n := s.ReplicaMetric(i, "duet_feedback_untrusted_total", nil); n != 0 {
			t.Errorf("replica %d did not believe %v access-log entries", i, n)
		}
	}

	killed := time.Now()
	s.Duets[1].Kill()
	gone := s.DuetGRPCs[1]
	done := make(chan struct{})
	go func() {
		defer close(done)
		servedAll(t, s, 100, 10)
	}()
	harness.WaitFor(t, 5*time.Second, "Envoy skips the killed replica on every cluster to duet", func() bool {
		for _, hosts := range hostStates(t, s.EnvoyAdminURL, clusters) {
			if hosts[gone] {
				return false
			}
		}
		return true
	})
	skipped := time.Since(killed)
	<-done
	t.Logf("the killed replica was skipped on every cluster to duet %v after SIGKILL", skipped.Round(time.Millisecond))
	if skipped > time.Second {
		t.Errorf("the killed replica was skipped after %v, want within a second", skipped)
	}
	servedAll(t, s, 200, 6)
	if n := s.ReplicaMetric(0, "duet_feedback_untrusted_total", nil); n != 0 {
		t.Errorf("the surviving replica did not believe %v access-log entries", n)
	}

	if err := s.RestartReplica(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	harness.WaitFor(t, 10*time.Second, "the restarted replica is healthy on every cluster again", allHealthy(s.DuetGRPCs))
	harness.WaitFor(t, 10*time.Second, "the restarted replica hears its peer", func() bool { return s.ReplicaMetric(1, "duet_sync_peers", nil) == 1 })
	servedAll(t, s, 300, 6)
}

// clustersOfBootstrap reads the names of the clusters to duet from the
// bootstrap the stack's Envoy runs.
func clustersOfBootstrap(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var boot object
	if err := json.Unmarshal(data, &boot); err != nil {
		t.Fatal(err)
	}
	var names []string
	for name := range clustersToDuet(harness.Dig(boot, "staticResources", "listeners", 0)) {
		names = append(names, name)
	}
	slices.Sort(names)
	if len(names) != 3 {
		t.Fatalf("the bootstrap's clusters to duet: %v, want 3", names)
	}
	return names
}

// mutatedManifests copies deploy/envoy-gateway into a temporary directory
// with old replaced by new (once) in file, and loads it.
func mutatedManifests(t *testing.T, file, old, new string) []object {
	t.Helper()
	dir := t.TempDir()
	files, err := filepath.Glob(filepath.Join(manifestDir, "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(f) == file {
			if !strings.Contains(string(data), old) {
				t.Fatalf("%s does not contain %q", file, old)
			}
			data = []byte(strings.Replace(string(data), old, new, 1))
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(f)), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	objs, err := loadManifestsIn(dir)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// The checks of replicaEffects are not vacuous: manifests that would leave
// a dead replica in use, as egctl translates them, fail the bootstrap.
func TestReplicaEffectsCatchWeakenings(t *testing.T) {
	egctl, creds := translateSetup(t)
	addrs := harness.Addresses{EnvoyListen: "127.0.0.1:10000", EnvoyAdmin: "127.0.0.1:10001", DuetGRPC: "127.0.0.1:9002",
		Decode: []string{"http://127.0.0.1:30001"}, Prefill: []string{"http://127.0.0.1:30002"}}
	for _, tt := range []struct {
		name, file, old, new, want string
	}{
		{"as shipped", "", "", "", ""},
		{"ext_proc checked every 3 s", "policies.yaml", "interval: 250ms", "interval: 3s", "(ext_proc): health checks and ejection"},
		// The first access-log sink of gateway.yaml: duet_downstream.
		{"the downstream log ejects after 5 refusals", "gateway.yaml", "consecutiveLocalOriginFailures: 1", "consecutiveLocalOriginFailures: 5",
			"(duet_downstream): health checks and ejection"},
		{"the no-traffic interval patch misses a cluster", "patch.yaml", "name: accesslog_als_1_0", "name: accesslog_als_9_0", "(duet_upstream): health checks and ejection"},
		{"no ALPN h2 for the health checks", "gateway.yaml", "alpnProtocols: [h2]", "alpnProtocols: [http/1.1]", "TLS offering ALPN h2"},
		{"ext_proc retries after Envoy's default back-off", "policies.yaml", "        perRetry:\n          backOff:\n            baseInterval: 10ms\n            maxInterval: 50ms\n", "",
			"ext_proc: retries as duet's bootstrap"},
		{"ext_proc retries may pick the same replica", "patch.yaml", "name: envoy.retry_host_predicates.previous_hosts", "name: envoy.retry_host_predicates.omit_canary_hosts",
			"ext_proc: retries as duet's bootstrap"},
		// The second access-log retry patch of patch.yaml: duet_upstream.
		{"upstream log streams not retried when refused", "patch.yaml", "path: /typed_config/upstream_log/0/typed_config/common_config/grpc_service/retry_policy\n      value:\n        retry_on: connect-failure,refused-stream",
			"path: /typed_config/upstream_log/0/typed_config/common_config/grpc_service/retry_policy\n      value:\n        retry_on: connect-failure", "access log duet_upstream: new streams retried"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			objs, err := loadManifests()
			if tt.file != "" {
				objs = mutatedManifests(t, tt.file, tt.old, tt.new)
			}
			if err != nil {
				t.Fatal(err)
			}
			_, err = gatewayBootstrap(context.Background(), egctl, t.TempDir(), objs, addrs, creds)
			switch {
			case tt.want == "" && err != nil:
				t.Fatal(err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Errorf("want an error with %q, got %v", tt.want, err)
			}
		})
	}
}
