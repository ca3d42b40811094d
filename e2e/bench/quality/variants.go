package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/duet-router/duet/e2e/bench"
)

// Suffixes of a duet policy's name that run it with the -tokenizer: on
// token ids with duet's own prefix index (kv_events off), or on the
// engines' KV events.
const (
	suffixTokens = "+tokens"
	suffixEvents = "+events"
)

// suffixNoQueue, last in a duet policy's name, runs it with duet's
// admission queue off (admission.enabled: false), e.g.
// least_cost+noqueue or least_cost+events+noqueue.
const suffixNoQueue = "+noqueue"

// selectPolicies is bench.SelectRoutings that also knows the +tokens and
// +events variants of a duet policy (e.g. least_cost+events), which need
// the tokenizer directory tok (pageSize is the engines' page size), and
// the +noqueue variant of any duet policy.
func selectPolicies(names []string, tok string, pageSize int) ([]bench.Policy, error) {
	var plain []string
	variants := map[int]string{} // position in names -> suffix
	noQueue := map[int]bool{}
	for i, n := range names {
		if base, ok := strings.CutSuffix(n, suffixNoQueue); ok && base != "" {
			noQueue[i], n = true, base
		}
		for _, suffix := range []string{suffixTokens, suffixEvents} {
			if base, ok := strings.CutSuffix(n, suffix); ok && base != "" {
				variants[i] = suffix
				n = base
				break
			}
		}
		plain = append(plain, n)
	}
	if len(variants) > 0 && tok == "" {
		return nil, fmt.Errorf("policies %s need -tokenizer", strings.Join(variantNames(names, variants), ", "))
	}
	if len(plain) == 0 {
		return bench.SelectRoutings(nil)
	}
	var out []bench.Policy
	for i, n := range plain {
		ps, err := bench.SelectRoutings([]string{n})
		if err != nil {
			return nil, err
		}
		suffix, ok := variants[i]
		if !ok && !noQueue[i] {
			out = append(out, ps...)
			continue
		}
		for _, p := range ps {
			if p.Router != "" {
				return nil, fmt.Errorf("policy %s: %s routes without duet, so without duet's tokenizer or admission queue", names[i], p.Name)
			}
			p.Name, p.Label = names[i], ""
			if ok {
				p.DuetYAML = tokenizerYAML(tok, pageSize, suffix == suffixEvents)
			}
			p.AdmissionOff = noQueue[i]
			out = append(out, p)
		}
	}
	return out, nil
}

// variantNames lists the names at the variants' positions.
func variantNames(names []string, variants map[int]string) []string {
	var out []string
	for i, n := range names {
		if _, ok := variants[i]; ok {
			out = append(out, n)
		}
	}
	return out
}

// tokenizerYAML is duet's configuration for a variant: the tokenizer in
// tok (pages of pageSize tokens, the engines'), and kv_events in mode
// auto (which follows the engines' events in a pool with a tokenizer)
// when events is set, else off.
func tokenizerYAML(tok string, pageSize int, events bool) string {
	mode := "off"
	if events {
		mode = "auto"
	}
	return fmt.Sprintf("tokenizer:\n  file: %s\n  config: %s\n  page_size: %d\nkv_events:\n  mode: %s\n",
		filepath.Join(tok, "tokenizer.json"), filepath.Join(tok, "tokenizer_config.json"), pageSize, mode)
}

// repeatPolicies returns ps n times in a row, run k > 1 of each named
// NAME#k, so that a plan runs every policy n times interleaved.
func repeatPolicies(ps []bench.Policy, n int) []bench.Policy {
	out := append([]bench.Policy{}, ps...)
	for k := 2; k <= n; k++ {
		for _, p := range ps {
			p.Name = fmt.Sprintf("%s#%d", p.Name, k)
			if p.Label != "" {
				p.Label = fmt.Sprintf("%s#%d", p.Label, k)
			}
			out = append(out, p)
		}
	}
	return out
}

// resolveTokenizer returns the absolute tokenizer directory that spec
// names ("" for none): a directory, or a family under $DUET_TOKENIZERS_DIR
// or else .tools/tokenizers. It must hold tokenizer.json and
// tokenizer_config.json.
func resolveTokenizer(spec string) (string, error) {
	if spec == "" {
		return "", nil
	}
	dir := spec
	if !strings.ContainsRune(spec, filepath.Separator) {
		root := os.Getenv("DUET_TOKENIZERS_DIR")
		if root == "" {
			root = filepath.Join(".tools", "tokenizers")
		}
		dir = filepath.Join(root, spec)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("-tokenizer %s: %w", spec, err)
	}
	var missing []error
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		if _, err := os.Stat(filepath.Join(abs, f)); err != nil {
			missing = append(missing, err)
		}
	}
	if len(missing) > 0 {
		return "", fmt.Errorf("-tokenizer %s (make tokenizers installs qwen3, llama3_1 and deepseek_v3): %w", spec, errors.Join(missing...))
	}
	return abs, nil
}

// tokenizerLines describe what -tokenizer changes, for the report's setup.
func tokenizerLines(spec string, pageSize int) []string {
	return []string{
		fmt.Sprintf("every engine, in every case, tokenizes with `%s` (`--tokenizer-path`: chat prompts keyed and counted by the token ids duet computes) "+
			"and publishes KV events (`--kv-events-config '{\"publisher\":\"zmq\",\"endpoint\":\"tcp://*:PORT\",\"replay_endpoint\":\"tcp://*:RPORT\"}'`, "+
			"a PUB and a replay port range of its own, advertised in /server_info)", spec),
		fmt.Sprintf("duet per policy: a bare name runs without a tokenizer (the text prefix index and character estimate; kv_events auto follows nothing without one); "+
			"`%s` adds `tokenizer: {file, config, page_size: %d}` with `kv_events: {mode: off}` (duet's prefix index on token blocks); "+
			"`%s` the same tokenizer with `kv_events: {mode: auto}` (the engines' events, where a rank's view is live)", suffixTokens, pageSize, suffixEvents),
	}
}
