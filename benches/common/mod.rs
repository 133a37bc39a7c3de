//! Inputs shared by the criterion benches: the real text pieces of the
//! bundled SmolLM2 trace (python/stopline/traces/text_smollm2.jsonl.gz, one
//! piece per token as the tokenizer's DecodeStream emitted them) and stop
//! lists shaped like the Python benchmark's (`stopline.tools.bench.data.stop_list`).

#![allow(dead_code)]

use std::sync::Arc;

use stopline::stop_strings::StopStrings;

const TRACE_GZ: &[u8] = include_bytes!("../../python/stopline/traces/text_smollm2.jsonl.gz");

const REAL_STOPS: [&str; 12] = [
    "\n\nUser:",
    "<|im_end|>",
    "###",
    "</s>",
    "Observation:",
    "\n\nHuman:",
    "<|endoftext|>",
    "[/INST]",
    "<end_of_turn>",
    "\nQ:",
    "END OF",
    "<|eot_id|>",
];

/// Every text piece of every request of the trace, in file order.
pub fn pieces() -> Vec<String> {
    use std::io::Read;
    let mut trace = String::new();
    flate2::read::GzDecoder::new(TRACE_GZ)
        .read_to_string(&mut trace)
        .expect("the bundled trace is gzip-compressed UTF-8");
    let mut out = Vec::new();
    for line in trace.lines().filter(|l| !l.trim().is_empty()) {
        let req: serde_json::Value = serde_json::from_str(line).expect("trace line is JSON");
        for step in req["steps"].as_array().into_iter().flatten() {
            for t in step["texts"].as_array().into_iter().flatten() {
                out.push(t.as_str().expect("text piece is a string").to_owned());
            }
        }
    }
    out
}

/// Consecutive pieces joined into speculative accept runs of 4 to 8 tokens.
pub fn runs(pieces: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut pos = 0;
    let mut k = 0;
    while pos < pieces.len() {
        let len = 4 + k % 5;
        out.push(pieces[pos..(pos + len).min(pieces.len())].concat());
        pos += len;
        k += 1;
    }
    out
}

/// `k` stop strings: the real chat-template stops first, then rare markers.
pub fn stop_list(k: usize) -> Vec<String> {
    let mut out: Vec<String> = REAL_STOPS.iter().take(k).map(|s| s.to_string()).collect();
    let mut i = 0;
    while out.len() < k {
        out.push(format!("<<stop-{i:04}>>"));
        i += 1;
    }
    out
}

/// `k` stop strings compiled, bypassing the cache.
pub fn compiled(k: usize) -> Arc<StopStrings> {
    Arc::new(StopStrings::new(stop_list(k)).expect("valid stops"))
}
