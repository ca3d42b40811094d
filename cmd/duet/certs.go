package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"time"

	"github.com/duet-router/duet/cmd/duet/internal/certs"
	"github.com/duet-router/duet/cmd/duet/internal/config"
)

// runCerts is `duet certs`: it writes a new CA, duet's server certificate,
// Envoy's client certificate and both tokens into -out, and prints the
// configuration that uses them.
func runCerts(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("duet certs", flag.ContinueOnError)
	fs.SetOutput(stderr)
	out := fs.String("out", "", "directory to write the files into (required)")
	hosts := fs.String("hosts", config.DefaultDuetServerName+",localhost,127.0.0.1",
		"comma-separated DNS names and IP addresses of duet: its server certificate's SANs; Envoy verifies envoy.duet_tls.server_name among them")
	client := fs.String("client-name", "envoy", "common name and DNS SAN of Envoy's client certificate")
	validity := fs.Duration("validity", 825*24*time.Hour, "how long the certificates are valid")
	force := fs.Bool("force", false, "replace existing files")
	setUsage(fs, "duet certs -out DIR [-hosts NAMES] [-client-name NAME] [-validity DURATION] [-force]",
		"Certs makes the credentials of auth: a CA, duet's server certificate, Envoy's client certificate, the\n"+
			"gRPC token and the admin token, writes them into -out and prints the configuration that uses them.")
	if help, err := parseFlags(fs, args); help || err != nil {
		return err
	}
	if *out == "" {
		return errors.New("certs: -out is required")
	}
	var names []string
	for _, h := range strings.Split(*hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			names = append(names, h)
		}
	}
	if err := certs.Write(certs.Options{Dir: *out, Hosts: names, ClientName: *client, Validity: *validity, Force: *force}); err != nil {
		return err
	}
	dir, err := filepath.Abs(*out)
	if err != nil {
		return err
	}
	p := func(name string) string { return filepath.Join(dir, name) }
	fmt.Fprintf(stdout, `# Wrote %s. duet's configuration for mutual TLS plus a token
# (paths as seen here; mount them where duet and Envoy run):
auth:
  tls:
    cert_file: %s
    key_file: %s
    client_ca_file: %s
    client_names: [%s]
  token_file: %s
  admin_token_file: %s
envoy:
  duet_tls:
    cert_file: %s
    key_file: %s
    ca_file: %s
    server_name: %s
`, strings.Join(certs.Files, ", "), p(certs.DuetCertFile), p(certs.DuetKeyFile), p(certs.CAFile), *client,
		p(certs.TokenFile), p(certs.AdminTokenFile), p(certs.EnvoyCertFile), p(certs.EnvoyKeyFile), p(certs.CAFile), names[0])
	return nil
}
