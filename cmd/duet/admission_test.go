package main

import (
	"testing"

	"github.com/duet-router/duet/cmd/duet/internal/config"
	"github.com/duet-router/duet/scheduler"
)

// fakePriorities is a pool whose engines advertise ps (ok: all alike).
type fakePriorities struct {
	ps scheduler.PriorityScheduling
	ok bool
}

func (f fakePriorities) EnginePriority() (scheduler.PriorityScheduling, bool) { return f.ps, f.ok }

func TestEnginePriority(t *testing.T) {
	seven := 7
	a := config.Admission{EnginePriorityMode: config.EnginePriorityAuto, Classes: []config.AdmissionClass{
		{Name: "interactive", Priority: 10}, {Name: "batch", Priority: 0}, {Name: "vip", Priority: 20, EnginePriority: &seven},
	}}
	high := fakePriorities{scheduler.PriorityScheduling{Enabled: true}, true}
	low := fakePriorities{scheduler.PriorityScheduling{Enabled: true, LowValuesFirst: true}, true}
	tests := []struct {
		name   string
		mode   string
		engine fakePriorities
		class  string
		want   int
		write  bool
	}{
		{"auto, engines without it", config.EnginePriorityAuto, fakePriorities{}, "interactive", 0, false},
		{"auto, larger first", config.EnginePriorityAuto, high, "interactive", 10, true},
		{"auto, smaller first: negated", config.EnginePriorityAuto, low, "interactive", -10, true},
		{"explicit value kept as is", config.EnginePriorityAuto, low, "vip", 7, true},
		{"on, engines silent", config.EnginePriorityOn, fakePriorities{}, "interactive", 10, true},
		{"off", config.EnginePriorityOff, high, "interactive", 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			a.EnginePriorityMode = tt.mode
			got, write := enginePriority(a, tt.class, tt.engine)
			if write != tt.write || write && got != tt.want {
				t.Errorf("got %d %v, want %d %v", got, write, tt.want, tt.write)
			}
		})
	}
}
