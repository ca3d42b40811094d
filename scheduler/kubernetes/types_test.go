package kubernetes

import (
	"reflect"
	"testing"

	discoveryv1 "k8s.io/api/discovery/v1"
)

// A deep copy shares no memory with the original: changing every pointer
// and slice of the original leaves the copy as it was.
func TestEndpointSliceDeepCopy(t *testing.T) {
	fresh := func() *EndpointSlice {
		s := convert(slice("d-1", "decode", discoveryv1.AddressTypeIPv4,
			[]discoveryv1.EndpointPort{port("http", 30000)},
			endpoint("10.0.0.1", "pod-a", cond{ready: yes, terminating: no})))
		s.Endpoints[0].Conditions.Serving = new(true)
		s.Ports[0].Protocol = new("TCP")
		return s
	}
	tests := []struct {
		name string
		// copy returns the original and its copy.
		copy func() (orig, cp *EndpointSlice)
	}{
		{"slice", func() (*EndpointSlice, *EndpointSlice) {
			s := fresh()
			return s, s.DeepCopyObject().(*EndpointSlice)
		}},
		{"list", func() (*EndpointSlice, *EndpointSlice) {
			l := &EndpointSliceList{Items: []EndpointSlice{*fresh()}}
			l.ResourceVersion = "7"
			c := l.DeepCopyObject().(*EndpointSliceList)
			if c.ResourceVersion != "7" {
				t.Errorf("list resource version %q", c.ResourceVersion)
			}
			return &l.Items[0], &c.Items[0]
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, c := tt.copy()
			want := fresh()
			if !reflect.DeepEqual(c, want) {
				t.Fatalf("copy %+v, want %+v", c, want)
			}
			src.Labels[LabelServiceName] = "changed"
			src.Endpoints[0].Addresses[0] = "10.9.9.9"
			*src.Endpoints[0].Conditions.Ready = false
			*src.Endpoints[0].Conditions.Serving = false
			*src.Endpoints[0].Conditions.Terminating = true
			src.Endpoints[0].TargetRef.Name = "changed"
			*src.Ports[0].Name = "changed"
			*src.Ports[0].Port = 1
			*src.Ports[0].Protocol = "UDP"
			if !reflect.DeepEqual(c, want) {
				t.Errorf("changing the original changed the copy: %+v", c)
			}
		})
	}
	var nilSlice *EndpointSlice
	var nilList *EndpointSliceList
	if nilSlice.DeepCopyObject() != nil || nilList.DeepCopyObject() != nil {
		t.Error("a nil object's copy is not nil")
	}
}
