# Thin wrappers around cargo; the README's two commands are the truth.
CARGO ?= cargo

.PHONY: build test lint fmt crds demo bench

build:
	$(CARGO) build --workspace --all-targets

test:
	$(CARGO) test --workspace

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

crds:
	$(CARGO) run -q -p netwave-api --example crdgen

demo:
	@echo "make demo lands with issue 7 (fleet in network namespaces); see README.md" >&2; exit 2

bench:
	@echo "no benchmarks yet" >&2
