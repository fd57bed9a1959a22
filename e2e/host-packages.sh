#!/usr/bin/env bash
# Install, with apt, the host packages the end-to-end suite needs
# (docs/e2e.md). Does nothing when they are all present.
#
#   qemu-system-x86 qemu-utils   boot the guests, make qcow2 overlays
#   debootstrap e2fsprogs        build the guest images (e2e/images.sh)
#   dnsmasq-base                 the DHCP server of the DHCP scenarios
#   genisoimage                  the cloud-init NoCloud seed ISOs
#   iputils-ping iproute2        ping the guest from its network namespace
#
# On a Debian 12 machine whose qemu-utils came from bookworm-backports (it
# Breaks the qemu-system-common of bookworm), qemu-system-x86 is taken from
# bookworm-backports too, so both are the same QEMU.
set -euo pipefail

die() { echo "host-packages.sh: $*" >&2; exit 1; }

need=()
have() { command -v "$1" >/dev/null 2>&1; }
have qemu-system-x86_64 || need+=(qemu-system-x86)
have qemu-img || need+=(qemu-utils)
have debootstrap || need+=(debootstrap)
have mkfs.ext4 || need+=(e2fsprogs)
have dnsmasq || need+=(dnsmasq-base)
have genisoimage || need+=(genisoimage)
have ping || need+=(iputils-ping)
have ip || need+=(iproute2)
if [ "${#need[@]}" -eq 0 ]; then
    echo "host packages: all present"
    exit 0
fi
[ "$(id -u)" -eq 0 ] || die "missing ${need[*]}; run as root: sudo bash $0"
have apt-get || die "missing ${need[*]} and no apt-get: install them with your package manager"

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
utils_version=$(dpkg-query -W -f='${Version}' qemu-utils 2>/dev/null || true)
if [[ " ${need[*]} " == *" qemu-system-x86 "* && "$utils_version" == *bpo12* ]]; then
    list=/etc/apt/sources.list.d/cocoon-fixup-e2e-backports.sources
    if ! apt-cache policy | grep -q bookworm-backports; then
        echo "qemu-utils $utils_version is from bookworm-backports: adding $list for qemu-system-x86"
        # shellcheck source=apt-mirror.sh
        . "$(dirname "$0")/apt-mirror.sh"
        mirror=$(e2e_mirror)
        cat >"$list" <<EOF
Types: deb
URIs: $mirror
Suites: bookworm-backports
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
        apt-get update -qq
    fi
    apt-get install -y -qq --no-install-recommends -t bookworm-backports qemu-system-x86 >/dev/null
    echo "host packages: installed qemu-system-x86 from bookworm-backports"
    rest=()
    for p in "${need[@]}"; do
        [ "$p" = qemu-system-x86 ] || rest+=("$p")
    done
    need=("${rest[@]}")
fi
if [ "${#need[@]}" -gt 0 ]; then
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
    echo "host packages: installed ${need[*]}"
fi
