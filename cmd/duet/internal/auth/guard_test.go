package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/duet-router/duet/cmd/duet/internal/certs"
)

// writeCerts makes a CA, certificates and tokens in a new directory.
func writeCerts(t *testing.T, clientName string) string {
	t.Helper()
	dir := t.TempDir()
	if err := certs.Write(certs.Options{Dir: dir, Hosts: []string{"duet", "127.0.0.1"}, ClientName: clientName, Validity: time.Hour}); err != nil {
		t.Fatal(err)
	}
	return dir
}

// serve runs a gRPC server guarded by g with the ext_proc service (which
// answers Unimplemented to an admitted caller) and gRPC health.
func serve(t *testing.T, g *Guard) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(g.ServerOptions()...)
	extprocv3.RegisterExternalProcessorServer(gs, extprocv3.UnimplementedExternalProcessorServer{})
	healthpb.RegisterHealthServer(gs, health.NewServer())
	go func() { _ = gs.Serve(lis) }()
	t.Cleanup(gs.Stop)
	return lis.Addr().String()
}

// clientTLS is a client's TLS configuration trusting dir's CA, with the
// client certificate of certDir (none when certDir is "").
func clientTLS(t *testing.T, dir, certDir string) credentials.TransportCredentials {
	t.Helper()
	pem, err := os.ReadFile(filepath.Join(dir, certs.CAFile))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	cfg := &tls.Config{RootCAs: pool, ServerName: "duet"}
	if certDir != "" {
		cert, err := tls.LoadX509KeyPair(filepath.Join(certDir, certs.EnvoyCertFile), filepath.Join(certDir, certs.EnvoyKeyFile))
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return credentials.NewTLS(cfg)
}

// call opens an ext_proc stream with creds and token ("" for none) and
// returns the status of its first receive.
func call(t *testing.T, addr string, creds credentials.TransportCredentials, token string) codes.Code {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+token)
	}
	stream, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err == nil {
		_, err = stream.Recv()
	}
	return status.Code(err)
}

func token(t *testing.T, dir string) string {
	t.Helper()
	tok, err := FirstToken(filepath.Join(dir, certs.TokenFile))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestGuard: each kind of caller against each mode. An admitted caller
// reaches the service (Unimplemented here); anyone else gets
// Unauthenticated and is counted by reason.
func TestGuard(t *testing.T) {
	dir := writeCerts(t, "envoy")
	other := writeCerts(t, "envoy") // another CA, another token
	tlsFiles := &TLSFiles{CertFile: filepath.Join(dir, certs.DuetCertFile), KeyFile: filepath.Join(dir, certs.DuetKeyFile),
		ClientCAFile: filepath.Join(dir, certs.CAFile)}
	tokenFile := filepath.Join(dir, certs.TokenFile)
	good, bad := token(t, dir), token(t, other)
	plain := insecure.NewCredentials()

	type caller struct {
		name   string
		creds  credentials.TransportCredentials
		token  string
		want   codes.Code
		reason string // counted refusal, "" for none
	}
	tests := []struct {
		name    string
		opts    Options
		callers []caller
	}{
		{"mtls", Options{TLS: tlsFiles}, []caller{
			{"Envoy's certificate", clientTLS(t, dir, dir), "", codes.Unimplemented, ""},
			{"no client certificate", clientTLS(t, dir, ""), "", codes.Unauthenticated, ReasonNoClientCertificate},
			{"a certificate of another CA", clientTLS(t, dir, other), "", codes.Unavailable, ReasonTLSHandshake},
			{"plaintext", plain, good, codes.Unavailable, ReasonTLSHandshake},
		}},
		{"mtls with client names", Options{TLS: &TLSFiles{CertFile: tlsFiles.CertFile, KeyFile: tlsFiles.KeyFile,
			ClientCAFile: tlsFiles.ClientCAFile, ClientNames: []string{"gateway"}}}, []caller{
			{"a certificate of another name", clientTLS(t, dir, dir), "", codes.Unauthenticated, ReasonClientName},
		}},
		{"token", Options{TokenFile: tokenFile}, []caller{
			{"the token", plain, good, codes.Unimplemented, ""},
			{"no token", plain, "", codes.Unauthenticated, ReasonNoToken},
			{"another token", plain, bad, codes.Unauthenticated, ReasonBadToken},
		}},
		{"mtls and token", Options{TLS: tlsFiles, TokenFile: tokenFile}, []caller{
			{"both", clientTLS(t, dir, dir), good, codes.Unimplemented, ""},
			{"certificate without token", clientTLS(t, dir, dir), "", codes.Unauthenticated, ReasonNoToken},
			{"token without certificate", clientTLS(t, dir, ""), good, codes.Unauthenticated, ReasonNoClientCertificate},
		}},
		{"none", Options{}, []caller{
			{"anyone", plain, "", codes.Unimplemented, ""},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			tt.opts.Refusals = NewRefusals(nil, reg)
			g, err := NewGuard(tt.opts)
			if err != nil {
				t.Fatal(err)
			}
			addr := serve(t, g)
			for _, c := range tt.callers {
				before := testutil.ToFloat64(tt.opts.Refusals.counter.WithLabelValues(ServiceExtProc, c.reason)) +
					testutil.ToFloat64(tt.opts.Refusals.counter.WithLabelValues(ServiceGRPC, c.reason))
				if got := call(t, addr, c.creds, c.token); got != c.want {
					t.Errorf("%s: status %v, want %v", c.name, got, c.want)
				}
				counted := func() float64 {
					return testutil.ToFloat64(tt.opts.Refusals.counter.WithLabelValues(ServiceExtProc, c.reason)) +
						testutil.ToFloat64(tt.opts.Refusals.counter.WithLabelValues(ServiceGRPC, c.reason))
				}
				after := counted()
				// A failed handshake reaches the client before the server
				// has finished with it (and counted it).
				for deadline := time.Now().Add(2 * time.Second); c.reason != "" && after <= before && time.Now().Before(deadline); after = counted() {
					time.Sleep(5 * time.Millisecond)
				}
				if c.reason != "" && after <= before {
					t.Errorf("%s: refusal %q not counted", c.name, c.reason)
				}
			}
			// gRPC health stays open to callers without credentials.
			creds := plain
			if tt.opts.TLS != nil {
				creds = clientTLS(t, dir, "")
			}
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if _, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
				t.Errorf("health check: %v", err)
			}
		})
	}
}

