package bench

import (
	"fmt"
	"slices"
	"strings"
)

// writeStages writes w's "TTFT by stage" table, when the engines of one
// of its cases reported stage latencies (Summary.Stages).
func (r Report) writeStages(b *strings.Builder, w string) {
	var keys []StageKey
	for _, s := range r.Summaries {
		if s.Workload != w {
			continue
		}
		for _, l := range s.Stages {
			if !slices.Contains(keys, l.key()) {
				keys = append(keys, l.key())
			}
		}
	}
	if len(keys) == 0 {
		return
	}
	slices.SortFunc(keys, compareStages)
	var roles []string
	for _, k := range keys {
		if !slices.Contains(roles, k.Role) {
			roles = append(roles, k.Role)
		}
	}
	b.WriteString("**TTFT by stage** (model ms): the mean time a request spent in each of SGLang's stages on the engines of a role " +
		"(their `" + StageMetric + "`, sum / count from the window's start until the replay ended); Σ adds a role's stages, n is its " +
		"most observed stage's count. A decode's stages contain its prefill's, so add stages within a role only; TTFT mean minus " +
		"decode Σ is roughly the time outside the engines (client, router, HTTP, KV polling). See README.md for the stages.\n\n")
	header := "| load (sessions/s) | policy | TTFT mean |"
	align := "|---|---|---:|"
	for _, role := range roles {
		for _, k := range keys {
			if k.Role == role {
				header += " " + stageColumn(k) + " |"
				align += "---:|"
			}
		}
		header += fmt.Sprintf(" %s Σ | %s n |", role, role)
		align += "---:|---:|"
	}
	b.WriteString(header + "\n" + align + "\n")
	for _, rate := range r.rates(w) {
		for _, p := range r.policies() {
			s, ok := r.find(w, rate, p)
			if !ok {
				continue
			}
			if s.Failed != "" {
				fmt.Fprintf(b, "| %s | %s | failed |%s\n", num(rate), PolicyLabel(p), strings.Repeat(" |", strings.Count(align, "|")-4))
				continue
			}
			b.WriteString(stageRow(s, keys, roles) + "\n")
		}
	}
	b.WriteString("\n")
}

// stageRow renders one case's row of the stage table.
func stageRow(s Summary, keys []StageKey, roles []string) string {
	row := fmt.Sprintf("| %s | %s | %s |", num(s.Rate), PolicyLabel(s.Policy), ms(s.TTFTms.Mean))
	for _, role := range roles {
		sum, n, seen := 0.0, 0.0, false
		for _, k := range keys {
			if k.Role != role {
				continue
			}
			i := slices.IndexFunc(s.Stages, func(l StageLatency) bool { return l.key() == k })
			if i < 0 {
				row += " - |"
				continue
			}
			l := s.Stages[i]
			row += " " + ms1(l.MeanMs) + " |"
			sum += l.MeanMs
			n = max(n, l.Count)
			seen = true
		}
		if !seen {
			row += " - | - |"
			continue
		}
		row += fmt.Sprintf(" %s | %.0f |", ms1(sum), n)
	}
	return row
}

// stageColumn names a stage's column: the stage, prefixed by its role
// when the stage's name does not say it.
func stageColumn(k StageKey) string {
	if strings.HasPrefix(k.Stage, k.Role+"_") {
		return k.Stage
	}
	return k.Role + ": " + k.Stage
}

// stagesLine renders stage latencies for a progress line.
func stagesLine(stages []StageLatency) string {
	parts := make([]string, 0, len(stages))
	for _, l := range stages {
		parts = append(parts, fmt.Sprintf("%s %.1f ms", stageColumn(l.key()), l.MeanMs))
	}
	return strings.Join(parts, ", ")
}
