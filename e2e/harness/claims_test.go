package harness

import "testing"

func TestClaimHeaderProblems(t *testing.T) {
	good := GatewayAdmission{ClassHeader: "x-duet-priority", TenantHeader: "x-duet-tenant", Classes: 2}
	tests := []struct {
		name    string
		headers map[string]string
		a       GatewayAdmission
		want    int
	}{
		{"agrees", map[string]string{"x-duet-priority": "tier", "x-duet-tenant": "org"}, good, 0},
		{"a header duet does not read", map[string]string{"x-duet-priority": "tier", "x-duet-org": "org"}, good, 1},
		{"outside x-duet-, empty claim", map[string]string{"x-priority": "tier", "x-duet-tenant": ""},
			GatewayAdmission{ClassHeader: "x-priority", TenantHeader: "x-duet-tenant", Classes: 2}, 2},
		{"trusts clients, one class", map[string]string{"x-duet-priority": "tier", "x-duet-tenant": "org"},
			GatewayAdmission{ClassHeader: "x-duet-priority", TenantHeader: "x-duet-tenant", TrustClientHeaders: true, Classes: 1}, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := ClaimHeaderProblems(tt.headers, tt.a); len(got) != tt.want {
				t.Errorf("%d problems, want %d: %q", len(got), tt.want, got)
			}
		})
	}
}