// TestGuardReload: new files take effect on Reload; a broken file leaves
// the old credentials in use.
func TestGuardReload(t *testing.T) {
	dir := writeCerts(t, "envoy")
	tokenFile := filepath.Join(t.TempDir(), "token")
	old := token(t, dir)
	if err := os.WriteFile(tokenFile, []byte(old+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	g, err := NewGuard(Options{TokenFile: tokenFile, Refusals: NewRefusals(nil, nil)})
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, g)
	plain := insecure.NewCredentials()
	next := "0123456789abcdef0123456789abcdef"
	// Rotation: the new token first, the old one still accepted.
	if err := os.WriteFile(tokenFile, []byte(next+"\n"+old+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if changed, err := g.Reload(); err != nil || !changed {
		t.Fatalf("reload after rotation: changed %v, %v", changed, err)
	}
	if changed, err := g.Reload(); err != nil || changed {
		t.Errorf("reload of unchanged files: changed %v, %v", changed, err)
	}
	for _, tok := range []string{next, old} {
		if got := call(t, addr, plain, tok); got != codes.Unimplemented {
			t.Errorf("token %s… after rotation: %v", tok[:4], got)
		}
	}
	if err := os.WriteFile(tokenFile, []byte("short\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := g.Reload(); err == nil {
		t.Fatal("a too-short token was accepted")
	}
	if got := call(t, addr, plain, next); got != codes.Unimplemented {
		t.Errorf("after a failed reload the previous tokens must stay: %v", got)
	}
}

func TestReadTokens(t *testing.T) {
	long := "0123456789abcdef"
	tests := []struct {
		name, content string
		want          int // tokens, or -1 for an error
	}{
		{"one", long + "\n", 1},
		{"comments and blanks", "# rotated 2026-11\n\n  " + long + "  \n" + long + "x\n", 2},
		{"empty", "\n# nothing\n", -1},
		{"too short", "abc\n", -1},
		{"space inside", "0123456789 abcdef\n", -1},
		{"quote", long + "\"\n", -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := ReadTokens(path)
			if tt.want < 0 {
				if err == nil {
					t.Errorf("accepted %q", tt.content)
				}
				return
			}
			if err != nil || len(got) != tt.want {
				t.Errorf("got %d tokens, err %v; want %d", len(got), err, tt.want)
			}
		})
	}
}

func TestMatchToken(t *testing.T) {
	tokens := [][]byte{[]byte("first-token-0123"), []byte("second-token-012")}
	for _, tt := range []struct {
		got  string
		want bool
	}{{"first-token-0123", true}, {"second-token-012", true}, {"first-token-012", false}, {"", false}, {"first-token-01234", false}} {
		if matchToken(tokens, []byte(tt.got)) != tt.want {
			t.Errorf("matchToken(%q) = %v", tt.got, !tt.want)
		}
	}
}
