package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	httpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/anypb"

	"istio.io/istio/pilot/pkg/model"
	"istio.io/istio/pilot/test/xds"
	"istio.io/istio/pkg/test"
)

// proxySpec describes the proxy whose configuration is generated.
type proxySpec struct {
	Type      string // a key of proxyTypes
	Name      string // the pod's name
	Namespace string
	IP        string
	Labels    map[string]string
}

// istioVersion is the version of the proxy the configuration is generated
// for: the one of the istio.io/istio module this program is built from (its
// VERSION file reads 1.31).
const istioVersion = "1.31.0"

// proxyTypes are the kinds of proxy xds generates for, by flag value.
var proxyTypes = map[string]model.NodeType{"router": model.Router, "sidecar": model.SidecarProxy}

// Placeholder clusters for the control plane that Istio's configuration
// refers to (ADS for EDS and SDS); Envoy in validate mode never dials them.
var controlPlaneClusters = map[string]int{"xds-grpc": 15010, "sds-grpc": 15012}

// istioOnlyTypes are type URL prefixes of extensions that only Istio's proxy
// build (istio/proxy) registers; an upstream Envoy cannot load them.
var istioOnlyTypes = []string{
	"type.googleapis.com/io.istio.",
	"type.googleapis.com/istio.",
	"type.googleapis.com/stats.PluginConfig",
	"type.googleapis.com/udpa.type.v1.TypedStruct",
	"type.googleapis.com/xds.type.v3.TypedStruct",
}

// generate builds the proxy's configuration from files and writes it to
// stdout as an Envoy bootstrap; what it removed goes to stderr.
func generate(_ context.Context, p proxySpec, files []string, stdout, stderr io.Writer) error {
	var istioCfg, kubeObjs []string
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("read %s: %w", f, err)
		}
		docs, err := splitDocuments(string(data))
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		for _, d := range docs {
			if d.isIstio() {
				istioCfg = append(istioCfg, strings.TrimSpace(d.text))
			} else {
				kubeObjs = append(kubeObjs, strings.TrimSpace(stripComments(d.text)))
			}
		}
	}
	var boot *bootstrapv3.Bootstrap
	var routes map[string]json.RawMessage
	err := test.Wrap(func(t test.Failer) {
		s := xds.NewFakeDiscoveryServer(t, xds.FakeOptions{
			ConfigString:           strings.Join(istioCfg, "\n---\n"),
			KubernetesObjectString: strings.Join(kubeObjs, "\n---\n"),
		})
		proxy := s.SetupProxy(&model.Proxy{
			Type:            proxyTypes[p.Type],
			ID:              p.Name + "." + p.Namespace,
			ConfigNamespace: p.Namespace,
			IPAddresses:     []string{p.IP},
			Labels:          p.Labels,
			// The proxy of the Istio version this module pins (the generator
			// tailors some configuration to the proxy's version).
			Metadata: &model.NodeMetadata{Namespace: p.Namespace, Labels: p.Labels, IstioVersion: istioVersion},
		})
		boot = &bootstrapv3.Bootstrap{
			Node:             &corev3.Node{Id: proxy.ID, Cluster: p.Name},
			StaticResources:  &bootstrapv3.Bootstrap_StaticResources{Listeners: s.Listeners(proxy), Clusters: s.Clusters(proxy)},
			DynamicResources: &bootstrapv3.Bootstrap_DynamicResources{AdsConfig: grpcSource("xds-grpc")},
		}
		routes = map[string]json.RawMessage{}
		for _, r := range s.Routes(proxy) {
			b, err := protojson.Marshal(r)
			if err != nil {
				t.Fatalf("marshal route %s: %v", r.GetName(), err)
			}
			routes[r.GetName()] = b
		}
	})
	if err != nil {
		return fmt.Errorf("generate configuration: %w", err)
	}
	names := make([]string, 0, len(controlPlaneClusters))
	for name := range controlPlaneClusters {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		c, err := placeholderCluster(name, controlPlaneClusters[name])
		if err != nil {
			return err
		}
		boot.StaticResources.Clusters = append(boot.StaticResources.Clusters, c)
	}
	raw, err := protojson.Marshal(boot)
	if err != nil {
		return fmt.Errorf("marshal bootstrap: %w", err)
	}
	var tree any
	if err := json.Unmarshal(raw, &tree); err != nil {
		return fmt.Errorf("re-read bootstrap: %w", err)
	}
	var removed []string
	tree, err = rewrite(tree, routes, &removed)
	if err != nil {
		return err
	}
	for _, r := range removed {
		fmt.Fprintln(stderr, "removed Istio-only extension:", r)
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(tree)
}

