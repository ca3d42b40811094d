package harness

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// GatewayAdmission is what a gateway's JWT claim headers must agree with in
// duet's admission section: the headers it reads, whether it trusts
// clients' copies, and how many classes it has.
type GatewayAdmission struct {
	ClassHeader, TenantHeader string
	TrustClientHeaders        bool
	Classes                   int
}

// ClaimHeaderProblems checks the headers a gateway sets from JWT claims
// (header → claim) against a: they must be exactly a's class and tenant
// headers, each an x-duet-* header (Envoy strips clients' copies) set from
// a claim; a must not trust clients' headers, and must have at least two
// classes for a tier claim to choose from. It returns one message per
// problem.
func ClaimHeaderProblems(headers map[string]string, a GatewayAdmission) []string {
	var out []string
	want := []string{a.ClassHeader, a.TenantHeader}
	slices.Sort(want)
	if got := slices.Sorted(maps.Keys(headers)); !slices.Equal(got, want) || slices.Contains(got, "") {
		out = append(out, fmt.Sprintf("the JWT claims set headers %v; duet's admission section reads class_header %q and tenant_header %q", got, a.ClassHeader, a.TenantHeader))
	}
	for _, h := range slices.Sorted(maps.Keys(headers)) {
		if claim := headers[h]; !strings.HasPrefix(h, "x-duet-") || claim == "" {
			out = append(out, fmt.Sprintf("claim %q sets header %q: want a claim, into an x-duet-* header (clients' copies are stripped)", claim, h))
		}
	}
	if a.TrustClientHeaders {
		out = append(out, "duet's admission section trusts client headers: the gateway sets them, and strips the clients'")
	}
	if a.Classes < 2 {
		out = append(out, fmt.Sprintf("duet's admission section has %d classes: want at least two for the tier claim to choose from", a.Classes))
	}
	return out
}
