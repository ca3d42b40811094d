package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/duet-router/duet/e2e/harness"
)

// SMGVersion is the SMG release the smg routings run: the PyPI package
// smg (the standalone Rust router), installed into .venv from
// e2e/bench/overhead/requirements.txt by `make .venv/.bench-installed`.
const SMGVersion = "1.13.0"

// SMGPrefill is one prefill engine as SMG's --prefill names it.
type SMGPrefill struct {
	// URL is the engine's base URL.
	URL string
	// BootstrapPort is its KV bootstrap server's port.
	BootstrapPort int
}

// SMGLaunch is one `smg launch` command line in PD mode.
type SMGLaunch struct {
	// Bin is the smg executable.
	Bin string
	// Host and Port are where SMG listens; PrometheusPort is its metrics
	// port, on Host too.
	Host                 string
	Port, PrometheusPort int
	// Prefill and Decode are the engines, every one.
	Prefill []SMGPrefill
	Decode  []string
	// PrefillPolicy and DecodePolicy are --prefill-policy and
	// --decode-policy.
	PrefillPolicy, DecodePolicy string
	// DPAware adds --dp-aware: SMG reads each engine's dp_size from its
	// server info and routes to (engine, rank) pairs.
	DPAware bool
	// DPMinTokens adds --dp-minimum-tokens-scheduler: SMG picks the DP
	// rank inside each chosen engine by the fewest tokens (its load poll
	// of the engines' GET /v1/loads plus what it sent since).
	DPMinTokens bool
	// LogLevel is --log-level (default warn).
	LogLevel string
}

// Argv returns the command line, the program first.
func (l SMGLaunch) Argv() []string {
	level := l.LogLevel
	if level == "" {
		level = "warn"
	}
	argv := []string{l.Bin, "launch", "--host", l.Host, "--port", strconv.Itoa(l.Port), "--log-level", level,
		"--prometheus-host", l.Host, "--prometheus-port", strconv.Itoa(l.PrometheusPort), "--pd-disaggregation"}
	for _, p := range l.Prefill {
		argv = append(argv, "--prefill", p.URL, strconv.Itoa(p.BootstrapPort))
	}
	for _, u := range l.Decode {
		argv = append(argv, "--decode", u)
	}
	argv = append(argv, "--prefill-policy", l.PrefillPolicy, "--decode-policy", l.DecodePolicy)
	if l.DPAware {
		argv = append(argv, "--dp-aware")
	}
	if l.DPMinTokens {
		argv = append(argv, "--dp-minimum-tokens-scheduler")
	}
	return argv
}

// SMGBin returns the smg executable the smg routings run, or an error
// saying how to install it.
func SMGBin() (string, error) {
	tools, err := harness.FindTools()
	if err != nil {
		return "", err
	}
	return smgBin(tools)
}

// smgBin returns the smg executable next to the harness's Python (in
// .venv), or an error saying how to install it.
func smgBin(tools harness.Tools) (string, error) {
	bin := filepath.Join(filepath.Dir(tools.Python), "smg")
	if _, err := os.Stat(bin); err != nil {
		return "", fmt.Errorf("the smg routings need smg==%s in .venv (make .venv/.bench-installed): %w", SMGVersion, err)
	}
	return bin, nil
}

// smgLaunch returns the launch of SMG in front of s's engines under p, on
// the given ports.
func smgLaunch(bin string, s *harness.Stack, p Policy, port, promPort int) SMGLaunch {
	l := SMGLaunch{Bin: bin, Host: "127.0.0.1", Port: port, PrometheusPort: promPort,
		PrefillPolicy: p.Prefill, DecodePolicy: p.Decode, DPAware: !p.EngineRanks, DPMinTokens: p.DPMinTokens}
	for _, sim := range s.Prefill {
		l.Prefill = append(l.Prefill, SMGPrefill{URL: sim.URL, BootstrapPort: sim.BootstrapPort})
	}
	for _, sim := range s.Decode {
		l.Decode = append(l.Decode, sim.URL)
	}
	return l
}

// smgWorkers is how many workers SMG registers for s: one per engine, or
// one per (engine, rank) when DP-aware.
func smgWorkers(s *harness.Stack, dpAware bool) int {
	n := 0
	for _, sim := range append(append([]*harness.Sim{}, s.Prefill...), s.Decode...) {
		if dpAware {
			n += max(sim.DPSize, 1)
		} else {
			n++
		}
	}
	return n
}

// startSMG starts SMG in front of s's engines under p, logging into
// dir/smg.log, and waits until it is ready and has every worker healthy.
// It returns the process, SMG's base URL and its command line.
func startSMG(ctx context.Context, dir string, s *harness.Stack, p Policy) (*harness.Process, string, []string, error) {
	bin, err := smgBin(s.Tools)
	if err != nil {
		return nil, "", nil, err
	}
	ports, err := harness.FreePorts(2)
	if err != nil {
		return nil, "", nil, fmt.Errorf("smg ports: %w", err)
	}
	l := smgLaunch(bin, s, p, ports[0], ports[1])
	argv := l.Argv()
	proc, err := harness.StartProcess(dir, "smg", argv...)
	if err != nil {
		return nil, "", argv, fmt.Errorf("start smg: %w", err)
	}
	url := "http://" + l.Host + ":" + strconv.Itoa(l.Port)
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	// /readiness answers 200 once SMG serves; the workers register in the
	// background, so wait for all of them too.
	err = harness.WaitHTTP(ctx, proc, url+"/readiness")
	if err == nil {
		err = waitSMGWorkers(ctx, proc, url, smgWorkers(s, l.DPAware))
	}
	if err != nil {
		_ = proc.Stop(time.Second)
		return nil, "", argv, fmt.Errorf("smg not ready: %w", err)
	}
	return proc, url, argv, nil
}

// waitSMGWorkers waits until SMG's GET /workers lists want healthy
// workers, p exits, or ctx ends.
func waitSMGWorkers(ctx context.Context, p *harness.Process, url string, want int) error {
	client := &http.Client{Timeout: time.Second}
	healthy := 0
	for {
		n, err := smgHealthyWorkers(ctx, client, url)
		if err == nil && n >= want {
			return nil
		}
		healthy = n
		if p.Exited() {
			return fmt.Errorf("smg exited with %d of %d workers healthy:\n%s", healthy, want, p.Tail(4000))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("smg has %d of %d workers healthy: %w\n%s", healthy, want, ctx.Err(), p.Tail(4000))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// smgHealthyWorkers counts the healthy workers in SMG's GET /workers.
func smgHealthyWorkers(ctx context.Context, client *http.Client, url string) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/workers", nil)
	if err != nil {
		return 0, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("smg workers: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("smg workers: status %d", resp.StatusCode)
	}
	var body struct {
		Workers []struct {
			Healthy bool `json:"is_healthy"`
		} `json:"workers"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, fmt.Errorf("smg workers: %w", err)
	}
	n := 0
	for _, w := range body.Workers {
		if w.Healthy {
			n++
		}
	}
	if len(body.Workers) == 0 {
		return 0, errors.New("smg workers: none registered yet")
	}
	return n, nil
}
