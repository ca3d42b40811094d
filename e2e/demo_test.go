package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/duet-router/duet/e2e/demo/conversations"
	"github.com/duet-router/duet/e2e/harness"
	"github.com/duet-router/duet/scheduler"
)

// TestDemoConversations runs what `make demo` runs, through a real Envoy:
// its stack (harness.DemoOptions: duet with no policy or request section,
// so with its default policies and body limit; duet-sim's engine model, whose DP ranks cache
// prefixes; decode engines with SGLang's decode radix cache) and its
// conversations (package conversations). It checks the claim the demo
// prints: every conversation's turns keep one prefill target and one decode
// target, the conversations that start together get different ones, and
// every later turn reports at least the previous turn's prompt cached.
func TestDemoConversations(t *testing.T) {
	opts := harness.DemoOptions()
	cfg := harness.DuetConfig(opts, harness.Addresses{})
	if strings.Contains(cfg, "\npolicy:") {
		t.Fatalf("the demo's duet configuration sets policies; it must run duet's defaults:\n%s", cfg)
	}
	if strings.Contains(cfg, "max_body_bytes") {
		t.Fatalf("the demo's duet configuration sets request.max_body_bytes; it must run duet's default:\n%s", cfg)
	}
	s := startStack(t, opts)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	policies, err := conversations.Policies(ctx, s)
	if err != nil {
		t.Fatal(err)
	}
	if policies["prefill"] != scheduler.DefaultPrefillPolicy || policies["decode"] != scheduler.DefaultDecodePolicy {
		t.Fatalf("duet runs %v, want the defaults: prefill %s, decode %s", policies, scheduler.DefaultPrefillPolicy, scheduler.DefaultDecodePolicy)
	}

	convs := conversations.Demo()
	turns, err := conversations.Play(ctx, s, convs, func(turn conversations.Turn) {
		t.Logf("%-12s turn %d: prompt %5d cached %5d  prefill %s  decode %s",
			turn.Conversation, turn.Index, turn.PromptTokens, turn.CachedTokens, turn.Prefill, turn.Decode)
	})
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, c := range convs {
		want += len(c.Users)
	}
	if len(turns) != want {
		t.Fatalf("%d turns, want %d", len(turns), want)
	}
	for _, turn := range turns {
		if turn.CachedTokens < 0 {
			t.Errorf("%s turn %d: the engines reported no cached_tokens", turn.Conversation, turn.Index)
		}
	}
	if err := conversations.Check(turns); err != nil {
		t.Error(err)
	}
}
