#!/usr/bin/env bash
# Build, once, the guest images of the end-to-end suite (docs/e2e.md) and
# cache them outside the repository.
#
#   bash e2e/images.sh            build what is missing or out of date
#   bash e2e/images.sh --force    rebuild everything
#   bash e2e/images.sh --smoke    only `bookworm`, the image of CI's smoke run
#
# Needs root, debootstrap, e2fsprogs and network access to the Debian
# archive (bash e2e/host-packages.sh installs the host side). Images go to
# $COCOON_FIXUP_E2E_CACHE (default /var/tmp/cocoon-fixup-e2e)/images/<name>/:
#
#   rootfs.raw   ext4 root file system (sparse, 2 GiB apparent size)
#   vmlinuz, initrd.img   the guest kernel and initramfs, booted directly
#   image.json   what the tests need to know about the image: the parent's
#                ("golden") MAC and address, the release, cloud-init's version
#   ready        the recipe's sha256; a different one means "rebuild"
#
# Images:
#
#   bookworm          Debian 12, systemd-networkd with a golden file
#                     10-<mac A>.network matching the parent's MAC A with the
#                     parent's static address X
#   bookworm-cloud    Debian 12 with cloud-init 22.4.x (NoCloud, networkd
#                     renderer); `cloud-init clean` has no --configs
#   trixie-cloud      Debian 13 with cloud-init 25.x (has --configs)
#   bookworm-nm       Debian 12 whose network NetworkManager owns (networkd
#                     installed, as Debian ships it, but not enabled), with
#                     a keyfile for the parent's MAC A and address X
#
# Every image: minbase + systemd, udev, iproute2, iputils-ping, e2fsprogs,
# qemu-guest-agent, linux-image-cloud-amd64, dbus; an empty machine-id
# (the parent's first boot makes one, which its snapshot clones share); no
# timers that would wake up during a test.
set -euo pipefail

# The parent VM's identity, written into image.json for the tests. Addresses
# live only inside the network namespaces the tests create.
readonly MAC_A=52:54:00:e2:e0:0a
readonly IP_X=10.213.7.10
readonly PREFIX=24
readonly GATEWAY=10.213.7.1

readonly CACHE=${COCOON_FIXUP_E2E_CACHE:-/var/tmp/cocoon-fixup-e2e}
# shellcheck source=apt-mirror.sh
. "$(dirname "$0")/apt-mirror.sh"
MIRROR=$(e2e_mirror)
readonly MIRROR
readonly SIZE=2G
readonly BASE_PACKAGES=systemd,systemd-sysv,udev,dbus,iproute2,iputils-ping,e2fsprogs,qemu-guest-agent,linux-image-cloud-amd64

force=0
smoke=0
case "${1:-}" in
    --force) force=1 ;;
    --smoke) smoke=1 ;;
    "") ;;
    *) echo "usage: $0 [--force | --smoke]" >&2; exit 2 ;;
esac

die() { echo "images.sh: $*" >&2; exit 1; }

[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, chroot, mkfs); run: sudo bash $0"
for tool in debootstrap mkfs.ext4 chroot sha256sum flock; do
    command -v "$tool" >/dev/null || die "$tool is missing; run: sudo bash $(dirname "$0")/host-packages.sh"
done

recipe=$(sha256sum "$0" | cut -d' ' -f1)
mkdir -p "$CACHE/images" "$CACHE/build" "$CACHE/debs"
exec 9>"$CACHE/.build.lock"
flock 9

now() { date +%s; }
elapsed() { echo "$(( $(now) - $1 ))s"; }

up_to_date() {
    [ "$force" -eq 0 ] && [ -f "$CACHE/images/$1/ready" ] && [ "$(cat "$CACHE/images/$1/ready")" = "$recipe" ]
}

# Unmount whatever chroot mounts a failed run left behind.
cleanup_mounts() {
    local m
    for m in $(awk -v c="$CACHE/build" '$2 ~ "^"c { print $2 }' /proc/mounts | sort -r); do
        umount -l "$m" || true
    done
}
trap cleanup_mounts EXIT

# Downloads fail now and then: three tries, 10 s and 30 s apart. What was
# downloaded stays in the package cache, so a retry fetches only the rest.
retry() {
    local try
    for try in 1 2 3; do
        "$@" && return 0
        [ "$try" -eq 3 ] && return 1
        local pause=$((try == 1 ? 10 : 30))
        echo "   try $try failed; again in ${pause}s" >&2
        sleep "$pause"
    done
}

# debootstrap a minbase tree of release $1 into $2.
bootstrap() {
    local release=$1 tree=$2 t
    t=$(now)
    echo "== debootstrap $release (minbase)"
    bootstrap_once() {
        cleanup_mounts
        rm -rf --one-file-system "$tree"
        debootstrap --variant=minbase --cache-dir="$CACHE/debs" \
            --include="$BASE_PACKAGES" "$release" "$tree" "$MIRROR" \
            >"$tree.debootstrap.log" 2>&1
    }
    retry bootstrap_once ||
        { tail -30 "$tree.debootstrap.log" >&2; die "debootstrap $release failed 3 times (log: $tree.debootstrap.log)"; }
    echo "   debootstrap $release: $(elapsed "$t")"
}

