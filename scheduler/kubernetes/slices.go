package kubernetes

import (
	"cmp"
	"fmt"
	"net/netip"
	"slices"
	"strconv"

	"github.com/duet-router/duet/scheduler"
)

// BootstrapPortName names the EndpointSlice port that gives a prefill
// engine's disaggregation bootstrap port.
const BootstrapPortName = "bootstrap"

// defaultPortName is the HTTP port's name when a Pool names none and a
// slice has several ports.
const defaultPortName = "http"

// Pool names the Service whose EndpointSlices list one role's engines.
type Pool struct {
	// Service is the Service's name: its slices carry the label
	// kubernetes.io/service-name=<Service>.
	Service string
	// Port is the slice port of the engines' HTTP port: a port name, or a
	// number. Empty means the slice's only port (a port named
	// BootstrapPortName aside), else the one named "http".
	Port string
	// DPSize is every engine's DP size when discovery cannot read it from
	// the engine (vLLM serves no /server_info); 0 means discover only.
	DPSize int
}

// engine is one endpoint found in a slice.
type engine struct {
	spec scheduler.EndpointSpec
	ipv4 bool
}

// specs returns the engines that the slices of pool list: one per ready,
// not terminating endpoint, addressed by its first address, and one per pod
// when a pod is listed twice (in two slices while an endpoint moves, or with
// both an IPv4 and an IPv6 address: IPv4 is kept). The result is sorted by
// URL. For the prefill role, a slice port named BootstrapPortName sets
// BootstrapPort. Slices it cannot use (no HTTP port, FQDN addresses) are
// skipped, each with an error in problems naming it.
func specs(role scheduler.Role, pool Pool, list []*EndpointSlice) (out []scheduler.EndpointSpec, problems []error) {
	byPod := make(map[string]engine)
	for _, s := range list {
		if !hasReady(s) {
			continue
		}
		if s.AddressType != AddressTypeIPv4 && s.AddressType != AddressTypeIPv6 {
			problems = append(problems, fmt.Errorf("EndpointSlice %s/%s: address type %q is not supported (IPv4 or IPv6 only)",
				s.Namespace, s.Name, s.AddressType))
			continue
		}
		port, err := httpPort(pool.Port, s.Ports)
		if err != nil {
			problems = append(problems, fmt.Errorf("EndpointSlice %s/%s: %w", s.Namespace, s.Name, err))
			continue
		}
		bootstrap := 0
		if role == scheduler.RolePrefill {
			bootstrap = namedPort(BootstrapPortName, s.Ports)
		}
		ipv4 := s.AddressType == AddressTypeIPv4
		for _, ep := range s.Endpoints {
			if len(ep.Addresses) == 0 || !ready(ep.Conditions) {
				continue
			}
			addr, err := netip.ParseAddr(ep.Addresses[0])
			if err != nil || addr.Zone() != "" || addr.Is4() != ipv4 {
				problems = append(problems, fmt.Errorf("EndpointSlice %s/%s: %q is not an %s address",
					s.Namespace, s.Name, ep.Addresses[0], s.AddressType))
				continue
			}
			e := engine{
				spec: scheduler.EndpointSpec{
					URL:           "http://" + netip.AddrPortFrom(addr, uint16(port)).String(),
					BootstrapPort: bootstrap,
					DPSize:        pool.DPSize,
				},
				ipv4: ipv4,
			}
			key := podKey(ep.TargetRef, e.spec.URL)
			if prev, ok := byPod[key]; !ok || better(e, prev) {
				byPod[key] = e
			}
		}
	}
	seen := make(map[string]bool, len(byPod))
	for _, e := range byPod {
		if !seen[e.spec.URL] {
			seen[e.spec.URL] = true
			out = append(out, e.spec)
		}
	}
	slices.SortFunc(out, func(a, b scheduler.EndpointSpec) int {
		return cmp.Or(cmp.Compare(a.URL, b.URL), cmp.Compare(a.BootstrapPort, b.BootstrapPort))
	})
	return out, problems
}

