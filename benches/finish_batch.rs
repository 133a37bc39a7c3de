//! Criterion: `FinishBatch::step` for 256 slots, one token with its real
//! text piece per slot per step, 4 stop strings, an EOS id and 2 stop ids
//! (the shape of the Python `finish` suite, without the binding).
//!
//!     cargo bench --bench finish_batch

mod common;

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use stopline::batch::{FinishBatch, StepInput};
use stopline::finish::StopParams;
use stopline::stop_strings::StopStrings;

const SLOTS: usize = 256;
/// Steps per fresh batch: the kept text grows every step, so the timed loop
/// starts over with new sequences (set-up not timed) to bound memory.
const STEPS_PER_BATCH: u64 = 512;

fn step_256(c: &mut Criterion) {
    let pieces = common::pieces();
    let text: String = pieces.concat();
    let stops: Vec<String> = common::stop_list(64)
        .into_iter()
        .filter(|s| !text.contains(s.as_str()))
        .take(4)
        .collect();
    let params = Arc::new(StopParams {
        stop: Some(StopStrings::compile(stops).unwrap()),
        eos_token_ids: vec![2],
        stop_token_ids: vec![3, 4],
        max_tokens: Some(1 << 30),
        ..StopParams::default()
    });
    let slots: Vec<i64> = (0..SLOTS as i64).collect();
    // Step k: slot s takes piece (s * 997 + k) and an id that is never special.
    let steps: Vec<(Vec<u32>, Vec<&str>)> = (0..STEPS_PER_BATCH as usize)
        .map(|k| {
            let ids = (0..SLOTS)
                .map(|s| 100 + ((s + k) % 30_000) as u32)
                .collect();
            let texts = (0..SLOTS)
                .map(|s| pieces[(s * 997 + k) % pieces.len()].as_str())
                .collect();
            (ids, texts)
        })
        .collect();
    let fresh = || {
        let mut b = FinishBatch::new(SLOTS).unwrap();
        for &s in &slots {
            b.add(s, Arc::clone(&params)).unwrap();
        }
        b
    };

    let mut g = c.benchmark_group("FinishBatch::step");
    g.throughput(Throughput::Elements(SLOTS as u64));
    g.bench_function("256 slots, one token each", |b| {
        b.iter_custom(|iters| {
            let mut out = Vec::with_capacity(SLOTS);
            let mut total = Duration::ZERO;
            let mut done = 0;
            while done < iters {
                let mut batch = fresh();
                let n = (iters - done).min(STEPS_PER_BATCH);
                let t0 = Instant::now();
                for (ids, texts) in &steps[..n as usize] {
                    out.clear();
                    let input = StepInput::new(&slots, ids).texts(Some(texts.as_slice()));
                    batch.step(input, &mut out).unwrap();
                    black_box(&out);
                }
                total += t0.elapsed();
                done += n;
            }
            total
        })
    });
    g.finish();
}

criterion_group!(benches, step_256);
criterion_main!(benches);
