# syntax=docker/dockerfile:1
# duet-sim: a simulated SGLang engine (prefill, decode or aggregated) for
# demos and tests. Build from the repository root:
#   docker build -f deploy/docker/duet-sim.Dockerfile -t duet-sim .

ARG GO_VERSION=1.26.8
ARG ALPINE_VERSION=3.22

FROM golang:${GO_VERSION}-alpine AS build
WORKDIR /src
# No separate `go mod download`: go.mod also lists test-only modules, and
# go build fetches only what the binary needs (into the cache mount).
COPY . .
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/duet-sim ./cmd/duet-sim

# Alpine, not distroless: busybox wget lets container health checks probe
# the engine's /health.
FROM alpine:${ALPINE_VERSION}
COPY --from=build /out/duet-sim /usr/local/bin/duet-sim
# 30000: the engine's HTTP API; 8998: a prefill's bootstrap server. Both
# follow --listen and --bootstrap-port.
EXPOSE 30000 8998
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/duet-sim"]
CMD ["--mode", "null", "--listen", "0.0.0.0:30000"]
