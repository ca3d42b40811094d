package main

import (
	"context"
	"fmt"
	"os"
	"sync"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"k8s.io/klog/v2"

	"github.com/duet-router/duet/cmd/duet/internal/config"
	"github.com/duet-router/duet/envoy"
	"github.com/duet-router/duet/scheduler/kubernetes"
)

// osEnv is the process's environment, for Kubernetes discovery.
var osEnv = kubernetes.Env{Getenv: os.Getenv, ReadFile: os.ReadFile}

// newDiscovery returns the function that runs Kubernetes discovery for
// every pool that names its Services, handing each pool's engines to
// setters[pool name]; without a kubernetes section, a function that returns
// at once. It fails when the API client cannot be configured or the
// namespace is unknown. Each pool's discovery metrics carry the label pool.
func newDiscovery(cfg *config.Config, setters map[string]endpointSetter, env kubernetes.Env, log *zap.Logger,
	reg prometheus.Registerer) (func(context.Context), error) {
	k := cfg.Kubernetes
	if k == nil {
		return func(context.Context) {}, nil
	}
	client, err := kubernetes.NewClient(k.Kubeconfig, env)
	if err != nil {
		return nil, err
	}
	ns, err := kubernetes.Namespace(k.Namespace, client.Namespace, env)
	if err != nil {
		return nil, err
	}
	var runs []func(context.Context)
	for _, p := range cfg.PoolList() {
		if p.Kubernetes == nil {
			continue
		}
		setter, ok := setters[p.Name]
		if !ok {
			return nil, fmt.Errorf("kubernetes discovery: no scheduler for pool %s", p.Name)
		}
		opts := kubernetes.Options{
			Client:     client.Slices,
			Namespace:  ns,
			Decode:     kubernetes.Pool{Service: p.Kubernetes.Decode.Service, Port: p.Kubernetes.Decode.Port, DPSize: p.Kubernetes.Decode.DPSize},
			Setter:     setter,
			Debounce:   k.Debounce,
			JoinDelay:  max(k.JoinDelay, 0), // -1s: at once
			Logger:     log.With(zap.String("pool", p.Name)),
			Registerer: nil,
		}
		if reg != nil {
			opts.Registerer = poolRegisterer(reg, p.Name)
		}
		if p.Kubernetes.Prefill != nil {
			opts.Prefill = &kubernetes.Pool{Service: p.Kubernetes.Prefill.Service, Port: p.Kubernetes.Prefill.Port, DPSize: p.Kubernetes.Prefill.DPSize}
		}
		d, err := kubernetes.New(opts)
		if err != nil {
			return nil, err
		}
		runs = append(runs, d.Run)
	}
	// client-go logs through klog: into duet's log, as JSON. klog's logger
	// is the process's; no client-go goroutine runs yet.
	klog.SetLogger(logr.New(zapSink{log.Named("client-go")}))
	log.Info("kubernetes discovery configured", zap.String("api_server", client.Host), zap.String("namespace", ns))
	return func(ctx context.Context) {
		var wg sync.WaitGroup
		for _, run := range runs {
			wg.Go(func() { run(ctx) })
		}
		wg.Wait()
	}, nil
}

// headlessAddress is the DNS name and port at which Envoy resolves every
// engine of pool: its headless Service's name in the cluster's DNS.
func headlessAddress(field string, k *config.Kubernetes, ns string, pool *config.KubernetesPool) (envoy.Address, error) {
	port := pool.PortNumber()
	if port == 0 {
		port = pool.TargetPort
	}
	if port == 0 {
		return envoy.Address{}, fmt.Errorf("%s.target_port: duet envoy-config needs the engines' HTTP port number (the pods' port): set %s.port or %s.target_port to it",
			field, field, field)
	}
	return envoy.Address{Host: pool.Service + "." + ns + ".svc." + k.ClusterDomain, Port: port}, nil
}

// kubernetesEnvoyParams fills in p's engine clusters from cfg's kubernetes
// section: one headless Service per role.
func kubernetesEnvoyParams(p *envoy.Params, k *config.Kubernetes, env kubernetes.Env) error {
	p.Headless = true
	var err error
	p.Prefill, p.Decode, err = kubernetesPoolAddresses("kubernetes", k, &config.PoolServices{Prefill: k.Prefill, Decode: k.Decode}, env)
	return err
}

// kubernetesPoolAddresses returns the names of a pool's headless Services
// (prefill nil when it has none), as Envoy resolves them; field prefixes
// errors.
func kubernetesPoolAddresses(field string, k *config.Kubernetes, svc *config.PoolServices, env kubernetes.Env) (prefill, decode []envoy.Address, err error) {
	ns, err := kubernetes.Namespace(k.Namespace, "", env)
	if err != nil {
		return nil, nil, err
	}
	d, err := headlessAddress(field+".decode", k, ns, svc.Decode)
	if err != nil {
		return nil, nil, err
	}
	decode = []envoy.Address{d}
	if svc.Prefill != nil {
		p, err := headlessAddress(field+".prefill", k, ns, svc.Prefill)
		if err != nil {
			return nil, nil, err
		}
		prefill = []envoy.Address{p}
	}
	return prefill, decode, nil
}
