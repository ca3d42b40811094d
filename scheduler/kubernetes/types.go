package kubernetes

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// The types below are the part of discovery.k8s.io/v1 EndpointSlices that
// discovery reads, decoded from the API's JSON. duet does not use
// k8s.io/api's types: they bring every core type along, megabytes of
// binary for a few fields.

// LabelServiceName is the label that names an EndpointSlice's Service.
const LabelServiceName = "kubernetes.io/service-name"

// EndpointSlice address types.
const (
	AddressTypeIPv4 = "IPv4"
	AddressTypeIPv6 = "IPv6"
	AddressTypeFQDN = "FQDN"
)

// protocolTCP is the port protocol duet's engines speak (the default).
const protocolTCP = "TCP"

// sliceGroupVersion is the API group and version of EndpointSlices.
var sliceGroupVersion = schema.GroupVersion{Group: "discovery.k8s.io", Version: "v1"}

// EndpointSlice is a discovery.k8s.io/v1 EndpointSlice.
type EndpointSlice struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// AddressType is AddressTypeIPv4, AddressTypeIPv6 or AddressTypeFQDN.
	AddressType string `json:"addressType"`
	// Endpoints are the slice's endpoints.
	Endpoints []Endpoint `json:"endpoints"`
	// Ports are the ports every endpoint of the slice serves.
	Ports []EndpointPort `json:"ports"`
}

// Endpoint is one endpoint of a slice.
type Endpoint struct {
	// Addresses are the endpoint's addresses; only the first is used.
	Addresses []string `json:"addresses"`
	// Conditions say whether the endpoint may get traffic.
	Conditions EndpointConditions `json:"conditions,omitempty"`
	// TargetRef is the pod behind the endpoint, if any.
	TargetRef *ObjectReference `json:"targetRef,omitempty"`
}

// EndpointConditions are an endpoint's conditions; nil means unknown.
type EndpointConditions struct {
	Ready       *bool `json:"ready,omitempty"`
	Serving     *bool `json:"serving,omitempty"`
	Terminating *bool `json:"terminating,omitempty"`
}

// ObjectReference names the object behind an endpoint.
type ObjectReference struct {
	Kind      string `json:"kind,omitempty"`
	Namespace string `json:"namespace,omitempty"`
	Name      string `json:"name,omitempty"`
}

// EndpointPort is one port of a slice.
type EndpointPort struct {
	// Name is the Service port's name; nil or empty when unnamed.
	Name *string `json:"name,omitempty"`
	// Protocol is TCP, UDP or SCTP; nil means TCP.
	Protocol *string `json:"protocol,omitempty"`
	// Port is the port number; nil means all ports.
	Port *int32 `json:"port,omitempty"`
}

// EndpointSliceList is a list of EndpointSlices.
type EndpointSliceList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []EndpointSlice `json:"items"`
}

// DeepCopyObject implements runtime.Object.
func (s *EndpointSlice) DeepCopyObject() runtime.Object {
	if s == nil {
		return nil
	}
	return s.DeepCopy()
}

// DeepCopy returns a copy of s that shares no memory with it.
func (s *EndpointSlice) DeepCopy() *EndpointSlice {
	out := &EndpointSlice{TypeMeta: s.TypeMeta, AddressType: s.AddressType}
	s.ObjectMeta.DeepCopyInto(&out.ObjectMeta)
	if s.Endpoints != nil {
		out.Endpoints = make([]Endpoint, len(s.Endpoints))
		for i, e := range s.Endpoints {
			out.Endpoints[i] = Endpoint{
				Addresses: append([]string(nil), e.Addresses...),
				Conditions: EndpointConditions{
					Ready: copyPtr(e.Conditions.Ready), Serving: copyPtr(e.Conditions.Serving),
					Terminating: copyPtr(e.Conditions.Terminating),
				},
				TargetRef: copyPtr(e.TargetRef),
			}
		}
	}
	if s.Ports != nil {
		out.Ports = make([]EndpointPort, len(s.Ports))
		for i, p := range s.Ports {
			out.Ports[i] = EndpointPort{Name: copyPtr(p.Name), Protocol: copyPtr(p.Protocol), Port: copyPtr(p.Port)}
		}
	}
	return out
}

// DeepCopyObject implements runtime.Object.
func (l *EndpointSliceList) DeepCopyObject() runtime.Object {
	if l == nil {
		return nil
	}
	out := &EndpointSliceList{TypeMeta: l.TypeMeta}
	l.ListMeta.DeepCopyInto(&out.ListMeta)
	if l.Items != nil {
		out.Items = make([]EndpointSlice, len(l.Items))
		for i := range l.Items {
			out.Items[i] = *l.Items[i].DeepCopy()
		}
	}
	return out
}

// copyPtr returns a pointer to a copy of *p, or nil.
func copyPtr[T any](p *T) *T {
	if p == nil {
		return nil
	}
	v := *p
	return &v
}

// addToScheme registers the slice types, and the meta types (list
// options, watch events, Status) their calls use.
func addToScheme(scheme *runtime.Scheme) {
	scheme.AddKnownTypes(sliceGroupVersion, &EndpointSlice{}, &EndpointSliceList{})
	metav1.AddToGroupVersion(scheme, sliceGroupVersion)
	metav1.AddToGroupVersion(scheme, schema.GroupVersion{Version: "v1"})
}
