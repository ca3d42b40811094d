package e2e

import (
	"bytes"
	"context"
	"fmt"
	"image"
	"image/png"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/duet-router/duet/e2e/harness"
)

// screenshotPath is where TestStatusPage saves the page under load
// (gitignored); the page with an engine ejected goes next to it, as
// status-page-ejected.png.
const screenshotPath = "../.artifacts/status-page.png"

// chromium returns the path of a headless-capable Chromium or Chrome:
// $DUET_CHROMIUM, else the first of the usual names on PATH. Without one
// the test is skipped, except in CI (CI set), where it fails.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("DUET_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome-stable", "google-chrome", "chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") != "" {
		t.Fatal("no Chromium on PATH (CI is set: .ci/run installs the Debian package chromium)")
	}
	t.Skip("no Chromium on PATH: apt-get install chromium, or set DUET_CHROMIUM")
	return ""
}

// statusJSON is the part of GET /status.json (docs/status-page.md) the
// test reads, decoded independently of the server's types.
type statusJSON struct {
	Time  time.Time `json:"time"`
	Roles []struct {
		Role           string   `json:"role"`
		Policy         string   `json:"policy"`
		TokenImbalance *float64 `json:"token_imbalance"`
		PicksPerSecond *float64 `json:"picks_per_second"`
		SaturatedRanks int      `json:"saturated_ranks"`
		PickableRanks  int      `json:"pickable_ranks"`
	} `json:"roles"`
	Endpoints []struct {
		Role   string `json:"role"`
		URL    string `json:"url"`
		Health struct {
			State string `json:"state"`
		} `json:"health"`
		Address       string     `json:"address"`
		DPSize        int        `json:"dp_size"`
		BootstrapPort int        `json:"bootstrap_port"`
		DecodeCache   string     `json:"decode_cache"`
		Ranks         []rankJSON `json:"ranks"`
	} `json:"endpoints"`
	Decisions []struct {
		RequestID string `json:"request_id"`
		Prefill   *struct {
			Target string `json:"target"`
		} `json:"prefill"`
		Decode *struct {
			Target string `json:"target"`
		} `json:"decode"`
	} `json:"decisions"`
	Pools []struct {
		Admission *struct {
			Open   bool `json:"open"`
			Queued int  `json:"queued"`
		} `json:"admission"`
	} `json:"pools"`
}

// rankJSON is one rank in statusJSON.
type rankJSON struct {
	Rank           *int   `json:"rank"`
	Target         string `json:"target"`
	Tokens         int64  `json:"tokens"`
	ScrapedTokens  int64  `json:"scraped_tokens"`
	ReservedTokens int64  `json:"reserved_tokens"`
	LoadFresh      bool   `json:"load_fresh"`
	Picks          int64  `json:"picks"`
	PrefixBlocks   int64  `json:"prefix_blocks"`
	KVEvents       *struct {
		State  string `json:"state"`
		Blocks int64  `json:"blocks"`
	} `json:"kv_events"`
}

// pageView is what the browser shows at one instant: the JSON the page
// rendered last and the DOM it rendered from it, read in one evaluation.
type pageView struct {
	Updates int        `json:"updates"`
	State   statusJSON `json:"state"`
	Ranks   []struct {
		Target   string `json:"target"`
		Rank     string `json:"rank"`
		Tokens   string `json:"tokens"`
		Scraped  string `json:"scraped"`
		Reserved string `json:"reserved"`
		Picks    string `json:"picks"`
		Prefix   string `json:"prefix"`
		Events   string `json:"events"` // the prefix cell's KV-event detail
		Cache    string `json:"cache"`  // the decode cache cell (decode ranks)
		Health   string `json:"health"`
		Bar      rect   `json:"bar"`
		Blue     rect   `json:"blue"`
		Orange   rect   `json:"orange"`
		Green    rect   `json:"green"`
	} `json:"ranks"`
	Endpoints []string `json:"endpoints"` // endpoint rows' text
	Decisions []struct {
		RequestID string `json:"rid"`
		Prefill   string `json:"prefill"`
		Decode    string `json:"decode"`
	} `json:"decisions"`
	Imbalance map[string]string `json:"imbalance"` // role -> the token imbalance figure
	Header    string            `json:"header"`    // the header's text (admission's queue line)
	Stats     []string          `json:"stats"`     // every role figure's text
}

