package config

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// Sync makes duet one of several replicas that share their view of the
// cluster over NATS (docs/replicas.md). Without it duet runs alone.
type Sync struct {
	// NATS is the server the replicas share through.
	NATS SyncNATS `yaml:"nats"`
	// Subject is the NATS subject the replicas of one gateway share;
	// replicas on other subjects share nothing with them.
	Subject string `yaml:"subject"`
	// Name identifies this replica among its peers; empty means the
	// POD_NAME environment variable, else the host name and process id
	// (ReplicaName).
	Name string `yaml:"name"`
	// Heartbeat is the interval at which the replica tells its peers it
	// is alive.
	Heartbeat time.Duration `yaml:"heartbeat"`
}

// SyncNATS is the NATS connection.
type SyncNATS struct {
	// URL is the server's URL, nats://host:4222 (comma-separated for a
	// cluster; tls:// for TLS).
	URL string `yaml:"url"`
	// TokenFile holds the token the server requires, if any.
	TokenFile string `yaml:"token_file"`
	// CredsFile is a NATS credentials file (a user JWT and nkey seed), if
	// the server uses decentralized authentication.
	CredsFile string `yaml:"creds_file"`
	// CAFile, when set, verifies the server's TLS certificate against
	// these CAs (PEM).
	CAFile string `yaml:"ca_file"`
	// CertFile and KeyFile, when set, are this replica's client
	// certificate for a server that requires one.
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Defaults of the sync section.
const (
	DefaultSyncSubject   = "duet"
	DefaultSyncHeartbeat = time.Second
)

// applyDefaults fills the sync section's defaults.
func (s *Sync) applyDefaults() {
	setDefault(&s.Subject, DefaultSyncSubject)
	if s.Heartbeat == 0 {
		s.Heartbeat = DefaultSyncHeartbeat
	}
}

// ReplicaName is the name this replica goes by among its peers: Name, else
// getenv("POD_NAME"), else the host name and process id.
func (s *Sync) ReplicaName(getenv func(string) string) string {
	if s.Name != "" {
		return s.Name
	}
	if pod := getenv("POD_NAME"); pod != "" {
		return pod
	}
	host, _ := os.Hostname()
	return host + "-" + strconv.Itoa(os.Getpid())
}

// validate checks the sync section, naming each field.
func (s *Sync) validate() []error {
	var errs []error
	if s.NATS.URL == "" {
		errs = append(errs, errors.New("sync.nats.url: is required with sync"))
	}
	for _, u := range strings.Split(s.NATS.URL, ",") {
		if u == "" {
			continue
		}
		p, err := url.Parse(strings.TrimSpace(u))
		if err != nil || (p.Scheme != "nats" && p.Scheme != "tls") || p.Host == "" {
			errs = append(errs, fmt.Errorf("sync.nats.url: %q is not nats://host:port or tls://host:port", u))
		}
	}
	if (s.NATS.CertFile == "") != (s.NATS.KeyFile == "") {
		errs = append(errs, errors.New("sync.nats.cert_file and sync.nats.key_file: set both or neither"))
	}
	if s.Subject == "" || strings.ContainsAny(s.Subject, " \t*>") {
		errs = append(errs, fmt.Errorf("sync.subject: %q must be a NATS subject without spaces or wildcards", s.Subject))
	}
	if s.Heartbeat < 0 {
		errs = append(errs, fmt.Errorf("sync.heartbeat: %v must not be negative", s.Heartbeat))
	}
	return errs
}
