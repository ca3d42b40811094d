package config

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Kubernetes discovers the engines from the EndpointSlices of Kubernetes
// Services instead of the static prefill and decode lists (see
// docs/deploy/discovery.md).
type Kubernetes struct {
	// Namespace is the engines' namespace; empty means duet's own (the
	// POD_NAMESPACE environment variable, else the service account's).
	Namespace string `yaml:"namespace"`
	// Kubeconfig is a kubeconfig file, for running outside the cluster;
	// empty means $KUBECONFIG if set, else the in-cluster service account.
	Kubeconfig string `yaml:"kubeconfig"`
	// ClusterDomain is the cluster's DNS domain, which the rendered Envoy
	// bootstrap uses to name the headless Services.
	ClusterDomain string `yaml:"cluster_domain"`
	// Debounce gathers a burst of EndpointSlice changes into one update:
	// duet applies them this long after the first.
	Debounce time.Duration `yaml:"debounce"`
	// JoinDelay is how long an engine that became ready waits before duet
	// schedules it, so that Envoy's DNS view of the headless Service has it
	// by then; "-1s" schedules new engines at once. Engines listed when duet
	// starts are scheduled at once.
	JoinDelay time.Duration `yaml:"join_delay"`
	// Prefill is the prefill pool's Service; nil means aggregated mode.
	Prefill *KubernetesPool `yaml:"prefill"`
	// Decode is the decode pool's (or the aggregated pool's) Service.
	Decode *KubernetesPool `yaml:"decode"`
}

// KubernetesPool names the Service whose EndpointSlices list one role's
// engines.
type KubernetesPool struct {
	// Service is the Service's name: duet watches the EndpointSlices
	// labelled kubernetes.io/service-name=<service>. Envoy resolves it as a
	// headless Service.
	Service string `yaml:"service"`
	// Port is the EndpointSlice port (a name, or a number) of the engines'
	// HTTP port; empty means the slice's only port (a port named bootstrap
	// aside), else the one named http.
	Port string `yaml:"port"`
	// TargetPort is the engines' HTTP port number in the pods, which Envoy
	// dials on every address of the headless Service. Only `duet
	// envoy-config` reads it, and only when Port is not a number.
	TargetPort int `yaml:"target_port"`
	// DPSize is each engine's DP size, used only when discovery cannot
	// read it from the engine (vLLM serves no /server_info); 0 means
	// discover.
	DPSize int `yaml:"dp_size"`
}

// Defaults of the kubernetes section.
const (
	DefaultClusterDomain = "cluster.local"
	DefaultDebounce      = 500 * time.Millisecond
	DefaultJoinDelay     = 10 * time.Second
)

// BootstrapPortName is the name of the EndpointSlice port that gives a
// prefill engine's disaggregation bootstrap port.
const BootstrapPortName = "bootstrap"

var (
	// dns1123Label is a Kubernetes namespace name or port name.
	dns1123Label = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	// dns1035Label is a Kubernetes Service name.
	dns1035Label = regexp.MustCompile(`^[a-z]([-a-z0-9]*[a-z0-9])?$`)
)

func (k *Kubernetes) applyDefaults() {
	setDefault(&k.ClusterDomain, DefaultClusterDomain)
	if k.Debounce == 0 {
		k.Debounce = DefaultDebounce
	}
	if k.JoinDelay == 0 {
		k.JoinDelay = DefaultJoinDelay
	}
}

// PortNumber returns Port as a number, or 0 when it is a name or empty.
func (p *KubernetesPool) PortNumber() int {
	n, err := strconv.Atoi(p.Port)
	if err != nil {
		return 0
	}
	return n
}

