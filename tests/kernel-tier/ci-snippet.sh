# Kernel tier for .ci/run (paste after the `make test` step, or `source tests/kernel-tier/ci-snippet.sh`).
# Boots Debian's cloud kernel under qemu and runs every test named kernel_tier_* in the packages below
# (tests/kernel-tier/run.sh). Fails the run if they fail or the guest gives no verdict; skips with a loud
# banner (exit 77 from run.sh) only when qemu, busybox or the kernel package cannot be installed/downloaded.
# Add a package when its kernel_tier_* tests pass in the tier; `--test kernel_tier` builds only that test
# target of each package (both have tests/kernel_tier.rs), which keeps the static link step short:
#   KERNEL_TIER_PACKAGES=(-p netwave-kernel-tier -p netwave-agent --test kernel_tier)
KERNEL_TIER_PACKAGES=(-p netwave-kernel-tier -p netwave-agent --test kernel_tier)
echo "== kernel tier (VRF/VLAN tests in a Debian kernel under qemu)"
kernel_tier_rc=0
tests/kernel-tier/run.sh --filter kernel_tier_ "${KERNEL_TIER_PACKAGES[@]}" || kernel_tier_rc=$?
case $kernel_tier_rc in
    0) ;;
    77) echo "== kernel tier SKIPPED: packages could not be installed or downloaded (see the banner above)" ;;
    *) echo "== kernel tier FAILED (run.sh exit $kernel_tier_rc)"; exit "$kernel_tier_rc" ;;
esac
