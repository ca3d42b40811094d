package config

import "testing"

func TestParseOTLP(t *testing.T) {
	const engines = `decode: [{url: "http://a:1"}]` + "\n"
	tests := []struct {
		name                          string
		yaml                          string
		endpoint, envoyEndpoint       string
		sampling                      float64
		serviceName, envoyServiceName string
	}{
		{"defaults", "otlp: {endpoint: \"127.0.0.1:4317\"}", "127.0.0.1:4317", "127.0.0.1:4317", 100, "duet", "duet-envoy"},
		{"everything", "otlp: {endpoint: \"localhost:4317\", envoy_endpoint: \"jaeger:4317\", sampling_percent: 0.5, service_name: router, envoy_service_name: edge}",
			"localhost:4317", "jaeger:4317", 0.5, "router", "edge"},
		{"never sample", "otlp: {endpoint: \"127.0.0.1:4317\", sampling_percent: 0}", "127.0.0.1:4317", "127.0.0.1:4317", 0, "duet", "duet-envoy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := Parse([]byte(engines + tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			o := cfg.OTLP
			if o.Endpoint != tt.endpoint || o.EnvoyEndpoint != tt.envoyEndpoint || o.Sampling() != tt.sampling ||
				o.ServiceName != tt.serviceName || o.EnvoyServiceName != tt.envoyServiceName {
				t.Errorf("got %+v (sampling %v)", o, o.Sampling())
			}
		})
	}
	if cfg, err := Parse([]byte(engines)); err != nil || cfg.OTLP != nil {
		t.Errorf("without the section: %+v, %v", cfg.OTLP, err)
	}
}

func TestParseOTLPErrors(t *testing.T) {
	const engines = `decode: [{url: "http://a:1"}]` + "\n"
	checkParseErrors(t, []parseErrorCase{
		{"no endpoint", engines + "otlp: {sampling_percent: 1}", []string{"otlp.endpoint: required"}},
		{"endpoint with a scheme", engines + `otlp: {endpoint: "http://c:4317"}`, []string{"otlp.endpoint"}},
		{"unspecified endpoint", engines + `otlp: {endpoint: "0.0.0.0:4317"}`, []string{"otlp.endpoint", "names no host to dial"}},
		{"bad envoy endpoint", engines + `otlp: {endpoint: "c:4317", envoy_endpoint: "c"}`, []string{"otlp.envoy_endpoint"}},
		{"sampling above 100", engines + `otlp: {endpoint: "c:4317", sampling_percent: 150}`, []string{"otlp.sampling_percent: 150 is not between 0 and 100"}},
		{"negative sampling", engines + `otlp: {endpoint: "c:4317", sampling_percent: -1}`, []string{"otlp.sampling_percent"}},
		{"misspelt key", engines + `otlp: {endpont: "c:4317"}`, []string{`otlp.endpont: unknown key: did you mean "endpoint"?`}},
	})
}
