package harness

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// NATS is a running nats-server, the real binary (see FindNATSServer), for
// tests of duet replicas that share state.
type NATS struct {
	*Process
	// URL is the client URL, nats://127.0.0.1:<port>.
	URL string
	// MonitorURL is the server's HTTP monitoring endpoint.
	MonitorURL string
}

// FindNATSServer locates the nats-server binary: DUET_NATS_SERVER_BIN
// (set by the Makefile), else the one `make nats-server` builds into
// .tools/. A missing binary is an error telling how to get it.
func FindNATSServer() (string, error) {
	if p := os.Getenv("DUET_NATS_SERVER_BIN"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("nats-server %s: %w: run `make nats-server`", p, err)
		}
		return p, nil
	}
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	found, _ := filepath.Glob(filepath.Join(root, ".tools", "nats-server-*", "nats-server"))
	if len(found) == 0 {
		return "", fmt.Errorf("no nats-server in %s/.tools: run `make nats-server`", root)
	}
	return found[len(found)-1], nil
}

// StartNATS runs nats-server on free loopback ports, logging into dir, and
// waits until it is ready. Process.Restart starts it again on the same
// ports (an outage and a return).
func StartNATS(ctx context.Context, dir string) (*NATS, error) {
	bin, err := FindNATSServer()
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	p, err := startProcess(dir, "nats", bin, "-a", "127.0.0.1", "-p", strconv.Itoa(ports[0]), "-m", strconv.Itoa(ports[1]))
	if err != nil {
		return nil, err
	}
	n := &NATS{Process: p, URL: "nats://" + hostPort(ports[0]), MonitorURL: "http://" + hostPort(ports[1])}
	if err := n.WaitReady(ctx); err != nil {
		p.Stop(0)
		return nil, err
	}
	return n, nil
}

// WaitReady waits until the server answers its health check.
func (n *NATS) WaitReady(ctx context.Context) error {
	return waitHTTP(ctx, n.Process, n.MonitorURL+"/healthz")
}