// grpcSource is an ADS/xDS config source on a static cluster.
func grpcSource(cluster string) *corev3.ApiConfigSource {
	return &corev3.ApiConfigSource{
		ApiType:             corev3.ApiConfigSource_GRPC,
		TransportApiVersion: corev3.ApiVersion_V3,
		GrpcServices: []*corev3.GrpcService{{
			TargetSpecifier: &corev3.GrpcService_EnvoyGrpc_{EnvoyGrpc: &corev3.GrpcService_EnvoyGrpc{ClusterName: cluster}},
		}},
	}
}

// placeholderCluster is a static HTTP/2 cluster on loopback.
func placeholderCluster(name string, port int) (*clusterv3.Cluster, error) {
	opts, err := anypb.New(&httpv3.HttpProtocolOptions{
		UpstreamProtocolOptions: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_{ExplicitHttpConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig{
			ProtocolConfig: &httpv3.HttpProtocolOptions_ExplicitHttpConfig_Http2ProtocolOptions{Http2ProtocolOptions: &corev3.Http2ProtocolOptions{}},
		}},
	})
	if err != nil {
		return nil, fmt.Errorf("placeholder cluster %s: %w", name, err)
	}
	return &clusterv3.Cluster{
		Name:                 name,
		ClusterDiscoveryType: &clusterv3.Cluster_Type{Type: clusterv3.Cluster_STATIC},
		LoadAssignment: &endpointv3.ClusterLoadAssignment{
			ClusterName: name,
			Endpoints: []*endpointv3.LocalityLbEndpoints{{LbEndpoints: []*endpointv3.LbEndpoint{{
				HostIdentifier: &endpointv3.LbEndpoint_Endpoint{Endpoint: &endpointv3.Endpoint{Address: &corev3.Address{
					Address: &corev3.Address_SocketAddress{SocketAddress: &corev3.SocketAddress{
						Address: "127.0.0.1", PortSpecifier: &corev3.SocketAddress_PortValue{PortValue: uint32(port)},
					}},
				}}},
			}}}},
		},
		TypedExtensionProtocolOptions: map[string]*anypb.Any{"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": opts},
	}, nil
}

// rewrite walks the JSON form of the bootstrap: it inlines each RDS route
// configuration (routes by name) and removes list entries and fields whose
// typed config is an Istio-only extension, naming each in removed.
func rewrite(node any, routes map[string]json.RawMessage, removed *[]string) (any, error) {
	switch n := node.(type) {
	case map[string]any:
		if rds, ok := n["rds"].(map[string]any); ok {
			name, _ := rds["routeConfigName"].(string)
			raw, found := routes[name]
			if !found {
				return nil, fmt.Errorf("no route configuration %q for an RDS reference", name)
			}
			var rc any
			if err := json.Unmarshal(raw, &rc); err != nil {
				return nil, fmt.Errorf("route configuration %q: %w", name, err)
			}
			delete(n, "rds")
			n["routeConfig"] = rc
		}
		for k, v := range n {
			if m, ok := v.(map[string]any); ok && istioOnly(m) {
				*removed = append(*removed, describe(k, m))
				delete(n, k)
				continue
			}
			out, err := rewrite(v, routes, removed)
			if err != nil {
				return nil, err
			}
			n[k] = out
		}
		return n, nil
	case []any:
		kept := n[:0]
		for _, v := range n {
			if m, ok := v.(map[string]any); ok && istioOnly(m) {
				*removed = append(*removed, describe("", m))
				continue
			}
			out, err := rewrite(v, routes, removed)
			if err != nil {
				return nil, err
			}
			kept = append(kept, out)
		}
		return kept, nil
	default:
		return node, nil
	}
}

// istioOnly reports whether an extension entry ({name, typedConfig}) or a
// bare typed config is of a type only Istio's proxy has.
func istioOnly(m map[string]any) bool {
	t, _ := m["@type"].(string)
	if tc, ok := m["typedConfig"].(map[string]any); ok {
		t, _ = tc["@type"].(string)
	}
	for _, prefix := range istioOnlyTypes {
		if strings.HasPrefix(t, prefix) {
			return true
		}
	}
	return false
}

// describe names a removed entry for the report.
func describe(field string, m map[string]any) string {
	name, _ := m["name"].(string)
	t, _ := m["@type"].(string)
	if tc, ok := m["typedConfig"].(map[string]any); ok {
		t, _ = tc["@type"].(string)
	}
	return strings.TrimSpace(strings.Join([]string{field, name, "(" + t + ")"}, " "))
}