// validate checks the kubernetes section (after defaults), naming each
// field; c is the whole configuration, whose static lists must be empty.
func (k *Kubernetes) validate(c *Config) []error {
	var errs []error
	if len(c.Prefill) > 0 {
		errs = append(errs, errors.New("prefill: must be empty when kubernetes is set (kubernetes.prefill names the Service)"))
	}
	if len(c.Decode) > 0 {
		errs = append(errs, errors.New("decode: must be empty when kubernetes is set (kubernetes.decode names the Service)"))
	}
	if k.Namespace != "" && (len(k.Namespace) > 63 || !dns1123Label.MatchString(k.Namespace)) {
		errs = append(errs, fmt.Errorf("kubernetes.namespace: %q is not a namespace name (a DNS-1123 label)", k.Namespace))
	}
	if strings.HasPrefix(k.ClusterDomain, ".") || strings.HasSuffix(k.ClusterDomain, ".") || len(k.ClusterDomain) > 253 ||
		!allLabels(k.ClusterDomain) {
		errs = append(errs, fmt.Errorf("kubernetes.cluster_domain: %q is not a DNS domain", k.ClusterDomain))
	}
	if k.Debounce < 0 {
		errs = append(errs, fmt.Errorf("kubernetes.debounce: %v must not be negative", k.Debounce))
	}
	if k.JoinDelay < 0 && k.JoinDelay != -time.Second {
		errs = append(errs, fmt.Errorf("kubernetes.join_delay: %v is neither a duration nor -1s (at once)", k.JoinDelay))
	}
	if k.Decode == nil && len(c.Pools) == 0 {
		errs = append(errs, errors.New("kubernetes.decode: is required"))
	} else if k.Decode != nil {
		errs = append(errs, k.Decode.validate("kubernetes.decode")...)
	}
	if k.Prefill != nil {
		errs = append(errs, k.Prefill.validate("kubernetes.prefill")...)
		if k.Decode != nil && k.Prefill.Service != "" && k.Prefill.Service == k.Decode.Service {
			errs = append(errs, fmt.Errorf("kubernetes.prefill.service: %q is also kubernetes.decode.service", k.Prefill.Service))
		}
	}
	return errs
}

// validate checks one pool, naming its fields under prefix.
func (p *KubernetesPool) validate(prefix string) []error {
	var errs []error
	switch {
	case p.Service == "":
		errs = append(errs, fmt.Errorf("%s.service: is required", prefix))
	case len(p.Service) > 63 || !dns1035Label.MatchString(p.Service):
		errs = append(errs, fmt.Errorf("%s.service: %q is not a Service name (a DNS-1035 label)", prefix, p.Service))
	}
	n, err := strconv.Atoi(p.Port)
	switch {
	case p.Port == "":
	case err == nil && (n < 1 || n > 65535):
		errs = append(errs, fmt.Errorf("%s.port: %d is not a port", prefix, n))
	case err == nil:
		if p.TargetPort != 0 && p.TargetPort != n {
			errs = append(errs, fmt.Errorf("%s.target_port: %d differs from port %d (a numbered port is the pods' port)", prefix, p.TargetPort, n))
		}
	case len(p.Port) > 63 || !dns1123Label.MatchString(p.Port):
		errs = append(errs, fmt.Errorf("%s.port: %q is neither a port number nor a port name", prefix, p.Port))
	case p.Port == BootstrapPortName:
		errs = append(errs, fmt.Errorf("%s.port: %q names the bootstrap port, not the HTTP port", prefix, p.Port))
	}
	if p.DPSize < 0 {
		errs = append(errs, fmt.Errorf("%s.dp_size: %d must not be negative", prefix, p.DPSize))
	}
	if p.TargetPort < 0 || p.TargetPort > 65535 {
		errs = append(errs, fmt.Errorf("%s.target_port: %d is not a port", prefix, p.TargetPort))
	}
	return errs
}

// allLabels reports whether every dot-separated part of name is a DNS-1123
// label.
func allLabels(name string) bool {
	for _, l := range strings.Split(name, ".") {
		if len(l) > 63 || !dns1123Label.MatchString(l) {
			return false
		}
	}
	return true
}
