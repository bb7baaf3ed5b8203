# Targets print their help with `make help` (the default): the text after
# "##" on a target line is its help.

GOLANGCI_LINT ?= go run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0
# The library at the root, then the modules that keep their dependencies
# (OpenTelemetry, Prometheus, chromedp, GORM and sqlx, gonum/plot, the
# Docker client) out of its module graph.
MODULES := . pgleaseotel pgleaseprom pgleaseui cmd/pglease examples/orm bench internal/pgcontainer
# Runs $(1) in every module, each against its own go.mod.
each_module = set -e; for m in $(MODULES); do echo "== $$m"; (cd $$m && GOWORK=off $(1)); done

.DEFAULT_GOAL := help
.PHONY: help test unit faults demo bench model nemesis lint vet tidy ci cli readme

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

test: ## Run every test of every module against a real PostgreSQL, with the race detector
	@$(call each_module,go test -race ./...)

unit: ## Run the tests that need no server: the Locker's logic on the in-memory driver, the mechanisms of internal/
	go test -race -short ./...

faults: ## Run the fault, failover, durability, server-clock, guard-chaos and soak suites alone
	go test -race -count=1 -v ./faults/

demo: ## Run the demo: replicas of a scheduler, the one running the job killed mid-run, and the ledger of runs
	go run ./examples/replicas

bench: ## Run the Go benchmarks, then the benchmark report program
	go test -bench . -run '^$$' -benchmem ./...
	go run ./bench

model: ## Check the protocol model
	bash model/check.sh

# The nemesis run's length and seed: make nemesis NEMESIS_DURATION=30m
# NEMESIS_SEED=42 (a seed of 0 takes one from the clock; every run prints
# its own).
NEMESIS_DURATION ?= 10m
NEMESIS_SEED ?= 0

nemesis: ## Run the nemesis test for NEMESIS_DURATION (10m), NEMESIS_SEED=N to replay a run
	go test -race -count=1 -timeout 3h -run '^TestNemesis' -v . -args -nemesis.duration=$(NEMESIS_DURATION) -nemesis.seed=$(NEMESIS_SEED) -nemesis.check=10m

lint: ## Run golangci-lint v2.15.0 over every module
	@$(call each_module,$(GOLANGCI_LINT) run ./...)

vet: ## Run go vet over every module
	@$(call each_module,go vet ./...)

tidy: ## Run go mod tidy in every module
	@$(call each_module,go mod tidy)

ci: ## Run what CI runs (.ci/run)
	bash .ci/run

cli: ## Run the operator CLI; pass arguments with ARGS="status -json"
	go run ./cmd/pglease $(ARGS)

readme: ## Rewrite the Go snippets of README.md, docs/GUIDE.md, docs/OPERATIONS.md and doc.go from the examples they name
	go run ./internal/readme/cmd/readme
