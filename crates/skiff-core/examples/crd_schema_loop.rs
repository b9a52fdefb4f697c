//! The schema's share of a custom resource create (benchmark B10 part 2),
//! in a loop for profiling: `cargo run --release -p skiff-core --example
//! crd_schema_loop -- [N]` parses the benchmark's 4 KB Prometheus object,
//! looks for unknown fields, prunes, defaults and validates it (CEL rules included) under the
//! benchmark's definition N times, and prints the time per object.
//! Under `valgrind --tool=callgrind` it counts the instructions of exactly
//! that work.

use std::time::Instant;

use skiff_core::crd_schema::Schema;

#[path = "../../skiff-apiserver/examples/common/b10.rs"]
mod b10;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let schema = Schema::compile(&b10::big_schema(), "openAPIV3Schema").expect("schema compiles");
    let body = b10::prometheus("p-0-0");
    let t = Instant::now();
    for _ in 0..n {
        let mut obj: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(schema.unknown_fields(&obj).is_empty());
        schema.prune_and_default(&mut obj);
        let causes = schema.validate(&obj, None);
        assert!(causes.is_empty(), "{causes:?}");
    }
    let per = t.elapsed() / n.max(1) as u32;
    println!("{n} objects of {} bytes: {per:?} per object", body.len());
}
