package bench

import (
	"math/rand/v2"
	"strconv"
	"time"
)

// The priority classes the priority mix's sessions name (Session.Class).
const (
	// ClassInteractive is the short, latency-sensitive chat turns.
	ClassInteractive = "interactive"
	// ClassBatch is the long prompts of batch jobs.
	ClassBatch = "batch"
)

// PriorityMixParams shape the priority mix, the real path's counterpart of
// the simulator's admission comparison's 20/80 classes mix (make bench-sim
// -admission): independent requests (sessions of one turn) whose Poisson
// arrivals are each drawn interactive with probability InteractiveShare,
// else batch, which makes the classes two independent Poisson streams as
// the simulator's are. Interactive sessions always stream, so that every
// one shows its time to first token; batch sessions stream as the plan's
// chunk budget allows (Params.StreamFraction). Each request's tenant is
// drawn by TenantWeights, whatever its class.
type PriorityMixParams struct {
	// InteractiveShare is the share of interactive requests (default 0.2).
	InteractiveShare float64
	// Interactive and Batch shape each class's requests (defaults, the
	// simulator's: 300-1,500 tokens in and 50-300 out; 2,000-6,000 in and
	// 100-800 out).
	Interactive, Batch VariableParams
	// TenantWeights are the tenants' relative shares of the requests,
	// TenantName(0) first (default 4, 2, 1, 1: the first tenant sends half
	// of each class, the last two an eighth each).
	TenantWeights []float64
}

// withDefaults fills zero fields.
func (p PriorityMixParams) withDefaults() PriorityMixParams {
	if p.InteractiveShare == 0 {
		p.InteractiveShare = 0.2
	}
	if p.Interactive == (VariableParams{}) {
		p.Interactive = VariableParams{Prompt: IntRange{300, 1500}, Output: IntRange{50, 300}}
	}
	if p.Batch == (VariableParams{}) {
		p.Batch = VariableParams{Prompt: IntRange{2000, 6000}, Output: IntRange{100, 800}}
	}
	if len(p.TenantWeights) == 0 {
		p.TenantWeights = []float64{4, 2, 1, 1}
	}
	return p
}

// TenantName names the priority mix's tenant i (from 0): tenant-1,
// tenant-2, ...
func TenantName(i int) string { return "tenant-" + strconv.Itoa(i+1) }

// tenant draws a tenant by the weights.
func (p PriorityMixParams) tenant(rng *rand.Rand) string {
	total := 0.0
	for _, w := range p.TenantWeights {
		total += w
	}
	x := rng.Float64() * total
	for i, w := range p.TenantWeights {
		if x < w {
			return TenantName(i)
		}
		x -= w
	}
	return TenantName(len(p.TenantWeights) - 1)
}

// priorityMixSessions draws one single-turn session per Poisson arrival:
// its class, its request (variableSession, of the class's shape) and its
// tenant.
func priorityMixSessions(rng *rand.Rand, rate float64, window time.Duration, p PriorityMixParams) []Session {
	var out []Session
	for i, at := range PoissonArrivals(rng, rate, window) {
		class, shape := ClassBatch, p.Batch
		if rng.Float64() < p.InteractiveShare {
			class, shape = ClassInteractive, p.Interactive
		}
		s := variableSession(rng, i, at, shape)
		s.Class, s.Tenant = class, p.tenant(rng)
		out = append(out, s)
	}
	return out
}

// alwaysStreams reports whether s streams whatever the stream fraction:
// the interactive sessions, whose time to first token is what a priority
// class is for.
func alwaysStreams(s Session) bool { return s.Class == ClassInteractive }
