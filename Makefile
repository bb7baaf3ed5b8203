# Targets print their help with `make help` (the default): the text after
# "##" on a target line is its help.

GOLANGCI_LINT ?= go run github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v2.15.0

.DEFAULT_GOAL := help
.PHONY: help test demo bench model lint vet ci cli readme

help: ## Show this help
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

test: ## Run every test against a real PostgreSQL, with the race detector
	go test -race ./...

demo: ## Run the demo: replicas of a scheduler taking turns on one job
	go run ./examples/replicas

bench: ## Run the Go benchmarks, then the benchmark report program
	go test -bench . -run '^$$' -benchmem ./...
	go run ./bench

model: ## Check the protocol model
	bash model/check.sh

lint: ## Run golangci-lint v2.15.0 over the whole module
	$(GOLANGCI_LINT) run ./...

vet: ## Run go vet
	go vet ./...

ci: ## Run what CI runs (.ci/run)
	bash .ci/run

cli: ## Run the operator CLI; pass arguments with ARGS="status -json"
	go run ./cmd/pglease $(ARGS)

readme: ## Rewrite the Go snippets of README.md and docs/OPERATIONS.md from the examples they name
	go run ./internal/readme/cmd/readme
