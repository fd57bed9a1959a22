//! Cold start: a planner ready with the four built-in plugins.
//!
//! - `cold_start/compile`: no cache, every plugin compiled by Cranelift.
//! - `cold_start/cache`: a warm precompiled cache (a daemon's second start).
//! - `cold_start/engine`: the engine alone, no plugin (what neither path can
//!   avoid).
//! - `cold_start/rebuilt/<variant>`: the cached start-up rebuilt outside the
//!   host ([`start_from_cache`]), shipped settings and the alternatives.
//!
//! In-process figures; `fixup-bench report` adds fresh-process ones.

use std::hint::black_box;
use std::path::Path;
use std::time::Duration;

use criterion::{Criterion, SamplingMode, criterion_group, criterion_main};
use fixup_bench::cases;
use fixup_bench::engines::{START_VARIANTS, start_from_cache};
use fixup_core::plugin::{EngineOptions, PluginHost};

fn cold_start(c: &mut Criterion) {
    let root = Path::new("/nonexistent");
    let cache = tempfile::tempdir().expect("temp dir");
    cases::warm_cache(cache.path()).expect("warm cache");

    let mut group = c.benchmark_group("cold_start");
    group
        .sampling_mode(SamplingMode::Flat)
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8));
    group.bench_function("compile", |b| {
        b.iter(|| cases::planner(root, None).expect("planner"));
    });
    group.bench_function("cache", |b| {
        b.iter(|| cases::planner(root, Some(cache.path().to_owned())).expect("planner"));
    });
    group.bench_function("engine", |b| {
        b.iter(|| PluginHost::new(black_box(EngineOptions::default())).expect("engine"));
    });
    // The same start-up rebuilt outside the host, with the engine settings
    // that change its cost: what `Planner::new` would take with them.
    for variant in START_VARIANTS {
        start_from_cache(variant, cache.path()).expect("fill the cache for this engine");
        group.bench_function(format!("rebuilt/{}", variant.label()), |b| {
            b.iter(|| start_from_cache(variant, cache.path()).expect("start"));
        });
    }
    group.finish();
}

criterion_group!(benches, cold_start);
criterion_main!(benches);
