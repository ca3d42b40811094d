package main

import (
	"context"
	"fmt"
	"os"

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
// cfg's kubernetes section until its context ends, handing the engines to
// sched; without the section, a function that returns at once. It fails
// when the API client cannot be configured or the namespace is unknown.
func newDiscovery(cfg *config.Config, sched kubernetes.EndpointSetter, env kubernetes.Env, log *zap.Logger,
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
	opts := kubernetes.Options{
		Client:     client.Slices,
		Namespace:  ns,
		Decode:     kubernetes.Pool{Service: k.Decode.Service, Port: k.Decode.Port},
		Setter:     sched,
		Debounce:   k.Debounce,
		JoinDelay:  max(k.JoinDelay, 0), // -1s: at once
		Logger:     log,
		Registerer: reg,
	}
	if k.Prefill != nil {
		opts.Prefill = &kubernetes.Pool{Service: k.Prefill.Service, Port: k.Prefill.Port}
	}
	d, err := kubernetes.New(opts)
	if err != nil {
		return nil, err
	}
	// client-go logs through klog: into duet's log, as JSON. klog's logger
	// is the process's; no client-go goroutine runs yet.
	klog.SetLogger(logr.New(zapSink{log.Named("client-go")}))
	log.Info("kubernetes discovery configured", zap.String("api_server", client.Host), zap.String("namespace", ns))
	return d.Run, nil
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
	ns, err := kubernetes.Namespace(k.Namespace, "", env)
	if err != nil {
		return err
	}
	p.Headless = true
	decode, err := headlessAddress("kubernetes.decode", k, ns, k.Decode)
	if err != nil {
		return err
	}
	p.Decode = []envoy.Address{decode}
	if k.Prefill != nil {
		prefill, err := headlessAddress("kubernetes.prefill", k, ns, k.Prefill)
		if err != nil {
			return err
		}
		p.Prefill = []envoy.Address{prefill}
	}
	return nil
}
