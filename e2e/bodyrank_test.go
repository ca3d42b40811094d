package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/envoy"
)

// luaConfig: the main cluster's upstream Lua filter writes routed_dp_rank
// from a header into that leg's body only; the mirror cluster has none.
const luaConfig = `
admin: {address: {socket_address: {address: 127.0.0.1, port_value: %[1]d}}}
static_resources:
  listeners:
  - address: {socket_address: {address: 127.0.0.1, port_value: %[2]d}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: bare
          http_filters:
          - name: envoy.filters.http.router
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router}
          route_config:
            virtual_hosts:
            - name: all
              domains: ["*"]
              routes:
              - match: {prefix: "/"}
                route:
                  cluster: main
                  request_mirror_policies: [{cluster: mirror}]
  clusters:
  - name: main
    load_assignment: {cluster_name: main, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %[3]d}}}}]}]}
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http_protocol_options: {}}
        http_filters:
        - name: envoy.filters.http.lua
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
            default_source_code:
              inline_string: |
%[5]s
        - name: envoy.filters.http.upstream_codec
          typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec}
  - name: mirror
    load_assignment: {cluster_name: mirror, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: %[4]d}}}}]}]}
`

// Claim: a Lua filter in one cluster's upstream filter chain can give that
// leg its own body field while the mirror keeps the original body.
func TestUpstreamLuaGivesOneLegItsOwnBody(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	dir := t.TempDir()
	main, err := harness.StartSim(ctx, dir, "main", "null", harness.SimSpec{DPSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer main.Stop(5 * time.Second)
	mirror, err := harness.StartSim(ctx, dir, "mirror", "null", harness.SimSpec{DPSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer mirror.Stop(5 * time.Second)
	ports, err := harness.FreePorts(2)
	if err != nil {
		t.Fatal(err)
	}
	lua := "                " + strings.ReplaceAll(strings.TrimRight(envoy.BodyRankLua(), "\n"), "\n", "\n                ")
	cfg := filepath.Join(dir, "envoy.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf(luaConfig, ports[0], ports[1], portOf(t, main), portOf(t, mirror), lua)), 0o644); err != nil {
		t.Fatal(err)
	}
	adminURL := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	envoy, err := harness.StartEnvoy(ctx, dir, cfg, adminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer envoy.Stop(5 * time.Second)
	s := &harness.Stack{EnvoyURL: fmt.Sprintf("http://127.0.0.1:%d", ports[1]), EnvoyAdminURL: adminURL}

	for i, rank := range []int{3, 1} {
		id := requestID(t, i)
		body := []byte(`{"text":"` + strings.Repeat("x", 100000) + `","sampling_params":{"max_new_tokens":2}}`)
		resp, out := send(t, s, "POST", "/generate", map[string]string{"x-request-id": id, "x-duet-decode-body-rank": fmt.Sprint(rank)}, body)
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, out)
		}
		_, m := only(t, legs(t, []*harness.Sim{main}, id, 1))
		_, r := only(t, legs(t, []*harness.Sim{mirror}, id, 1))
		if m.DPRank == nil || *m.DPRank != rank || m.Source() != "body" {
			t.Errorf("main leg: rank %v from %q, want %d from the body", m.DPRank, m.Source(), rank)
		}
		var fields map[string]json.RawMessage
		if err := json.Unmarshal(r.Body, &fields); err != nil {
			t.Fatal(err)
		}
		if _, ok := fields["routed_dp_rank"]; ok || len(r.Body) != len(body) {
			t.Errorf("the mirror's body changed too (%d bytes, routed_dp_rank present %v)", len(r.Body), ok)
		}
	}
}
