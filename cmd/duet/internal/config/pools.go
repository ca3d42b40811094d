package config

import (
	"errors"
	"fmt"
	"regexp"
)

// Pool is one model's engines: the model names it serves, its prefill and
// decode engines (listed, or found through Kubernetes), its policies and
// its Envoy clusters. duet routes a request to the pool that serves the
// body's `model` (docs/pools.md).
type Pool struct {
	// Name names the pool in metrics (label pool), logs, the status page,
	// the x-duet-pool header and the default cluster names: a DNS-1123
	// label of at most 40 characters.
	Name string `yaml:"name"`
	// Models are the model names the pool serves, as clients send them in
	// `model` and as GET /v1/models lists them. The first is the name the
	// engines serve (SGLang's and vLLM's served model name).
	Models []string `yaml:"models"`
	// Aliases are further names clients may send; duet rewrites them to
	// Models[0] before the engines see the body. /v1/models does not list
	// them.
	Aliases []string `yaml:"aliases"`
	// Prefill lists the prefill engines; empty means an aggregated pool.
	Prefill []Endpoint `yaml:"prefill"`
	// Decode lists the decode engines (or the aggregated ones).
	Decode []Endpoint `yaml:"decode"`
	// Kubernetes names the Services whose EndpointSlices list the pool's
	// engines (the top-level kubernetes section says where and how to
	// watch); Prefill and Decode must then be empty.
	Kubernetes *PoolServices `yaml:"kubernetes"`
	// Policy is the pool's policy per role; a role it leaves unnamed takes
	// the top-level policy.
	Policy Policy `yaml:"policy"`
	// Clusters names the pool's Envoy clusters; default
	// duet_<name>_decode and duet_<name>_prefill.
	Clusters EnvoyClusters `yaml:"clusters"`
	// Tokenizer, when set, is the pool's model tokenizer: duet routes its
	// requests on token ids (docs/tokenizer.md). Off by default.
	Tokenizer *Tokenizer `yaml:"tokenizer"`

	// implicit marks the pool made of the top-level lists when the file
	// has no pools section.
	implicit bool
}

// PoolServices are the Services of one pool's roles.
type PoolServices struct {
	// Prefill is the prefill engines' Service; nil means aggregated.
	Prefill *KubernetesPool `yaml:"prefill"`
	// Decode is the decode (or aggregated) engines' Service.
	Decode *KubernetesPool `yaml:"decode"`
}

// DefaultPoolName names the pool of a configuration without a pools
// section.
const DefaultPoolName = "default"

// Implicit reports whether the pool stands for a configuration without a
// pools section: its engines, policies and clusters are the top-level
// ones, and it serves every model.
func (p *Pool) Implicit() bool { return p.implicit }

// PD reports whether the pool disaggregates prefill and decode.
func (p *Pool) PD() bool {
	if p.Kubernetes != nil {
		return p.Kubernetes.Prefill != nil
	}
	return len(p.Prefill) > 0
}

