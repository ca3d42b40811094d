package certs

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestWrite: the certificates chain to the CA, carry the names and usages
// TLS checks, keys and tokens are private, and nothing is overwritten
// without Force.
func TestWrite(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "creds")
	opts := Options{Dir: dir, Hosts: []string{"duet", "duet.inference.svc", "10.0.0.7"}, ClientName: "envoy", Validity: 24 * time.Hour}
	if err := Write(opts); err != nil {
		t.Fatal(err)
	}
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(read(CAFile)) {
		t.Fatal("ca.crt holds no certificate")
	}
	for _, c := range []struct {
		cert, key string
		usage     x509.ExtKeyUsage
		name      string
	}{
		{DuetCertFile, DuetKeyFile, x509.ExtKeyUsageServerAuth, "duet.inference.svc"},
		{EnvoyCertFile, EnvoyKeyFile, x509.ExtKeyUsageClientAuth, "envoy"},
	} {
		pair, err := tls.X509KeyPair(read(c.cert), read(c.key))
		if err != nil {
			t.Fatalf("%s: %v", c.cert, err)
		}
		leaf, err := x509.ParseCertificate(pair.Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, DNSName: c.name, KeyUsages: []x509.ExtKeyUsage{c.usage}}); err != nil {
			t.Errorf("%s does not verify for %s: %v", c.cert, c.name, err)
		}
	}
	if leaf := parse(t, read(DuetCertFile)); len(leaf.IPAddresses) != 1 || leaf.IPAddresses[0].String() != "10.0.0.7" {
		t.Errorf("duet.crt IP SANs %v, want 10.0.0.7", leaf.IPAddresses)
	}
	for _, name := range []string{DuetKeyFile, EnvoyKeyFile, TokenFile, AdminTokenFile} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v (%v), want 0600", name, fi.Mode(), err)
		}
	}
	if tok := read(TokenFile); len(tok) != 65 || string(tok) == string(read(AdminTokenFile)) {
		t.Errorf("token %q: want 64 hex characters and a newline, unlike the admin token", tok)
	}
	if err := Write(opts); err == nil {
		t.Error("Write replaced existing files without Force")
	}
	opts.Force = true
	if err := Write(opts); err != nil {
		t.Errorf("Force: %v", err)
	}
}

func parse(t *testing.T, pemBytes []byte) *x509.Certificate {
	t.Helper()
	block, _ := pem.Decode(pemBytes)
	if block == nil {
		t.Fatal("no PEM block")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}
