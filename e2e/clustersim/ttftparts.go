package clustersim

import (
	"slices"
	"strings"
	"time"

	"github.com/duet-router/duet/e2e/sim"
)

// TTFTParts splits the mean time to first token of a run's measured,
// served PD requests into where it went, and says how the routing placed
// each session's turns. The times are means in model milliseconds; they
// add up to the mean TTFT.
type TTFTParts struct {
	// Requests is the number of requests measured (served PD requests).
	Requests int
	// TTFT is their mean time to first token.
	TTFT float64
	// PrefillWait is arrival to the prefill rank's admission (its
	// bootstrap queue, waiting for the decode's preallocation, then its
	// waiting queue); PrefillCompute admission to the prompt in KV;
	// Transfer the KV's way to the decode; DecodeWait the time the KV
	// waited beyond the transfer for the decode rank's preallocation (0
	// now that the prefill waits for it first); FirstStep the rest, from
	// the KV at the decode to the first token.
	PrefillWait, PrefillCompute, Transfer, DecodeWait, FirstStep float64
	// Later is the same split over the later turns of sessions (turn > 0),
	// which have a previous turn whose prefix they can reuse.
	LaterRequests                                                   int
	LaterTTFT, LaterPrefillWait, LaterPrefillCompute, LaterTransfer float64
	// HitRate is cached prompt tokens / prompt tokens; LaterHitRate the
	// same over later turns, and LaterHitOfBound their hits over their
	// bound (Request.HitBound).
	HitRate, LaterHitRate, LaterHitOfBound float64
	// SamePrefillRank and SameDecodeRank are the shares of later turns
	// served by the same prefill (decode) rank as the session's previous
	// turn; SamePrefillEngine the share on the same prefill engine.
	SamePrefillRank, SamePrefillEngine, SameDecodeRank float64
	// MovedTTFT and MovedHitRate are the mean TTFT and hit rate of the
	// later turns served by another prefill rank than their previous turn;
	// FirstHitRate is the hit rate of first turns.
	MovedTTFT, MovedHitRate, FirstHitRate float64
	// PrefillSolo is the part of PrefillCompute the request's own chunks
	// would take on an idle rank of an idle engine (the profile's step
	// cost over its uncached tokens); the rest of PrefillCompute is what
	// other requests added: the chunks it shared a step with on its rank
	// and, with DP attention, the longer steps of its engine's other ranks
	// (lockstep). 0 without a profile.
	PrefillSolo float64
	// PrefillWaitP99 is the 99th percentile of PrefillWait.
	PrefillWaitP99 float64
	// PrefillWork and DecodeRequests are, per rank name ("p0/r1"), the
	// prompt tokens computed (prompt less cache hit) and the requests
	// decoded, over measured requests, in name order.
	PrefillWork    []RankShare
	DecodeRequests []RankShare
}

// RankShare is one rank's part of a total.
type RankShare struct {
	Rank  string
	Value float64
}

