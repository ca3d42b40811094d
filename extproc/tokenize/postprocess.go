package tokenize

import (
	"encoding/json"
	"fmt"
)

// postProcessorSpec is one post-processor entry; TemplateProcessing's
// single template and special tokens are read, ByteLevel's options do not
// change ids.
type postProcessorSpec struct {
	Type          string            `json:"type"`
	Processors    []json.RawMessage `json:"processors"`
	Single        []templatePiece   `json:"single"`
	SpecialTokens map[string]struct {
		IDs []int64 `json:"ids"`
	} `json:"special_tokens"`
}

// templatePiece is one element of a TemplateProcessing template: a special
// token or the sequence itself.
type templatePiece struct {
	SpecialToken *struct {
		ID string `json:"id"`
	} `json:"SpecialToken"`
	Sequence *struct {
		ID string `json:"id"`
	} `json:"Sequence"`
}

// parsePostProcessor returns the ids a single sequence gets before and
// after it when special tokens are added.
func parsePostProcessor(raw json.RawMessage) (prefix, suffix []int64, err error) {
	if isNull(raw) {
		return nil, nil, nil
	}
	var spec postProcessorSpec
	if err := json.Unmarshal(raw, &spec); err != nil {
		return nil, nil, err
	}
	switch spec.Type {
	case "ByteLevel":
		return nil, nil, nil
	case "Sequence":
		for i, r := range spec.Processors {
			p, s, err := parsePostProcessor(r)
			if err != nil {
				return nil, nil, fmt.Errorf("sequence entry %d: %w", i, err)
			}
			if len(p)+len(s) > 0 && len(prefix)+len(suffix) > 0 {
				return nil, nil, fmt.Errorf("two templates in one sequence: %w", errUnsupported)
			}
			prefix, suffix = append(prefix, p...), append(suffix, s...)
		}
		return prefix, suffix, nil
	case "TemplateProcessing":
		seen := false
		for _, piece := range spec.Single {
			switch {
			case piece.Sequence != nil:
				if seen {
					return nil, nil, fmt.Errorf("single template repeats the sequence: %w", errUnsupported)
				}
				seen = true
			case piece.SpecialToken != nil:
				tok, ok := spec.SpecialTokens[piece.SpecialToken.ID]
				if !ok {
					return nil, nil, fmt.Errorf("single template names special token %q that special_tokens lacks", piece.SpecialToken.ID)
				}
				if seen {
					suffix = append(suffix, tok.IDs...)
				} else {
					prefix = append(prefix, tok.IDs...)
				}
			}
		}
		if !seen {
			return nil, nil, fmt.Errorf("single template without the sequence: %w", errUnsupported)
		}
		return prefix, suffix, nil
	}
	return nil, nil, fmt.Errorf("type %q: %w", spec.Type, errUnsupported)
}
