package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// TLSFiles are duet's side of mutual TLS on the gRPC port.
type TLSFiles struct {
	// CertFile and KeyFile are duet's server certificate chain and key (PEM).
	CertFile, KeyFile string
	// ClientCAFile holds the CAs (PEM) a client certificate must chain to.
	ClientCAFile string
	// ClientNames, when set, admits only client certificates one of whose
	// DNS or URI SANs, or whose common name, is listed.
	ClientNames []string
}

// Options configure a Guard. With neither TLS nor TokenFile, the Guard
// admits every caller.
type Options struct {
	// TLS, when set, requires a client certificate that chains to its CA.
	TLS *TLSFiles
	// TokenFile, when set, requires "authorization: Bearer <token>" gRPC
	// metadata with one of the file's tokens (ReadTokens).
	TokenFile string
	// Refusals counts and logs refused callers; required.
	Refusals *Refusals
}

// Guard authenticates the callers of duet's gRPC port. Create it with
// NewGuard and serve with its ServerOptions.
type Guard struct {
	opts   Options
	files  watched
	tls    atomic.Pointer[tls.Config]
	tokens atomic.Pointer[[][]byte]
}

// healthService is left open: it tells whether duet serves, nothing more,
// and health checkers do not carry Envoy's credentials.
const healthService = "/grpc.health.v1.Health/"

// NewGuard loads the files that opts names.
func NewGuard(opts Options) (*Guard, error) {
	if opts.Refusals == nil {
		return nil, errors.New("auth: Options.Refusals is required")
	}
	g := &Guard{opts: opts}
	if _, err := g.Reload(); err != nil {
		return nil, err
	}
	return g, nil
}

// Mode names what the Guard requires: "mtls", "token", "mtls+token" or
// "none".
func (g *Guard) Mode() string {
	switch {
	case g.opts.TLS != nil && g.opts.TokenFile != "":
		return "mtls+token"
	case g.opts.TLS != nil:
		return "mtls"
	case g.opts.TokenFile != "":
		return "token"
	}
	return "none"
}

// Reload reads the certificate, key, CA and token files again and reports
// whether they changed since the last load. On any error the Guard keeps
// what it had and the error says which file failed.
func (g *Guard) Reload() (changed bool, err error) {
	var paths []string
	if f := g.opts.TLS; f != nil {
		paths = append(paths, f.CertFile, f.KeyFile, f.ClientCAFile)
	}
	if g.opts.TokenFile != "" {
		paths = append(paths, g.opts.TokenFile)
	}
	return g.files.reload(paths, g.load)
}

// load reads and applies the files.
func (g *Guard) load() error {
	var cfg *tls.Config
	if f := g.opts.TLS; f != nil {
		var err error
		if cfg, err = loadTLS(f); err != nil {
			return err
		}
	}
	var tokens [][]byte
	if g.opts.TokenFile != "" {
		var err error
		if tokens, err = ReadTokens(g.opts.TokenFile); err != nil {
			return fmt.Errorf("auth.token_file: %w", err)
		}
	}
	if cfg != nil {
		g.tls.Store(cfg)
	}
	if tokens != nil {
		g.tokens.Store(&tokens)
	}
	return nil
}

// loadTLS builds the server's TLS configuration from f. The TLS layer only
// asks for a client certificate (and rejects one that does not verify);
// the gRPC layer refuses a caller without one, so that the caller gets a
// gRPC Unauthenticated status rather than a failed handshake.
func loadTLS(f *TLSFiles) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("auth.tls: server certificate: %w", err)
	}
	pem, err := os.ReadFile(f.ClientCAFile)
	if err != nil {
		return nil, fmt.Errorf("auth.tls.client_ca_file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("auth.tls.client_ca_file: %s holds no PEM certificate", f.ClientCAFile)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		ClientAuth:   tls.VerifyClientCertIfGiven,
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2"},
	}, nil
}

// ServerOptions returns the options that make a gRPC server apply the
// Guard: TLS credentials whose files Reload can replace, and interceptors
// that refuse unauthenticated calls.
func (g *Guard) ServerOptions() []grpc.ServerOption {
	var opts []grpc.ServerOption
	if g.opts.TLS != nil {
		base := &tls.Config{
			MinVersion: tls.VersionTLS12,
			// Each handshake takes the configuration Reload last stored.
			GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) { return g.tls.Load(), nil },
		}
		opts = append(opts, grpc.Creds(&countingCreds{TransportCredentials: credentials.NewTLS(base), refusals: g.opts.Refusals}))
	}
	if g.Mode() == "none" {
		return opts
	}
	return append(opts,
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if err := g.authorize(ctx, info.FullMethod); err != nil {
				return nil, err
			}
			return handler(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			if err := g.authorize(ss.Context(), info.FullMethod); err != nil {
				return err
			}
			return handler(srv, ss)
		}),
	)
}

