package contract

// Headers of the contract between duet and the Envoy configuration. Envoy
// strips every one of them from client requests before ext_proc runs (early
// header mutation), so only duet can set them.
const (
	// HeaderDecodeEndpoint names the decode host ("ip:port") for the decode
	// cluster's override_host load balancer.
	HeaderDecodeEndpoint = "x-duet-decode-endpoint"
	// HeaderPrefillEndpoint names the prefill host for the prefill cluster's
	// override_host load balancer (read on the mirrored copy).
	HeaderPrefillEndpoint = "x-duet-prefill-endpoint"
	// HeaderMirror names the cluster the route mirrors to (cluster_header);
	// absent means no mirror.
	HeaderMirror = "x-duet-mirror"
	// HeaderPrefillRank carries the prefill DP rank; the mirror policy copies
	// it into HeaderDPRank on the prefill leg only.
	HeaderPrefillRank = "x-duet-prefill-dp-rank"
	// HeaderDPRank is the engine-facing DP rank header honoured by SGLang's
	// OpenAI routes and vLLM. duet sets the decode rank on the main request.
	HeaderDPRank = "x-data-parallel-rank"
	// HeaderDecodeBodyRank carries the decode rank of a PD /generate request,
	// where SGLang ignores HeaderDPRank: a Lua filter in the decode cluster's
	// upstream chain writes it into that leg's body as routed_dp_rank (the
	// mirrored prefill leg keeps the shared body).
	HeaderDecodeBodyRank = "x-duet-decode-body-rank"
	// HeaderRequestID is the client's request id, kept for logs and
	// responses; duet sets it when the client sent none. duet never keys
	// anything by it: a client can reuse or guess another request's id.
	HeaderRequestID = "x-request-id"
	// HeaderDuetRequestID is the id duet mints for every request. It keys
	// everything duet tracks (reservations, completion feedback, aborts) and
	// is the rid SGLang knows the request by. Clients cannot set it: Envoy
	// strips every x-duet-* header from client requests.
	HeaderDuetRequestID = "x-duet-request-id"
	// HeaderPool names the pool duet routed the request to (the pool that
	// serves its body's model). With several pools, Envoy chooses the
	// pool's route by it once duet has asked for the route again
	// (clear_route_cache).
	HeaderPool = "x-duet-pool"
)

// HeaderPrefix is the prefix of every duet routing header.
const HeaderPrefix = "x-duet-"

// MetadataNamespace is the dynamic-metadata namespace duet writes (allowed
// through ext_proc's metadata_options.receiving_namespaces).
const MetadataNamespace = "duet"

// gRPC metadata the rendered bootstrap's ext_proc filter sends on every
// stream to duet (its grpc_service's initial_metadata), as Go durations:
// the filter's message_timeout, and the longest override_message_timeout
// it honours (its max_message_timeout; the message_timeout when it has
// none, since Envoy then ignores every override). duet caps a queued
// request's wait by them, so that it answers before Envoy gives up.
const (
	MetadataMessageTimeout    = "x-duet-envoy-message-timeout"
	MetadataMaxMessageTimeout = "x-duet-envoy-max-message-timeout"
)

// ClientStrippedHeaders lists the headers Envoy must remove from client
// requests before any filter runs, besides those with HeaderPrefix.
var ClientStrippedHeaders = []string{HeaderDPRank}

// Log names of the two gRPC access-log (ALS) streams Envoy opens to duet:
// LogDownstream carries one entry per client request (HCM access_log),
// LogUpstream one entry per upstream request, the prefill mirror included
// (router upstream_log). Package extproc/accesslog reads them.
const (
	LogDownstream = "duet_downstream"
	LogUpstream   = "duet_upstream"
)

// Keys in the MetadataNamespace dynamic metadata that the response
// filters (json_to_metadata, sse_to_metadata) fill with the engine's token
// usage, as numbers.
const (
	MetadataPromptTokens     = "prompt_tokens"
	MetadataCompletionTokens = "completion_tokens"
)

// Names of the engine clusters in the bootstrap `duet envoy-config` renders:
// the decode (or aggregated) pool and the prefill pool. A gateway that names
// clusters itself configures its own names (envoy.clusters).
const (
	ClusterDecode  = "duet_decode"
	ClusterPrefill = "duet_prefill"
)

// HeaderTraceParent is W3C Trace Context's header. It is no routing
// header (Envoy passes a client's on, and its tracer continues that
// trace): with duet's otlp section, Envoy's tracer sets it on each leg's
// request, naming that leg's span, and every access-log entry logs it, so
// that duet's span of the leg's end joins the leg's span.
const HeaderTraceParent = "traceparent"
