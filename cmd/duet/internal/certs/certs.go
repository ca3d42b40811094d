// Package certs makes the credentials of a duet deployment without a PKI of
// its own (`duet certs`): a private CA, duet's server certificate, Envoy's
// client certificate, the bearer token Envoy sends and the admin token.
// Where an organisation has a PKI (cert-manager, a mesh), its certificates
// serve instead; nothing in duet depends on this package's choices.
package certs

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// File names written into the output directory.
const (
	CAFile         = "ca.crt"
	DuetCertFile   = "duet.crt"
	DuetKeyFile    = "duet.key"
	EnvoyCertFile  = "envoy.crt"
	EnvoyKeyFile   = "envoy.key"
	TokenFile      = "token"
	AdminTokenFile = "admin-token"
)

// Files lists every file Write creates.
var Files = []string{CAFile, DuetCertFile, DuetKeyFile, EnvoyCertFile, EnvoyKeyFile, TokenFile, AdminTokenFile}

// Options say what Write makes.
type Options struct {
	// Dir receives the files; it is created if missing.
	Dir string
	// Hosts are duet's names and addresses: the DNS and IP SANs of its
	// server certificate. Envoy verifies the one it is configured with
	// (envoy.duet_tls.server_name).
	Hosts []string
	// ClientName is the common name and DNS SAN of Envoy's client
	// certificate (auth.tls.client_names may admit only it).
	ClientName string
	// Validity is how long the certificates are valid.
	Validity time.Duration
	// Force overwrites existing files; without it Write refuses to.
	Force bool
	// Now is the start of validity; zero means time.Now.
	Now time.Time
}

// Write makes a new CA, signs duet's server and Envoy's client certificates
// with it, draws both tokens, and writes them into opts.Dir. Private keys
// and tokens are readable by their owner only. The CA's private key is not
// kept: new certificates mean running Write again, and a leaked directory
// cannot mint more.
func Write(opts Options) error {
	if len(opts.Hosts) == 0 || opts.ClientName == "" || opts.Validity <= 0 {
		return errors.New("certs: hosts, a client name and a validity are required")
	}
	if !opts.Force {
		for _, name := range Files {
			if _, err := os.Stat(filepath.Join(opts.Dir, name)); err == nil {
				return fmt.Errorf("certs: %s exists (use -force to replace every file)", filepath.Join(opts.Dir, name))
			}
		}
	}
	if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
		return fmt.Errorf("certs: %w", err)
	}
	now := opts.Now
	if now.IsZero() {
		now = time.Now()
	}
	// Backdated a little: clocks across hosts differ.
	notBefore, notAfter := now.Add(-time.Hour), now.Add(opts.Validity)

	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return fmt.Errorf("certs: CA key: %w", err)
	}
	caTmpl := &x509.Certificate{
		Subject:               pkix.Name{CommonName: "duet CA"},
		NotBefore:             notBefore,
		NotAfter:              notAfter,
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
	}
	caDER, ca, err := sign(caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return err
	}
	server := &x509.Certificate{
		Subject:     pkix.Name{CommonName: opts.Hosts[0]},
		NotBefore:   notBefore,
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, h := range opts.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			server.IPAddresses = append(server.IPAddresses, ip)
		} else {
			server.DNSNames = append(server.DNSNames, h)
		}
	}
	client := &x509.Certificate{
		Subject:     pkix.Name{CommonName: opts.ClientName},
		DNSNames:    []string{opts.ClientName},
		NotBefore:   notBefore,
		NotAfter:    notAfter,
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	files := map[string][]byte{CAFile: pemBlock("CERTIFICATE", caDER)}
	for _, leaf := range []struct {
		tmpl      *x509.Certificate
		cert, key string
	}{{server, DuetCertFile, DuetKeyFile}, {client, EnvoyCertFile, EnvoyKeyFile}} {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return fmt.Errorf("certs: key: %w", err)
		}
		der, _, err := sign(leaf.tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return err
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return fmt.Errorf("certs: key: %w", err)
		}
		files[leaf.cert] = pemBlock("CERTIFICATE", der)
		files[leaf.key] = pemBlock("PRIVATE KEY", keyDER)
	}
	for _, name := range []string{TokenFile, AdminTokenFile} {
		var b [32]byte
		if _, err := rand.Read(b[:]); err != nil {
			return fmt.Errorf("certs: token: %w", err)
		}
		files[name] = []byte(hex.EncodeToString(b[:]) + "\n")
	}
	for _, name := range Files {
		mode := os.FileMode(0o644)
		if name == DuetKeyFile || name == EnvoyKeyFile || name == TokenFile || name == AdminTokenFile {
			mode = 0o600
		}
		path := filepath.Join(opts.Dir, name)
		if err := os.WriteFile(path, files[name], mode); err != nil {
			return fmt.Errorf("certs: %w", err)
		}
		if err := os.Chmod(path, mode); err != nil { // WriteFile keeps an existing file's mode
			return fmt.Errorf("certs: %w", err)
		}
	}
	return nil
}

// sign signs tmpl with parent's key and returns the certificate, DER and
// parsed.
func sign(tmpl, parent *x509.Certificate, pub *ecdsa.PublicKey, parentKey *ecdsa.PrivateKey) ([]byte, *x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, nil, fmt.Errorf("certs: serial: %w", err)
	}
	tmpl.SerialNumber = serial
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, pub, parentKey)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: sign %s: %w", tmpl.Subject.CommonName, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, nil, fmt.Errorf("certs: parse %s: %w", tmpl.Subject.CommonName, err)
	}
	return der, cert, nil
}

func pemBlock(kind string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
}
