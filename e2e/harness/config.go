package harness

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// DemoOptions is the stack `make demo` runs: two prefill and two decode
// simulated engines with two DP ranks each, on duet-sim's engine model of
// a dense 8B model on one H100 per rank (a prefix cache per rank,
// cached_tokens in the usage, about 7 ms per decode step), the decode
// engines with SGLang's decode radix cache; duet logs at info and runs its
// default policies (DuetDefaultPolicies: no policy section, so least_cost
// for prefill and decode) and its default body limit (no request section).
// DecodeMsPerToken paces the simple-model engines that take these options
// (the compose stack's vLLM pool); the engine model ignores it. The compose stack in deploy/compose runs the same
// configuration (its test compares them).
func DemoOptions() Options {
	return Options{
		Prefill:             []SimSpec{{DPSize: 2, Args: demoEngineArgs()}, {DPSize: 2, Args: demoEngineArgs()}},
		Decode:              []SimSpec{{DPSize: 2, Args: demoDecodeArgs()}, {DPSize: 2, Args: demoDecodeArgs()}},
		DecodeMsPerToken:    25,
		LogLevel:            "info",
		DuetDefaultPolicies: true,
		MaxBodyBytes:        -1, // duet's default request.max_body_bytes
	}
}

// demoEngineArgs are the duet-sim flags of the demo's prefill engines:
// the calibrated engine model of a dense 8B model, one H100 per rank, in
// real time.
func demoEngineArgs() []string { return []string{"--profile", "dense-8b-h100"} }

// demoDecodeArgs are the duet-sim flags of the demo's decode engines:
// demoEngineArgs and SGLang's decode radix cache
// (--disaggregation-decode-enable-radix-cache), which keeps each rank's
// earlier prompts and answers, and which duet discovers and follows.
func demoDecodeArgs() []string {
	return append(demoEngineArgs(), "--disaggregation-decode-enable-radix-cache")
}

// withDefaults returns o with every unset field at its default.
func (o Options) withDefaults() Options {
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = 4 << 20
	}
	if o.KVTimeout == 0 {
		o.KVTimeout = 5 * time.Second
	}
	if o.DecodeMsPerToken == 0 {
		o.DecodeMsPerToken = 2
	}
	if o.LogLevel == "" {
		o.LogLevel = "debug"
	}
	if o.PrefillPolicy == "" && !o.DuetDefaultPolicies {
		o.PrefillPolicy = "round_robin"
	}
	if o.DecodePolicy == "" && !o.DuetDefaultPolicies {
		o.DecodePolicy = "round_robin"
	}
	if o.LoadInterval == 0 {
		o.LoadInterval = 200 * time.Millisecond
	}
	if o.DuetReplicas == 0 {
		o.DuetReplicas = 1
	}
	return o
}

// Addresses place a stack's parts: where each listens and how the others
// reach it. A Stack uses loopback ports; deploy/compose uses container
// addresses.
type Addresses struct {
	// DuetGRPC and DuetAdmin are duet's listen.grpc and listen.admin.
	DuetGRPC, DuetAdmin string
	// EnvoyListen and EnvoyAdmin are duet's envoy.listen and envoy.admin.
	EnvoyListen, EnvoyAdmin string
	// EnvoyDuet is duet's envoy.duet (how Envoy dials duet); empty leaves
	// duet's default, listen.grpc.
	EnvoyDuet string
	// EnvoyDuetReplicas, when set, is duet's envoy.duet_replicas: the gRPC
	// address of every duet replica, for Envoy's bootstrap.
	EnvoyDuetReplicas []string
	// Prefill and Decode are the engines' base URLs, in the order of
	// Options.Prefill and Options.Decode.
	Prefill, Decode []string
	// Credentials are the files duet's auth section and Envoy's side of it
	// name (unused under AuthNone).
	Credentials Credentials
}

