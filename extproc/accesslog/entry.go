package accesslog

import (
	"net"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogdatav3 "github.com/envoyproxy/go-control-plane/envoy/data/accesslog/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/duet-router/duet/envoy/contract"
)

// Keys of duet's dynamic metadata (contract.MetadataNamespace) that a
// completion reads besides the token counts: the targets extproc.Server
// chose, written as "decode" and "prefill".
const (
	metadataDecode  = "decode"
	metadataPrefill = "prefill"
)

// Clusters names the engine pools' clusters in Envoy's configuration: an
// upstream entry's cluster tells its leg.
type Clusters struct {
	// Decode is the decode (or aggregated) pool's cluster.
	Decode string
	// Prefill is the prefill pool's cluster, the mirror's target.
	Prefill string
}

// DefaultClusters are the clusters of the bootstrap `duet envoy-config`
// renders (package envoy). Gateways that name clusters themselves, such as
// Envoy Gateway, need others.
var DefaultClusters = Clusters{Decode: contract.ClusterDecode, Prefill: contract.ClusterPrefill}

// ClusterSet names the clusters of every pool (one model's engines each).
type ClusterSet []Clusters

// legOf returns the leg an entry of the named log describes, or false when
// the entry is not one duet asked for (another log, or an upstream entry of
// a cluster that is not an engine pool).
func (cs ClusterSet) legOf(logName, cluster string) (Leg, bool) {
	switch logName {
	case contract.LogDownstream:
		return LegRequest, true
	case contract.LogUpstream:
		for _, cl := range cs {
			switch cluster {
			case cl.Decode:
				return LegDecode, true
			case cl.Prefill:
				return LegPrefill, true
			}
		}
	}
	return "", false
}

// completion converts one HTTP entry of the named log, as ClusterSet's
// completion does for a single pool.
func (cl Clusters) completion(logName string, e *accesslogdatav3.HTTPAccessLogEntry) (Completion, bool) {
	return ClusterSet{cl}.completion(logName, e)
}

// completion converts one HTTP entry of the named log. ok is false when the
// entry is not one duet asked for; the returned Leg is then empty.
func (cs ClusterSet) completion(logName string, e *accesslogdatav3.HTTPAccessLogEntry) (c Completion, ok bool) {
	common := e.GetCommonProperties()
	c.Cluster = common.GetUpstreamCluster()
	if c.Leg, ok = cs.legOf(logName, c.Cluster); !ok {
		return Completion{}, false
	}
	headers := e.GetRequest().GetRequestHeaders()
	c.RequestID = headers[contract.HeaderDuetRequestID]
	c.ClientRequestID = headers[contract.HeaderRequestID]
	c.TraceParent = headers[contract.HeaderTraceParent]
	if c.ClientRequestID == "" {
		c.ClientRequestID = e.GetRequest().GetRequestId()
	}
	c.DPRank = NoRank
	if r, err := strconv.Atoi(headers[contract.HeaderDPRank]); err == nil && r >= 0 {
		c.DPRank = r
	}
	c.Upstream = hostPort(common.GetUpstreamRemoteAddress())
	c.Status = int(e.GetResponse().GetResponseCode().GetValue())
	var flagsFailed bool
	c.ResponseFlags, flagsFailed = flagString(common.GetResponseFlags())
	c.Failed = legFailed(c.Status, flagsFailed)
	c.Unreachable = unreachable(c.Status, common.GetResponseFlags())
	c.Duration = common.GetDuration().AsDuration()
	if common.GetDuration() == nil {
		// Older Envoys leave duration unset: fall back to the last byte sent.
		c.Duration = common.GetTimeToLastDownstreamTxByte().AsDuration()
	}
	if md := common.GetMetadata().GetFilterMetadata()[contract.MetadataNamespace]; md != nil {
		f := md.GetFields()
		c.PromptTokens = number(f[contract.MetadataPromptTokens])
		c.CompletionTokens = number(f[contract.MetadataCompletionTokens])
		c.DecodeTarget = f[metadataDecode].GetStringValue()
		c.PrefillTarget = f[metadataPrefill].GetStringValue()
	}
	return c, true
}

// hostPort renders a socket address as "ip:port", or "" when there is none.
func hostPort(a *corev3.Address) string {
	sa := a.GetSocketAddress()
	if sa.GetAddress() == "" {
		return ""
	}
	return net.JoinHostPort(sa.GetAddress(), strconv.FormatUint(uint64(sa.GetPortValue()), 10))
}

// number reads a metadata value written as a number (json_to_metadata's
// NUMBER type gives a float64) or, leniently, as a decimal string. Anything
// else, negative values included, reads as 0.
func number(v *structpb.Value) int64 {
	switch k := v.GetKind().(type) {
	case *structpb.Value_NumberValue:
		if k.NumberValue > 0 && k.NumberValue < 1<<63 {
			return int64(k.NumberValue)
		}
	case *structpb.Value_StringValue:
		if n, err := strconv.ParseInt(k.StringValue, 10, 64); err == nil && n > 0 {
			return n
		}
	}
	return 0
}
