# pgscribe. `make help` lists the targets; `make test` runs everything.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO ?= go
# Image for the integration tests. Where it is absent and cannot be pulled
# (no registry), pg-image builds LOCAL_PG_IMAGE from this machine's
# PostgreSQL install and the tests use that instead.
PG_IMAGE ?= postgres:16
LOCAL_PG_IMAGE ?= pgscribe-postgres:local
PULL_TIMEOUT ?= 120
TEST_TIMEOUT ?= 45m
# The image pg-image chose, read by `test`; empty when there is no Docker
# engine (the harness then uses local PostgreSQL binaries).
PG_IMAGE_FILE := .cache/pg-image

.PHONY: help build test test-unit vet pg-image demo walkthrough bench clean console-screenshots bench-console campaign

help: ## list the targets
	@awk 'BEGIN { FS = ":.*## " } /^[a-zA-Z_-]+:.*## / { printf "  %-12s %s\n", $$1, $$2 }' $(MAKEFILE_LIST)

# What `pgscribe version` prints (empty values fall back to the VCS
# information the go command embeds, or "unknown").
BUILD_VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
BUILD_COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null)
BUILD_DATE ?= $(shell TZ=UTC git log -1 --date=format-local:%Y-%m-%dT%H:%M:%SZ --format=%cd 2>/dev/null)
LDFLAGS := -X main.version=$(BUILD_VERSION) -X main.commit=$(BUILD_COMMIT) -X main.commitDate=$(BUILD_DATE)

build: ## build bin/pgscribe
	$(GO) build -ldflags "$(LDFLAGS)" -o bin/pgscribe .

# `test` pipes `go test -json` through internal/tools/testsum: per-package
# lines as they come, the output of every failed test, every skipped test
# with its reason, then one line "N passed, N failed, N skipped" (tests and
# subtests each count). It fails when any test or package does.
TESTSUM := .cache/testsum

test: pg-image ## run all tests with -race, integration tests against real PostgreSQL; ends with a summary
	$(GO) build -o $(TESTSUM) ./internal/tools/testsum
	PGSCRIBE_TEST_PG_IMAGE="$${PGSCRIBE_TEST_PG_IMAGE:-$$(cat $(PG_IMAGE_FILE) 2>/dev/null || true)}" \
		$(GO) test -json -race -count=1 -timeout $(TEST_TIMEOUT) ./... | $(TESTSUM)

bench-console: build ## the console beside pgscribe status at 50 versions and 100k dead letters (bench/RESULTS.md, "Console")
	$(GO) run ./bench/consolebench -bin bin/pgscribe

console-screenshots: pg-image ## refresh docs/img/console-*.png with the console's browser test (needs chromium)
	PGSCRIBE_TEST_PG_IMAGE="$${PGSCRIBE_TEST_PG_IMAGE:-$$(cat $(PG_IMAGE_FILE) 2>/dev/null || true)}" \
	PGSCRIBE_CONSOLE_SCREENSHOTS=$(CURDIR)/docs/img $(GO) test -count=1 -run TestConsoleBrowser ./integration/

test-unit: ## run the unit tests only (-short, no database)
	$(GO) test -race -short -count=1 ./...

vet: ## run go vet
	$(GO) vet ./...

pg-image: ## make sure a PostgreSQL image for the tests exists (pull, else build one locally)
	@mkdir -p $(dir $(PG_IMAGE_FILE))
	@if [ -n "$${PGSCRIBE_TEST_PG_IMAGE:-}" ]; then \
		echo "pg-image: PGSCRIBE_TEST_PG_IMAGE=$$PGSCRIBE_TEST_PG_IMAGE is set; using it as is"; \
		echo "$$PGSCRIBE_TEST_PG_IMAGE" > $(PG_IMAGE_FILE); \
	elif ! docker info >/dev/null 2>&1; then \
		echo "pg-image: no Docker engine; the tests will use local PostgreSQL binaries"; \
		: > $(PG_IMAGE_FILE); \
	elif docker image inspect $(PG_IMAGE) >/dev/null 2>&1; then \
		echo "$(PG_IMAGE)" > $(PG_IMAGE_FILE); \
	elif timeout $(PULL_TIMEOUT) docker pull -q $(PG_IMAGE) >/dev/null 2>&1; then \
		echo "pg-image: pulled $(PG_IMAGE)"; \
		echo "$(PG_IMAGE)" > $(PG_IMAGE_FILE); \
	else \
		echo "pg-image: cannot pull $(PG_IMAGE); using $(LOCAL_PG_IMAGE) built from local PostgreSQL"; \
		scripts/build-pg-image.sh $(LOCAL_PG_IMAGE); \
		echo "$(LOCAL_PG_IMAGE)" > $(PG_IMAGE_FILE); \
	fi
	@echo "pg-image: tests use image '$$(cat $(PG_IMAGE_FILE))'" | sed "s/image ''/local PostgreSQL binaries/"

