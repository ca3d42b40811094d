package main

import (
	"errors"
	"fmt"
	"testing"

	"github.com/go-logr/logr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// client-go's log calls reach zap with their level, name and fields.
func TestZapSink(t *testing.T) {
	tests := []struct {
		name      string
		minLevel  zapcore.Level
		log       func(logr.Logger)
		wantLevel zapcore.Level
		wantName  string
		wantMsg   string
		wantCtx   string // fmt.Sprint of the entry's context map; "" for no entry
	}{
		{"info", zapcore.InfoLevel, func(l logr.Logger) { l.Info("watch ended", "reflector", "r", "count", 3) },
			zapcore.InfoLevel, "client-go", "watch ended", "map[count:3 reflector:r]"},
		{"verbose without debug", zapcore.InfoLevel, func(l logr.Logger) { l.V(2).Info("noise") },
			0, "", "", ""},
		{"verbose with debug", zapcore.DebugLevel, func(l logr.Logger) { l.V(2).Info("detail", "k", "v") },
			zapcore.DebugLevel, "client-go", "detail", "map[k:v]"},
		{"error", zapcore.InfoLevel, func(l logr.Logger) { l.Error(errors.New("boom"), "list failed", "ns", "inference") },
			zapcore.ErrorLevel, "client-go", "list failed", "map[error:boom ns:inference]"},
		{"name and values", zapcore.InfoLevel, func(l logr.Logger) { l.WithName("reflector").WithValues("type", "slice").Info("started") },
			zapcore.InfoLevel, "client-go.reflector", "started", "map[type:slice]"},
		{"odd pairs", zapcore.InfoLevel, func(l logr.Logger) { l.Info("odd", 7, "seven", "dangling") },
			zapcore.InfoLevel, "client-go", "odd", "map[7:seven dangling:(MISSING)]"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			core, logs := observer.New(tt.minLevel)
			tt.log(logr.New(zapSink{zap.New(core).Named("client-go")}))
			entries := logs.All()
			if tt.wantCtx == "" {
				if len(entries) != 0 {
					t.Fatalf("logged %v", entries)
				}
				return
			}
			if len(entries) != 1 {
				t.Fatalf("%d entries, want 1", len(entries))
			}
			e := entries[0]
			if e.Level != tt.wantLevel || e.LoggerName != tt.wantName || e.Message != tt.wantMsg ||
				fmt.Sprint(e.ContextMap()) != tt.wantCtx {
				t.Errorf("entry %v %q %q %v; want %v %q %q %s", e.Level, e.LoggerName, e.Message, e.ContextMap(),
					tt.wantLevel, tt.wantName, tt.wantMsg, tt.wantCtx)
			}
		})
	}
}
