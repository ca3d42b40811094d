package clustersim

import (
	"fmt"

	"gopkg.in/yaml.v3"

	"github.com/duet-router/duet/scheduler"
)

// policySection is one role's policy as duet's configuration writes it: a
// name alone, or a mapping with parameters (docs/configuration.md).
type policySection struct {
	Name              string             `yaml:"name"`
	CacheThreshold    float64            `yaml:"cache_threshold"`
	BalanceAbsTokens  int64              `yaml:"balance_abs_tokens"`
	BalanceRel        float64            `yaml:"balance_rel"`
	LoadFactor        float64            `yaml:"load_factor"`
	Weights           map[string]float64 `yaml:"weights"`
	Seed              uint64             `yaml:"seed"`
	IgnoreDecodeCache bool               `yaml:"ignore_decode_cache"`
}

// policySpec parses a bench.Policy section (YAML flow form, e.g.
// "least_tokens" or "{name: cache_aware, cache_threshold: 0.5}").
func policySpec(section string) (scheduler.PolicySpec, error) {
	var node yaml.Node
	if err := yaml.Unmarshal([]byte(section), &node); err != nil {
		return scheduler.PolicySpec{}, fmt.Errorf("policy %q: %w", section, err)
	}
	var p policySection
	if len(node.Content) == 1 && node.Content[0].Kind == yaml.ScalarNode {
		p.Name = node.Content[0].Value
	} else if err := node.Decode(&p); err != nil {
		return scheduler.PolicySpec{}, fmt.Errorf("policy %q: %w", section, err)
	}
	return scheduler.PolicySpec{
		Name: p.Name, CacheThreshold: p.CacheThreshold, BalanceAbsTokens: p.BalanceAbsTokens,
		BalanceRel: p.BalanceRel, LoadFactor: p.LoadFactor, Weights: p.Weights, Seed: p.Seed,
		IgnoreDecodeCache: p.IgnoreDecodeCache,
	}, nil
}