# Run apt-get inside the tree: /proc mounted, no service started.
chroot_apt() {
    local tree=$1; shift
    cp /etc/resolv.conf "$tree/etc/resolv.conf"
    printf '#!/bin/sh\nexit 101\n' >"$tree/usr/sbin/policy-rc.d"
    chmod 755 "$tree/usr/sbin/policy-rc.d"
    mount -t proc proc "$tree/proc"
    local rc=0
    chroot "$tree" env DEBIAN_FRONTEND=noninteractive LC_ALL=C apt-get "$@" >"$tree.apt.log" 2>&1 || rc=$?
    umount "$tree/proc"
    rm -f "$tree/usr/sbin/policy-rc.d" "$tree/etc/resolv.conf"
    [ "$rc" -eq 0 ] || { tail -30 "$tree.apt.log" >&2; echo "apt-get $* in $tree failed (log: $tree.apt.log)" >&2; return 1; }
}

# Settings every image shares.
configure_common() {
    local tree=$1
    printf '/dev/vda / ext4 rw,errors=remount-ro 0 1\n' >"$tree/etc/fstab"
    echo e2e-parent >"$tree/etc/hostname"
    # systemd-networkd is in the systemd package on Debian 12 and a package
    # of its own on Debian 13.
    if [ ! -e "$tree/usr/lib/systemd/systemd-networkd" ] && [ ! -e "$tree/lib/systemd/systemd-networkd" ]; then
        retry chroot_apt "$tree" install -y --no-install-recommends systemd-networkd || die "apt-get in $tree failed 3 times"
    fi
    chroot "$tree" systemctl enable systemd-networkd.service >/dev/null 2>&1
    # Nothing waits for the network, and no timer wakes up mid-test.
    chroot "$tree" systemctl mask systemd-networkd-wait-online.service \
        apt-daily.timer apt-daily-upgrade.timer e2scrub_all.timer fstrim.timer \
        man-db.timer dpkg-db-backup.timer >/dev/null 2>&1 || true
    rm -f "$tree"/etc/systemd/network/*
    # The parent's first boot makes a machine-id (and so its DHCP DUID);
    # its snapshot clones share it, and lease by MAC (ClientIdentifier=mac).
    : >"$tree/etc/machine-id"
    rm -f "$tree/var/lib/dbus/machine-id"
    chroot "$tree" apt-get clean
    rm -rf "$tree"/var/lib/apt/lists/* "$tree"/var/log/*.log
}

cloud_init_config() {
    local tree=$1
    mkdir -p "$tree/etc/cloud/cloud.cfg.d"
    cat >"$tree/etc/cloud/cloud.cfg.d/90-cocoon-fixup-e2e.cfg" <<'EOF'
# NoCloud seed on a CD (label cidata); networkd renders and activates.
datasource_list: [NoCloud, None]
system_info:
  network:
    renderers: [networkd]
    activators: [networkd]
# minbase has no update-locale: without this, `cloud-init modules` fails.
locale: false
EOF
}

# NetworkManager owns the network: networkd stays installed but disabled
# (Debian's default), NetworkManager configures only what a keyfile names
# (no automatic "Wired connection" on a NIC nothing matches), and the
# parent's keyfile has the form the nm-keyfile plugin writes, for MAC A.
configure_network_manager() {
    local tree=$1
    chroot "$tree" systemctl disable systemd-networkd.service systemd-networkd.socket >/dev/null 2>&1 || true
    chroot "$tree" systemctl enable NetworkManager.service >/dev/null 2>&1
    chroot "$tree" systemctl mask NetworkManager-wait-online.service >/dev/null 2>&1 || true
    mkdir -p "$tree/etc/NetworkManager/conf.d" "$tree/etc/NetworkManager/system-connections"
    cat >"$tree/etc/NetworkManager/conf.d/90-cocoon-fixup-e2e.conf" <<'EOF'
[main]
plugins=keyfile
no-auto-default=*
EOF
    local file="$tree/etc/NetworkManager/system-connections/cocoon-${MAC_A//:/}.nmconnection"
    cat >"$file" <<EOF
[connection]
id=cocoon-${MAC_A//:/}
uuid=8f3c1a52-0e2e-4c1e-9f00-00000000000a
type=ethernet
autoconnect=true
autoconnect-priority=100

[ethernet]
mac-address=$MAC_A

[ipv4]
method=manual
address1=$IP_X/$PREFIX,$GATEWAY

[ipv6]
method=ignore
EOF
    chmod 600 "$file"
}

# Turn tree $2 into image $1, with image.json fields from the rest.
finish_image() {
    local name=$1 tree=$2 release=$3 cloud_init=$4 t
    t=$(now)
    # A parent snapshot of the old image would sit on blocks that changed.
    rm -rf "$CACHE/snapshots/$name"
    local out="$CACHE/build/$name.out"
    rm -rf "$out"
    mkdir -p "$out"
    local kernel initrd
    kernel=$(ls "$tree"/boot/vmlinuz-* | sort -V | tail -1)
    initrd=$(ls "$tree"/boot/initrd.img-* | sort -V | tail -1)
    cp "$kernel" "$out/vmlinuz"
    cp "$initrd" "$out/initrd.img"
    truncate -s "$SIZE" "$out/rootfs.raw"
    mkfs.ext4 -q -F -L root -d "$tree" "$out/rootfs.raw"
    cat >"$out/image.json" <<EOF
{
  "name": "$name",
  "release": "$release",
  "kernel": "$(basename "$kernel")",
  "cloud_init": "$cloud_init",
  "golden": { "mac": "$MAC_A", "ip": "$IP_X", "prefix": $PREFIX, "gateway": "$GATEWAY" }
}
EOF
    echo "$recipe" >"$out/ready"
    rm -rf "$CACHE/images/$name"
    mv "$out" "$CACHE/images/$name"
    echo "   $name: image $(elapsed "$t"), $(du -sh --apparent-size "$CACHE/images/$name/rootfs.raw" | cut -f1) apparent, $(du -sh "$CACHE/images/$name/rootfs.raw" | cut -f1) on disk"
}

cloud_init_version() {
    chroot "$1" dpkg-query -W -f='${Version}' cloud-init
}

build_bookworm_pair() {
    local base="$CACHE/build/bookworm.tree"
    bootstrap bookworm "$base"
    configure_common "$base"
    if ! up_to_date bookworm; then
        local tree="$CACHE/build/bookworm.plain"
        rm -rf "$tree"
        cp -a "$base" "$tree"
        # The parent's network: the file the fixup would have written for it.
        cat >"$tree/etc/systemd/network/10-${MAC_A//:/}.network" <<EOF
[Match]
MACAddress=$MAC_A

[Network]
Address=$IP_X/$PREFIX
Gateway=$GATEWAY
EOF
        finish_image bookworm "$tree" bookworm ""
        rm -rf "$tree"
    fi
    if [ "$smoke" -eq 0 ] && ! up_to_date bookworm-nm; then
        local tree="$CACHE/build/bookworm.nm"
        rm -rf "$tree"
        cp -a "$base" "$tree"
        retry chroot_apt "$tree" update || die "apt-get in $tree failed 3 times"
        retry chroot_apt "$tree" install -y --no-install-recommends network-manager || die "apt-get in $tree failed 3 times"
        configure_common "$tree"
        configure_network_manager "$tree"
        finish_image bookworm-nm "$tree" bookworm ""
        rm -rf "$tree"
    fi
    if [ "$smoke" -eq 0 ] && ! up_to_date bookworm-cloud; then
        local tree="$CACHE/build/bookworm.cloud"
        rm -rf "$tree"
        cp -a "$base" "$tree"
        retry chroot_apt "$tree" update || die "apt-get in $tree failed 3 times"
        retry chroot_apt "$tree" install -y --no-install-recommends cloud-init || die "apt-get in $tree failed 3 times"
        cloud_init_config "$tree"
        local v
        v=$(cloud_init_version "$tree")
        configure_common "$tree"
        finish_image bookworm-cloud "$tree" bookworm "$v"
        rm -rf "$tree"
    fi
    rm -rf "$base"
}

build_trixie_cloud() {
    local tree="$CACHE/build/trixie.cloud"
    bootstrap trixie "$tree"
    # cloud-init cannot go into debootstrap's --include (it depends on a
    # virtual package there): install it with apt afterwards.
    retry chroot_apt "$tree" update || die "apt-get in $tree failed 3 times"
    retry chroot_apt "$tree" install -y --no-install-recommends cloud-init || die "apt-get in $tree failed 3 times"
    cloud_init_config "$tree"
    local v
    v=$(cloud_init_version "$tree")
    configure_common "$tree"
    finish_image trixie-cloud "$tree" trixie "$v"
    rm -rf "$tree"
}

start=$(now)
if up_to_date bookworm && { [ "$smoke" -eq 1 ] || { up_to_date bookworm-cloud && up_to_date bookworm-nm; }; }; then
    echo "== bookworm$([ "$smoke" -eq 1 ] || echo ', bookworm-cloud, bookworm-nm'): cached"
else
    build_bookworm_pair
fi
if [ "$smoke" -eq 1 ]; then
    : # the smoke run needs bookworm only
elif up_to_date trixie-cloud; then
    echo "== trixie-cloud: cached"
else
    build_trixie_cloud
fi
rm -f "$CACHE"/build/*.log
echo "== images ready in $CACHE/images ($(elapsed "$start"))"
