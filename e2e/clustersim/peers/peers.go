package peers

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/duet-router/duet/scheduler"
)

// The peer routings' names.
const (
	nameSMGCacheAware  = "smg_cache_aware"
	nameSMGDPMinTokens = "smg_dp_min_tokens"
	nameDynamoKV       = "dynamo_kv"
	nameLLMDEPP        = "llmd_epp"
)

// roleAggregated is the role NewAggregated builds for: one pool serving
// whole requests.
const roleAggregated = scheduler.Role("aggregated")

// Names lists the peer routings: "smg_cache_aware", "smg_dp_min_tokens",
// "dynamo_kv", "llmd_epp".
func Names() []string {
	return []string{nameSMGCacheAware, nameSMGDPMinTokens, nameDynamoKV, nameLLMDEPP}
}

// New returns a fresh policy instance of the named peer for one role of a
// PD deployment (scheduler.RolePrefill or scheduler.RoleDecode). Each call
// returns a new instance with its own state; an instance serves one
// scheduler.
//
// An instance keeps router-side counts from its own picks and from the legs
// the scheduler reports (scheduler.LegObserver), so it sees the legs of its
// own role only. SMG holds a PD request's load on both its prefill and its
// decode worker until the decode response ends; NewPair reproduces that,
// New releases a prefill worker's count when the prefill leg ends.
func New(name string, role scheduler.Role) (scheduler.Policy, error) {
	if role != scheduler.RolePrefill && role != scheduler.RoleDecode {
		return nil, fmt.Errorf("peers: %s: role %q (want %q or %q)", name, role, scheduler.RolePrefill, scheduler.RoleDecode)
	}
	return build(name, role)
}

// NewPair returns the named peer's prefill and decode instances for one PD
// scheduler (Config.PrefillPolicyInstance and DecodePolicyInstance). For
// the SMG peers the two share state: a request's in-flight count on its
// prefill worker is released when its decode leg ends, as SMG's PD router
// keeps both workers' load guards until the decode response is done
// (smg-project/smg model_gateway/src/routers/http/pd_router.rs: the
// load_guards built for both legs are attached to the decode response with
// AttachedBody::wrap_response). The other peers track per leg, as their
// routers do, and NewPair is New for each role. Both instances must serve
// the same scheduler: it calls its two policies under one lock, which is
// what keeps their shared state consistent.
func NewPair(name string) (prefill, decode scheduler.Policy, err error) {
	if prefill, err = build(name, scheduler.RolePrefill); err != nil {
		return nil, nil, err
	}
	if decode, err = build(name, scheduler.RoleDecode); err != nil {
		return nil, nil, err
	}
	p, okP := prefill.(*smgPolicy)
	d, okD := decode.(*smgPolicy)
	if okP && okD {
		d.pairedPrefill = p
		p.paired = true
	}
	return prefill, decode, nil
}

// NewAggregated returns a fresh instance of the named peer for an
// aggregated pool, where one engine serves the whole request (the decode
// pool of a scheduler without prefill engines): Dynamo's KV router with its
// default settings (prefill and decode terms together), llm-d's default
// scheduling profile (queue 2, KV-cache utilization 2, prefix 3) and SMG's
// cache_aware. smg_dp_min_tokens has no aggregated form: SMG enables it in
// PD mode only.
func NewAggregated(name string) (scheduler.Policy, error) {
	if name == nameSMGDPMinTokens {
		// SMG wires the DP minimum-tokens scheduler in PD mode only
		// (model_gateway/src/routers/factory.rs, create_pd_router).
		return nil, fmt.Errorf("peers: %s: SMG has no aggregated form of it (PD mode only)", name)
	}
	return build(name, roleAggregated)
}

// build returns the named peer for role (prefill, decode or aggregated).
func build(name string, role scheduler.Role) (scheduler.Policy, error) {
	switch name {
	case nameSMGCacheAware:
		return newSMG(name, role, false), nil
	case nameSMGDPMinTokens:
		return newSMG(name, role, true), nil
	case nameDynamoKV:
		return newDynamoKV(role), nil
	case nameLLMDEPP:
		return newLLMDEPP(role), nil
	}
	return nil, fmt.Errorf("peers: unknown peer %q (valid: %s)", name, strings.Join(Names(), ", "))
}

// newRand returns the generator a port breaks random ties with, seeded by
// the peer's name and role so that a simulation run is reproducible.
func newRand(name string, role scheduler.Role) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(name))
	h.Write([]byte{0})
	h.Write([]byte(role))
	s := h.Sum64()
	return rand.New(rand.NewPCG(s, s^0x9e3779b97f4a7c15))
}

// tieBreak is reservoir sampling over exact ties: the caller has seen the
// n-th candidate tied with the best (n >= 2) and takes it with probability
// 1/n, so that every tied candidate ends up chosen with equal probability.
func tieBreak(r *rand.Rand, n int) bool { return r.IntN(n) == 0 }

// held is one pick's contribution to a router-side count: the target it was
// placed on and the amount.
type held[T any] struct {
	target scheduler.TargetKey
	v      T
}

// holds remembers what each pick added to a router-side count, so that the
// leg's end (scheduler.LegReport) can take exactly that amount off again.
// Picks are keyed by request ID. A pick without an ID (the scheduler then
// reports a generated one) or with an ID already in flight is queued per
// target instead, and the target's oldest such pick is released first: the
// count stays right, the amount may belong to another leg of that target.
type holds[T any] struct {
	byID map[string]held[T]
	anon map[scheduler.TargetKey][]T
}

func newHolds[T any]() holds[T] {
	return holds[T]{byID: make(map[string]held[T]), anon: make(map[scheduler.TargetKey][]T)}
}

// add records that request id added v on target.
func (h *holds[T]) add(id string, target scheduler.TargetKey, v T) {
	if _, dup := h.byID[id]; id != "" && !dup {
		h.byID[id] = held[T]{target: target, v: v}
		return
	}
	h.anon[target] = append(h.anon[target], v)
}

// take removes and returns what the ended leg r added, if known.
func (h *holds[T]) take(r scheduler.LegReport) (T, bool) {
	if e, ok := h.byID[r.RequestID]; ok && e.target == r.Target {
		delete(h.byID, r.RequestID)
		return e.v, true
	}
	return h.takeAnon(r.Target)
}

// takeAnon removes and returns target's oldest pick without an ID.
func (h *holds[T]) takeAnon(target scheduler.TargetKey) (T, bool) {
	q := h.anon[target]
	if len(q) == 0 {
		var zero T
		return zero, false
	}
	v := q[0]
	if len(q) == 1 {
		delete(h.anon, target)
	} else {
		h.anon[target] = q[1:]
	}
	return v, true
}

// takeID removes and returns what request id added, wherever it was placed.
func (h *holds[T]) takeID(id string) (held[T], bool) {
	e, ok := h.byID[id]
	if ok {
		delete(h.byID, id)
	}
	return e, ok
}

// words counts the whitespace-separated words of b, as Rust's
// str::split_whitespace does (Unicode White_Space), without allocating.
func words(b []byte) int {
	n, in := 0, false
	for len(b) > 0 {
		r, size := rune(b[0]), 1
		if r >= utf8.RuneSelf {
			r, size = utf8.DecodeRune(b)
		}
		b = b[size:]
		if unicode.IsSpace(r) {
			in = false
		} else if !in {
			in = true
			n++
		}
	}
	return n
}

// noCandidates is the error for an empty candidate list, which the
// scheduler never passes.
func noCandidates(name string) error { return fmt.Errorf("peers: %s: no candidates", name) }
