# Thin wrappers around cargo; the README's two commands are the truth.
CARGO ?= cargo

.PHONY: build deps test unit kernel-tier fleet-vm control-plane lint fmt crds demo cluster bench explore images previous-release

build:
	$(CARGO) build --workspace --all-targets

# Every tool the demo and the tests run (tools/deps.sh says which and why): as root on Debian it installs
# what is missing (FRR, ping, buildah, mmdebstrap, Prometheus, qemu, busybox-static; ~1-2 min once),
# otherwise it names each missing tool and how to install it. DEPS=demo|demo-nokernel|vm|cluster|test.
DEPS ?= test
deps:
	@bash tools/deps.sh $(DEPS)

# Everything CI runs after lint: the tools (make deps), the real control plane (built from Go modules on
# first use), the images, the previous release, the workspace tests against them, then the kernel tier
# (VRF/VLAN netlink tests in a Debian kernel under qemu; downloads the kernel package on first use).
test:
	@bash tools/deps.sh test
	$(MAKE) --no-print-directory control-plane images previous-release unit kernel-tier fleet-vm

# kube-apiserver, etcd and kubectl from Go modules, cached in ~/.cache/netwave/control-plane/ (cold:
# ~10 min on 2 cores; nothing when cached). Prints the versions and how long the build took. Then the
# GitOps tools of #50's tests, cached beside it: kstatus and Argo CD's Lua VM (~40 s cold), and Flux's
# source-controller and kustomize-controller (~8 min cold).
control-plane:
	@dir=$$(bash tests/control-plane/build.sh) && echo "control plane: $$(cat $$dir/build-info)"
	@echo "gitops-health: $$(bash tests/gitops-health/build.sh)"
	@echo "flux: $$(bash tests/flux/build.sh)"

# OCI images of the configurator, the agent (static release binaries on an empty base) and the agent with
# FRR (Debian bookworm via mmdebstrap) in target/images/<name>/, built with buildah (no Docker engine),
# tagged v<workspace version>. Cold: ~10 min on 2 cores (the static release build; Debian ~35 s); warm:
# ~15 s. tests/tests/images.rs checks them.
images:
	CARGO="$(CARGO)" bash images/build.sh

# The previous release (releases.toml's newest entry): its binaries, CRDs and manifests built from its
# commit, and its images, in ~/.cache/netwave/releases/ (cold: ~8-11 min on 2 cores; nothing when cached).
# The skew tests and the real node's upgrade test install it beside this tree.
previous-release:
	@dir=$$(bash tests/previous-release/images.sh) && echo "previous release: $$(cat $$dir/build-info)"

# The workspace tests, several test binaries at once (tests/run-suites.sh says why and how).
unit:
	CARGO="$(CARGO)" bash tests/run-suites.sh

kernel-tier:
	bash tests/kernel-tier/ci-snippet.sh

# The whole fleet (API server, configurators, agents, FRR per node) inside Debian's cloud kernel under
# qemu: VRFs, L3 VNIs, leaking, a VLAN trunk, a bad VRF rolled back, BGP as a service (tests/tests/fleet_vm.rs).
# Makes the guest root filesystem with mmdebstrap on first use (~2 min, cached a week); the run takes 6-21 min under TCG (measured 395 s, 894 s and 1,279 s on three machines).
fleet-vm:
	@bash tests/kernel-tier/fleet-vm.sh; rc=$$?; \
	if [ $$rc = 77 ]; then echo "== full-kernel fleet SKIPPED: its packages could not be installed (banner above)"; \
	elif [ $$rc != 0 ]; then echo "== full-kernel fleet FAILED (fleet-vm.sh exit $$rc)"; exit $$rc; fi

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

crds:
	$(CARGO) run -q -p netwave-api --example crdgen

# The demo: 6 nodes in network namespaces, testbed API server, 2 configurators, 6 agents (needs root).
# REAL=1: on kube-apiserver + etcd built from Go modules instead of the testbed.
# KERNEL=full: the same demo inside Debian's cloud kernel under qemu (tests/kernel-tier/fleet-vm.sh),
# with real FRR per node (BGP EVPN), where the samples' VRFs get their L3 VNIs (a few minutes).
demo:
ifeq ($(KERNEL),full)
	@bash tools/deps.sh vm
	bash tests/kernel-tier/fleet-vm.sh --demo
else
	@bash tools/deps.sh $(if $(NO_KERNEL),demo-nokernel,demo)
	$(CARGO) build -q -p netwave-testbed -p netwave-configurator -p netwave-agent -p netwave-e2e --bins
	"$${CARGO_TARGET_DIR:-target}/debug/netwave-demo" $(if $(NO_KERNEL),--no-kernel) $(if $(REAL),--real-control-plane)
