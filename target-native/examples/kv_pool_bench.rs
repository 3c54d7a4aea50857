//! The paged KV pool's costs: page operations on their own (a fork, a copy-on-write append, a
//! release; a prefix lookup) and decoding several sequences in turn against one sequence alone.
//!
//! `cargo run --release -p nxrt --example kv_pool_bench -- [MODEL_DIR] [--rounds R]`
//! (MODEL_DIR defaults to `$NXRT_CACHE/genai/models/llama_bench_fp32`).

use std::time::Instant;

use nxrt::genai::Generator;
use nxrt_core::genai::KvPool;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn cache() -> std::path::PathBuf {
    std::env::var_os("NXRT_CACHE")
        .map(Into::into)
        .unwrap_or_else(|| {
            std::path::PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/nxrt")
        })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rounds = args
        .iter()
        .position(|a| a == "--rounds")
        .and_then(|i| args.get(i + 1))
        .map_or(5, |r| r.parse().expect("--rounds N"));
    let dir = args
        .iter()
        .find(|a| !a.starts_with("--") && a.parse::<usize>().is_err())
        .map(Into::into)
        .unwrap_or_else(|| cache().join("genai/models/llama_bench_fp32"));

    // page operations: a pool shaped as the folder's KV cache, pages of 16 rows
    let g = Generator::from_folder(&dir, &nxrt::Session::builder()).expect("load the folder");
    let c = g.config().clone();
    let (t, heads, h, pr) = (2 * c.layers, c.kv_heads, c.head_size, 16);
    let rows = 64;
    let src: Vec<Vec<f32>> = (0..t).map(|i| vec![i as f32; heads * rows * h]).collect();
    let refs: Vec<&[f32]> = src.iter().map(|v| &v[..]).collect();
    let ids: Vec<i64> = (0..rows as i64).collect();
    let reps = 2000;
    let mut fork_ns = vec![];
    let mut prefix_ns = vec![];
    for _ in 0..rounds {
        let mut p = KvPool::new(c.layers, heads, h, pr, 4096).unwrap();
        let base = p.create();
        p.write_rows(base, &ids[..rows - 8], 0, &refs, rows, &[])
            .unwrap();
        // fork, append 8 rows (one shared partial page copied, then a new page), release
        let t0 = Instant::now();
        for _ in 0..reps {
            let f = p.fork(base).unwrap();
            p.write_rows(f, &ids, rows - 8, &refs, rows, &[]).unwrap();
            p.release(f).unwrap();
        }
        fork_ns.push(t0.elapsed().as_nanos() as f64 / reps as f64);
        // a new sequence taking a 56-id prefix's three whole pages, then released
        let t0 = Instant::now();
        for _ in 0..reps {
            let s = p.create();
            assert_eq!(p.share_prefix(s, &ids[..rows - 7]).unwrap(), 48);
            p.release(s).unwrap();
        }
        prefix_ns.push(t0.elapsed().as_nanos() as f64 / reps as f64);
    }
    let page_kib = t * heads * pr * h * 4 / 1024;
    println!(
        "pages of {pr} rows ({page_kib} KiB: {} layers x {heads} KV heads x {h}), medians of {rounds} rounds x {reps}:",
        c.layers
    );
    println!(
        "  fork + append 8 rows (one page copied on write, one new) + release: {:.2} us",
        median(fork_ns) / 1e3
    );
    println!(
        "  new sequence sharing a 48-id prefix (3 pages) + release: {:.2} us",
        median(prefix_ns) / 1e3
    );

    // decoding: 4 sequences advanced in turn, one token each, against one sequence alone
    let (n_seq, prompt_len, new) = (4, 32, 64);
    let prompts: Vec<Vec<i64>> = (0..n_seq)
        .map(|s| {
            (0..prompt_len)
                .map(|i| 1 + ((i * 7 + s * 13) % 500) as i64)
                .collect()
        })
        .collect();
    let mut alone = vec![];
    let mut turns = vec![];
    let mut single = Generator::from_folder(&dir, &nxrt::Session::builder()).unwrap();
    let mut pg = g.into_paged(16, 4096).unwrap();
    for _ in 0..rounds {
        single.reset().unwrap();
        single.append_tokens(&prompts[0], 0).unwrap();
        let t0 = Instant::now();
        for _ in 0..new {
            let id = argmax(single.logits());
            single.append_tokens(&[id], 0).unwrap();
        }
        alone.push(new as f64 / t0.elapsed().as_secs_f64());
        let seqs: Vec<_> = (0..n_seq).map(|_| pg.create()).collect();
        for (&s, p) in seqs.iter().zip(&prompts) {
            pg.append_tokens(s, p, 0).unwrap();
        }
        let t0 = Instant::now();
        for _ in 0..new {
            for &s in &seqs {
                let id = argmax(pg.logits(s).unwrap());
                pg.append_tokens(s, &[id], 0).unwrap();
            }
        }
        turns.push((n_seq * new) as f64 / t0.elapsed().as_secs_f64());
        for s in seqs {
            pg.release(s).unwrap();
        }
    }
    println!(
        "decode, 1 thread, {prompt_len}-id prompts, {new} new ids each (medians of {rounds}): one sequence {:.1} tok/s; {n_seq} sequences in turn {:.1} tok/s (each switch gathers the sequence's rows)",
        median(alone),
        median(turns)
    );
    println!("{:?}", pg.stats());
}

/// The greedy choice (ties to the lowest id), as the sampler makes it.
fn argmax(l: &[f32]) -> i64 {
    nxrt_core::genai::sampling::argmax(l).expect("a finite logit") as i64
}
