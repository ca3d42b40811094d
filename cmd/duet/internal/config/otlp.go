package config

import (
	"errors"
	"fmt"
)

// OTLP turns on OpenTelemetry tracing (docs/tracing.md): Envoy traces the
// requests it samples and exports its spans over OTLP/gRPC, and duet's
// decision spans join the same traces. Without the section nothing is
// traced and `duet envoy-config` renders no tracer.
type OTLP struct {
	// Endpoint is the OTLP/gRPC collector (host:port) duet exports its
	// spans to, in plaintext (a collector on the node or in the mesh).
	Endpoint string `yaml:"endpoint"`
	// EnvoyEndpoint is where Envoy reaches the collector, when that is not
	// Endpoint (Envoy in another network namespace or container).
	EnvoyEndpoint string `yaml:"envoy_endpoint"`
	// SamplingPercent is the share of requests Envoy starts a trace for
	// (its random_sampling), 0 to 100. duet never decides by itself: it
	// traces a request exactly when Envoy's trace of it is sampled. Unset
	// means DefaultSamplingPercent.
	SamplingPercent *float64 `yaml:"sampling_percent"`
	// ServiceName is the service.name of duet's spans.
	ServiceName string `yaml:"service_name"`
	// EnvoyServiceName is the service.name of Envoy's spans.
	EnvoyServiceName string `yaml:"envoy_service_name"`
}

// Defaults of the otlp section.
const (
	// DefaultSamplingPercent traces every request, as Envoy does by
	// default; busy deployments set 1 or less.
	DefaultSamplingPercent  = 100.0
	DefaultServiceName      = "duet"
	DefaultEnvoyServiceName = "duet-envoy"
)

// Sampling returns the sampling percentage, the default where unset.
func (o *OTLP) Sampling() float64 {
	if o.SamplingPercent == nil {
		return DefaultSamplingPercent
	}
	return *o.SamplingPercent
}

func (o *OTLP) applyDefaults() {
	setDefault(&o.ServiceName, DefaultServiceName)
	setDefault(&o.EnvoyServiceName, DefaultEnvoyServiceName)
	setDefault(&o.EnvoyEndpoint, o.Endpoint)
}

func (o *OTLP) validate() []error {
	var errs []error
	if o.Endpoint == "" {
		errs = append(errs, errors.New("otlp.endpoint: required: the collector's OTLP/gRPC address, host:port (4317 is OTLP/gRPC's port)"))
	} else if err := validateDialable(o.Endpoint); err != nil {
		errs = append(errs, fmt.Errorf("otlp.endpoint: %w", err))
	}
	if o.EnvoyEndpoint != "" && o.EnvoyEndpoint != o.Endpoint {
		if err := validateDialable(o.EnvoyEndpoint); err != nil {
			errs = append(errs, fmt.Errorf("otlp.envoy_endpoint: %w", err))
		}
	}
	if p := o.Sampling(); p < 0 || p > 100 {
		errs = append(errs, fmt.Errorf("otlp.sampling_percent: %v is not between 0 and 100", p))
	}
	return errs
}