// better reports whether e should replace prev for the same pod: IPv4 wins,
// then the smaller URL (so that the choice does not depend on slice order).
func better(e, prev engine) bool {
	if e.ipv4 != prev.ipv4 {
		return e.ipv4
	}
	return e.spec.URL < prev.spec.URL
}

// podKey identifies the pod behind an endpoint, or, without a pod
// reference, the endpoint's URL.
func podKey(ref *ObjectReference, url string) string {
	if ref == nil || ref.Name == "" {
		return "url/" + url
	}
	return ref.Kind + "/" + ref.Namespace + "/" + ref.Name
}

// ready reports whether an endpoint may get traffic: ready (nil counts as
// ready, per the API) and not terminating.
func ready(c EndpointConditions) bool {
	return (c.Ready == nil || *c.Ready) && (c.Terminating == nil || !*c.Terminating)
}

// hasReady reports whether a slice lists a ready endpoint with an address.
// Slices without one are skipped before their ports are checked: a Service
// without endpoints has a slice without ports.
func hasReady(s *EndpointSlice) bool {
	for _, ep := range s.Endpoints {
		if len(ep.Addresses) > 0 && ready(ep.Conditions) {
			return true
		}
	}
	return false
}

// httpPort returns the number of the slice's HTTP port that want names (a
// name, a number, or empty; see Pool.Port). Only TCP ports with a number
// count.
func httpPort(want string, ports []EndpointPort) (int, error) {
	var usable []EndpointPort
	for _, p := range ports {
		if p.Port != nil && *p.Port > 0 && *p.Port <= 65535 && (p.Protocol == nil || *p.Protocol == protocolTCP) {
			usable = append(usable, p)
		}
	}
	if n, err := strconv.Atoi(want); err == nil {
		for _, p := range usable {
			if int(*p.Port) == n {
				return n, nil
			}
		}
		return 0, fmt.Errorf("no TCP port %d (ports: %s)", n, portList(ports))
	}
	if want != "" {
		if n := namedPort(want, usable); n > 0 {
			return n, nil
		}
		return 0, fmt.Errorf("no TCP port named %q (ports: %s)", want, portList(ports))
	}
	var candidates []EndpointPort
	for _, p := range usable {
		if p.Name == nil || *p.Name != BootstrapPortName {
			candidates = append(candidates, p)
		}
	}
	if len(candidates) == 1 {
		return int(*candidates[0].Port), nil
	}
	if n := namedPort(defaultPortName, usable); n > 0 {
		return n, nil
	}
	return 0, fmt.Errorf("%d candidate ports and none named %q: name the HTTP port in the configuration (ports: %s)",
		len(candidates), defaultPortName, portList(ports))
}

// namedPort returns the number of the TCP port called name, or 0.
func namedPort(name string, ports []EndpointPort) int {
	for _, p := range ports {
		if p.Name != nil && *p.Name == name && p.Port != nil && *p.Port > 0 && *p.Port <= 65535 &&
			(p.Protocol == nil || *p.Protocol == protocolTCP) {
			return int(*p.Port)
		}
	}
	return 0
}

// portList formats ports for an error message, e.g. "http=30000/TCP, 8998/TCP".
func portList(ports []EndpointPort) string {
	if len(ports) == 0 {
		return "none"
	}
	var b []byte
	for i, p := range ports {
		if i > 0 {
			b = append(b, ", "...)
		}
		if p.Name != nil && *p.Name != "" {
			b = append(b, *p.Name...)
			b = append(b, '=')
		}
		if p.Port != nil {
			b = strconv.AppendInt(b, int64(*p.Port), 10)
		} else {
			b = append(b, "any"...)
		}
		proto := protocolTCP
		if p.Protocol != nil {
			proto = *p.Protocol
		}
		b = append(b, '/')
		b = append(b, proto...)
	}
	return string(b)
}
