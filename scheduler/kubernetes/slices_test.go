package kubernetes

import (
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/duet-router/duet/scheduler"
)

func TestSpecs(t *testing.T) {
	const v4, v6 = discoveryv1.AddressTypeIPv4, discoveryv1.AddressTypeIPv6
	one := []discoveryv1.EndpointPort{port("", 30000)}
	udp := port("http", 30000)
	udp.Protocol = new(corev1.ProtocolUDP)
	tests := []struct {
		name     string
		role     scheduler.Role
		pool     Pool
		slices   []*discoveryv1.EndpointSlice
		want     []scheduler.EndpointSpec
		problems []string // substrings, one per problem
	}{
		{
			name: "the only port, sorted by URL",
			pool: Pool{Service: "d"},
			slices: []*discoveryv1.EndpointSlice{slice("d-1", "d", v4, one,
				readyAt("10.0.0.2", "d-b"), readyAt("10.0.0.1", "d-a"))},
			want: specsOf("http://10.0.0.1:30000", "http://10.0.0.2:30000"),
		},
		{
			name: "readiness: nil is ready, not ready and terminating are skipped",
			pool: Pool{Service: "d"},
			slices: []*discoveryv1.EndpointSlice{slice("d-1", "d", v4, one,
				endpoint("10.0.0.1", "nil", cond{}),
				endpoint("10.0.0.2", "not-ready", cond{ready: no}),
				endpoint("10.0.0.3", "terminating", cond{ready: no, terminating: yes}),
				endpoint("10.0.0.4", "ready-terminating", cond{ready: yes, terminating: yes}),
				endpoint("10.0.0.5", "ready", cond{ready: yes, terminating: no}))},
			want: specsOf("http://10.0.0.1:30000", "http://10.0.0.5:30000"),
		},
		{
			name: "port by name",
			pool: Pool{Service: "d", Port: "api"},
			slices: []*discoveryv1.EndpointSlice{slice("d-1", "d", v4,
				[]discoveryv1.EndpointPort{port("metrics", 9090), port("api", 8000)}, readyAt("10.0.0.1", "d-a"))},
			want: specsOf("http://10.0.0.1:8000"),
		},
		{
			name: "port by number",
			pool: Pool{Service: "d", Port: "8000"},
			slices: []*discoveryv1.EndpointSlice{slice("d-1", "d", v4,
				[]discoveryv1.EndpointPort{port("metrics", 9090), port("api", 8000)}, readyAt("10.0.0.1", "d-a"))},
			want: specsOf("http://10.0.0.1:8000"),
		},
		{
			name: "default: the port named http among several",
			pool: Pool{Service: "d"},
			slices: []*discoveryv1.EndpointSlice{slice("d-1", "d", v4,
				[]discoveryv1.EndpointPort{port("metrics", 9090), port("http", 30000)}, readyAt("10.0.0.1", "d-a"))},
			want: specsOf("http://10.0.0.1:30000"),
		},
		{
			name: "prefill: the bootstrap port, and the only other port",
			role: scheduler.RolePrefill,
			pool: Pool{Service: "p"},
			slices: []*discoveryv1.EndpointSlice{slice("p-1", "p", v4,
				[]discoveryv1.EndpointPort{port("bootstrap", 8998), port("web", 30000)}, readyAt("10.0.1.1", "p-a"))},
			want: []scheduler.EndpointSpec{{URL: "http://10.0.1.1:30000", BootstrapPort: 8998}},
		},
		{
			name: "a configured DP size goes with every engine (vLLM serves no /server_info)",
			pool: Pool{Service: "d", DPSize: 4},
			slices: []*discoveryv1.EndpointSlice{slice("d-1", "d", v4,
				[]discoveryv1.EndpointPort{port("http", 8000)}, readyAt("10.0.0.1", "d-a"), readyAt("10.0.0.2", "d-b"))},
			want: []scheduler.EndpointSpec{{URL: "http://10.0.0.1:8000", DPSize: 4}, {URL: "http://10.0.0.2:8000", DPSize: 4}},
		},
		{
			name: "decode: a bootstrap port is not read",
			pool: Pool{Service: "d", Port: "http"},
			slices: []*discoveryv1.EndpointSlice{slice("d-1", "d", v4,
				[]discoveryv1.EndpointPort{port("bootstrap", 8998), port("http", 30000)}, readyAt("10.0.0.1", "d-a"))},
			want: specsOf("http://10.0.0.1:30000"),
		},
		{
			name: "IPv6",
			pool: Pool{Service: "d"},
			slices: []*discoveryv1.EndpointSlice{slice("d-1", "d", v6, one,
				readyAt("fd00::1", "d-a"))},
			want: specsOf("http://[fd00::1]:30000"),
		},
		{
			name: "dual stack: one engine per pod, IPv4",
			pool: Pool{Service: "d"},
			slices: []*discoveryv1.EndpointSlice{
				slice("d-6", "d", v6, one, readyAt("fd00::1", "d-a"), readyAt("fd00::2", "d-b")),
				slice("d-4", "d", v4, one, readyAt("10.0.0.1", "d-a")),
			},
			want: specsOf("http://10.0.0.1:30000", "http://[fd00::2]:30000"),
		},
		{
			name: "several slices; an endpoint listed in two counts once",
			pool: Pool{Service: "d"},
			slices: []*discoveryv1.EndpointSlice{
				slice("d-1", "d", v4, one, readyAt("10.0.0.1", "d-a"), readyAt("10.0.0.2", "d-b")),
				slice("d-2", "d", v4, one, readyAt("10.0.0.2", "d-b"), readyAt("10.0.0.3", "d-c")),
				slice("d-3", "d", v4, []discoveryv1.EndpointPort{port("", 31000)}, readyAt("10.0.0.4", "")),
			},
			want: specsOf("http://10.0.0.1:30000", "http://10.0.0.2:30000", "http://10.0.0.3:30000", "http://10.0.0.4:31000"),
		},
		{
			name: "a slice without ready endpoints needs no port",
			pool: Pool{Service: "d", Port: "http"},
			slices: []*discoveryv1.EndpointSlice{
				slice("d-empty", "d", v4, nil),
				slice("d-1", "d", v4, nil, endpoint("10.0.0.1", "d-a", cond{ready: no})),
			},
		},
		{
			name: "unusable slices are problems; the others still count",
			pool: Pool{Service: "d"},
			slices: []*discoveryv1.EndpointSlice{
				slice("d-fqdn", "d", discoveryv1.AddressTypeFQDN, one, readyAt("engine.example", "d-a")),
				slice("d-two", "d", v4, []discoveryv1.EndpointPort{port("a", 1), port("b", 2)}, readyAt("10.0.0.1", "d-b")),
				slice("d-udp", "d", v4, []discoveryv1.EndpointPort{udp}, readyAt("10.0.0.2", "d-c")),
				slice("d-bad", "d", v4, one, readyAt("fd00::9", "d-d"), readyAt("10.0.0.3", "d-e")),
			},
			want: specsOf("http://10.0.0.3:30000"),
			problems: []string{
				`d-fqdn: address type "FQDN" is not supported`,
				`d-two: 2 candidate ports and none named "http"`,
				`d-udp: 0 candidate ports`,
				`d-bad: "fd00::9" is not an IPv4 address`,
			},
		},
		{
			name:     "a named port that is missing",
			pool:     Pool{Service: "d", Port: "api"},
			slices:   []*discoveryv1.EndpointSlice{slice("d-1", "d", v4, one, readyAt("10.0.0.1", "d-a"))},
			problems: []string{`d-1: no TCP port named "api" (ports: 30000/TCP)`},
		},
		{
			name:     "a numbered port that is missing",
			pool:     Pool{Service: "d", Port: "8000"},
			slices:   []*discoveryv1.EndpointSlice{slice("d-1", "d", v4, one, readyAt("10.0.0.1", "d-a"))},
			problems: []string{`d-1: no TCP port 8000`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			role := tt.role
			if role == "" {
				role = scheduler.RoleDecode
			}
			var in []*EndpointSlice
			for _, s := range tt.slices {
				in = append(in, convert(s))
			}
			got, problems := specs(role, tt.pool, in)
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Errorf("specs = %v, want %v", got, tt.want)
			}
			if len(problems) != len(tt.problems) {
				t.Fatalf("problems = %v, want %d", problems, len(tt.problems))
			}
			for i, p := range problems {
				if !strings.Contains(p.Error(), tt.problems[i]) {
					t.Errorf("problem %d = %q, want it to contain %q", i, p, tt.problems[i])
				}
			}
		})
	}
}
