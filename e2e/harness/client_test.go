package harness

import "testing"

func TestParseEnvoyCounters(t *testing.T) {
	got, err := parseEnvoyCounters("cluster.duet_decode.upstream_rq_total: 830\ncluster.duet_prefill.upstream_rq_total: 829\nnoise\n")
	if err != nil {
		t.Fatal(err)
	}
	if got["cluster.duet_decode.upstream_rq_total"] != 830 || got["cluster.duet_prefill.upstream_rq_total"] != 829 || len(got) != 2 {
		t.Errorf("got %v", got)
	}
	if _, err := parseEnvoyCounters("cluster.x.upstream_rq_time: P0(nan,1) P25(nan,2)\n"); err == nil {
		t.Error("a histogram line parsed as a counter")
	}
}