// authorize returns nil when the call to method may proceed, else an
// Unauthenticated status, after counting and logging the refusal.
func (g *Guard) authorize(ctx context.Context, method string) error {
	if strings.HasPrefix(method, healthService) {
		return nil
	}
	reason, msg := g.check(ctx)
	if reason == "" {
		return nil
	}
	addr := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		addr = p.Addr.String()
	}
	g.opts.Refusals.Refuse(serviceOf(method), reason, addr, nil)
	return status.Error(codes.Unauthenticated, "duet: "+msg)
}

// check returns the reason and message of a refusal, or "" when the
// caller authenticated.
func (g *Guard) check(ctx context.Context) (reason, msg string) {
	if f := g.opts.TLS; f != nil {
		p, _ := peer.FromContext(ctx)
		var state tls.ConnectionState
		if p != nil {
			if info, ok := p.AuthInfo.(credentials.TLSInfo); ok {
				state = info.State
			}
		}
		if len(state.VerifiedChains) == 0 || len(state.PeerCertificates) == 0 {
			return ReasonNoClientCertificate, "a client certificate signed by duet's client CA (auth.tls.client_ca_file) is required"
		}
		if len(f.ClientNames) > 0 && !namedIn(state.PeerCertificates[0], f.ClientNames) {
			return ReasonClientName, "the client certificate's names are not in auth.tls.client_names"
		}
	}
	if tokens := g.tokens.Load(); tokens != nil {
		md, _ := metadata.FromIncomingContext(ctx)
		values := md.Get("authorization")
		if len(values) == 0 {
			return ReasonNoToken, "an \"authorization: Bearer <token>\" header is required"
		}
		for _, v := range values {
			if t, ok := bearer(v); ok && matchToken(*tokens, []byte(t)) {
				return "", ""
			}
		}
		return ReasonBadToken, "the bearer token is not one of duet's (auth.token_file)"
	}
	return "", ""
}

// bearer returns the token of an "authorization" value of the Bearer
// scheme (RFC 6750: the scheme is case-insensitive).
func bearer(v string) (string, bool) {
	const scheme = "bearer "
	if len(v) < len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) {
		return "", false
	}
	return strings.TrimSpace(v[len(scheme):]), true
}

// namedIn reports whether one of cert's DNS or URI SANs, or its common
// name, is in names.
func namedIn(cert *x509.Certificate, names []string) bool {
	if slices.Contains(names, cert.Subject.CommonName) {
		return true
	}
	for _, n := range cert.DNSNames {
		if slices.Contains(names, n) {
			return true
		}
	}
	for _, u := range cert.URIs {
		if slices.Contains(names, u.String()) {
			return true
		}
	}
	return false
}

// serviceOf names the service of a full gRPC method name for metrics.
func serviceOf(method string) string {
	switch {
	case strings.HasPrefix(method, "/envoy.service.ext_proc.v3.ExternalProcessor/"):
		return ServiceExtProc
	case strings.HasPrefix(method, "/envoy.service.accesslog.v3.AccessLogService/"):
		return ServiceAccessLog
	}
	return ServiceGRPC
}

// countingCreds counts and logs failed server handshakes: a caller without
// TLS, or with a certificate that does not verify, never reaches a gRPC
// method.
type countingCreds struct {
	credentials.TransportCredentials
	refusals *Refusals
}

// ServerHandshake implements credentials.TransportCredentials.
func (c *countingCreds) ServerHandshake(conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	out, info, err := c.TransportCredentials.ServerHandshake(conn)
	if err != nil {
		c.refusals.Refuse(ServiceGRPC, ReasonTLSHandshake, conn.RemoteAddr().String(), err)
	}
	return out, info, err
}

// Clone implements credentials.TransportCredentials.
func (c *countingCreds) Clone() credentials.TransportCredentials {
	return &countingCreds{TransportCredentials: c.TransportCredentials.Clone(), refusals: c.refusals}
}
