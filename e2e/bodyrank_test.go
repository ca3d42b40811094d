package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/envoy"
)

// luaOptions gives the main cluster an upstream Lua filter (duet's own
// script) that writes routed_dp_rank from a header into that leg's body.
const luaOptions = `    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {http_protocol_options: {}}
        http_filters:
        - name: envoy.filters.http.lua
          typed_config:
            "@type": type.googleapis.com/envoy.extensions.filters.http.lua.v3.Lua
            default_source_code:
              inline_string: |
%s
        - name: envoy.filters.http.upstream_codec
          typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.upstream_codec.v3.UpstreamCodec}`

// Claim: a Lua filter in one cluster's upstream filter chain can give that
// leg its own body field while the mirror keeps the original body.
func TestUpstreamLuaGivesOneLegItsOwnBody(t *testing.T) {
	lua := "                " + strings.ReplaceAll(strings.TrimRight(envoy.BodyRankLua(), "\n"), "\n", "\n                ")
	s, main, mirror := startBare(t, 4, "{cluster: mirror}", fmt.Sprintf(luaOptions, lua))

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