// DuetConfig renders duet's YAML configuration for opts (defaults applied)
// with the parts at addrs.
func DuetConfig(opts Options, addrs Addresses) string {
	opts = opts.withDefaults()
	var b strings.Builder
	fmt.Fprintf(&b, "log_level: %s\nlisten:\n  grpc: %s\n  admin: %s\n", opts.LogLevel, addrs.DuetGRPC, addrs.DuetAdmin)
	if opts.Pprof {
		b.WriteString("  pprof: true\n")
	}
	if opts.MaxBodyBytes > 0 {
		fmt.Fprintf(&b, "request:\n  max_body_bytes: %d\n", opts.MaxBodyBytes)
	}
	fmt.Fprintf(&b, "discovery:\n  interval: %s\n  timeout: 1s\n", cmp.Or(opts.DiscoveryInterval, 2*time.Second))
	fmt.Fprintf(&b, "load:\n  interval: %s\n  timeout: 1s\n", opts.LoadInterval)
	if opts.CoverDelay > 0 {
		fmt.Fprintf(&b, "  cover_delay: %s\n", opts.CoverDelay)
	}
	if opts.PrefillPolicy != "" || opts.DecodePolicy != "" {
		b.WriteString("policy:\n")
		if opts.PrefillPolicy != "" {
			fmt.Fprintf(&b, "  prefill: %s\n", opts.PrefillPolicy)
		}
		if opts.DecodePolicy != "" {
			fmt.Fprintf(&b, "  decode: %s\n", opts.DecodePolicy)
		}
	}
	if opts.EngineRanks {
		b.WriteString("engine_ranks: true\n")
	}
	authSection, envoyAuth := authYAML(opts.Auth, addrs.Credentials)
	b.WriteString(authSection)
	fmt.Fprintf(&b, "envoy:\n  listen: %s\n  admin: %s\n", addrs.EnvoyListen, addrs.EnvoyAdmin)
	b.WriteString(envoyAuth)
	if opts.MaxRoutingRequests > 0 {
		fmt.Fprintf(&b, "  max_routing_requests: %d\n", opts.MaxRoutingRequests)
	}
	if addrs.EnvoyDuet != "" {
		fmt.Fprintf(&b, "  duet: %s\n", addrs.EnvoyDuet)
	}
	if len(addrs.EnvoyDuetReplicas) > 0 {
		fmt.Fprintf(&b, "  duet_replicas: [%s]\n", strings.Join(addrs.EnvoyDuetReplicas, ", "))
	}
	if opts.DecodeCluster != "" || opts.PrefillCluster != "" {
		b.WriteString("  clusters:\n")
		if opts.DecodeCluster != "" {
			fmt.Fprintf(&b, "    decode: %q\n", opts.DecodeCluster)
		}
		if opts.PrefillCluster != "" {
			fmt.Fprintf(&b, "    prefill: %q\n", opts.PrefillCluster)
		}
	}
	if opts.DuetYAML != "" {
		b.WriteString(strings.TrimSuffix(opts.DuetYAML, "\n") + "\n")
	}
	if len(addrs.Prefill) > 0 {
		b.WriteString("prefill:\n")
		for _, u := range addrs.Prefill {
			fmt.Fprintf(&b, "  - url: %s\n", u)
		}
	}
	b.WriteString("decode:\n")
	for _, u := range addrs.Decode {
		fmt.Fprintf(&b, "  - url: %s\n", u)
	}
	return b.String()
}

// SimArgs returns the duet-sim flags (without the program name) of one
// engine of opts (defaults applied) in mode (prefill, decode or null),
// serving its API on listen and, for a prefill, its bootstrap server on
// bootstrapPort; with opts.SimTokenizer, its --tokenizer-path. The KV
// event ports of opts.KVEvents are chosen per engine when a Stack starts,
// and are not among them.
func SimArgs(mode string, spec SimSpec, listen string, bootstrapPort int, opts Options) []string {
	return simArgs(mode, spec, listen, bootstrapPort, kvPorts{}, opts)
}

// simArgs is SimArgs with the engine's KV event ports (zero: none), and
// opts.SimTokenizer, before spec.Args.
func simArgs(mode string, spec SimSpec, listen string, bootstrapPort int, kv kvPorts, opts Options) []string {
	opts = opts.withDefaults()
	args := []string{
		"--mode", mode,
		"--listen", listen,
		"--dp-size", strconv.Itoa(max(spec.DPSize, 1)),
		"--bootstrap-port", strconv.Itoa(bootstrapPort),
		"--kv-timeout", opts.KVTimeout.String(),
		"--decode-ms-per-token", strconv.Itoa(opts.DecodeMsPerToken),
	}
	if mode == "prefill" {
		// As SGLang: a prefill answers once its decode took the KV.
		args = append(args, "--await-transfer")
	}
	args = append(args, kv.args()...)
	if opts.SimTokenizer != "" {
		args = append(args, "--tokenizer-path", opts.SimTokenizer)
	}
	return append(args, spec.Args...)
}

// EnvoyArgs returns the Envoy flags (without the program name) a stack runs
// Envoy with, on the bootstrap at configPath.
func EnvoyArgs(configPath string) []string {
	return []string{"-c", configPath, "--disable-hot-restart", "--concurrency", "1", "--log-level", "info"}
}
