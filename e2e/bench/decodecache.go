package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// DecodeCache is a case's evidence of the decode engines' radix cache
// (SGLang's --disaggregation-decode-enable-radix-cache), measured only
// when a decode engine reports that cache in its server info.
type DecodeCache struct {
	// Workload, Rate and Policy name the case (as its Summary does).
	Workload string  `json:"workload"`
	Rate     float64 `json:"rate"`
	Policy   string  `json:"policy"`
	// GaugeHitRate is the mean of the decode ranks' cache_hit_rate gauge
	// over the measured window, counting a rank only while it holds
	// tokens: the share of prompt tokens the decode radix cache matched at
	// preallocation (so the prefill sent only the rest), by sample rather
	// than by token; -1 when no sample counts.
	GaugeHitRate float64 `json:"gauge_hit_rate"`
	// ReportedHitRate is the decode engines' cached / prompt token
	// counters over the window: the cached_tokens the decode reports,
	// which with the decode radix cache is the larger of the prefill's hit
	// and the decode's match per request; -1 when unknown.
	ReportedHitRate float64 `json:"reported_hit_rate"`
}

// decodeRadixCache reports whether any engine at urls runs SGLang's decode
// radix cache (server info disaggregation_decode_enable_radix_cache).
func decodeRadixCache(ctx context.Context, urls []string) (bool, error) {
	client := &http.Client{Timeout: 2 * time.Second}
	for _, u := range urls {
		on, err := serverInfoFlag(ctx, client, u, "disaggregation_decode_enable_radix_cache")
		if err != nil {
			return false, err
		}
		if on {
			return true, nil
		}
	}
	return false, nil
}

// serverInfoFlag reads the boolean field of the engine at url's GET
// /server_info (false when absent).
func serverInfoFlag(ctx context.Context, client *http.Client, url, field string) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/server_info", nil)
	if err != nil {
		return false, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return false, fmt.Errorf("server info of %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, fmt.Errorf("server info of %s: status %d", url, resp.StatusCode)
	}
	var info map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		return false, fmt.Errorf("server info of %s: %w", url, err)
	}
	on, _ := info[field].(bool)
	return on, nil
}

// hitRatio is c's cached/prompt, -1 without c or prompt tokens.
func hitRatio(c *CounterDelta) float64 {
	if c == nil || c.Prompt <= 0 {
		return -1
	}
	return c.Cached / c.Prompt
}
