//go:build tools

// Package jaeger pins the Jaeger version that the tracing tests run: a
// module of its own (Jaeger is no dependency of duet), from which `make
// jaeger` builds github.com/jaegertracing/jaeger/cmd/jaeger, the Jaeger v2
// all-in-one binary, into .tools/. This file only keeps the requirement.
package jaeger

import _ "github.com/jaegertracing/jaeger/cmd/jaeger"
