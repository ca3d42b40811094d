package main

import (
	"reflect"
	"testing"

	"github.com/duet-router/duet/envoy"
)

// Envoy reaches duet at envoy.duet (by default listen.grpc), or at every
// replica of envoy.duet_replicas.
func TestEnvoyParamsDuetAddresses(t *testing.T) {
	const engines = "decode: [{url: \"http://10.0.0.2:30000\"}]\n"
	tests := []struct {
		name     string
		yaml     string
		duet     envoy.Address
		replicas []envoy.Address
	}{
		{"default", engines, envoy.Address{Host: "127.0.0.1", Port: 9002}, nil},
		{"envoy.duet", engines + "envoy: {duet: \"duet.inference.svc.cluster.local:9002\"}\n",
			envoy.Address{Host: "duet.inference.svc.cluster.local", Port: 9002}, nil},
		{"envoy.duet_replicas", engines + "envoy: {duet_replicas: [\"10.0.0.5:9002\", \"duet-1.duet:9002\", \"[fd00::7]:9102\"]}\n",
			envoy.Address{}, []envoy.Address{{Host: "10.0.0.5", Port: 9002}, {Host: "duet-1.duet", Port: 9002}, {Host: "fd00::7", Port: 9102}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := envoyParams(mustParse(t, tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if p.Duet != tt.duet || !reflect.DeepEqual(p.DuetReplicas, tt.replicas) {
				t.Errorf("Duet %+v, DuetReplicas %+v; want %+v, %+v", p.Duet, p.DuetReplicas, tt.duet, tt.replicas)
			}
		})
	}
}
