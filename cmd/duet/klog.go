package main

import (
	"fmt"

	"github.com/go-logr/logr"
	"go.uber.org/zap"
)

// zapSink is a logr.LogSink that writes through a zap logger: client-go
// logs through klog, which duet points at it (klog.SetLogger) so that
// every line duet writes is JSON.
type zapSink struct{ log *zap.Logger }

var _ logr.LogSink = zapSink{}

// Init implements logr.LogSink.
func (zapSink) Init(logr.RuntimeInfo) {}

// Enabled implements logr.LogSink: klog's V(n) levels above 0 are debug
// logs, written when zap's debug level is enabled.
func (s zapSink) Enabled(level int) bool {
	return level <= 0 || s.log.Core().Enabled(zap.DebugLevel)
}

// Info implements logr.LogSink.
func (s zapSink) Info(level int, msg string, kv ...any) {
	if level > 0 {
		s.log.Debug(msg, fields(kv)...)
		return
	}
	s.log.Info(msg, fields(kv)...)
}

// Error implements logr.LogSink.
func (s zapSink) Error(err error, msg string, kv ...any) {
	s.log.Error(msg, append(fields(kv), zap.Error(err))...)
}

// WithValues implements logr.LogSink.
func (s zapSink) WithValues(kv ...any) logr.LogSink { return zapSink{s.log.With(fields(kv)...)} }

// WithName implements logr.LogSink.
func (s zapSink) WithName(name string) logr.LogSink { return zapSink{s.log.Named(name)} }

// fields turns logr's alternating keys and values into zap fields; a key
// that is not a string is formatted, a missing last value is "(MISSING)".
func fields(kv []any) []zap.Field {
	out := make([]zap.Field, 0, (len(kv)+1)/2)
	for i := 0; i < len(kv); i += 2 {
		key, ok := kv[i].(string)
		if !ok {
			key = fmt.Sprint(kv[i])
		}
		var v any = "(MISSING)"
		if i+1 < len(kv) {
			v = kv[i+1]
		}
		out = append(out, zap.Any(key, v))
	}
	return out
}
