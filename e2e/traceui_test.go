//go:build traceui

package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/duet-router/duet/e2e/harness"
)

// traceScreenshotPath is where TestTraceUI saves the trace as Jaeger's UI
// shows it (gitignored; docs/tracing.png is a copy).
const traceScreenshotPath = "../.artifacts/trace.png"

// TestTraceUI opens a PD request's trace in Jaeger's own UI, in headless
// Chromium, checks that it shows every hop (Envoy's spans, duet's decision
// with its attributes, both legs), and saves a screenshot. Jaeger's Go
// module carries no UI and no registry this project installs from has its
// built assets, so the test is not part of `make test`: it builds with the
// tag traceui (`make trace-screenshot JAEGER_UI=DIR`, docs/tracing.md) and
// fails without the assets in DUET_JAEGER_UI. TestTracing proves the same
// trace through Jaeger's query API on every run.
func TestTraceUI(t *testing.T) {
	assets := os.Getenv("DUET_JAEGER_UI")
	if assets == "" {
		t.Fatal("DUET_JAEGER_UI (built Jaeger UI assets) is not set: docs/tracing.md, \"The screenshot\"")
	}
	browser := chromium(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	j, err := harness.StartJaeger(ctx, t.TempDir(), harness.JaegerOptions{UIAssets: assets})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Stop(5 * time.Second)
	st := startPoolsStackWith(t, ctx, fmt.Sprintf("otlp: {endpoint: %q, sampling_percent: 100}\n", j.OTLPAddr))
	if resp, body := st.chat(t, ctx, requestID(t, 0), modelChat(pdModel, true), nil); resp.StatusCode != http.StatusOK {
		t.Fatalf("request: %d %s", resp.StatusCode, body)
	}
	recs, err := st.decode.Requests(ctx)
	if err != nil || len(recs) == 0 {
		t.Fatalf("decode records: %v", err)
	}
	traceID := harness.TraceID(recs[len(recs)-1].TraceParent)
	waitTrace(t, ctx, j, traceID, func(s []harness.TraceSpan) bool {
		return len(spansWhere(s, func(s harness.TraceSpan) bool { return s.Operation == "duet.route" })) > 0 &&
			len(spansWhere(s, func(s harness.TraceSpan) bool { return s.Operation == "ingress" })) > 0 &&
			len(spansWhere(s, func(s harness.TraceSpan) bool { return s.Operation == "mirror" })) > 0
	})

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.WindowSize(1500, 1080), chromedp.Flag("disable-gpu", true))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	if err := chromedp.Do(bctx, chromedp.EmulateViewport(1500, 1080), chromedp.Navigate(j.QueryURL+"/trace/"+traceID)); err != nil {
		t.Fatalf("open the trace: %v", err)
	}
	// Every hop is on the page; then duet's span is opened to show its
	// attributes.
	const shown = `(() => {
  const text = document.body.innerText;
  return ["duet-envoy", "ingress", "ExternalProcessor", "duet.route", "router duet_deepseek_decode egress", "mirror"].every(s => text.includes(s));
})()`
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](shown, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		text, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.body.innerText`))
		t.Fatalf("the trace page lacks a hop: %v\n%s", err, text)
	}
	const openDuet = `(() => {
  const name = [...document.querySelectorAll(".span-name")].find(e => e.textContent.includes("duet.route"));
  const row = name && name.closest(".span-row");
  const bar = row && row.querySelector(".span-view");
  if (!bar) return false;
  bar.click();
  return true;
})()`
	if opened, err := chromedp.Run(bctx, chromedp.Evaluate[bool](openDuet)); err != nil || !opened {
		t.Fatalf("duet's span cannot be opened: %v", err)
	}
	// The span's tags, folded in one line, are opened into their table.
	const openTags = `(() => {
  const header = [...document.querySelectorAll("[class*=AccordianKeyValues--header]")].find(e => e.textContent.startsWith("Tags"));
  if (!header) return false;
  header.click();
  return true;
})()`
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](openTags, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatalf("duet's span has no tags to open: %v", err)
	}
	const detail = `document.querySelectorAll("[class*=KeyValueTable] tr").length > 10 && document.body.innerText.includes("duet.decode.endpoint")`
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](detail, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		text, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`document.body.innerHTML`))
		if shot, err := chromedp.Run(bctx, chromedp.CaptureScreenshot()); err == nil {
			_ = os.WriteFile(strings.Replace(traceScreenshotPath, ".png", "-failed.png", 1), shot, 0o644)
		}
		t.Fatalf("duet's span shows no attributes: %v\n%s", err, text)
	}
	shot, err := chromedp.Run(bctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(traceScreenshotPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(traceScreenshotPath, shot, 0o644); err != nil {
		t.Fatal(err)
	}
}