// rect is an element's box in CSS pixels (the device pixel ratio is 1).
type rect struct{ X, Y, W, H float64 }

// readView reads the page; it is one JavaScript evaluation, so no poll
// re-renders the page in the middle.
const readView = `(() => {
  const box = e => { if (!e) return {X:0,Y:0,W:0,H:0}; const r = e.getBoundingClientRect(); return {X:r.x, Y:r.y, W:r.width, H:r.height}; };
  const text = (row, sel) => row.querySelector(sel).textContent;
  return {
    updates: Number(document.body.dataset.updates || 0),
    state: window.duetStatus || null,
    ranks: [...document.querySelectorAll("tr.rank")].map(r => ({
      target: r.dataset.target, rank: text(r, "td.name"), tokens: text(r, "td.tokens"), scraped: text(r, "td.scraped"),
      reserved: text(r, "td.reserved"), picks: text(r, "td.picks"), prefix: r.querySelector("td.prefix").firstChild.textContent,
      events: r.querySelector("td.prefix .detail")?.textContent || "", cache: r.querySelector("td.decode-cache")?.textContent || "", health: text(r, "td.health"),
      bar: box(r.querySelector(".bar")), blue: box(r.querySelector(".bar .scraped")),
      orange: box(r.querySelector(".bar .reserved")), green: box(r.querySelector(".bar .rate")),
    })),
    endpoints: [...document.querySelectorAll("tr.endpoint")].map(r => r.textContent),
    decisions: [...document.querySelectorAll("tr.decision")].map(r => ({
      rid: text(r, "td.rid"), prefill: r.querySelector("td.prefill .target")?.textContent, decode: r.querySelector("td.decode .target")?.textContent,
    })),
    imbalance: Object.fromEntries([...document.querySelectorAll("[id^=imbalance-]")].map(e => [e.id.slice(10), e.textContent])),
    header: document.querySelector("header")?.textContent || "",
    stats: [...document.querySelectorAll(".stat")].map(e => e.textContent),
  };
})()`

// statusPageOptions is TestStatusPage's stack, the one docs/status-page.png
// shows: duet on its defaults (no policy section, so least_cost on both
// roles; admission on; load.interval 1s), one prefill and two decode
// engines of two DP ranks on duet-sim's engine model (as the demo's), the
// decode engines with SGLang's decode radix cache, and every engine
// publishing KV events that duet follows, through Qwen3's tokenizer (the
// fixture in tokenizers: `make tokenizers`).
func statusPageOptions(tokenizers string) harness.Options {
	dir := filepath.Join(tokenizers, "qwen3")
	engine := []string{"--profile", "dense-8b-h100"}
	decode := append(slices.Clone(engine), "--disaggregation-decode-enable-radix-cache")
	return harness.Options{
		Prefill:             []harness.SimSpec{{DPSize: 2, Args: engine}},
		Decode:              []harness.SimSpec{{DPSize: 2, Args: decode}, {DPSize: 2, Args: decode}},
		DuetDefaultPolicies: true,
		MaxBodyBytes:        -1,
		LoadInterval:        time.Second,
		LogLevel:            "info",
		KVTimeout:           30 * time.Second,
		KVEvents:            true,
		SimTokenizer:        dir,
		DuetYAML: fmt.Sprintf("tokenizer:\n  file: %s\n  config: %s\n  page_size: 16\n",
			filepath.Join(dir, "tokenizer.json"), filepath.Join(dir, "tokenizer_config.json")),
	}
}

// tokenizersDir is the directory of the tokenizer fixtures:
// DUET_TOKENIZERS_DIR (set by the Makefile), else .tools/tokenizers, where
// `make tokenizers` puts them. Missing, the test fails and says so.
func tokenizersDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("DUET_TOKENIZERS_DIR")
	if dir == "" {
		dir = filepath.Join("..", ".tools", "tokenizers")
	}
	if _, err := os.Stat(filepath.Join(dir, "qwen3", "tokenizer.json")); err != nil {
		t.Fatalf("no Qwen3 tokenizer fixture: %v (run `make tokenizers`)", err)
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		t.Fatal(err)
	}
	return abs
}

