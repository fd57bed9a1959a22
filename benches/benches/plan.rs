//! Plan latency per scenario against the native baseline, and the engine
//! settings on the plugin call alone.
//!
//! - `plan/native/<scenario>` and `plan/wasm/<scenario>`: `Planner::plan`
//!   and its native twin ([`fixup_bench::native`]) on the same observation.
//!   The setup asserts both make the same plan, argv, script and hint.
//! - `engine/native`, `engine/shipped`, `engine/<variant>`: one
//!   oci-networkd call, natively, through `PluginHost::plan`, and through
//!   each [`Variant`]; the setup asserts every one makes the native plan.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use fixup_bench::cases::{self, Case};
use fixup_bench::engines::{Variant, VariantEngine};
use fixup_bench::native;
use fixup_core::classify::Scenario;
use fixup_core::facts::{ImageKind, VmFacts};

fn plan(c: &mut Criterion) {
    let root = tempfile::tempdir().expect("temp dir");
    let planner = cases::planner(root.path(), None).expect("planner");
    let mut group = c.benchmark_group("plan");
    for case in Case::ALL {
        let obs = case.observation(0);
        let wasm = planner.plan(&obs).expect("wasm plan");
        let baseline = native::plan(&planner, root.path(), &obs).expect("native plan");
        native::assert_same(&wasm, &baseline);
        group.bench_function(BenchmarkId::new("native", case.name()), |b| {
            b.iter(|| native::plan(&planner, root.path(), black_box(&obs)).expect("native plan"));
        });
        group.bench_function(BenchmarkId::new("wasm", case.name()), |b| {
            b.iter(|| planner.plan(black_box(&obs)).expect("wasm plan"));
        });
    }
    group.finish();
}

fn engine(c: &mut Criterion) {
    let root = tempfile::tempdir().expect("temp dir");
    let planner = cases::planner(root.path(), None).expect("planner");
    let obs = Case::OciNetworkd.observation(0);
    let facts = VmFacts::validate(&obs, ImageKind::Oci).expect("facts");
    let scenario = Scenario::OciNetworkd;
    let expected = native::call("oci-networkd", scenario, &facts).expect("native call");
    let selection = planner
        .plugins()
        .registry()
        .select(scenario, None)
        .expect("oci-networkd is loaded");
    let (shipped, _) = planner
        .plugins()
        .plan(&selection.plugin, scenario, &facts)
        .expect("shipped call");
    assert_eq!(
        shipped, expected,
        "the shipped engine makes the native plan"
    );

    let mut group = c.benchmark_group("engine");
    group.bench_function("native", |b| {
        b.iter(|| native::call("oci-networkd", scenario, black_box(&facts)).expect("call"));
    });
    group.bench_function("shipped", |b| {
        b.iter(|| {
            planner
                .plugins()
                .plan(&selection.plugin, scenario, black_box(&facts))
                .expect("call")
        });
    });
    for variant in Variant::ALL {
        // Built per variant and dropped after it: an epoch ticker thread
        // must not run during the other measurements.
        let engine = VariantEngine::new(variant, "oci-networkd").expect("variant engine");
        let plan = engine.plan(scenario, &facts).expect("variant call");
        assert_eq!(plan, expected, "{} makes the native plan", variant.label());
        group.bench_function(variant.label(), |b| {
            b.iter(|| engine.plan(scenario, black_box(&facts)).expect("call"));
        });
    }
    group.finish();
}

fn config() -> Criterion {
    Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args()
}

criterion_group! {
    name = benches;
    config = config();
    targets = plan, engine
}
criterion_main!(benches);
