package auth

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// LogEvery is how often a refusal of one kind is logged at most: a caller
// that keeps knocking must not flood the log.
const LogEvery = 10 * time.Second

// Services of duet_auth_refused_total: what the refused caller tried to reach.
const (
	ServiceExtProc   = "ext_proc"   // the ext_proc stream
	ServiceAccessLog = "access_log" // the access-log (ALS) stream
	ServiceGRPC      = "grpc"       // another gRPC method, or the TLS handshake
	ServiceAdmin     = "admin"      // a protected page of the admin port
)

// Reasons of duet_auth_refused_total.
const (
	ReasonTLSHandshake        = "tls_handshake"         // no TLS, or a certificate that does not verify
	ReasonNoClientCertificate = "no_client_certificate" // TLS without a client certificate
	ReasonClientName          = "client_name"           // a verified certificate whose name is not admitted
	ReasonNoToken             = "no_token"              // no bearer token
	ReasonBadToken            = "bad_token"             // a token that is not one of duet's
	ReasonNoAdminToken        = "admin_token_unset"     // a protected page on a port beyond loopback, and no admin token is configured
)

// Refusals counts and logs refused callers. Its methods are safe for
// concurrent use.
type Refusals struct {
	counter *prometheus.CounterVec
	log     *zap.Logger
}

// NewRefusals returns a Refusals that logs to log, sampled to one line per
// LogEvery per reason, and registers duet_auth_refused_total{service,reason}
// with reg unless reg is nil.
func NewRefusals(log *zap.Logger, reg prometheus.Registerer) *Refusals {
	if log == nil {
		log = zap.NewNop()
	}
	r := &Refusals{
		counter: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "duet_auth_refused_total",
			Help: "Callers duet refused because they did not authenticate, by service (ext_proc, access_log, grpc, admin) and reason.",
		}, []string{"service", "reason"}),
		// The sampler keys on the message, which names the reason.
		log: log.WithOptions(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
			return zapcore.NewSamplerWithOptions(c, LogEvery, 1, 0)
		})),
	}
	if reg != nil {
		reg.MustRegister(r.counter)
	}
	return r
}

// Refuse records one refusal of a caller from peer (its address, or "").
func (r *Refusals) Refuse(service, reason, peer string, err error) {
	r.counter.WithLabelValues(service, reason).Inc()
	fields := []zap.Field{zap.String("service", service), zap.String("peer", peer)}
	if err != nil {
		fields = append(fields, zap.Error(err))
	}
	r.log.Warn("refused an unauthenticated caller ("+reason+"); further refusals for this reason are logged at most every "+LogEvery.String(), fields...)
}
