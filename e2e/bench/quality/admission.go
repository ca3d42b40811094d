package main

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/duet-router/duet/e2e/bench"
)

// The priority mix's classes' wait limits in model time: duet's
// configuration holds them in wall time, divided by the time scale, as
// every model duration of the benchmark.
const (
	interactiveWaitLimit = 10 * time.Second
	batchWaitLimit       = 20 * time.Second
)

// apiKeyHash is the hex SHA-256 of class's API key (bench.APIKey), the
// form duet's admission.api_keys takes.
func apiKeyHash(class string) string {
	sum := sha256.Sum256([]byte(bench.APIKey(class)))
	return hex.EncodeToString(sum[:])
}

// priorityMixAdmission is the keys of duet's admission section for the
// priority mix at time scale scale: the interactive class (priority 10)
// above the batch one (priority 0), the interactive API key's requests
// interactive and all others batch, the tenant from the benchmark's tenant
// header, which duet is told to trust (the clients are the benchmark's).
// Everything else is duet's default: the saturation thresholds, the queue's
// bounds, engine priorities where the engines advertise them.
func priorityMixAdmission(scale float64) string {
	wall := func(d time.Duration) string { return time.Duration(float64(d) / scale).String() }
	return fmt.Sprintf("  classes:\n  - {name: %s, priority: 10, wait_limit: %s}\n  - {name: %s, priority: 0, wait_limit: %s}\n"+
		"  default_class: %s\n  api_keys: {%s: %s}\n  tenant_header: %s\n  trust_client_headers: true\n",
		bench.ClassInteractive, wall(interactiveWaitLimit), bench.ClassBatch, wall(batchWaitLimit),
		bench.ClassBatch, apiKeyHash(bench.ClassInteractive), bench.ClassInteractive, bench.TenantHeader)
}

// addAdmission gives the priority mix, when the plan runs it, its
// admission section, and describes the admission configuration and the
// SLO in the setup.
func addAdmission(plan *bench.Plan, scale float64) {
	if slices.Contains(plan.Workloads, bench.WorkloadPriorityMix) {
		keys := priorityMixAdmission(scale)
		plan.Admission = map[string]string{bench.WorkloadPriorityMix: keys}
		plan.Setup = append(plan.Setup,
			fmt.Sprintf("%s: each request carries its class as an API key (`Authorization: Bearer %s` or `%s`) and its tenant in `%s`; "+
				"every duet case of it runs with `admission: {classes: [{name: %s, priority: 10, wait_limit: %s}, {name: %s, priority: 0, wait_limit: %s}], "+
				"default_class: %s, api_keys: {%s: %s}, tenant_header: %s, trust_client_headers: true}` (the key's SHA-256; the wait limits in model time, "+
				"duet's configuration has them divided by F), and duet's defaults for the rest of the section (saturation thresholds, queue bounds)",
				bench.WorkloadPriorityMix, bench.APIKey(bench.ClassInteractive), bench.APIKey(bench.ClassBatch), bench.TenantHeader,
				bench.ClassInteractive, interactiveWaitLimit, bench.ClassBatch, batchWaitLimit, bench.ClassBatch,
				apiKeyHash(bench.ClassInteractive), bench.ClassInteractive, bench.TenantHeader),
			"the other workloads run duet's admission defaults (the queue on, one class)")
	}
	var off []string
	for _, p := range plan.Policies {
		if p.AdmissionOff && !slices.Contains(off, bench.RunBase(p.Name)) {
			off = append(off, bench.RunBase(p.Name))
		}
	}
	if len(off) > 0 {
		plan.Setup = append(plan.Setup, fmt.Sprintf("%s: the same duet policy with its admission queue off (`admission: {enabled: false}` "+
			"before the workload's admission keys): every request routed at once, however full the engines are", strings.Join(off, ", ")))
	}
	if plan.Admission != nil {
		plan.Setup = append(plan.Setup, fmt.Sprintf("goodput SLO, per request (model time): %s", plan.Config.SLO))
	}
}
