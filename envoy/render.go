package envoy

import (
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"text/template"
	"time"

	"github.com/duet-router/duet/extproc"
)

// Cluster names used in the rendered bootstrap.
const (
	ClusterDecode  = "duet_decode"
	ClusterPrefill = "duet_prefill"
	ClusterDuet    = "duet_extproc"
)

// Address is a host (IP or DNS name) and port.
type Address struct {
	Host string
	Port int
}

// ParseAddress parses "host:port".
func ParseAddress(hostport string) (Address, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return Address{}, fmt.Errorf("parse address %q: %w", hostport, err)
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 0 || n > 65535 {
		return Address{}, fmt.Errorf("parse address %q: bad port", hostport)
	}
	if host == "" {
		host = "0.0.0.0"
	}
	return Address{Host: host, Port: n}, nil
}

// IsIP reports whether the host is a literal IP address.
func (a Address) IsIP() bool {
	_, err := netip.ParseAddr(a.Host)
	return err == nil
}

// Params are the inputs of the bootstrap.
type Params struct {
	// Listen is where Envoy accepts client traffic.
	Listen Address
	// Admin is Envoy's admin interface.
	Admin Address
	// Duet is duet's gRPC (ext_proc) address as Envoy dials it.
	Duet Address
	// MaxBodyBytes is the request buffer limit: larger bodies get 413.
	MaxBodyBytes int
	// MessageTimeout bounds each ext_proc exchange.
	MessageTimeout time.Duration
	// StreamIdleTimeout closes idle client and upstream streams.
	StreamIdleTimeout time.Duration
	// Prefill engines; empty renders an aggregated (mirror-free) bootstrap.
	Prefill []Address
	// Decode engines (or the aggregated pool).
	Decode []Address
}

//go:embed bootstrap.yaml.tmpl
var bootstrapTemplate string

var tmpl = template.Must(template.New("bootstrap").Funcs(template.FuncMap{
	"quote":    strconv.Quote,
	"duration": func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s" },
	"list":     func(a Address) []Address { return []Address{a} },
	"engine": func(name string, hosts []Address, header string, p Params) engineCluster {
		return engineCluster{Name: name, Hosts: hosts, Header: header, MaxBodyBytes: p.MaxBodyBytes, StreamIdleTimeout: p.StreamIdleTimeout}
	},
	"clusterType": func(addrs []Address) string {
		for _, a := range addrs {
			if !a.IsIP() {
				return "STRICT_DNS"
			}
		}
		return "STATIC"
	},
}).Parse(bootstrapTemplate))

// engineCluster is what the template needs to render one role's cluster.
type engineCluster struct {
	Name              string
	Hosts             []Address
	Header            string
	MaxBodyBytes      int
	StreamIdleTimeout time.Duration
}

// templateData is what the template sees.
type templateData struct {
	Params
	ClusterDecode, ClusterPrefill, ClusterDuet    string
	HeaderDecodeEndpoint, HeaderPrefillEndpoint   string
	HeaderMirror, HeaderPrefillRank, HeaderDPRank string
	HeaderPrefix, MetadataNamespace               string
}

// Render writes the Envoy bootstrap YAML for p to w.
func Render(w io.Writer, p Params) error {
	if len(p.Decode) == 0 {
		return errors.New("render envoy bootstrap: no decode endpoints")
	}
	if p.MaxBodyBytes <= 0 || p.MessageTimeout <= 0 || p.StreamIdleTimeout <= 0 {
		return errors.New("render envoy bootstrap: body limit and timeouts must be positive")
	}
	for _, a := range append(append([]Address{p.Listen, p.Admin, p.Duet}, p.Prefill...), p.Decode...) {
		if a.Host == "" || strings.ContainsAny(a.Host, " \"'\n{}[]#") {
			return fmt.Errorf("render envoy bootstrap: bad host %q", a.Host)
		}
	}
	data := templateData{
		Params:                p,
		ClusterDecode:         ClusterDecode,
		ClusterPrefill:        ClusterPrefill,
		ClusterDuet:           ClusterDuet,
		HeaderDecodeEndpoint:  extproc.HeaderDecodeEndpoint,
		HeaderPrefillEndpoint: extproc.HeaderPrefillEndpoint,
		HeaderMirror:          extproc.HeaderMirror,
		HeaderPrefillRank:     extproc.HeaderPrefillRank,
		HeaderDPRank:          extproc.HeaderDPRank,
		HeaderPrefix:          extproc.HeaderPrefix,
		MetadataNamespace:     extproc.MetadataNamespace,
	}
	if err := tmpl.Execute(w, data); err != nil {
		return fmt.Errorf("render envoy bootstrap: %w", err)
	}
	return nil
}
