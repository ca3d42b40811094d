package scheduler

import (
	"context"
	"fmt"
	"strings"
)

// Request is what a policy may look at when it chooses a target.
type Request struct {
	// ID identifies the request, e.g. its x-request-id.
	ID string
	// Path is the request's HTTP path, e.g. /v1/chat/completions.
	Path string
	// DecodeOnly asks for a decode target alone, even in PD mode: requests
	// that are not inference (GET /v1/models, ...) are never mirrored, so no
	// prefill target is chosen and the prefill pool need not be ready.
	DecodeOnly bool
}

// Policy chooses one target among candidates.
//
// The scheduler calls Pick concurrently and only with a non-empty candidate
// list, which the policy must not modify or retain past the call. The
// returned target must be one of the candidates. Pick must be cheap: it runs
// on the request path.
type Policy interface {
	// Name returns the name the policy was created with, e.g. "round_robin".
	Name() string
	// Pick returns the chosen target.
	Pick(ctx context.Context, req *Request, candidates []Target) (Target, error)
}

// policyRoundRobin names the round_robin policy; it is the default.
const policyRoundRobin = "round_robin"

// policyNames lists the valid policy names, sorted.
func policyNames() []string {
	return []string{policyRoundRobin}
}

// NewPolicy returns a new instance of the policy called name. Each call
// returns an independent instance with its own state. An unknown name is an
// error that lists the valid ones.
func NewPolicy(name string) (Policy, error) {
	p, err := newPolicy(name)
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	return p, nil
}

// newPolicy is NewPolicy without the package prefix on its error, for
// callers that add their own context.
func newPolicy(name string) (Policy, error) {
	switch name {
	case policyRoundRobin:
		return newRoundRobin(), nil
	default:
		return nil, fmt.Errorf("unknown policy %q (valid: %s)", name, strings.Join(policyNames(), ", "))
	}
}
