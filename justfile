# cocoon-fixup tasks. `just --list` shows them.

# Build the host (and, through fixup-core's build script, the built-in plugins).
build:
    cargo build --release

# Build only the plugins as wasm32-wasip2 components (one cargo per plugin).
plugins:
    for p in cloudimg oci-networkd fc-mac windows-pnp; do \
        cargo build --release --target wasm32-wasip2 -p fixup-plugin-$p --target-dir target/plugin-wasm || exit 1; \
    done
    ls -l target/plugin-wasm/wasm32-wasip2/release/*.wasm

# Run every test (plugins natively, the host, the real components through the host).
test:
    cargo test --workspace

# The Go package's tests alone (go test -race against the debug archive,
# and the consumer module built as vk-cocoon builds it).
go:
    cargo test -p fixup-capi --test go --test consumer -- --nocapture

# cocoon-fixup for the nodes: one static binary (musl, release, about
# 31 MB) to install beside cocoon and cocoon-net, e.g. /usr/local/bin. ring
# compiles C for the target: needs musl-gcc (Debian: apt-get install musl-tools).
static:
    rustup target add x86_64-unknown-linux-musl
    cargo build --release --target x86_64-unknown-linux-musl -p fixup-host --bin cocoon-fixup
    file target/x86_64-unknown-linux-musl/release/cocoon-fixup | grep -E 'static(ally|-pie) linked'
    ls -l target/x86_64-unknown-linux-musl/release/cocoon-fixup

# The same for arm64 nodes (about 25 MB), cross-built: needs Debian's
# gcc-aarch64-linux-gnu and libc6-dev-arm64-cross (ring's C, and the linker).
static-arm64:
    rustup target add aarch64-unknown-linux-musl
    CC_aarch64_unknown_linux_musl=aarch64-linux-gnu-gcc AR_aarch64_unknown_linux_musl=aarch64-linux-gnu-ar \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=aarch64-linux-gnu-gcc \
        cargo build --release --target aarch64-unknown-linux-musl -p fixup-host --bin cocoon-fixup
    file target/aarch64-unknown-linux-musl/release/cocoon-fixup | grep -E 'static(ally|-pie) linked'
    ls -l target/aarch64-unknown-linux-musl/release/cocoon-fixup

# Rewrite the golden files after an intended change, then show what changed.
bless:
    BLESS=1 cargo test -p fixup-tests
    BLESS=1 cargo test -p fixup-capi --test header
    BLESS=1 cargo test -p fixup-host --test it settings::
    git status --short tests/fixtures host/capi/include go/cocoonfixup docs/settings.md

# Lints as CI runs them.
lint:
    cargo fmt --all -- --check
    cargo clippy --workspace --all-targets -- -D warnings

# Print the plan for every bundled example.
demo:
    bash examples/run-all

# Benchmarks (benches/, see BENCHMARKS.md): the criterion benches (plan
# latency against the native baseline, engine settings, cold start), then
# the whole-process figures (cold start, clone storms of 1,000 and 10,000,
# serve with 10,000 pods, the plan process, readiness reaction)
# and the summary table, also written to target/bench-summary.md. Run it on
# a quiet machine: `uptime` should show a load well under 1.
bench:
    cargo bench -p fixup-bench
    cargo build --release -p fixup-host --bin cocoon-fixup
    cargo run --release -p fixup-bench --bin fixup-bench -- report --output target/bench-summary.md

# API requests per clone and the API server's load (BENCHMARKS.md, "API
# requests per clone and the API server's load"), on a real kube-apiserver
# (lab/kube; Go and its modules, docs/kubernetes.md): the Go test counts
# the package's and the daemon's requests per pod kind, then `fixup-bench
# kube` runs three daemons, each kind one clone at a time, and CLONES
# clones at once. Writes target/bench-kube.md (the tables) and
# target/bench-kube.json. About 5 minutes; run it on a quiet machine.
bench-kube clones="1000":
    cd lab/kube && GOPROXY=off go build -trimpath -buildvcs=false -mod=readonly -o ../../target/cocoon-kube-lab .
    rm -f target/kube-requests-go.json
    COCOON_FIXUP_REQUIRE_KUBE=1 COCOON_FIXUP_KUBE_LAB={{justfile_directory()}}/target/cocoon-kube-lab COCOON_FIXUP_COUNT_REQUESTS={{justfile_directory()}}/target/kube-requests-go.json cargo test -p fixup-capi --test kubeclient -- --nocapture
    cargo build --release -p fixup-host --bin cocoon-fixup -p fake-cocoon --bin fake-cocoon -p fixup-bench --bin fixup-bench
    target/release/fixup-bench kube --clones {{clones}} --go-counts target/kube-requests-go.json --output target/bench-kube.md > target/bench-kube.json
    cat target/bench-kube.md

# Run each fuzz target for SECONDS (default 60) on stable Rust: needs
# cargo-fuzz (`cargo install cargo-fuzz --locked`); docs/fuzzing.md.
fuzz seconds="60":
    cd fuzz && mkdir -p corpus/facts && RUSTC_BOOTSTRAP=1 cargo fuzz run -s none facts corpus/facts seeds/facts -- -dict=facts.dict -max_total_time={{seconds}}
    cd fuzz && mkdir -p corpus/render && RUSTC_BOOTSTRAP=1 cargo fuzz run -s none render corpus/render -- -max_total_time={{seconds}}

# End-to-end guest suite (root, QEMU, minutes; docs/e2e.md): installs the
# host packages it lacks, builds the guest images once (cached outside the
# repository, /var/tmp/cocoon-fixup-e2e), saves a parent per image and
# kind, then restores clones from it and runs the real apply flow into
# each, and upstream's commands into a second clone, side by side.
# `just e2e cloudimg` runs only the scenarios whose name contains `cloudimg`.
e2e *FILTER:
    bash e2e/host-packages.sh
    bash e2e/images.sh
    RUST_LIB_BACKTRACE=0 cargo test -p fixup-e2e --test guest -- --ignored --test-threads=1 --nocapture {{FILTER}}