// TestStatusPage drives the live status page in headless Chromium against
// a PD stack under load (statusPageOptions: duet's defaults, decode
// engines with a decode radix cache, KV events): it waits for live data
// (loads on the ranks, pick rates, decisions, a rank whose KV events are
// live), checks the DOM against the JSON it was rendered from and that the
// decode-cache, KV-event and admission views show, checks a screenshot's
// pixels where the DOM says the rank bars are, and once the traffic
// stopped, checks the page against a /status.json of its own. Then a
// decode engine dies (the page shows it ejected), and duet stops (the page
// says it lost the connection).
func TestStatusPage(t *testing.T) {
	browser := chromium(t)
	s := startStack(t, statusPageOptions(tokenizersDir(t)))
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()

	// Eight clients of four teams keep streaming 300-token chats until
	// told to stop.
	load, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var clients sync.WaitGroup
	for c := range 8 {
		clients.Go(func() {
			for i := 0; load.Err() == nil; i++ {
				statusChat(load, s.EnvoyURL, c%4, c*100000+i)
			}
		})
	}
	defer clients.Wait()

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.NoSandbox,
		chromedp.WindowSize(1440, 1000), chromedp.Flag("disable-gpu", true))
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	bctx, cancelBrowser := chromedp.NewContext(allocCtx)
	defer cancelBrowser()
	if err := chromedp.Do(bctx, chromedp.EmulateViewport(1440, 1000), chromedp.Navigate(s.DuetAdminURL+"/status")); err != nil {
		t.Fatalf("open the page: %v", err)
	}

	// Live data: both roles have pick rates, some rank has scraped tokens,
	// some reserved ones and prefix blocks, each bar colour covers at least
	// 10 px, and decisions are listed. The screenshot is kept only if no
	// poll re-rendered the page while it was taken.
	const live = `(() => {
  const s = window.duetStatus;
  if (!s || Number(document.body.dataset.updates) < 3 || document.querySelectorAll("tr.decision").length < 4) return false;
  const ranks = s.endpoints.flatMap(e => e.ranks);
  const width = sel => [...document.querySelectorAll(sel)].reduce((w, e) => w + e.getBoundingClientRect().width, 0);
  return width(".bar .scraped") >= 10 && width(".bar .reserved") >= 10 && width(".bar .rate") >= 10 && s.roles.length === 2 && s.roles.every(r => r.picks_per_second > 0) &&
    ranks.some(r => r.scraped_tokens > 0) && ranks.some(r => r.reserved_tokens > 0) && ranks.some(r => r.prefix_blocks > 0) &&
    ranks.filter(r => r.picks_per_second > 0).length >= 4 && ranks.some(r => r.kv_events && r.kv_events.state === "live" && r.kv_events.blocks > 0);
})()`
	var view pageView
	var shot []byte
	for attempt := 0; ; attempt++ {
		if attempt == 20 {
			t.Fatal("the page kept re-rendering during the screenshot")
		}
		if _, err := chromedp.Run(bctx, chromedp.Poll[bool](live, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(60*time.Second))); err != nil {
			v, _ := chromedp.Run(bctx, chromedp.Evaluate[pageView](readView))
			t.Fatalf("no live data on the page: %v; last state %+v", err, v.State)
		}
		var err error
		if view, err = chromedp.Run(bctx, chromedp.Evaluate[pageView](readView)); err != nil {
			t.Fatalf("read the page: %v", err)
		}
		if shot, err = chromedp.Run(bctx, chromedp.CaptureScreenshot()); err != nil {
			t.Fatalf("screenshot: %v", err)
		}
		after, err := chromedp.Run(bctx, chromedp.Evaluate[int](`Number(document.body.dataset.updates)`))
		if err != nil {
			t.Fatal(err)
		}
		if after == view.Updates {
			break
		}
	}
	if err := os.MkdirAll(filepath.Dir(screenshotPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(screenshotPath, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", screenshotPath, len(shot))

	checkRendering(t, view)
	checkViews(t, view)
	checkScreenshot(t, shot, view)

	// Without traffic, picks and decisions stand still: the page must show
	// what /status.json says.
	stopLoad()
	clients.Wait()
	var fetched statusJSON
	if err := harness.GetJSON(ctx, s.DuetAdminURL+"/status.json", &fetched); err != nil {
		t.Fatal(err)
	}
	for {
		v, err := chromedp.Run(bctx, chromedp.Evaluate[pageView](readView))
		if err != nil {
			t.Fatal(err)
		}
		if v.State.Time.After(fetched.Time) {
			view = v
			break
		}
		select {
		case <-ctx.Done():
			t.Fatal("the page stopped updating")
		case <-time.After(100 * time.Millisecond):
		}
	}
	checkRendering(t, view)
	checkAgainst(t, view, fetched)

	// A decode engine dies: its failing scrapes and legs eject it, and the
	// page shows it ejected and its ranks out of the balance.
	dead := s.Decode[1]
	dead.Kill()
	for i := range 4 {
		harness.Chat(ctx, httpClient, s.EnvoyURL, 900000+i, false, 5)
	}
	ejected := fmt.Sprintf(`(() => {
  const row = document.querySelector('tr.endpoint[data-url=%q]');
  const ranks = [...document.querySelectorAll("#role-decode tr.rank")];
  const stat = [...document.querySelectorAll("#role-decode .stat")].find(e => e.textContent.startsWith("pickable ranks"));
  return row && row.classList.contains("ejected") && row.textContent.includes("ejected") &&
    ranks.filter(r => r.classList.contains("ejected")).length === 2 &&
    stat && stat.textContent.endsWith("2 / 4") && stat.querySelector(".value").classList.contains("bad");
})()`, dead.URL)
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](ejected, chromedp.WithPollingTimeout(30*time.Second))); err != nil {
		v, _ := chromedp.Run(bctx, chromedp.Evaluate[pageView](readView))
		t.Fatalf("the page never showed %s ejected: %v; endpoint rows %q", dead.URL, err, v.Endpoints)
	}
	if shot, err := chromedp.Run(bctx, chromedp.CaptureScreenshot()); err == nil {
		_ = os.WriteFile(strings.Replace(screenshotPath, ".png", "-ejected.png", 1), shot, 0o644)
	}
	if err := harness.GetJSON(ctx, s.DuetAdminURL+"/status.json", &fetched); err != nil {
		t.Fatal(err)
	}
	for _, e := range fetched.Endpoints {
		if e.URL == dead.URL && e.Health.State != "ejected" {
			t.Errorf("/status.json: %s health %+v while the page shows it ejected", e.URL, e.Health)
		}
	}

	// duet goes away: the page says so instead of showing stale numbers as
	// live.
	if err := s.Duet.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	const down = `document.getElementById("conn").className === "down" && document.getElementById("conn").textContent.startsWith("disconnected")`
	if _, err := chromedp.Run(bctx, chromedp.Poll[bool](down, chromedp.WithPollingTimeout(10*time.Second))); err != nil {
		t.Fatalf("the page did not report the lost connection: %v", err)
	}
}

