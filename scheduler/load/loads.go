package load

import (
	"fmt"

	"github.com/duet-router/duet/scheduler/jsondepth"

	"github.com/tidwall/gjson"
)

// maxJSONDepth bounds a /v1/loads document's nesting (the real one nests
// three levels); see package jsondepth.
const maxJSONDepth = 64

// ParseLoads parses the JSON body of SGLang's GET /v1/loads and returns one
// Rank per DP rank, sorted by rank.
//
// Each element of "loads" contributes dp_rank (its index in the array when
// absent), num_used_tokens, num_total_tokens (num_used_tokens when absent),
// max_total_num_tokens, num_running_reqs, num_waiting_reqs and token_usage.
// Entries that share a rank are added together: token and request counts
// are summed, and the largest capacity and usage are kept. Entries whose
// dp_rank is not a whole number in range are skipped. It is an error if the
// body is not JSON, nests deeper than 64 levels or has no usable entry.
func ParseLoads(body []byte) ([]Rank, error) {
	if err := jsondepth.Check(body, maxJSONDepth); err != nil {
		return nil, fmt.Errorf("parse /v1/loads: %w", err)
	}
	if !gjson.ValidBytes(body) {
		return nil, fmt.Errorf("parse /v1/loads: invalid JSON")
	}
	loads := gjson.GetBytes(body, "loads")
	if !loads.IsArray() {
		return nil, fmt.Errorf("parse /v1/loads: %w: no \"loads\" array", ErrNoLoads)
	}
	set := rankSet{}
	for i, e := range loads.Array() {
		if !e.IsObject() {
			return nil, fmt.Errorf("parse /v1/loads: loads[%d] is not an object", i)
		}
		addLoadsEntry(set, i, e)
	}
	if len(set) == 0 {
		return nil, fmt.Errorf("parse /v1/loads: %w", ErrNoLoads)
	}
	return set.ranks(), nil
}

// addLoadsEntry merges the i-th element of "loads" into set.
func addLoadsEntry(set rankSet, i int, e gjson.Result) {
	rank, ok := entryRank(e, i)
	if !ok {
		return
	}
	a := set.get(rank)
	used, hasUsed := number(e, "num_used_tokens")
	if hasUsed {
		a.addUsed(tokens(used))
	}
	if total, present := number(e, "num_total_tokens"); present {
		a.addTotal(tokens(total))
	} else {
		a.addTotal(tokens(used))
	}
	if v, present := number(e, "max_total_num_tokens"); present {
		a.setMax(tokens(v))
	}
	if v, present := number(e, "num_running_reqs"); present {
		a.addRunning(count(v))
	}
	if v, present := number(e, "num_waiting_reqs"); present {
		a.addWaiting(count(v))
	}
	if v, present := number(e, "token_usage"); present {
		a.setUsage(ratio(v))
	}
}

// entryRank returns the dp_rank of the i-th element e of "loads": i when the
// field is absent or null, and ok false when it is anything but a whole
// number in 0..maxRank.
func entryRank(e gjson.Result, i int) (rank int, ok bool) {
	f := e.Get("dp_rank")
	switch f.Type {
	case gjson.Null: // absent or null
		return i, i <= maxRank
	case gjson.Number:
		return rankNumber(f.Num)
	}
	return 0, false
}

// number returns the numeric field key of object e; present is false when
// the field is absent, null or not a number.
func number(e gjson.Result, key string) (v float64, present bool) {
	f := e.Get(key)
	if f.Type != gjson.Number {
		return 0, false
	}
	return f.Num, true
}