endif

# A real cluster on this machine for a person to try netwave on (needs root): etcd, kube-apiserver,
# controller-manager, scheduler, one kubelet on containerd (network namespace netwave-real-node), netwave
# installed with `kubectl apply -k deploy/base` (EVPN=1: deploy/overlays/evpn, FRR beside the agent) from
# the images of `make images`. Prints the kubeconfig; Ctrl-C tears it all down.
cluster:
	@bash tools/deps.sh cluster
	@$(MAKE) --no-print-directory control-plane images
	$(CARGO) build -q -p netwave-e2e --bins
	"$${CARGO_TARGET_DIR:-target}/debug/netwave-cluster" $(if $(EVPN),--evpn)

# Benchmarks print figures (release builds). The agent benchmark and the hitless table (packets lost per
# flow while a 3-node FRR fleet applies each kind of change, tests/tests/hitless.rs) need root. The fleet benchmark runs
# six rollouts per size and das-schiff's rules as a baseline, on the testbed and then on the real
# kube-apiserver + etcd (built from Go modules on first use, cached outside the repo); about 20 min for
# 1,000 and 5,000 nodes on both servers on 2 cores, and 8 more for 15,000 on the testbed. kube-apiserver
# runs sizes up to BENCH_FLEET_APISERVER_MAX (it took ~3 GiB at 5,000 nodes; set it to 15000 to add that
# size on it too: up to 4.9 GiB and 1.0 GiB for etcd, ~25 min more; on 2 cores it saturates, 5-12 x the
# ideal per rollout; some runs failed their second revision on the bench's 10 s pickup timeout, and the
# spec delivery line of each rollout says how close that came, #28). BENCH_FLEET_SIZES="1000" and BENCH_FLEET_SERVERS="apiserver" (comma-separated) pick
# other sizes and servers; BENCH_FLEET_AGENT_WATCH=node gives each simulated agent its own watch.
BENCH_FLEET_SIZES ?= 1000,5000,15000
BENCH_FLEET_SERVERS ?= testbed,apiserver
BENCH_FLEET_APISERVER_MAX ?= 5000
bench:
	$(CARGO) run --release -q -p netwave-core --example bench_render
	$(CARGO) run --release -q -p netwave-core --example bench_step
	$(CARGO) run --release -q -p netwave-testbed --example scale
	$(CARGO) run --release -q -p netwave-configurator --example bench_reconcile
	$(CARGO) build --release -q -p netwave-configurator -p netwave-testbed --bins && \
		BENCH_FLEET_SIZES="$(BENCH_FLEET_SIZES)" BENCH_FLEET_SERVERS="$(BENCH_FLEET_SERVERS)" \
		BENCH_FLEET_APISERVER_MAX="$(BENCH_FLEET_APISERVER_MAX)" $(CARGO) run --release -q -p netwave-configurator --example bench_fleet
	$(CARGO) build --release -q -p netwave-agent --bins
	$(CARGO) build --profile agent-release -q -p netwave-agent --bins --examples
	"$${CARGO_TARGET_DIR:-target}/agent-release/examples/bench"
	$(CARGO) test -q -p netwave-e2e --test hitless -- --nocapture

# Core properties and simulator on fresh random seeds (EXPLORE_CASES per property, EXPLORE_SIM_SEEDS
# runs, EXPLORE_SEED replays a run); prints any counterexample and its regression line.
EXPLORE_CASES ?= 100000
EXPLORE_SIM_SEEDS ?= 10000
explore:
	@seed=$${EXPLORE_SEED:-$$(od -An -N8 -tu8 /dev/urandom | tr -d ' ')}; \
	echo "explore: seed $$seed, $(EXPLORE_CASES) cases per property, $(EXPLORE_SIM_SEEDS) simulator runs"; \
	PROPTEST_RNG_SEED=$$seed PROPTEST_CASES=$(EXPLORE_CASES) EXPLORE_SEED=$$seed EXPLORE_SIM_SEEDS=$(EXPLORE_SIM_SEEDS) \
		$(CARGO) test --release --no-fail-fast -p netwave-core --lib --tests -- --include-ignored --show-output; rc=$$?; \
	git --no-pager diff --no-color -U0 -- crates/core/proptest-regressions | grep '^+cc' | sed 's/^+/new regression: /'; \
	git ls-files --others --exclude-standard -- crates/core/proptest-regressions | xargs -r grep -h '^cc' | sed 's/^/new regression: /'; \
	echo "explore: seed $$seed: $$([ $$rc = 0 ] && echo nothing found || echo 'FAILED (counterexamples above)')"; exit $$rc
