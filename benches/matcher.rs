//! Criterion: the stop-string matcher's per-step cost for K stop strings
//! (the core loop under `StopMatcher.feed`, without Python), and compiling a
//! 16-string list with and without the cache.
//!
//!     cargo bench --bench matcher

mod common;

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use stopline::stop_strings::StopStrings;

const KS: [usize; 6] = [1, 4, 16, 64, 256, 1024];

fn feed(c: &mut Criterion) {
    let pieces = common::pieces();
    let runs = common::runs(&pieces);
    for (name, deltas) in [
        ("feed/single token", &pieces),
        ("feed/4-8 token runs", &runs),
    ] {
        let mut g = c.benchmark_group(name);
        g.throughput(Throughput::Elements(deltas.len() as u64));
        for k in KS {
            let stops = common::compiled(k);
            g.bench_with_input(BenchmarkId::from_parameter(k), deltas, |b, deltas| {
                b.iter(|| {
                    let mut m = stops.matcher(false);
                    let mut held = 0;
                    for d in deltas {
                        if black_box(m.feed(d)).is_some() {
                            held += 1;
                        }
                        held += m.holdback();
                    }
                    held
                })
            });
        }
        g.finish();
    }
}

fn compile(c: &mut Criterion) {
    let mut g = c.benchmark_group("compile 16");
    let base = common::stop_list(16);
    g.bench_function("new (no cache)", |b| {
        b.iter(|| StopStrings::new(black_box(base.clone())).unwrap())
    });
    StopStrings::compile(base.clone()).unwrap();
    g.bench_function("cache hit", |b| {
        b.iter(|| StopStrings::compile(black_box(base.clone())).unwrap())
    });
    g.finish();
}

criterion_group!(benches, feed, compile);
criterion_main!(benches);
