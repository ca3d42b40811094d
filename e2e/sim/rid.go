package sim

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"github.com/tidwall/gjson"
)

// Messages of SGLang's rid validation (io_struct.GenerateReqInput and
// tokenizer_manager._init_req_state).
const (
	ridLengthMismatchMsg = "The specified rids length mismatch with the batch_size for batch processing."
	duplicateRIDPrefix   = "Duplicate request ID detected: "
	duplicateInBatchMsg  = "Duplicate request IDs detected within the request: "
)

// newRID returns a fresh request id like uuid.uuid4().hex: 32 lowercase
// hex characters.
func newRID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return hex.EncodeToString(b[:])
}

// parseRIDs assigns one rid per item from the body's rid field, as
// SGLang's GenerateReqInput normalization does:
//
//   - a single request takes the rid as given (a one-element list is
//     accepted too), else a random one;
//   - a batch (list text, list of input_ids lists, list prompt) expands a
//     string rid to "<rid>_<i>", takes a list as is when its length is the
//     batch size (else 400), and draws random rids without one;
//   - chat with n > 1: every sample gets a fresh random rid whatever the
//     caller sent (SGLang regenerates the rids of parallel samples).
//
// The vLLM flavour ignores the field (vLLM reads no rid from the body).
func parseRIDs(root gjson.Result, req *inferRequest, vllm bool) ([]string, *apiError) {
	n := len(req.items)
	out := make([]string, n)
	for i := range out {
		out[i] = newRID()
	}
	v := root.Get("rid")
	if vllm || !v.Exists() || v.Type == gjson.Null {
		return out, nil
	}
	var given []string
	switch {
	case v.Type == gjson.String:
		given = []string{v.String()}
	case v.IsArray():
		for _, e := range v.Array() {
			if e.Type != gjson.String {
				return nil, badRequestf("rid: Input should be a valid string, got %s", e.Raw)
			}
			given = append(given, e.String())
		}
	default:
		return nil, badRequestf("rid: Input should be a valid string or a list of strings, got %s", v.Raw)
	}
	if req.route == routeChat && n > 1 {
		// Parallel sampling: the caller's rid has no effect.
		return out, nil
	}
	if !req.batch {
		if v.IsArray() && len(given) != 1 {
			return nil, badRequestf("%s", ridLengthMismatchMsg)
		}
		out[0] = given[0]
		return out, nil
	}
	if v.Type == gjson.String {
		for i := range out {
			out[i] = given[0] + "_" + strconv.Itoa(i)
		}
		return out, nil
	}
	if len(given) != n {
		return nil, badRequestf("%s", ridLengthMismatchMsg)
	}
	if dups := duplicates(given); len(dups) > 0 {
		return nil, badRequestf("%s%s", duplicateInBatchMsg, pyList(dups))
	}
	return given, nil
}

// duplicates returns the values that occur more than once in v, in order
// of their second occurrence.
func duplicates(v []string) []string {
	seen := make(map[string]int, len(v))
	var out []string
	for _, s := range v {
		seen[s]++
		if seen[s] == 2 {
			out = append(out, s)
		}
	}
	return out
}

// pyList formats strings like Python's repr of a list of str.
func pyList(v []string) string {
	parts := make([]string, len(v))
	for i, s := range v {
		parts[i] = fmt.Sprintf("'%s'", strings.ReplaceAll(s, "'", `\'`))
	}
	return "[" + strings.Join(parts, ", ") + "]"
}
