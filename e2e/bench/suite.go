package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Plan is a full benchmark: every workload at every load under every
// policy.
type Plan struct {
	Config Config
	Params Params
	// Workloads are run in this order.
	Workloads []string
	// Rates are each workload's session arrival rates (per model second),
	// from light to overload.
	Rates map[string][]float64
	// Window is the arrival window of every case (model time).
	Window time.Duration
	// Seed makes the workloads; every policy replays the same arrivals.
	Seed uint64
	// Build, if set, makes each workload instead of Generate (a replayed
	// trace: see TraceWorkload). Streaming is then limited to the chunk
	// budget by the workload's own mean output.
	Build func(name string, rate float64, window time.Duration, seed uint64, p Params) (Workload, error)
	// Policies are compared; the first should be the baseline.
	Policies []Policy
	// Admission holds, by workload, the keys of duet's admission section
	// for that workload's duet cases (YAML indented by two spaces; see
	// AdmissionYAML); a workload without one runs duet's defaults.
	Admission map[string]string
	// ChunkBudget bounds the streamed content chunks per wall second that
	// the plan expects (every chunk costs the simulator, Envoy and the
	// client CPU time): a case streams only the share of its sessions that
	// keeps its expected chunk rate under the budget, and sends the others
	// without streaming. 0 streams every session.
	ChunkBudget float64
	// StreamInterval is the tokens per streamed chunk (the simulator's
	// --stream-interval; 0 or 1: one chunk per token).
	StreamInterval int
	// OutDir receives quality-envoy.md, quality-envoy.json and the PNG plots ("" writes
	// nothing).
	OutDir string
	// Setup lines head the report.
	Setup []string
}

// ReportFile and DataFile are the outputs' names in Plan.OutDir.
const (
	ReportFile = "quality-envoy.md"
	DataFile   = "quality-envoy.json"
)

// RunPlan runs every case and writes the outputs. Case failures are
// recorded in the report and returned joined after the outputs are
// written; a cancelled ctx stops the run.
func RunPlan(ctx context.Context, plan Plan) (Report, error) {
	cfg := plan.Config.withDefaults()
	rep := Report{Setup: plan.Setup}
	var failures []error
	// The per-rank load of the highest load of the first workload, by
	// policy, for the rank-load plots.
	rankRuns := map[string]CaseResult{}
	// The routers whose command line the setup shows, by policy.
	routerNoted := map[string]bool{}
	for _, name := range plan.Workloads {
		rates := plan.Rates[name]
		for ri, rate := range rates {
			perSession := MeanRequestsPerSession(name, plan.Params)
			var w Workload
			var err error
			if plan.Build != nil {
				w, err = plan.Build(name, rate, plan.Window, plan.Seed+uint64(ri), plan.Params)
				if err == nil && len(w.Sessions) > 0 {
					perSession = float64(w.Requests()) / float64(len(w.Sessions))
					w.LimitStreaming(plan.streamFractionOf(w, perSession, cfg.Scale))
				}
			} else {
				params := plan.Params
				params.StreamFraction = plan.streamFraction(name, rate, cfg.Scale)
				w, err = Generate(name, rate, plan.Window, plan.Seed+uint64(ri), params)
			}
			if err != nil {
				return rep, err
			}
			fmt.Fprintf(cfg.Log, "%s at %g sessions/s: %d sessions, %d requests planned, %.0f%% of sessions streamed\n",
				name, rate, len(w.Sessions), w.Requests(), 100*w.StreamFraction)
			for _, pol := range plan.Policies {
				c := Case{Workload: w, Policy: pol.forWorkload(plan.Admission[name]), RequestsPerSession: perSession}
				res, err := RunCase(ctx, cfg, c)
				if ctx.Err() != nil {
					return rep, ctx.Err()
				}
				if err != nil {
					fmt.Fprintf(cfg.Log, "  %s %g %s FAILED: %v\n", name, rate, pol.Name, err)
					failures = append(failures, fmt.Errorf("%s at %g under %s: %w", name, rate, pol.Name, err))
				}
				rep.Summaries = append(rep.Summaries, res.Summary)
				if res.Decode != nil {
					rep.DecodeCaches = append(rep.DecodeCaches, *res.Decode)
				}
				if len(res.RouterArgv) > 0 && !routerNoted[pol.Name] {
					routerNoted[pol.Name] = true
					rep.Setup = append(rep.Setup, fmt.Sprintf("`%s` ran %s: `%s` (ports and engine URLs of its first case)",
						pol.Name, pol.Router, strings.Join(res.RouterArgv, " ")))
				}
				if name == plan.Workloads[0] && ri == len(rates)-1 && err == nil {
					rankRuns[pol.Name] = res
				}
			}
		}
	}
	if plan.OutDir == "" {
		return rep, errors.Join(failures...)
	}
	if err := writeOutputs(plan, &rep, rankRuns); err != nil {
		return rep, err
	}
	return rep, errors.Join(failures...)
}