# The demo is built into bin/ and run from there, not with `go run`: the
# signals of Ctrl-C or `timeout` then reach the demo itself, and no binary
# is left in the temporary directory when `go run` is killed. It uses the
# PostgreSQL image `make pg-image` chose, if it ran (else the test harness's
# default, falling back to local binaries with a word of why).
demo: build ## a throwaway PostgreSQL, the demo read models, sample events and the engine (Ctrl-C stops)
	$(GO) build -o bin/demo ./internal/tools/demo
	PGSCRIBE_TEST_PG_IMAGE="$${PGSCRIBE_TEST_PG_IMAGE:-$$(cat $(PG_IMAGE_FILE) 2>/dev/null || true)}" \
		bin/demo -bin bin/pgscribe -config config.toml.example -schema examples/demo/schema.sql

walkthrough: ## the first hour as a script: CLI messages, make demo stopped by Ctrl-C and SIGTERM, nothing left behind (~1 min)
	GO=$(GO) scripts/walkthrough.sh

# Extra flags for the bench program, e.g. BENCH_FLAGS="-scale 0.1 -workloads W1,W4"
# for a smoke run (quick runs write to bench/out/, never over bench/RESULTS.md).
BENCH_FLAGS ?=

bench: build ## benchmarks against their references on a throwaway PostgreSQL (fsync on); writes bench/RESULTS.md and results.png
	$(GO) run ./bench -bin bin/pgscribe -go $(GO) $(BENCH_FLAGS)

# The seeded fault campaign (docs/testing.md#the-fault-campaign-make-campaign):
# SEED empty draws one from the clock; SKIP drops steps of the schedule by
# number (2,5); CAMPAIGN_FLAGS passes more flags, e.g. -minimise or -dry.
SEED ?=
DURATION ?= 60s
SKIP ?=
CAMPAIGN_FLAGS ?=

campaign: pg-image ## seeded fault campaign against real PostgreSQL: make campaign SEED=10 DURATION=2m
	PGSCRIBE_TEST_PG_IMAGE="$${PGSCRIBE_TEST_PG_IMAGE:-$$(cat $(PG_IMAGE_FILE) 2>/dev/null || true)}" \
		$(GO) run ./internal/tools/campaign -go $(GO) -duration $(DURATION) \
		$(if $(SEED),-seed $(SEED)) $(if $(SKIP),-skip $(SKIP)) $(CAMPAIGN_FLAGS)

clean: ## remove build outputs and caches
	rm -rf bin .cache

# Checks of deploy/: promtool validates and unit-tests the alerting rules, and
# the Go test in deploy/ checks every alert and dashboard query against the
# metrics pgscribe exports. promtool comes from Debian's `prometheus` package;
# without it the rule checks are skipped with a note, except in CI.
PROMTOOL ?= promtool

.PHONY: lint-deploy
lint-deploy: ## check the Prometheus alert rules (promtool) and the Grafana dashboard
	@if command -v $(PROMTOOL) >/dev/null 2>&1; then \
		$(PROMTOOL) check rules deploy/prometheus/pgscribe-rules.yml; \
		(cd deploy/prometheus && $(PROMTOOL) test rules pgscribe-rules.test.yml); \
	elif [ -n "$${CI:-}" ]; then \
		echo "lint-deploy: promtool not found (apt-get install prometheus)" >&2; exit 1; \
	else \
		echo "lint-deploy: promtool not found; skipping the rule checks (apt-get install prometheus)"; \
	fi
	$(GO) test -count=1 ./deploy/

# `make test` runs the deploy checks too (CI runs `make test`).
test: lint-deploy