// systemPrompt is the system prompt of a team's chats: shared by the
// team, so that the prefix index fills and decisions show prefix matches,
// and different between teams, so that their prompts spread over the
// prefill ranks.
func systemPrompt(team int) string {
	return strings.Repeat(fmt.Sprintf("You are a concise assistant who explains disaggregated LLM serving to team %d. ", team), 24)
}

// statusChat streams one 300-token chat with its team's system prompt and
// reads the answer to its end (or until ctx ends).
func statusChat(ctx context.Context, baseURL string, team, i int) {
	body := fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"system","content":%q},{"role":"user","content":"Question %d"}],"max_tokens":300,"stream":true}`,
		systemPrompt(team), i)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set("content-type", "application/json")
	resp, err := httpClient.Do(req)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
}

// checkRendering checks that the DOM shows the JSON the page rendered.
func checkRendering(t *testing.T, v pageView) {
	t.Helper()
	endpoints := v.State.Endpoints
	ranks := map[string]rankJSON{}
	for _, e := range endpoints {
		for _, r := range e.Ranks {
			ranks[r.Target] = r
		}
	}
	if len(endpoints) != 3 || len(ranks) != 6 || len(v.Ranks) != 6 || len(v.Endpoints) != 3 {
		t.Fatalf("%d endpoints with %d ranks in the JSON, %d endpoint rows and %d rank rows on the page; want 3 and 6",
			len(endpoints), len(ranks), len(v.Endpoints), len(v.Ranks))
	}
	for i, e := range endpoints {
		row := v.Endpoints[i]
		want := []string{e.URL, e.Address, fmt.Sprintf("dp %d", e.DPSize)}
		if e.Role == "prefill" {
			want = append(want, fmt.Sprintf("bootstrap %d", e.BootstrapPort))
		}
		for _, w := range want {
			if !strings.Contains(row, w) {
				t.Errorf("endpoint row %q lacks %q", row, w)
			}
		}
		if e.DPSize != 2 || (e.Role == "prefill" && e.BootstrapPort == 0) {
			t.Errorf("endpoint %+v: want dp 2 and, on prefill, a bootstrap port", e)
		}
	}
	num := func(n int64) string { return commas(n) }
	for _, row := range v.Ranks {
		r, ok := ranks[row.Target]
		if !ok {
			t.Errorf("rank row %s is not in the JSON", row.Target)
			continue
		}
		wantScraped := num(r.ScrapedTokens)
		if !r.LoadFresh {
			wantScraped = "stale"
		}
		got := [6]string{row.Rank, row.Tokens, row.Scraped, row.Reserved, row.Picks, row.Prefix}
		want := [6]string{fmt.Sprintf("dp%d", *r.Rank), num(r.Tokens), wantScraped, num(r.ReservedTokens), num(r.Picks), num(r.PrefixBlocks)}
		if got != want {
			t.Errorf("%s: page shows rank, tokens, scraped, reserved, picks, prefix = %q, JSON says %q", row.Target, got, want)
		}
		if row.Health != "healthy" {
			t.Errorf("%s: health %q", row.Target, row.Health)
		}
		wantEvents := ""
		if r.KVEvents != nil {
			wantEvents = fmt.Sprintf(" · events %s %s", num(r.KVEvents.Blocks), r.KVEvents.State)
		}
		if row.Events != wantEvents {
			t.Errorf("%s: page shows KV events %q, JSON says %q", row.Target, row.Events, wantEvents)
		}
	}
	if len(v.Decisions) != len(v.State.Decisions) || len(v.Decisions) == 0 {
		t.Fatalf("%d decision rows, %d decisions in the JSON", len(v.Decisions), len(v.State.Decisions))
	}
	for i, d := range v.State.Decisions {
		row := v.Decisions[i]
		if d.Prefill == nil || d.Decode == nil || row.RequestID != d.RequestID || row.Prefill != d.Prefill.Target || row.Decode != d.Decode.Target {
			t.Errorf("decision row %d = %+v, JSON %+v", i, row, d)
		}
	}
	for _, role := range v.State.Roles {
		want := "idle"
		if role.TokenImbalance != nil {
			want = fmt.Sprintf("%.2f", *role.TokenImbalance)
		}
		if got := v.Imbalance[role.Role]; got != want {
			t.Errorf("%s token imbalance shows %q, JSON says %s", role.Role, got, want)
		}
	}
}

// checkViews checks that the page shows what docs/status-page.png is
// meant to: duet's default policies, the decode engines' decode radix
// cache, every rank following KV events (one of them live), and the
// admission queue in the header and the saturated-ranks figures.
func checkViews(t *testing.T, v pageView) {
	t.Helper()
	for _, role := range v.State.Roles {
		if role.Policy != "least_cost" {
			t.Errorf("%s runs %s, want duet's default least_cost", role.Role, role.Policy)
		}
	}
	decode := map[string]bool{} // decode rank targets
	for i, e := range v.State.Endpoints {
		if e.Role != "decode" {
			continue
		}
		if e.DecodeCache != "radix" || !strings.Contains(v.Endpoints[i], "decode cache radix") {
			t.Errorf("decode endpoint %s: decode cache %q, row %q; want radix shown", e.URL, e.DecodeCache, v.Endpoints[i])
		}
		for _, r := range e.Ranks {
			decode[r.Target] = true
		}
	}
	live := 0
	for _, row := range v.Ranks {
		if row.Events == "" {
			t.Errorf("%s: the page shows no KV events", row.Target)
		}
		if strings.HasSuffix(row.Events, " live") {
			live++
		}
		if decode[row.Target] && !strings.HasPrefix(row.Cache, "radix") {
			t.Errorf("%s: no decode cache cell", row.Target)
		}
	}
	if live == 0 {
		t.Error("no rank's KV events are live on the page")
	}
	if len(v.State.Pools) != 1 || v.State.Pools[0].Admission == nil || !strings.Contains(v.Header, " queued") {
		t.Errorf("admission: JSON %+v, header %q; want the queue shown", v.State.Pools, v.Header)
	}
	saturated := 0
	for _, s := range v.Stats {
		if strings.HasPrefix(s, "saturated ranks") {
			saturated++
		}
	}
	if saturated != 2 {
		t.Errorf("%d saturated-ranks figures, want one per role: %q", saturated, v.Stats)
	}
}

// checkScreenshot decodes the PNG and checks it is the viewport, that it
// is not blank, and that the rank bars' colours are where the DOM has the
// bars, in the proportions the DOM gives them.
func checkScreenshot(t *testing.T, shot []byte, v pageView) {
	t.Helper()
	img, err := png.Decode(bytes.NewReader(shot))
	if err != nil {
		t.Fatalf("the screenshot is not a PNG: %v", err)
	}
	if b := img.Bounds(); b.Dx() != 1440 || b.Dy() != 1000 {
		t.Fatalf("screenshot is %dx%d, want 1440x1000", b.Dx(), b.Dy())
	}
	// Not blank: a good share of the pixels are not the white background.
	b := img.Bounds()
	inked := 0
	for y := b.Min.Y; y < b.Max.Y; y++ {
		for x := b.Min.X; x < b.Max.X; x++ {
			if r, g, bl, _ := img.At(x, y).RGBA(); r>>8 < 235 || g>>8 < 235 || bl>>8 < 235 {
				inked++
			}
		}
	}
	if share := float64(inked) / float64(b.Dx()*b.Dy()); share < 0.03 {
		t.Errorf("only %.1f%% of the screenshot is not background", 100*share)
	}
	colours := []struct {
		name    string
		rgb     [3]uint8
		segment func(i int) rect
	}{
		{"scraped (blue)", [3]uint8{0x2f, 0x6f, 0xdf}, func(i int) rect { return v.Ranks[i].Blue }},
		{"reserved (orange)", [3]uint8{0xf2, 0x9d, 0x38}, func(i int) rect { return v.Ranks[i].Orange }},
		{"picks (green)", [3]uint8{0x2e, 0x9e, 0x6a}, func(i int) rect { return v.Ranks[i].Green }},
	}
	for _, c := range colours {
		var want, got float64
		for i := range v.Ranks {
			seg := c.segment(i)
			want += seg.W * seg.H
			got += float64(countColour(img, seg, c.rgb))
		}
		if want < 50 {
			t.Errorf("%s: the DOM's bars have only %.0f px of it", c.name, want)
			continue
		}
		// Segment edges fall on fractional pixels: allow them.
		if got < 0.8*want || got > 1.2*want+50 {
			t.Errorf("%s: %0.f px of its colour in the bars, the DOM says %.0f", c.name, got, want)
		}
	}
}

// countColour counts the pixels of img inside r (grown by one pixel) that
// are within a small distance of rgb.
func countColour(img image.Image, r rect, rgb [3]uint8) int {
	n := 0
	for y := int(r.Y) - 1; y <= int(r.Y+r.H)+1; y++ {
		for x := int(r.X) - 1; x <= int(r.X+r.W)+1; x++ {
			pr, pg, pb, _ := img.At(x, y).RGBA()
			if near(pr>>8, rgb[0]) && near(pg>>8, rgb[1]) && near(pb>>8, rgb[2]) {
				n++
			}
		}
	}
	return n
}

func near(v uint32, want uint8) bool { return v+12 >= uint32(want) && v <= uint32(want)+12 }

// checkAgainst checks the page against a /status.json fetched before it
// last rendered, with no traffic in between: picks, prefix blocks and
// decisions have not changed since.
func checkAgainst(t *testing.T, v pageView, fetched statusJSON) {
	t.Helper()
	picks := map[string][2]string{}
	for _, e := range fetched.Endpoints {
		for _, r := range e.Ranks {
			picks[r.Target] = [2]string{commas(r.Picks), commas(r.PrefixBlocks)}
		}
	}
	for _, row := range v.Ranks {
		if got, want := [2]string{row.Picks, row.Prefix}, picks[row.Target]; got != want {
			t.Errorf("%s: page shows picks, prefix blocks %q, /status.json %q", row.Target, got, want)
		}
	}
	if len(v.Decisions) != len(fetched.Decisions) {
		t.Fatalf("%d decisions on the page, %d in /status.json", len(v.Decisions), len(fetched.Decisions))
	}
	for i, d := range fetched.Decisions {
		if v.Decisions[i].RequestID != d.RequestID {
			t.Errorf("decision %d: page %s, /status.json %s", i, v.Decisions[i].RequestID, d.RequestID)
		}
	}
}

// commas formats n as the page does (toLocaleString("en-US")).
func commas(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
