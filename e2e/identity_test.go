package e2e

import (
	"encoding/json"
	"sync"
	"testing"

	"github.com/duet-router/duet/e2e/harness"
)

// Two concurrent requests with the same x-request-id are two requests to
// duet: each gets its own duet id, which is also its SGLang rid, both are
// served, and each one's feedback releases only its own reservations. A
// client-chosen rid is replaced.
func TestSameClientRequestIDTwice(t *testing.T) {
	id := requestID(t, 0)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			resp, body := send(t, pd, "POST", "/v1/chat/completions", map[string]string{"x-request-id": id},
				chatBody(true, `,"rid":"chosen-by-client"`))
			if resp.StatusCode != 200 {
				t.Errorf("status %d: %s", resp.StatusCode, body)
			}
		})
	}
	wg.Wait()
	duetIDs := map[string]bool{}
	for _, group := range [][]*harness.Sim{pd.Decode, pd.Prefill} {
		for _, recs := range legs(t, group, id, 2) {
			for _, r := range recs {
				duetID := r.Headers["x-duet-request-id"]
				var body struct {
					RID string `json:"rid"`
				}
				if err := json.Unmarshal(r.Body, &body); err != nil {
					t.Fatal(err)
				}
				if duetID == "" || body.RID != duetID {
					t.Errorf("%s leg: x-duet-request-id %q, rid %q: want the same duet-minted id", r.Mode, duetID, body.RID)
				}
				duetIDs[duetID] = true
			}
		}
	}
	if len(duetIDs) != 2 {
		t.Errorf("duet ids %v: want 2, one per request (each shared by its two legs)", duetIDs)
	}
	waitReservationsDrained(t, pd)
}
