#!/usr/bin/env bash
# The VM tier's guest (tests/vm/run.sh builds it through this script when
# its cache misses): a Debian 12 root file system made by mmdebstrap from
# Debian's archive (through apt, so it reaches only what apt reaches), with
# systemd as PID 1, Debian's cloud kernel, and what the checks and the
# integration tests inside need. Writes into OUT (a new directory):
#   rootfs.img   raw ext4, the guest's / (booted read-write through a qcow2
#                overlay per run, so this file never changes)
#   vmlinuz, initrd.img   the kernel and initramfs installed in it
# Its runner (vm-tier.service) unpacks the run's payload disk and runs
# the checks from it (tests/vm/guest.sh), then powers off.
# The sandboxd package is NOT in the image: each run installs the one it
# built (`dpkg -i` is one of the checks). run.sh keys the cache by this
# file's hash: change a package here and the next run rebuilds.
#
#   bash tests/vm/image.sh OUT
set -euo pipefail

out=$1
suite=bookworm
mirror=http://deb.debian.org/debian
security=http://deb.debian.org/debian-security

packages=(
    # PID 1, its udev (module autoloading for virtio and 9p), the kernel.
    systemd systemd-sysv udev kmod linux-image-cloud-amd64 initramfs-tools
    # The package's dependency, and deb-systemd-helper for its scripts.
    nftables init-system-helpers
    # The in-guest checks: the API over curl, bpftool for the device
    # program, ip for the egress check's network namespace.
    curl jq bpftool iproute2 procps psmisc util-linux
    # The integration tests: workloads inside sandboxes use the host's /usr
    # (python3 and pip, git, cc), runc and crun cross-check bundles.
    python3 python3-pip git gcc libc6-dev runc crun ca-certificates
)

if [ -e "$out" ]; then
    echo "image.sh: $out exists" >&2
    exit 1
fi
work=$(mktemp -d "$(dirname "$out")/image.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root

echo "image.sh: mmdebstrap $suite (${#packages[@]} packages) into $root"
mmdebstrap --mode=root --variant=minbase --quiet \
    --include="$(IFS=,; echo "${packages[*]}")" \
    --aptopt='Acquire::Retries "3"' \
    --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' \
    "$suite" "$root" \
    "deb $mirror $suite main" \
    "deb $mirror $suite-updates main" \
    "deb $security $suite-security main"

echo sandboxd-vm > "$root/etc/hostname"
printf '127.0.0.1 localhost\n127.0.1.1 sandboxd-vm\n' > "$root/etc/hosts"
printf 'LABEL=root / ext4 rw,errors=remount-ro 0 1\n' > "$root/etc/fstab"
: > "$root/etc/machine-id"

# The runner. The cloud kernel has no 9p, so the run's files travel on
# virtio disks: the payload disk is a tar (the checks, the package, the
# integration test binary); the results disk receives a tar of out/ at the
# end. Each result line also goes out as it happens on the virtio-serial
# port tier.results, and the checks' output on the console. The guest
# powers off when the runner ends, whatever happened.
cat > "$root/usr/local/sbin/vm-tier-runner" <<'EOF'
#!/bin/sh
T=/var/tmp/tier
disk() { # the virtio disk with serial $1 (fallback: its usual name $2)
    for i in $(seq 50); do
        [ -e "/dev/disk/by-id/virtio-$1" ] && { echo "/dev/disk/by-id/virtio-$1"; return; }
        sleep 0.1
    done
    echo "$2"
}
rm -rf "$T" && mkdir -p "$T"
if tar -xf "$(disk tier-payload /dev/vdb)" -C "$T"; then
    mkdir -p "$T/out"
    echo "vm-tier: payload unpacked at uptime $(cut -d' ' -f1 /proc/uptime)" > /dev/console
    bash "$T/guest.sh" 2>&1 | tee "$T/out/guest.log" > /dev/console
else
    echo "vm-tier: cannot unpack the payload disk" > /dev/console
    mkdir -p "$T/out"
fi
tar -cf "$(disk tier-results /dev/vdc)" -C "$T" out
sync
echo "vm-tier: results written" > /dev/console
EOF
chmod 0755 "$root/usr/local/sbin/vm-tier-runner"
cat > "$root/etc/systemd/system/vm-tier.service" <<'EOF'
[Unit]
Description=sandboxd VM tier (tests/vm/run.sh)
After=multi-user.target
SuccessAction=poweroff-force
FailureAction=poweroff-force

[Service]
Type=oneshot
ExecStart=/usr/local/sbin/vm-tier-runner
TimeoutStartSec=infinity
TasksMax=infinity

[Install]
WantedBy=multi-user.target
EOF
chroot "$root" systemctl enable vm-tier.service
# Nothing else at boot: no login prompts, no timers.
chroot "$root" systemctl mask serial-getty@ttyS0.service getty@tty1.service \
    apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer e2scrub_all.timer \
    fstrim.timer man-db.timer systemd-tmpfiles-clean.timer >/dev/null 2>&1 || true

mkdir -p "$work/out"
cp "$(readlink -f "$root/vmlinuz")" "$work/out/vmlinuz"
cp "$(readlink -f "$root/initrd.img")" "$work/out/initrd.img"
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*
echo "image.sh: $(du -sh --exclude=proc "$root" | cut -f1) installed; making the ext4 image"
mkfs.ext4 -q -F -L root -E root_owner=0:0 -d "$root" "$work/out/rootfs.img" 4G
mv "$work/out" "$out"
echo "image.sh: done: $out"