// TTFTParts computes the split over the measured, served PD requests;
// prof, if set, is the prefill engines' profile (for PrefillSolo).
func (res *Result) TTFTParts(prof *sim.Profile) TTFTParts {
	var p TTFTParts
	type prev struct{ prefill, decode string }
	last := map[int]prev{}
	work, decoded := map[string]float64{}, map[string]float64{}
	var prompt, cached, laterPrompt, laterCached, laterBound float64
	var later, samePR, samePE, sameDR, moved int
	var movedPrompt, movedCached, firstPrompt, firstCached float64
	var waits []float64
	for _, q := range res.Requests {
		before, seen := last[q.Session]
		if q.Err == "" {
			last[q.Session] = prev{q.Prefill, q.Decode}
		}
		if !res.measured(q.Arrival) || q.Err != "" || q.Prefill == "" || q.PrefillDone == 0 {
			continue
		}
		p.Requests++
		ttft := ms(q.TTFT)
		wait := ms(q.PrefillAdmitted - q.Arrival)
		compute := ms(q.PrefillComputed - q.PrefillAdmitted)
		transfer := ms(q.PrefillDone - q.PrefillComputed)
		decodeWait := max(0, ms(q.DecodeAdmitted-q.PrefillDone))
		p.TTFT += ttft
		p.PrefillWait += wait
		p.PrefillCompute += compute
		p.Transfer += transfer
		p.DecodeWait += decodeWait
		p.FirstStep += ttft - wait - compute - transfer - decodeWait
		waits = append(waits, wait)
		if prof != nil {
			p.PrefillSolo += ms(soloPrefill(prof, q.PromptTokens-q.CachedTokens, q.CachedTokens))
		}
		prompt += float64(q.PromptTokens)
		cached += float64(q.CachedTokens)
		work[q.Prefill] += float64(q.PromptTokens - q.CachedTokens)
		decoded[q.Decode]++
		if q.Turn == 0 || !seen {
			firstPrompt += float64(q.PromptTokens)
			firstCached += float64(q.CachedTokens)
			continue
		}
		later++
		p.LaterTTFT += ttft
		p.LaterPrefillWait += wait
		p.LaterPrefillCompute += compute
		p.LaterTransfer += transfer
		laterPrompt += float64(q.PromptTokens)
		laterCached += float64(q.CachedTokens)
		laterBound += float64(q.HitBound)
		if before.prefill == q.Prefill {
			samePR++
		} else {
			moved++
			p.MovedTTFT += ttft
			movedPrompt += float64(q.PromptTokens)
			movedCached += float64(q.CachedTokens)
		}
		if engineOf(before.prefill) == engineOf(q.Prefill) {
			samePE++
		}
		if before.decode == q.Decode {
			sameDR++
		}
	}
	if p.Requests > 0 {
		n := float64(p.Requests)
		p.TTFT /= n
		p.PrefillWait /= n
		p.PrefillCompute /= n
		p.Transfer /= n
		p.DecodeWait /= n
		p.FirstStep /= n
		p.PrefillSolo /= n
	}
	if later > 0 {
		n := float64(later)
		p.LaterRequests = later
		p.LaterTTFT /= n
		p.LaterPrefillWait /= n
		p.LaterPrefillCompute /= n
		p.LaterTransfer /= n
		p.SamePrefillRank, p.SamePrefillEngine, p.SameDecodeRank = float64(samePR)/n, float64(samePE)/n, float64(sameDR)/n
	}
	if prompt > 0 {
		p.HitRate = cached / prompt
	}
	if moved > 0 {
		p.MovedTTFT /= float64(moved)
	}
	if movedPrompt > 0 {
		p.MovedHitRate = movedCached / movedPrompt
	}
	if firstPrompt > 0 {
		p.FirstHitRate = firstCached / firstPrompt
	}
	if laterPrompt > 0 {
		p.LaterHitRate = laterCached / laterPrompt
	}
	if laterBound > 0 {
		p.LaterHitOfBound = laterCached / laterBound
	}
	slices.Sort(waits)
	p.PrefillWaitP99 = percentile(waits, 99)
	p.PrefillWork, p.DecodeRequests = shares(work), shares(decoded)
	return p
}

// engineOf is the engine part of a rank name ("p0/r1" → "p0").
func engineOf(rank string) string {
	e, _, _ := strings.Cut(rank, "/")
	return e
}

// shares lists m by rank name.
func shares(m map[string]float64) []RankShare {
	out := make([]RankShare, 0, len(m))
	for k, v := range m {
		out = append(out, RankShare{k, v})
	}
	slices.SortFunc(out, func(a, b RankShare) int { return strings.Compare(a.Rank, b.Rank) })
	return out
}

// soloPrefill is the time to compute uncached tokens after cached ones
// alone on a rank: one step per chunk of the profile's budget.
func soloPrefill(prof *sim.Profile, uncached, cached int) time.Duration {
	var d time.Duration
	chunk := max(prof.ChunkedPrefillSize, 1)
	for done := 0; done < uncached; done += chunk {
		n := min(chunk, uncached-done)
		before := float64(cached + done)
		d += prof.PrefillBase + time.Duration(n)*prof.PrefillPerToken +
			time.Duration(prof.PrefillQuadMS*float64(n)*(before+float64(n)/2)*float64(time.Millisecond))
	}
	return d
}
