package sim

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// latencyStage is one of SGLang's request stages (RequestStage in
// python/sglang/srt/managers/schedule_batch.py; the metrics are observed
// by metric_trace_slice_end in req_time_stats.py) that the engine model
// times. Its value is SGLang's stage label.
type latencyStage string

// The stages the engine model observes; MODEL.md maps them to the model.
const (
	// latPrefillBootstrap: a PD prefill's bootstrap queue, from arrival
	// until its decode preallocated the KV and sent the transfer metadata
	// (the request then enters the waiting queue).
	latPrefillBootstrap latencyStage = "prefill_bootstrap"
	// latPrefillWaiting: the waiting queue until the request's first
	// prefill step starts (prefill and aggregated servers).
	latPrefillWaiting latencyStage = "prefill_waiting"
	// latPrefillForward: the first prefill step's start until the end of
	// the step that completes the prompt (every chunk included).
	latPrefillForward latencyStage = "prefill_forward"
	// latPrefillTransfer: a PD prefill's KV transfer, from the end of its
	// prefill until the transfer ends.
	latPrefillTransfer latencyStage = "prefill_transfer_kv_cache"
	// latDecodeBootstrap: a PD decode's prealloc queue, from arrival until
	// its KV is preallocated.
	latDecodeBootstrap latencyStage = "decode_bootstrap"
	// latDecodeTransferred: a PD decode's transfer queue, from
	// preallocation until the prefill's KV arrived.
	latDecodeTransferred latencyStage = "decode_transferred"
	// latDecodeWaiting: a PD decode's waiting queue, from the KV's arrival
	// until the request joins a decode batch (its first token).
	latDecodeWaiting latencyStage = "decode_waiting"
)

// stageSink receives a request's stage latency on a rank, in model time.
type stageSink func(rank int, stage latencyStage, d time.Duration)

// observeStage reports that q spent d in stage (nothing without a sink).
func (c *engineCore) observeStage(q *engineRequest, stage latencyStage, d time.Duration) {
	if c.stages != nil {
		c.stages(q.rank, stage, d)
	}
}

// stageHistogram is SGLang's sglang:per_stage_req_latency_seconds: the
// per-rank labels of the other scheduler metrics plus stage, SGLang's
// buckets (exponential from 1 ms, factor 1.62, 30 buckets), observed in
// model seconds.
type stageHistogram struct {
	vec    *prometheus.HistogramVec
	engine string
	model  string
	dpSize int
}

// newStageHistogram builds the histogram for a server of cfg.
func newStageHistogram(cfg Config) *stageHistogram {
	return &stageHistogram{
		vec: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sglang:per_stage_req_latency_seconds",
			Help:    "The latency of each stage of requests.",
			Buckets: prometheus.ExponentialBuckets(0.001, 1.62, 30),
		}, append(metricLabels(cfg.DPSize), "stage")),
		engine: cfg.Mode.engineType(),
		model:  cfg.Model,
		dpSize: cfg.DPSize,
	}
}

// observe is the engine's stageSink.
func (h *stageHistogram) observe(rank int, stage latencyStage, d time.Duration) {
	labels := []string{h.engine, h.model, "0", "0", string(stage)}
	if h.dpSize > 1 {
		labels = append([]string{strconv.Itoa(rank)}, labels...)
	}
	h.vec.WithLabelValues(labels...).Observe(d.Seconds())
}
