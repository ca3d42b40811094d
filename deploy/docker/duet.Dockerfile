# syntax=docker/dockerfile:1
# duet: the ext_proc server. Build from the repository root:
#   docker build -f deploy/docker/duet.Dockerfile -t duet .
# (`make image` builds it with the version and commit of the checkout.)

ARG GO_VERSION=1.26.8
ARG ALPINE_VERSION=3.22

FROM golang:${GO_VERSION}-alpine AS build
WORKDIR /src
# No separate `go mod download`: go.mod also lists test-only modules, and
# go build fetches only what the binary needs (into the cache mount).
COPY . .
ARG VERSION=dev
ARG COMMIT=
RUN --mount=type=cache,target=/root/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X main.version=${VERSION} -X main.commit=${COMMIT}" \
      -o /out/duet ./cmd/duet

# Alpine, not distroless: busybox wget lets container health checks probe
# duet's admin port (/readyz).
FROM alpine:${ALPINE_VERSION}
COPY --from=build /out/duet /usr/local/bin/duet
# 9002: gRPC (ext_proc and access-log service); 9003: admin (/healthz,
# /readyz, /metrics). Both follow duet.yaml's listen section.
EXPOSE 9002 9003
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/duet"]
CMD ["serve", "-config", "/etc/duet/duet.yaml"]
