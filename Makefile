# Thin wrappers around cargo; the README's two commands are the truth.
CARGO ?= cargo

.PHONY: build test unit kernel-tier lint fmt crds demo bench

build:
	$(CARGO) build --workspace --all-targets

# Everything CI runs after lint: the workspace tests, then the kernel tier (VRF/VLAN netlink tests in a
# Debian kernel under qemu; installs qemu and the kernel package on first use).
test: unit kernel-tier

unit:
	$(CARGO) test --workspace

kernel-tier:
	bash tests/kernel-tier/ci-snippet.sh

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

crds:
	$(CARGO) run -q -p netwave-api --example crdgen

# The demo: 6 nodes in network namespaces, testbed API server, 2 configurators, 6 agents (needs root).
demo:
	$(CARGO) build -q -p netwave-testbed -p netwave-configurator -p netwave-agent -p netwave-e2e --bins
	"$${CARGO_TARGET_DIR:-target}/debug/netwave-demo" $(if $(NO_KERNEL),--no-kernel)

# Benchmarks print figures (release builds). The agent benchmark needs root.
bench:
	$(CARGO) run --release -q -p netwave-core --example bench_render
	$(CARGO) run --release -q -p netwave-core --example bench_step
	$(CARGO) run --release -q -p netwave-testbed --example scale
	$(CARGO) build --release -q -p netwave-agent --bins --examples
	target/release/examples/bench
