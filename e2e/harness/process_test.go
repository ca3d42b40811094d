package harness

import (
	"strings"
	"testing"
	"time"
)

// A process's extra environment reaches it, on top of the inherited one,
// and again when it restarts.
func TestProcessEnv(t *testing.T) {
	t.Setenv("DUET_HARNESS_INHERITED", "kept")
	t.Setenv("SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK", "") // whatever the runner has
	dir := t.TempDir()
	p, err := startProcessEnv(dir, "env", []string{"SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1"},
		"/bin/sh", "-c", `echo "force=$SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK inherited=$DUET_HARNESS_INHERITED"`)
	if err != nil {
		t.Fatal(err)
	}
	wait := func() {
		deadline := time.Now().Add(5 * time.Second)
		for !p.Exited() && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}
	wait()
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	wait()
	if got, want := p.Tail(1000), strings.Repeat("force=1 inherited=kept\n", 2); got != want {
		t.Errorf("log %q, want %q", got, want)
	}
	plain, err := startProcess(dir, "plain", "/bin/sh", "-c", `echo "force=$SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK"`)
	if err != nil {
		t.Fatal(err)
	}
	p = plain
	wait()
	if got := plain.Tail(1000); got != "force=\n" {
		t.Errorf("without env: log %q", got)
	}
}
