package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// HostHealth is what Envoy's admin /clusters says of one host of a cluster.
type HostHealth struct {
	// Address is the host's ip:port.
	Address string
	// FailedActiveHealthCheck: the host failed its active health checks.
	FailedActiveHealthCheck bool
	// FailedOutlierCheck: outlier detection ejected the host.
	FailedOutlierCheck bool
	// Requests is how many requests (streams) Envoy sent the host, and
	// Active how many are open.
	Requests, Active int64
}

// Healthy reports whether Envoy's load balancer may pick the host.
func (h HostHealth) Healthy() bool { return !h.FailedActiveHealthCheck && !h.FailedOutlierCheck }

// clustersJSON is the part of Envoy's /clusters?format=json that
// EnvoyHosts reads.
type clustersJSON struct {
	ClusterStatuses []struct {
		Name         string `json:"name"`
		HostStatuses []struct {
			Address struct {
				SocketAddress struct {
					Address   string `json:"address"`
					PortValue int    `json:"port_value"`
				} `json:"socket_address"`
			} `json:"address"`
			Stats []struct {
				Name  string `json:"name"`
				Value string `json:"value"`
			} `json:"stats"`
			HealthStatus struct {
				FailedActiveHealthCheck bool `json:"failed_active_health_check"`
				FailedOutlierCheck      bool `json:"failed_outlier_check"`
			} `json:"health_status"`
		} `json:"host_statuses"`
	} `json:"cluster_statuses"`
}

// EnvoyHosts reads the hosts of one cluster from the admin /clusters of
// the Envoy at adminURL, by address (ip:port).
func EnvoyHosts(ctx context.Context, adminURL, cluster string) (map[string]HostHealth, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, adminURL+"/clusters?format=json", nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("envoy clusters: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("envoy clusters: status %d", resp.StatusCode)
	}
	var doc clustersJSON
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return nil, fmt.Errorf("envoy clusters: %w", err)
	}
	for _, c := range doc.ClusterStatuses {
		if c.Name != cluster {
			continue
		}
		out := map[string]HostHealth{}
		for _, h := range c.HostStatuses {
			sa := h.Address.SocketAddress
			hh := HostHealth{
				Address:                 net.JoinHostPort(sa.Address, strconv.Itoa(sa.PortValue)),
				FailedActiveHealthCheck: h.HealthStatus.FailedActiveHealthCheck,
				FailedOutlierCheck:      h.HealthStatus.FailedOutlierCheck,
			}
			for _, st := range h.Stats {
				v, _ := strconv.ParseInt(strings.TrimSpace(st.Value), 10, 64)
				switch st.Name {
				case "rq_total":
					hh.Requests = v
				case "rq_active":
					hh.Active = v
				}
			}
			out[hh.Address] = hh
		}
		return out, nil
	}
	return nil, fmt.Errorf("envoy clusters: no cluster %q", cluster)
}

// EnvoyHostsHealthy reads, for each of clusters of the Envoy at adminURL,
// whether its load balancer may pick each host (by address).
func EnvoyHostsHealthy(ctx context.Context, adminURL string, clusters ...string) (map[string]map[string]bool, error) {
	out := map[string]map[string]bool{}
	for _, c := range clusters {
		hosts, err := EnvoyHosts(ctx, adminURL, c)
		if err != nil {
			return nil, err
		}
		out[c] = map[string]bool{}
		for addr, h := range hosts {
			out[c][addr] = h.Healthy()
		}
	}
	return out, nil
}