// streamFraction is the share of sessions a case of workload name at rate
// can stream within the chunk budget.
func (plan Plan) streamFraction(name string, rate, scale float64) float64 {
	return plan.streamShare(rate*MeanRequestsPerSession(name, plan.Params), MeanOutputTokens(name, plan.Params), scale)
}

// streamFractionOf is the share of w's sessions that can stream within the
// chunk budget, from w's own arrival rate and mean output.
func (plan Plan) streamFractionOf(w Workload, perSession, scale float64) float64 {
	var out, n float64
	for _, s := range w.Sessions {
		for _, t := range s.Turns {
			out += float64(t.OutputTokens)
			n++
		}
	}
	if n == 0 {
		return 1
	}
	return plan.streamShare(w.Rate*perSession, out/n, scale)
}

// streamShare is the share of requests, arriving at requestRate per model
// second with meanOutput tokens each, that can stream within the chunk
// budget at time scale scale.
func (plan Plan) streamShare(requestRate, meanOutput, scale float64) float64 {
	wallChunks := requestRate * scale * meanOutput / float64(max(plan.StreamInterval, 1))
	if plan.ChunkBudget <= 0 || wallChunks <= 0 {
		return 1
	}
	return min(1, plan.ChunkBudget/wallChunks)
}

// writeOutputs writes the plots, the Markdown report and the JSON data.
func writeOutputs(plan Plan, rep *Report, rankRuns map[string]CaseResult) error {
	if err := os.MkdirAll(plan.OutDir, 0o755); err != nil {
		return err
	}
	var names []string
	for _, p := range plan.Policies {
		names = append(names, p.Name)
	}
	for _, w := range plan.Workloads {
		file := TTFTPlotFile(w)
		if err := PlotTTFTvsLoad(filepath.Join(plan.OutDir, file), w, rep.Summaries, names); err != nil {
			return fmt.Errorf("plot %s: %w", file, err)
		}
		rep.Plots = append(rep.Plots, Plot{Caption: fmt.Sprintf("TTFT vs load, %s workload", w), File: file})
	}
	if len(plan.Workloads) > 0 {
		w := plan.Workloads[0]
		rates := plan.Rates[w]
		for _, name := range names {
			res, ok := rankRuns[name]
			if !ok {
				continue
			}
			file := RankLoadPlotFile(name)
			title := fmt.Sprintf("%s @ %g/s, %s", w, rates[len(rates)-1], name)
			if err := PlotRankLoad(filepath.Join(plan.OutDir, file), title, res.Polls, res.Labels, res.Window); err != nil {
				return fmt.Errorf("plot %s: %w", file, err)
			}
			rep.Plots = append(rep.Plots, Plot{Caption: "Per-rank load over time: " + title, File: file})
		}
	}
	f, err := os.Create(filepath.Join(plan.OutDir, ReportFile))
	if err != nil {
		return err
	}
	if err := WriteMarkdown(f, *rep); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	out := map[string]any{"setup": rep.Setup, "cases": rep.Summaries}
	if len(rep.DecodeCaches) > 0 {
		out["decode_cache"] = rep.DecodeCaches
	}
	data, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(plan.OutDir, DataFile), append(data, '\n'), 0o644)
}
