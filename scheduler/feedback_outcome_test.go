package scheduler

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// duet_feedback_total tells a leg's entry that comes after the whole
// request's (Envoy flushes the two logs separately) from one about a
// request the ledger never held or has forgotten.
func TestFeedbackOutcomes(t *testing.T) {
	type step struct {
		id   string
		role Role
	}
	tests := []struct {
		name string
		// steps are completed in order after request "r" was picked; the
		// last one's outcome is checked.
		steps []step
		// after is how long after the previous steps the last one comes.
		after time.Duration
		want  string
	}{
		{"leg before the request", []step{{"r", RoleDecode}}, 0, OutcomeReleased},
		{"request after its leg", []step{{"r", RoleDecode}, {"r", ""}}, 0, OutcomeReleased},
		{"leg after the request", []step{{"r", ""}, {"r", RoleDecode}}, 0, OutcomeAlreadyReleased},
		{"leg just within the grace", []step{{"r", ""}, {"r", RoleDecode}}, finishedGrace, OutcomeAlreadyReleased},
		{"request entry repeated", []step{{"r", ""}, {"r", ""}}, time.Second, OutcomeAlreadyReleased},
		{"leg after the grace", []step{{"r", ""}, {"r", RoleDecode}}, finishedGrace + time.Second, OutcomeUnknownRequest},
		{"an id never picked", []step{{"forged", RoleDecode}}, 0, OutcomeUnknownRequest},
		{"a request never picked", []step{{"forged", ""}}, 0, OutcomeUnknownRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := leastTokensScheduler(t, 1, 2, prometheus.NewRegistry())
			clock := newFakeClock()
			s.now = clock.now
			s.ledger.now = clock.now
			if _, err := s.Pick(testContext(t), &Request{ID: "r", Prompt: []byte("hello")}); err != nil {
				t.Fatal(err)
			}
			for i, st := range tt.steps {
				if i == len(tt.steps)-1 {
					clock.advance(tt.after)
				}
				before := testutil.ToFloat64(s.metrics.feedback.WithLabelValues(roleLabel(st.role), tt.want))
				s.Complete(Feedback{RequestID: st.id, Role: st.role, Rank: NoRank})
				if i < len(tt.steps)-1 {
					continue
				}
				if got := testutil.ToFloat64(s.metrics.feedback.WithLabelValues(roleLabel(st.role), tt.want)) - before; got != 1 {
					for _, o := range []string{OutcomeReleased, OutcomeAlreadyReleased, OutcomeUnknownRequest} {
						t.Logf("%s %s = %v", roleLabel(st.role), o, testutil.ToFloat64(s.metrics.feedback.WithLabelValues(roleLabel(st.role), o)))
					}
					t.Fatalf("the last entry was not counted as %s", tt.want)
				}
			}
		})
	}
}
