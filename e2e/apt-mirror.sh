# Sourced by images.sh and host-packages.sh: the Debian archive this
# machine's apt already uses, so the e2e scripts fetch from wherever the
# machine is configured to (COCOON_FIXUP_E2E_MIRROR overrides it).

# The first archive URI in the apt sources (deb822 `.sources` files, then
# one-line `.list` files) that is not the security archive; empty when
# there is none.
machine_mirror() {
    {
        grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{ print $2 }'
        grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
            awk '{ for (i = 2; i <= NF; i++) if ($i ~ /:\/\//) { print $i; break } }'
    } | grep -v -- '-security' | head -n 1
}

# COCOON_FIXUP_E2E_MIRROR, else machine_mirror; exits naming the variable
# when neither gives one.
e2e_mirror() {
    local mirror=${COCOON_FIXUP_E2E_MIRROR:-$(machine_mirror)}
    if [ -z "$mirror" ]; then
        echo "no Debian archive in this machine's apt sources: set COCOON_FIXUP_E2E_MIRROR to one" >&2
        exit 1
    fi
    echo "$mirror"
}
