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
CYCLONEDX_GOMOD_VERSION:= v1.10.0

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
COMMIT  ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS := -X main.version=$(VERSION) -X main.commit=$(COMMIT)
# The commit's time (seconds since the epoch): the date of every release
# archive's entries and of the image's created label.
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
# How release binaries (and the image's) are built: static, no paths, no
# build ID, no VCS stamping (the version and commit are stamped by -X), a
# clean GOFLAGS and the baseline instruction sets, so that the same commit
# and Go toolchain give the same bytes (docs/RELEASING.md).
RELEASE_ENV   := GOFLAGS= CGO_ENABLED=0 GOAMD64=v1 GOARM64=v8.0
RELEASE_BUILD := -trimpath -buildvcs=false -ldflags '-s -w -buildid= $(LDFLAGS)'

.DEFAULT_GOAL := help

.PHONY: help
help: ## list the targets
	@grep -hE '^[a-zA-Z_-]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*?## "}{printf "  %-15s %s\n", $$1, $$2}'

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
# The SBOMs name this tool's version and carry its hash: the file is named
# after the version (a new one is installed when it changes) and built with
# -trimpath (the same bytes wherever the module cache is).
CYCLONEDX_GOMOD := $(BIN)/cyclonedx-gomod-$(CYCLONEDX_GOMOD_VERSION)
$(CYCLONEDX_GOMOD):
	GOBIN=$(BIN)/cyclonedx-gomod.tmp $(GO) install -trimpath github.com/CycloneDX/cyclonedx-gomod/cmd/cyclonedx-gomod@$(CYCLONEDX_GOMOD_VERSION)
	mv $(BIN)/cyclonedx-gomod.tmp/cyclonedx-gomod $@ && rmdir $(BIN)/cyclonedx-gomod.tmp

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
deps: ## install redis-server (Redis tests), memcached (memcached tests) and chromium (browser tests) when missing
	@command -v redis-server >/dev/null && command -v redis-sentinel >/dev/null && command -v redis-cli >/dev/null || { \
	  echo "installing redis-server, redis-sentinel, redis-tools"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server redis-sentinel redis-tools >/dev/null; }
	@command -v memcached >/dev/null || { \
	  echo "installing memcached"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq memcached >/dev/null; }
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
bench-load: build $(BIN)/ghz ## load benchmark: sluice (memory, and Redis if redis-server is installed) vs a no-op RLS server on loopback, and envoyproxy/ratelimit beside it if REFERENCE=path/to/its/binary, an older sluice build beside the current one if BASELINE=path/to/it; writes docs/BENCHMARKS.md (BENCH_FLAGS=-duration 5s ...)
	$(GO) run ./loadgen/benchload -sluice bin/sluice -ghz $(BIN)/ghz -out docs/BENCHMARKS.md $(if $(REFERENCE),-reference $(REFERENCE)) $(if $(BASELINE),-baseline $(BASELINE)) $(BENCH_FLAGS)

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
# The commit's time in RFC 3339 (GNU date, else BSD date).
CREATED    = $(shell date -u -d @$(SOURCE_DATE_EPOCH) +%Y-%m-%dT%H:%M:%SZ 2>/dev/null || date -u -r $(SOURCE_DATE_EPOCH) +%Y-%m-%dT%H:%M:%SZ)
# The Containerfile's labels (org.opencontainers.image.*).
IMAGE_ARGS = --build-arg VERSION=$(VERSION) --build-arg REVISION=$(COMMIT) --build-arg CREATED=$(CREATED)

.PHONY: image-deps
image-deps: ## install podman and buildah (image targets) when missing
	@command -v podman >/dev/null || command -v buildah >/dev/null || { \
	  echo "installing podman, buildah"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman buildah >/dev/null; }

# The image's platforms: one static binary per platform, cross-compiled on
# the host (no RUN step, so no emulation), one manifest list.
IMAGE_PLATFORMS ?= linux/amd64 linux/arm64
# podman, else buildah: both take the same build, manifest and push verbs.
IMAGE_TOOL = $(shell command -v podman >/dev/null && echo podman || echo buildah)

