package tokenize

import (
	"encoding/json"
	"fmt"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites text before it is split; nil leaves it as it is.
type normalizer []norm.Form

// apply runs the normalization forms in order.
func (n normalizer) apply(s string) string {
	for _, f := range n {
		if !f.IsNormalString(s) {
			s = f.String(s)
		}
	}
	return s
}

// normalizerSpec is one normalizer entry.
type normalizerSpec struct {
	Type        string            `json:"type"`
	Normalizers []json.RawMessage `json:"normalizers"`
}

// parseNormalizer reads the normalizer section: Unicode normal forms, or a
// Sequence of them.
func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var spec normalizerSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return nil, err
	}
	switch spec.Type {
	case "NFC":
		return normalizer{norm.NFC}, nil
	case "NFD":
		return normalizer{norm.NFD}, nil
	case "NFKC":
		return normalizer{norm.NFKC}, nil
	case "NFKD":
		return normalizer{norm.NFKD}, nil
	case "Sequence":
		var out normalizer
		for i, r := range spec.Normalizers {
			n, err := parseNormalizer(r)
			if err != nil {
				return nil, fmt.Errorf("sequence entry %d: %w", i, err)
			}
			out = append(out, n...)
		}
		return out, nil
	}
	return nil, fmt.Errorf("type %q: %w", spec.Type, errUnsupported)
}
