# Sluice. `make help` lists the targets.
SHELL := /bin/bash
GO    ?= go
BIN   := $(CURDIR)/.bin
export PATH := $(BIN):$(PATH)

# Pinned tool versions (never @latest).
BUF_VERSION            := v1.75.0
PROTOC_GEN_GO_VERSION  := v1.36.12
PROTOC_GEN_GRPC_VERSION:= v1.6.2
GRPCURL_VERSION        := v1.9.4
STATICCHECK_VERSION    := v0.8.2
GHZ_VERSION            := v0.120.0

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse --short HEAD 2>/dev/null)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*?## "}{printf "  %-12s %s\n", $$1, $$2}'

.PHONY: build
build: ## build bin/sluice
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/sluice ./cmd/sluice

.PHONY: run
run: ## run sluice with the example config (in-memory store)
	$(GO) run ./cmd/sluice serve --config examples/config

$(BIN)/buf:
	GOBIN=$(BIN) $(GO) install github.com/bufbuild/buf/cmd/buf@$(BUF_VERSION)
$(BIN)/protoc-gen-go:
	GOBIN=$(BIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
$(BIN)/protoc-gen-go-grpc:
	GOBIN=$(BIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GRPC_VERSION)
$(BIN)/grpcurl:
	GOBIN=$(BIN) $(GO) install github.com/fullstorydev/grpcurl/cmd/grpcurl@$(GRPCURL_VERSION)
$(BIN)/staticcheck:
	GOBIN=$(BIN) $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
$(BIN)/ghz:
	GOBIN=$(BIN) $(GO) install github.com/bojand/ghz/cmd/ghz@$(GHZ_VERSION)

.PHONY: tools
tools: $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc $(BIN)/grpcurl ## install the pinned Go tools into .bin/

.PHONY: generate
generate: $(BIN)/buf $(BIN)/protoc-gen-go $(BIN)/protoc-gen-go-grpc ## regenerate gen/ from proto/ with buf
	buf lint
	buf generate

.PHONY: fmt
fmt: ## gofmt the tree
	gofmt -w $$(git ls-files '*.go' | grep -v '^gen/')

.PHONY: lint
lint: $(BIN)/staticcheck ## go vet, gofmt and staticcheck
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	staticcheck ./...

.PHONY: deps
deps: ## install redis-server (Redis tests) and chromium (browser tests) when missing
	@command -v redis-server >/dev/null && command -v redis-sentinel >/dev/null && command -v redis-cli >/dev/null || { \
	  echo "installing redis-server, redis-sentinel, redis-tools"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-sentinel redis-tools >/dev/null; }
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || { \
	  echo "installing chromium"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

.PHONY: test
test: deps $(BIN)/grpcurl ## run every test with -race
	$(GO) test -race -count=1 -timeout 20m ./...

.PHONY: screenshots
screenshots: deps ## redo the status page's screenshots in docs/img with the browser test
	SLUICE_SCREENSHOTS=$(CURDIR)/docs/img $(GO) test -count=1 -run '^TestUI_Browser$$' -v ./cmd/sluice

.PHONY: bench
bench: ## run the Go benchmarks
	$(GO) test -run '^$$' -bench . -benchmem ./...

.PHONY: bench-load
bench-load: build $(BIN)/ghz ## load benchmark: sluice (memory, and Redis if redis-server is installed) vs a no-op RLS server on loopback, writes docs/BENCHMARKS.md (BENCH_FLAGS=-duration 5s ...)
	$(GO) run ./loadgen/benchload -sluice bin/sluice -ghz $(BIN)/ghz -out docs/BENCHMARKS.md $(BENCH_FLAGS)

SOAK_DURATION ?= 10m
.PHONY: soak
soak: build ## soak: 3 Redis instances + 1 memory under mixed load, Redis restarted every 2 min, limits rewritten every 10 s; CSV in soak.csv (SOAK_DURATION=10m)
	$(GO) run ./loadgen/soak -sluice bin/sluice -duration $(SOAK_DURATION) -csv soak.csv $(SOAK_FLAGS)

SOAK_CHURN_DURATION ?= 2m
.PHONY: soak-churn
soak-churn: build ## churn soak: 3 replicas over xDS (Envoy Gateway's env), renamed rules pushed every second, RLQS streams coming and going, Redis restarted every 2 min; soak-churn.md and CSVs (SOAK_CHURN_DURATION=2m; 30m for the report)
	$(GO) run ./loadgen/churn -sluice bin/sluice -duration $(SOAK_CHURN_DURATION) $(SOAK_CHURN_FLAGS)

.PHONY: check-generated
check-generated: generate ## fail when gen/ or go.mod/go.sum are stale
	$(GO) mod tidy
	git diff --exit-code -- gen/ go.mod go.sum

IMAGE     ?= localhost/sluice:$(VERSION)
IMAGE_DIR := bin/image

.PHONY: image-deps
image-deps: ## install podman and buildah (image targets) when missing
	@command -v podman >/dev/null || command -v buildah >/dev/null || { \
	  echo "installing podman, buildah"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah >/dev/null; }

.PHONY: image
image: image-deps ## build the container image $(IMAGE) (static binary FROM scratch; see Containerfile)
	rm -rf $(IMAGE_DIR) && mkdir -p $(IMAGE_DIR)/rootfs/bin $(IMAGE_DIR)/rootfs/etc/ssl/certs
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '-s -w $(LDFLAGS)' -o $(IMAGE_DIR)/rootfs/bin/sluice ./cmd/sluice
	ln -s sluice $(IMAGE_DIR)/rootfs/bin/ratelimit
	cp /etc/ssl/certs/ca-certificates.crt $(IMAGE_DIR)/rootfs/etc/ssl/certs/
	printf 'root:x:0:0:root:/:/sbin/nologin\nsluice:x:65532:65532:sluice:/:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n' > $(IMAGE_DIR)/rootfs/etc/passwd
	printf 'root:x:0:\nsluice:x:65532:\nnogroup:x:65534:\n' > $(IMAGE_DIR)/rootfs/etc/group
	cp Containerfile $(IMAGE_DIR)/
	if command -v podman >/dev/null; then podman build -q -f $(IMAGE_DIR)/Containerfile -t $(IMAGE) $(IMAGE_DIR); \
	else buildah bud -q -f $(IMAGE_DIR)/Containerfile -t $(IMAGE) $(IMAGE_DIR); fi

.PHONY: image-test
image-test: image ## export the image, check its config and layout, run its /bin/ratelimit with Envoy Gateway's environment
	rm -f $(IMAGE_DIR)/image.tar
	if command -v podman >/dev/null; then podman save --format oci-archive -o $(IMAGE_DIR)/image.tar $(IMAGE); \
	else buildah push $(IMAGE) oci-archive:$(IMAGE_DIR)/image.tar; fi
	SLUICE_IMAGE_ARCHIVE=$(CURDIR)/$(IMAGE_DIR)/image.tar $(GO) test -count=1 -run TestImage ./deploy/

.PHONY: ci
ci: lint check-generated test image-test ## what CI runs: lint, stale-code checks, tests, the image's test