// poolName is a pool name: a DNS-1123 label short enough to fit cluster
// and metric names.
var poolName = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$`)

// PoolList returns the pools duet routes to, in order: the pools section
// (with defaults applied), or one implicit pool named "default" made of the
// top-level prefill, decode, kubernetes, policy and envoy.clusters.
func (c *Config) PoolList() []Pool {
	if len(c.Pools) > 0 {
		return c.Pools
	}
	p := Pool{Name: DefaultPoolName, Prefill: c.Prefill, Decode: c.Decode, Policy: c.Policy,
		Clusters: c.Envoy.Clusters, Tokenizer: c.Tokenizer, implicit: true}
	if c.Kubernetes != nil {
		p.Kubernetes = &PoolServices{Prefill: c.Kubernetes.Prefill, Decode: c.Kubernetes.Decode}
	}
	return []Pool{p}
}

// applyPoolDefaults gives each pool the top-level policy for a role it
// leaves unnamed, and its default cluster names.
func (c *Config) applyPoolDefaults() {
	for i := range c.Pools {
		p := &c.Pools[i]
		if p.Policy.Prefill.Name == "" {
			p.Policy.Prefill = c.Policy.Prefill
		}
		if p.Policy.Decode.Name == "" {
			p.Policy.Decode = c.Policy.Decode
		}
		setDefault(&p.Clusters.Decode, "duet_"+p.Name+"_decode")
		setDefault(&p.Clusters.Prefill, "duet_"+p.Name+"_prefill")
	}
}

// validatePools checks the pools section: each pool's name, models,
// engines and clusters, and that no model, engine or cluster belongs to two
// pools. With no pools section it returns nothing: the top-level lists are
// checked as before.
func (c *Config) validatePools() []error {
	if len(c.Pools) == 0 {
		return nil
	}
	var errs []error
	if len(c.Prefill) > 0 || len(c.Decode) > 0 {
		errs = append(errs, errors.New("prefill, decode: with a pools section, list each pool's engines under pools[].prefill and pools[].decode"))
	}
	if c.Kubernetes != nil && (c.Kubernetes.Prefill != nil || c.Kubernetes.Decode != nil) {
		errs = append(errs, errors.New("kubernetes.prefill, kubernetes.decode: with a pools section, name each pool's Services under pools[].kubernetes"))
	}
	names := map[string]int{}
	models := map[string]string{}
	clusters := map[string]string{}
	services := map[string]string{}
	urls := map[string]string{}
	for i, p := range c.Pools {
		field := fmt.Sprintf("pools[%d]", i)
		if !poolName.MatchString(p.Name) {
			errs = append(errs, fmt.Errorf("%s.name: %q is not a pool name (lower-case letters, digits and '-', at most 40, starting and ending with a letter or digit)", field, p.Name))
		} else if j, dup := names[p.Name]; dup {
			errs = append(errs, fmt.Errorf("%s.name: %q is also pools[%d].name", field, p.Name, j))
		}
		names[p.Name] = i
		if len(p.Models) == 0 {
			errs = append(errs, fmt.Errorf("%s.models: at least one model name is required", field))
		}
		for _, names := range []struct {
			key  string
			list []string
		}{{"models", p.Models}, {"aliases", p.Aliases}} {
			for j, m := range names.list {
				f := fmt.Sprintf("%s.%s[%d]", field, names.key, j)
				if m == "" {
					errs = append(errs, fmt.Errorf("%s: is empty", f))
					continue
				}
				if prev, dup := models[m]; dup {
					errs = append(errs, fmt.Errorf("%s: %q is already %s", f, m, prev))
				}
				models[m] = f
			}
		}
		for _, cl := range []struct{ field, name string }{{"decode", p.Clusters.Decode}, {"prefill", p.Clusters.Prefill}} {
			f := fmt.Sprintf("%s.clusters.%s", field, cl.field)
			if prev, dup := clusters[cl.name]; dup {
				errs = append(errs, fmt.Errorf("%s: %q is already %s", f, cl.name, prev))
			}
			clusters[cl.name] = f
		}
		if p.Kubernetes != nil {
			if c.Kubernetes == nil {
				errs = append(errs, fmt.Errorf("%s.kubernetes: needs the top-level kubernetes section (namespace, kubeconfig, debounce, join_delay)", field))
			}
			if len(p.Prefill) > 0 || len(p.Decode) > 0 {
				errs = append(errs, fmt.Errorf("%s: prefill and decode must be empty when %s.kubernetes names the Services", field, field))
			}
			if p.Kubernetes.Decode == nil {
				errs = append(errs, fmt.Errorf("%s.kubernetes.decode: is required", field))
			} else {
				errs = append(errs, p.Kubernetes.Decode.validate(field+".kubernetes.decode")...)
			}
			if p.Kubernetes.Prefill != nil {
				errs = append(errs, p.Kubernetes.Prefill.validate(field+".kubernetes.prefill")...)
			}
			for _, svc := range []struct {
				field string
				pool  *KubernetesPool
			}{{"prefill", p.Kubernetes.Prefill}, {"decode", p.Kubernetes.Decode}} {
				if svc.pool == nil || svc.pool.Service == "" {
					continue
				}
				f := fmt.Sprintf("%s.kubernetes.%s.service", field, svc.field)
				if prev, dup := services[svc.pool.Service]; dup {
					errs = append(errs, fmt.Errorf("%s: %q is already %s", f, svc.pool.Service, prev))
				}
				services[svc.pool.Service] = f
			}
		} else if len(p.Decode) == 0 {
			errs = append(errs, fmt.Errorf("%s.decode: at least one endpoint is required (or %s.kubernetes)", field, field))
		}
		errs = append(errs, validateEndpoints(field+".", p.Prefill, p.Decode, urls)...)
	}
	return errs
}
