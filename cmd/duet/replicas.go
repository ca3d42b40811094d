package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/duet-router/duet/cmd/duet/internal/config"
	"github.com/duet-router/duet/cmd/duet/internal/replicas"
	"github.com/duet-router/duet/cmd/duet/internal/status"
	"github.com/duet-router/duet/extproc"
	"github.com/duet-router/duet/extproc/accesslog"
	"github.com/duet-router/duet/extproc/routed"
	"github.com/duet-router/duet/scheduler"
)

// startReplicas connects this replica to its peers as the sync section
// says, applying their events through a.
func startReplicas(s *config.Sync, a replicaApplier, log *zap.Logger, reg prometheus.Registerer) (*replicas.Replicas, error) {
	opts, err := natsOptions(s.NATS)
	if err != nil {
		return nil, err
	}
	name := s.ReplicaName(os.Getenv)
	r, err := replicas.Start(replicas.Options{URL: s.NATS.URL, Subject: s.Subject, Name: name, NATS: opts,
		Heartbeat: s.Heartbeat, Apply: a, Logger: log, Registerer: reg})
	if err != nil {
		return nil, fmt.Errorf("sync: %w", err)
	}
	log.Info("sharing state with the other replicas", zap.String("replica", name), zap.String("subject", s.Subject),
		zap.Bool("connected", r.Connected()))
	return r, nil
}

// natsOptions turns the sync.nats section into connection options.
func natsOptions(n config.SyncNATS) ([]nats.Option, error) {
	var opts []nats.Option
	if n.TokenFile != "" {
		b, err := os.ReadFile(n.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("sync.nats.token_file: %w", err)
		}
		opts = append(opts, nats.Token(strings.TrimSpace(string(b))))
	}
	if n.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(n.CredsFile))
	}
	if n.CAFile != "" || n.CertFile != "" {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if n.CAFile != "" {
			pem, err := os.ReadFile(n.CAFile)
			if err != nil {
				return nil, fmt.Errorf("sync.nats.ca_file: %w", err)
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("sync.nats.ca_file: %s holds no PEM certificate", n.CAFile)
			}
		}
		if n.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(n.CertFile, n.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("sync.nats.cert_file: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		opts = append(opts, nats.Secure(cfg))
	}
	return opts, nil
}

// replicaApplier applies the peers' events to this replica: picks to the
// scheduler, routes to the route record, and feedback, once the record
// believes it, to the scheduler and the legs tracker.
type replicaApplier struct {
	pools poolSet
	book  *routed.Book
	apply accesslog.Sink
}

// ApplyPicked implements replicas.Applier: the pick goes to its pool's
// scheduler.
func (a replicaApplier) ApplyPicked(p scheduler.Picked) { a.pools.ApplyPicked(p) }

// Record implements replicas.Applier: it records the route and applies the
// entries about the request that came before it.
func (a replicaApplier) Record(id string, r routed.Route) {
	for _, c := range a.book.Adopt(id, r) {
		a.apply.Complete(context.Background(), c)
	}
}

// Admit implements replicas.Applier.
func (a replicaApplier) Admit(c *accesslog.Completion) (bool, string) { return a.book.Admit(c) }

// Complete implements replicas.Applier.
func (a replicaApplier) Complete(ctx context.Context, c accesslog.Completion) {
	a.apply.Complete(ctx, c)
}

// recorders tells every recorder of a routed request.
type recorders []extproc.RouteRecorder

// Record implements extproc.RouteRecorder.
func (rs recorders) Record(id string, r routed.Route) {
	for _, x := range rs {
		x.Record(id, r)
	}
}

// syncStatus is what the status page shows of r.
func syncStatus(r *replicas.Replicas) *status.Sync {
	out := &status.Sync{Replica: r.Name(), Connected: r.Connected()}
	for _, p := range r.Peers() {
		out.Peers = append(out.Peers, status.SyncPeer{Name: p.Name, Alive: p.Alive, LastSeen: p.LastSeen, LagMs: float64(p.Lag) / float64(time.Millisecond)})
	}
	return out
}
