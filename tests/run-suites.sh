#!/usr/bin/env bash
# Runs the workspace's tests — what `cargo test --workspace` runs — with several test binaries at once.
#
#   bash tests/run-suites.sh            # lanes: $TEST_LANES, default 3
#
# Why not `cargo test --workspace`: it runs the ~50 test binaries one after another, and most of their
# time is spent waiting (rollouts with apply delays, API servers starting, FRR converging), so on 2 cores
# the run was ~17 of CI's ~60 cold minutes with the CPU half idle. Why not cargo-nextest: it runs every
# test in its own process, and our API suites share one kube-apiserver + etcd per test binary (started
# once, emptied between tests); per test that would start ~100 control planes.
#
# How: one `cargo test --workspace --no-run` builds every test binary with the workspace's unified
# features (exactly what `cargo test --workspace` builds), then each binary runs as cargo would run it
# (working directory and CARGO_* variables of its package), up to $TEST_LANES at a time, the slowest
# first; doc tests run as one more job. The binaries are independent: each makes its own namespaces,
# temporary directories, FRR path spaces and control plane on free ports. A job's output is kept in
# target/test-suites/ and printed only when it fails; every job prints one line with its time. Extra
# arguments go to every test binary (e.g. `-- --nocapture`). Exit status: non-zero if any job failed.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo=${CARGO:-cargo}
lanes=${TEST_LANES:-3}
target_dir=${CARGO_TARGET_DIR:-$PWD/target}
logs=$target_dir/test-suites
rm -rf "$logs"
mkdir -p "$logs"

start=$(date +%s)
# The list of test executables: one JSON line per compiled artifact; a test build has profile.test.
"$cargo" test --workspace --no-run --message-format=json-render-diagnostics >"$logs/build.json"
python3 - "$logs/build.json" >"$logs/jobs.tsv" <<'EOF'
import json, os, sys
for line in open(sys.argv[1]):
    m = json.loads(line)
    if m.get("reason") != "compiler-artifact" or not m["profile"]["test"] or not m.get("executable"):
        continue
    # path+file:///…/dir#name@0.1.0, or path+file:///…/name#0.1.0 for a package named like its directory
    url, _, frag = m["package_id"].partition("#")
    pkg = frag.split("@")[0] if "@" in frag else url.rstrip("/").rsplit("/", 1)[-1]
    name = f"{pkg}:{m['target']['kind'][0]}:{m['target']['name']}"
    print("\t".join([name, os.path.dirname(m["manifest_path"]), pkg, m["executable"]]))
EOF
echo "test binaries built in $(($(date +%s) - start)) s: $(wc -l <"$logs/jobs.tsv") binaries, $lanes lanes"
# The e2e fleets run the netwave binaries this build put in target/debug (built for the integration
# tests, with the workspace's features). Without this they would `cargo build` a few packages, whose
# other feature set relinks target/debug/netwave-* while other lanes run them.
export NETWAVE_BIN_DIR=$target_dir/debug

# One job runs these binaries one after another: each builds fleets of network namespaces wired to the
# same host address in the root namespace (tests/src/fleet.rs serialises them anyway, across processes,
# with Fleet::lock; as one job they do not hold lanes while they wait for it). The real-node suites
# (tests/tests/real_node*.rs: real_node, real_node_monitoring, real_node_upgrade) are netwave-e2e binaries
# too and run here:
# one kubelet per machine (netwave_control_plane::machine_lock).
fleet_group=netwave-e2e:test:
# Slowest first (longest-processing-time order keeps the lanes even). Measured on 2 cores: the fleet
# group 231-277 s (before real_node_monitoring, ~180 s alone, joined it), failover 137-147 s, scenarios 38-42 s, frr_root 27 s; most binaries under 25 s. Jobs not
# named here follow in build order.
slow=(
    fleet-group
    netwave-configurator:test:failover
    netwave-configurator:test:scenarios
    netwave-agent:test:frr_root
)
order=()
for s in "${slow[@]}"; do
    if [ "$s" = fleet-group ] || grep -q "^$s"$'\t' "$logs/jobs.tsv"; then order+=("$s"); fi
done
while IFS=$'\t' read -r name _; do
    [[ $name == "$fleet_group"* || " ${slow[*]} " == *" $name "* ]] || order+=("$name")
done <"$logs/jobs.tsv"
order+=(doctests)

run_binary() {
    local dir pkg exe
    IFS=$'\t' read -r _ dir pkg exe < <(grep "^$1"$'\t' "$logs/jobs.tsv")
    shift
    (cd "$dir" && CARGO="$(command -v "$cargo")" CARGO_MANIFEST_DIR="$dir" CARGO_PKG_NAME="$pkg" \
        "$exe" "$@" </dev/null)
}

run_job() {
    local name=$1 log=$logs/$1.log
    shift
    case $name in
    doctests) "$cargo" test --workspace --doc "$@" >"$log" 2>&1 ;;
    fleet-group)
        local status=0 member
        while IFS=$'\t' read -r member _; do
            [[ $member == "$fleet_group"* ]] || continue
            echo "===== $member" >>"$log"
            run_binary "$member" "$@" >>"$log" 2>&1 || status=$?
        done <"$logs/jobs.tsv"
        return "$status"
        ;;
    *) run_binary "$name" "$@" >"$log" 2>&1 ;;
    esac
}

declare -A started=() name_of=()
failed=()
extra=("$@")
[ "${extra[0]:-}" = -- ] && extra=("${extra[@]:1}")
finish() {
    local pid status=0
    wait -n -p pid || status=$?
    local name=${name_of[$pid]}
    local took=$(($(date +%s) - ${started[$pid]}))
    local summary
    summary=$({ grep -h '^test result:' "$logs/$name.log" || true; } | awk '{p+=$4; f+=$6; i+=$8} END {printf "%d passed, %d failed, %d ignored", p, f, i}')
    if [ "$status" -eq 0 ]; then
        printf '  ok    %4d s  %-48s %s\n' "$took" "$name" "$summary"
    else
        printf '  FAIL  %4d s  %-48s %s (exit %d)\n' "$took" "$name" "$summary" "$status"
        echo "----- output of $name -----"
        cat "$logs/$name.log"
        echo "----- end of $name -----"
        failed+=("$name")
    fi
    unset "name_of[$pid]" "started[$pid]"
}
for name in "${order[@]}"; do
    while [ "${#name_of[@]}" -ge "$lanes" ]; do finish; done
    run_job "$name" "${extra[@]}" &
    name_of[$!]=$name
    started[$!]=$(date +%s)
done
while [ "${#name_of[@]}" -gt 0 ]; do finish; done

echo "tests: $((${#order[@]} - ${#failed[@]})) of ${#order[@]} jobs passed in $(($(date +%s) - start)) s (logs in $logs)"
if [ "${#failed[@]}" -gt 0 ]; then
    echo "FAILED: ${failed[*]}"
    exit 1
fi
