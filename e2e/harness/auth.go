package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Auth is how a stack's Envoy authenticates to duet's gRPC port.
type Auth int

// Auth modes. The zero value, AuthMTLS, is the default: stacks run
// authenticated, as deployments should.
const (
	// AuthMTLS: mutual TLS (auth.tls and envoy.duet_tls).
	AuthMTLS Auth = iota
	// AuthToken: a bearer token on every stream (auth.token_file).
	AuthToken
	// AuthBoth: mutual TLS and the token.
	AuthBoth
	// AuthNone: duet authenticates nobody (its gRPC port is on loopback).
	AuthNone
)

// String names the mode.
func (a Auth) String() string {
	switch a {
	case AuthMTLS:
		return "mtls"
	case AuthToken:
		return "token"
	case AuthBoth:
		return "mtls+token"
	case AuthNone:
		return "none"
	}
	return fmt.Sprintf("Auth(%d)", int(a))
}

// TLS reports whether the mode uses mutual TLS.
func (a Auth) TLS() bool { return a == AuthMTLS || a == AuthBoth }

// UsesToken reports whether the mode uses the bearer token.
func (a Auth) UsesToken() bool { return a == AuthToken || a == AuthBoth }

// Credentials are the files `duet certs` writes (the names of package
// cmd/duet/internal/certs) and, once read, the tokens.
type Credentials struct {
	// Dir holds the files.
	Dir string
	// CAFile signs every certificate; DuetCertFile and DuetKeyFile are
	// duet's server certificate, EnvoyCertFile and EnvoyKeyFile Envoy's
	// client certificate.
	CAFile, DuetCertFile, DuetKeyFile, EnvoyCertFile, EnvoyKeyFile string
	// TokenFile and AdminTokenFile hold the gRPC and admin tokens.
	TokenFile, AdminTokenFile string
	// Token and AdminToken are the files' tokens; empty until read
	// (MakeCredentials reads them).
	Token, AdminToken string
	// ServerName is a DNS SAN of duet's certificate that Envoy verifies.
	ServerName string
	// ClientName is the name of Envoy's client certificate.
	ClientName string
}

// CredentialsIn returns the paths of the credentials `duet certs -out dir`
// writes, without reading them: for a configuration rendered for another
// filesystem (the compose stack's containers).
func CredentialsIn(dir string) Credentials {
	p := func(name string) string { return filepath.Join(dir, name) }
	return Credentials{
		Dir: dir, CAFile: p("ca.crt"), DuetCertFile: p("duet.crt"), DuetKeyFile: p("duet.key"),
		EnvoyCertFile: p("envoy.crt"), EnvoyKeyFile: p("envoy.key"),
		TokenFile: p("token"), AdminTokenFile: p("admin-token"),
		ServerName: "duet", ClientName: "envoy",
	}
}

// MakeCredentials runs `duet certs` (the binary duet) into dir and returns
// the credentials with their tokens read.
func MakeCredentials(ctx context.Context, duet, dir string) (Credentials, error) {
	if out, err := exec.CommandContext(ctx, duet, "certs", "-out", dir, "-force").CombinedOutput(); err != nil {
		return Credentials{}, fmt.Errorf("duet certs: %w: %s", err, out)
	}
	c := CredentialsIn(dir)
	for _, t := range []struct {
		path string
		dst  *string
	}{{c.TokenFile, &c.Token}, {c.AdminTokenFile, &c.AdminToken}} {
		b, err := os.ReadFile(t.path)
		if err != nil {
			return Credentials{}, err
		}
		*t.dst = strings.TrimSpace(string(b))
	}
	return c, nil
}

// authYAML is duet's auth section for mode with credentials c, and the
// lines to add to its envoy section.
func authYAML(mode Auth, c Credentials) (authSection, envoyLines string) {
	if mode == AuthNone {
		return "", ""
	}
	var b strings.Builder
	b.WriteString("auth:\n")
	if mode.TLS() {
		fmt.Fprintf(&b, "  tls:\n    cert_file: %s\n    key_file: %s\n    client_ca_file: %s\n    client_names: [%s]\n",
			c.DuetCertFile, c.DuetKeyFile, c.CAFile, c.ClientName)
		envoyLines = fmt.Sprintf("  duet_tls:\n    cert_file: %s\n    key_file: %s\n    ca_file: %s\n    server_name: %s\n",
			c.EnvoyCertFile, c.EnvoyKeyFile, c.CAFile, c.ServerName)
	}
	if mode.UsesToken() {
		fmt.Fprintf(&b, "  token_file: %s\n", c.TokenFile)
	}
	fmt.Fprintf(&b, "  admin_token_file: %s\n", c.AdminTokenFile)
	return b.String(), envoyLines
}
