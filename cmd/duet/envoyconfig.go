package main

import (
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/duet-router/duet/cmd/duet/internal/auth"
	"github.com/duet-router/duet/cmd/duet/internal/config"
	"github.com/duet-router/duet/envoy"
	"github.com/duet-router/duet/envoy/contract"
	"github.com/duet-router/duet/extproc"
)

// writeEnvoyConfig renders the Envoy bootstrap that matches cfg.
func writeEnvoyConfig(w io.Writer, cfg *config.Config) error {
	p, err := envoyParams(cfg)
	if err != nil {
		return err
	}
	return envoy.Render(w, p)
}

// writeEnvoyConfigFile renders the bootstrap into path atomically: a reader
// (Envoy starting next to an init container) sees the old file or the whole
// new one, never a partial one.
func writeEnvoyConfigFile(path string, cfg *config.Config) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".envoy-*.yaml")
	if err != nil {
		return fmt.Errorf("envoy-config: %w", err)
	}
	defer os.Remove(tmp.Name()) // after a successful rename: a no-op error
	if err := writeEnvoyConfig(tmp, cfg); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return fmt.Errorf("envoy-config: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("envoy-config: write %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("envoy-config: %w", err)
	}
	return nil
}

// maxMessageTimeout is Envoy's max_message_timeout for cfg: the longest
// wait limit of an admission class, plus the margin duet adds to it, plus
// a second; never below envoy.message_timeout.
func maxMessageTimeout(cfg *config.Config) time.Duration {
	return max(cfg.Admission.MaxWaitLimit()+extproc.HoldMargin+time.Second, cfg.Envoy.MessageTimeout)
}

// envoyParams maps duet's configuration onto the bootstrap's inputs.
func envoyParams(cfg *config.Config) (envoy.Params, error) {
	if c := cfg.Envoy.Clusters; c.Decode != contract.ClusterDecode || c.Prefill != contract.ClusterPrefill {
		return envoy.Params{}, fmt.Errorf("envoy.clusters: the bootstrap names its clusters %s and %s; other names are for a gateway that builds its own Envoy configuration (Envoy Gateway)",
			contract.ClusterDecode, contract.ClusterPrefill)
	}
	p := envoy.Params{
		MaxBodyBytes:       cfg.Request.MaxBodyBytes,
		MessageTimeout:     cfg.Envoy.MessageTimeout,
		MaxRoutingRequests: cfg.Envoy.MaxRoutingRequests,
		StreamIdleTimeout:  cfg.Envoy.StreamIdleTimeout,
	}
	if cfg.Admission.Enabled {
		p.MaxMessageTimeout = maxMessageTimeout(cfg)
	}
	var err error
	for _, a := range []struct {
		field, value string
		dst          *envoy.Address
	}{
		{"envoy.listen", cfg.Envoy.Listen, &p.Listen},
		{"envoy.admin", cfg.Envoy.Admin, &p.Admin},
	} {
		if *a.dst, err = envoy.ParseAddress(a.value); err != nil {
			return p, fmt.Errorf("%s: %w", a.field, err)
		}
	}
	if err := duetAddresses(&p, cfg.Envoy); err != nil {
		return p, err
	}
	if err := duetAuthParams(&p, cfg); err != nil {
		return p, err
	}
	if o := cfg.OTLP; o != nil {
		collector, err := envoy.ParseAddress(o.EnvoyEndpoint)
		if err != nil {
			return p, fmt.Errorf("otlp.envoy_endpoint: %w", err)
		}
		p.Tracing = &envoy.Tracing{Collector: collector, SamplingPercent: o.Sampling(), ServiceName: o.EnvoyServiceName}
	}
	if len(cfg.Pools) > 0 {
		return p, poolEnvoyParams(&p, cfg)
	}
	if cfg.Kubernetes != nil {
		return p, kubernetesEnvoyParams(&p, cfg.Kubernetes, osEnv)
	}
	if p.Prefill, err = engineAddresses("prefill", cfg.Prefill); err != nil {
		return p, err
	}
	if p.Decode, err = engineAddresses("decode", cfg.Decode); err != nil {
		return p, err
	}
	return p, nil
}

// poolEnvoyParams gives each pool of cfg its clusters: its listed engines,
// or its headless Services.
func poolEnvoyParams(p *envoy.Params, cfg *config.Config) error {
	for i, pool := range cfg.Pools {
		field := fmt.Sprintf("pools[%d]", i)
		ep := envoy.Pool{Name: pool.Name, DecodeCluster: pool.Clusters.Decode, PrefillCluster: pool.Clusters.Prefill}
		var err error
		if pool.Kubernetes != nil {
			ep.Headless = true
			if ep.Prefill, ep.Decode, err = kubernetesPoolAddresses(field+".kubernetes", cfg.Kubernetes, pool.Kubernetes, osEnv); err != nil {
				return err
			}
		} else {
			if ep.Prefill, err = engineAddresses(field+".prefill", pool.Prefill); err != nil {
				return err
			}
			if ep.Decode, err = engineAddresses(field+".decode", pool.Decode); err != nil {
				return err
			}
		}
		p.Pools = append(p.Pools, ep)
	}
	return nil
}

// duetAddresses says where Envoy reaches duet: every replica of
// envoy.duet_replicas, or envoy.duet.
func duetAddresses(p *envoy.Params, e config.Envoy) error {
	if len(e.DuetReplicas) == 0 {
		var err error
		if p.Duet, err = envoy.ParseAddress(e.Duet); err != nil {
			return fmt.Errorf("envoy.duet: %w", err)
		}
		return nil
	}
	for i, r := range e.DuetReplicas {
		a, err := envoy.ParseAddress(r)
		if err != nil {
			return fmt.Errorf("envoy.duet_replicas[%d]: %w", i, err)
		}
		p.DuetReplicas = append(p.DuetReplicas, a)
	}
	return nil
}

// duetAuthParams gives Envoy the credentials duet requires of it: the
// client certificate of envoy.duet_tls under auth.tls, and the first token
// of auth.token_file.
func duetAuthParams(p *envoy.Params, cfg *config.Config) error {
	if cfg.Auth.TLS != nil {
		t := cfg.Envoy.DuetTLS
		if t == nil {
			return errors.New("envoy.duet_tls: auth.tls makes duet require Envoy's client certificate; name it (and the CA of duet's certificate) in envoy.duet_tls")
		}
		p.DuetTLS = &envoy.ClientTLS{CertFile: t.CertFile, KeyFile: t.KeyFile, CAFile: t.CAFile, ServerName: t.ServerName}
	}
	if cfg.Auth.TokenFile != "" {
		token, err := auth.FirstToken(cfg.Auth.TokenFile)
		if err != nil {
			return fmt.Errorf("auth.token_file: %w", err)
		}
		p.DuetToken = token
	}
	return nil
}

func engineAddresses(role string, eps []config.Endpoint) ([]envoy.Address, error) {
	out := make([]envoy.Address, 0, len(eps))
	for i, ep := range eps {
		u, err := url.Parse(ep.URL)
		if err != nil {
			return nil, fmt.Errorf("%s[%d].url: %w", role, i, err)
		}
		port := 80
		if s := u.Port(); s != "" {
			if port, err = strconv.Atoi(s); err != nil {
				return nil, fmt.Errorf("%s[%d].url: bad port: %w", role, i, err)
			}
		}
		out = append(out, envoy.Address{Host: u.Hostname(), Port: port})
	}
	return out, nil
}