.PHONY: image
image: image-deps ## build the multi-arch image $(IMAGE) (a manifest list of IMAGE_PLATFORMS; static binaries FROM scratch; see Containerfile)
	rm -rf $(IMAGE_DIR) && mkdir -p $(IMAGE_DIR)
	@set -e; for p in $(IMAGE_PLATFORMS); do \
	  os=$${p%/*}; arch=$${p#*/}; root=$(IMAGE_DIR)/rootfs/$$arch; \
	  [ "$$os" = linux ] || { echo "image: platform $$p: only linux"; exit 1; }; \
	  echo "image: $$p"; \
	  mkdir -p $$root/bin $$root/etc/ssl/certs; \
	  env $(RELEASE_ENV) GOOS=$$os GOARCH=$$arch $(GO) build $(RELEASE_BUILD) -o $$root/bin/sluice ./cmd/sluice; \
	  ln -s sluice $$root/bin/ratelimit; \
	  cp /etc/ssl/certs/ca-certificates.crt $$root/etc/ssl/certs/; \
	  printf 'root:x:0:0:root:/:/sbin/nologin\nsluice:x:65532:65532:sluice:/:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n' > $$root/etc/passwd; \
	  printf 'root:x:0:\nsluice:x:65532:\nnogroup:x:65534:\n' > $$root/etc/group; \
	done
	cp Containerfile $(IMAGE_DIR)/
	@# Replace the list and its per-platform images whole, leaving no
	@# untagged image behind (--layers=false: no intermediate ones either).
	$(IMAGE_TOOL) manifest rm $(IMAGE) >/dev/null 2>&1 || $(IMAGE_TOOL) rmi $(IMAGE) >/dev/null 2>&1 || true
	@set -e; for p in $(IMAGE_PLATFORMS); do \
	  arch=$${p#*/}; \
	  $(IMAGE_TOOL) rmi $(IMAGE)-$$arch >/dev/null 2>&1 || true; \
	  echo "$(IMAGE_TOOL) build --platform $$p -t $(IMAGE)-$$arch"; \
	  $(IMAGE_TOOL) build -q --layers=false $(IMAGE_ARGS) --platform $$p -t $(IMAGE)-$$arch -f $(IMAGE_DIR)/Containerfile $(IMAGE_DIR) >/dev/null; \
	done
	$(IMAGE_TOOL) manifest create $(IMAGE) >/dev/null
	@set -e; for p in $(IMAGE_PLATFORMS); do \
	  echo "$(IMAGE_TOOL) manifest add $(IMAGE) $(IMAGE)-$${p#*/}"; \
	  $(IMAGE_TOOL) manifest add $(IMAGE) containers-storage:$(IMAGE)-$${p#*/} >/dev/null; \
	done

.PHONY: image-test
image-test: image ## export the image, check each platform's config, binary and layout, run the host's /bin/ratelimit with Envoy Gateway's environment
	rm -f $(IMAGE_DIR)/image.tar
	$(IMAGE_TOOL) manifest push -q --all --format oci $(IMAGE) oci-archive:$(IMAGE_DIR)/image.tar
	SLUICE_IMAGE_ARCHIVE=$(CURDIR)/$(IMAGE_DIR)/image.tar SLUICE_IMAGE_PLATFORMS="$(IMAGE_PLATFORMS)" \
	  SLUICE_IMAGE_VERSION=$(VERSION) SLUICE_IMAGE_REVISION=$(COMMIT) \
	  SLUICE_IMAGE_CREATED=$(CREATED) $(GO) test -count=1 -run TestImage ./deploy/

RELEASE_PLATFORMS ?= linux/amd64 linux/arm64 darwin/amd64 darwin/arm64 windows/amd64
DIST              ?= dist
RELEASE_CHECK_DIR := bin/release-check
RELEASE_CHECK_VERSION := v0.0.0-check
# The release's own test on the dist directory $(1) of version $(2).
RELEASE_TEST = SLUICE_RELEASE_DIST=$(abspath $(1)) SLUICE_RELEASE_VERSION=$(2) SLUICE_RELEASE_COMMIT=$(COMMIT) \
  SLUICE_RELEASE_EPOCH=$(SOURCE_DATE_EPOCH) $(GO) test -count=1 -run '^TestRelease$$' ./internal/release

.PHONY: release
release: ## build release VERSION=vX.Y.Z of the committed tree into dist/ (archives, SBOMs, SHA256SUMS) and check it; see docs/RELEASING.md
	@[[ "$(VERSION)" =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$$ ]] || { echo "release: VERSION=$(VERSION): want vX.Y.Z or vX.Y.Z-pre"; exit 1; }
	@[ -z "$$(git status --porcelain)" ] || { echo "release: the tree has uncommitted or untracked files; a release is built from a commit"; git status --short; exit 1; }
	@! t=$$(git rev-parse -q --verify "refs/tags/$(VERSION)^{commit}") || [ "$$t" = "$$(git rev-parse HEAD)" ] || { echo "release: tag $(VERSION) is not HEAD"; exit 1; }
	$(MAKE) --no-print-directory release-dist
	cd $(DIST) && sha256sum -c SHA256SUMS
	$(call RELEASE_TEST,$(DIST),$(VERSION))

# release-dist builds RELEASE_PLATFORMS into DIST: per platform the
# binary, its SBOM and an archive with LICENSE and README.md; then
# SHA256SUMS over the archives and SBOMs.
.PHONY: release-dist
release-dist: $(CYCLONEDX_GOMOD)
	@[ -n "$(COMMIT)" ] && [ -n "$(SOURCE_DATE_EPOCH)" ] || { echo "release: COMMIT and SOURCE_DATE_EPOCH are needed (a git checkout sets them)"; exit 1; }
	rm -rf $(DIST) && mkdir -p $(DIST)
	@set -e; for p in $(RELEASE_PLATFORMS); do \
	  os=$${p%/*}; arch=$${p#*/}; name=sluice_$(VERSION)_$${os}_$${arch}; exe=sluice; ext=tar.gz; \
	  if [ "$$os" = windows ]; then exe=sluice.exe; ext=zip; fi; \
	  echo "release: $(DIST)/$$name.$$ext"; \
	  mkdir -p $(DIST)/$$name; \
	  env $(RELEASE_ENV) GOOS=$$os GOARCH=$$arch $(GO) build $(RELEASE_BUILD) -o $(DIST)/$$name/$$exe ./cmd/sluice; \
	  cp LICENSE README.md $(DIST)/$$name/; \
	  env $(RELEASE_ENV) GOOS=$$os GOARCH=$$arch $(CYCLONEDX_GOMOD) bin -json -std -noserial -notimestamp \
	    -version $(VERSION) -output $(DIST)/$$name.cdx.json $(DIST)/$$name/$$exe; \
	  $(GO) run ./internal/release archive -mtime $(SOURCE_DATE_EPOCH) -o $(DIST)/$$name.$$ext $(DIST)/$$name; \
	done
	shopt -s nullglob; $(GO) run ./internal/release sums -o $(DIST)/SHA256SUMS $(DIST)/*.tar.gz $(DIST)/*.zip $(DIST)/*.cdx.json

.PHONY: release-check
release-check: $(CYCLONEDX_GOMOD) ## build this platform as a release twice (the second from a copy of the tree elsewhere), compare the bytes, check sums, version and SBOM
	rm -rf $(RELEASE_CHECK_DIR)
	$(MAKE) --no-print-directory release-dist VERSION=$(RELEASE_CHECK_VERSION) RELEASE_PLATFORMS=$$($(GO) env GOOS)/$$($(GO) env GOARCH) DIST=$(RELEASE_CHECK_DIR)/a
	src=$$(mktemp -d) && trap 'rm -rf "$$src"' EXIT && \
	  tar --exclude-vcs --exclude=./bin --exclude=./.bin --exclude=./dist -cf - . | (umask 077 && tar -xmf - -C "$$src") && \
	  $(MAKE) --no-print-directory -C "$$src" release-dist VERSION=$(RELEASE_CHECK_VERSION) RELEASE_PLATFORMS=$$($(GO) env GOOS)/$$($(GO) env GOARCH) \
	    DIST=$(CURDIR)/$(RELEASE_CHECK_DIR)/b BIN=$(BIN) COMMIT=$(COMMIT) SOURCE_DATE_EPOCH=$(SOURCE_DATE_EPOCH)
	diff -r $(RELEASE_CHECK_DIR)/a $(RELEASE_CHECK_DIR)/b
	cd $(RELEASE_CHECK_DIR)/a && sha256sum -c SHA256SUMS
	$(call RELEASE_TEST,$(RELEASE_CHECK_DIR)/a,$(RELEASE_CHECK_VERSION))

.PHONY: ci
ci: lint check-generated test release-check image-test ## what CI runs: lint, stale-code checks, tests, the release check, the image's test
