package config

import (
	"testing"
	"time"
)

func TestParseKubernetes(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want Kubernetes
	}{
		{
			name: "pd with defaults",
			yaml: `
kubernetes:
  prefill: {service: sglang-prefill}
  decode: {service: sglang-decode, port: http}
`,
			want: Kubernetes{
				ClusterDomain: DefaultClusterDomain, Debounce: DefaultDebounce, JoinDelay: DefaultJoinDelay,
				Prefill: &KubernetesPool{Service: "sglang-prefill"},
				Decode:  &KubernetesPool{Service: "sglang-decode", Port: "http"},
			},
		},
		{
			name: "aggregated, every field",
			yaml: `
kubernetes:
  namespace: inference
  kubeconfig: /etc/kube/config
  cluster_domain: k8s.example.org
  debounce: 2s
  join_delay: -1s
  decode: {service: sglang, port: 30000}
`,
			want: Kubernetes{
				Namespace: "inference", Kubeconfig: "/etc/kube/config", ClusterDomain: "k8s.example.org",
				Debounce: 2 * time.Second, JoinDelay: -time.Second,
				Decode: &KubernetesPool{Service: "sglang", Port: "30000"},
			},
		},
		{
			name: "named port with target port",
			yaml: `{kubernetes: {decode: {service: d, port: web, target_port: 8000}}}`,
			want: Kubernetes{
				ClusterDomain: DefaultClusterDomain, Debounce: DefaultDebounce, JoinDelay: DefaultJoinDelay,
				Decode: &KubernetesPool{Service: "d", Port: "web", TargetPort: 8000},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			k := cfg.Kubernetes
			if k == nil {
				t.Fatal("no kubernetes section")
			}
			if k.Namespace != tt.want.Namespace || k.Kubeconfig != tt.want.Kubeconfig ||
				k.ClusterDomain != tt.want.ClusterDomain || k.Debounce != tt.want.Debounce || k.JoinDelay != tt.want.JoinDelay {
				t.Errorf("kubernetes = %+v, want %+v", *k, tt.want)
			}
			if *k.Decode != *tt.want.Decode {
				t.Errorf("decode = %+v, want %+v", *k.Decode, *tt.want.Decode)
			}
			if (k.Prefill == nil) != (tt.want.Prefill == nil) || (k.Prefill != nil && *k.Prefill != *tt.want.Prefill) {
				t.Errorf("prefill = %+v, want %+v", k.Prefill, tt.want.Prefill)
			}
		})
	}
}

func TestParseKubernetesErrorsNameTheField(t *testing.T) {
	checkParseErrors(t, []parseErrorCase{
		{"static lists too", `{kubernetes: {decode: {service: d}}, decode: [{url: "http://a:1"}], prefill: [{url: "http://b:1"}]}`,
			[]string{"decode: must be empty when kubernetes is set", "prefill: must be empty when kubernetes is set"}},
		{"no decode", `{kubernetes: {prefill: {service: p}}}`, []string{"kubernetes.decode: is required"}},
		{"no service", `{kubernetes: {decode: {port: http}, prefill: {port: 80}}}`,
			[]string{"kubernetes.decode.service: is required", "kubernetes.prefill.service: is required"}},
		{"bad service", `{kubernetes: {decode: {service: 9decode}}}`, []string{"kubernetes.decode.service", "DNS-1035"}},
		{"same service", `{kubernetes: {decode: {service: s}, prefill: {service: s}}}`, []string{"kubernetes.prefill.service", "also kubernetes.decode.service"}},
		{"bad namespace", `{kubernetes: {namespace: Infer_ence, decode: {service: d}}}`, []string{"kubernetes.namespace"}},
		{"bad cluster domain", `{kubernetes: {cluster_domain: "cluster..local", decode: {service: d}}}`, []string{"kubernetes.cluster_domain"}},
		{"port out of range", `{kubernetes: {decode: {service: d, port: 70000}}}`, []string{"kubernetes.decode.port", "not a port"}},
		{"bad port name", `{kubernetes: {decode: {service: d, port: "HTTP port"}}}`, []string{"kubernetes.decode.port", "neither a port number nor a port name"}},
		{"bootstrap as http port", `{kubernetes: {prefill: {service: p, port: bootstrap}, decode: {service: d}}}`, []string{"kubernetes.prefill.port", "bootstrap port"}},
		{"target port differs", `{kubernetes: {decode: {service: d, port: 30000, target_port: 30001}}}`, []string{"kubernetes.decode.target_port", "differs"}},
		{"target port range", `{kubernetes: {decode: {service: d, port: http, target_port: -1}}}`, []string{"kubernetes.decode.target_port", "not a port"}},
		{"negative debounce", `{kubernetes: {debounce: -1s, decode: {service: d}}}`, []string{"kubernetes.debounce"}},
		{"bad join delay", `{kubernetes: {join_delay: -5s, decode: {service: d}}}`, []string{"kubernetes.join_delay"}},
		{"unknown field", `{kubernetes: {decode: {service: d, prot: http}}}`, []string{`line 1: kubernetes.decode.prot: unknown key: did you mean "port"?`}},
	})
}

func TestKubernetesPoolPortNumber(t *testing.T) {
	for _, tt := range []struct {
		port string
		want int
	}{{"30000", 30000}, {"http", 0}, {"", 0}} {
		if got := (&KubernetesPool{Port: tt.port}).PortNumber(); got != tt.want {
			t.Errorf("PortNumber(%q) = %d, want %d", tt.port, got, tt.want)
		}
	}
}
