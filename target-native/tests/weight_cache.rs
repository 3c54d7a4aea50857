//! The dense weight cache (`nxrt::weight_cache`): block-quantized weights multiplied from a
//! cached dense copy give the bits of the uncached many-row arm, the copies are leased as
//! `dequantized` and bounded by the cache's limit, and `release_cached` or a lease the account
//! refuses gives them back, the run going on from the codes. A lease the process's budget
//! refuses has every pool's arena cache and every session's weight cache give back theirs too.
//!
//! The tests of this file run one at a time (`serial`): one of them sets the process's limit.

mod common;

use common::{node, vi, xorshift_data};
use nxrt::governor::Holder;
use nxrt::{BlockWeights, Session, Tensor};
use nxrt_core::proto::{AttributeProto, GraphProto, ModelProto, OperatorSetIdProto, TensorProto};
use prost::Message;

// big enough that folding does not expand the weight at load (it folds growth up to 1 MiB)
const K: usize = 1024;

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
const N: usize = 1024;
const BS: usize = 32;

/// The two paths of a blocked weight: zero points of 128 make every code minus its zero point
/// an int8 (the int8 weights' path, MXFP4's too), others do not (the float path).
#[derive(Clone, Copy, Debug)]
enum Kind {
    Int8,
    Float,
}

/// Codes, scales and zero points of the blocked weight (`[K, N]` uint8 codes, blocks of 32
/// along K).
fn weight(kind: Kind) -> (Vec<u8>, Vec<f32>, Vec<u8>) {
    let codes: Vec<u8> = xorshift_data(K * N, 3)
        .iter()
        .map(|v| ((v + 1.0) * 127.9) as u8)
        .collect();
    let scales: Vec<f32> = xorshift_data(K / BS * N, 4)
        .iter()
        .map(|v| 0.01 + 0.02 * v.abs())
        .collect();
    let zps: Vec<u8> = xorshift_data(K / BS * N, 5)
        .iter()
        .map(|v| match kind {
            Kind::Int8 => 128,
            Kind::Float => (120.0 + v * 8.0) as u8,
        })
        .collect();
    (codes, scales, zps)
}

/// `y = Relu(x · DequantizeLinear(codes, scales, zero points; axis 0, block_size 32))`, opset 21:
/// the pattern nxrt runs as one block-quantized product.
fn model(kind: Kind) -> Vec<u8> {
    let (codes, scales, zps) = weight(kind);
    let u8s = |name: &str, dims: &[usize], v: Vec<u8>| TensorProto {
        name: name.into(),
        dims: dims.iter().map(|&d| d as i64).collect(),
        data_type: 2,
        raw_data: v.into(),
        ..Default::default()
    };
    let mut dq = node("DequantizeLinear", &["w_q", "w_scale", "w_zp"], &["w"]);
    for (name, i) in [("axis", 0), ("block_size", BS as i64)] {
        dq.attribute.push(AttributeProto {
            name: name.into(),
            i,
            r#type: 2,
            ..Default::default()
        });
    }
    let graph = GraphProto {
        name: "blocked".into(),
        // the product is an intermediate, placed in the memory plan's arena
        node: vec![
            dq,
            node("MatMul", &["x", "w"], &["p"]),
            node("Relu", &["p"], &["y"]),
        ],
        input: vec![vi("x", 1, &["m", &K.to_string()])],
        output: vec![vi("y", 1, &["m", &N.to_string()])],
        initializer: vec![
            u8s("w_q", &[K, N], codes),
            TensorProto {
                name: "w_scale".into(),
                dims: vec![(K / BS) as i64, N as i64],
                data_type: 1,
                float_data: scales,
                ..Default::default()
            },
            u8s("w_zp", &[K / BS, N], zps),
        ],
        ..Default::default()
    };
    ModelProto {
        ir_version: 10,
        opset_import: vec![OperatorSetIdProto {
            domain: String::new(),
            version: 21,
        }],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec()
}

/// The product in f64 from the dequantized weight.
fn reference(kind: Kind, x: &[f32], m: usize) -> Vec<f64> {
    let (codes, scales, zps) = weight(kind);
    let w = |k: usize, n: usize| {
        let b = (k / BS) * N + n;
        (codes[k * N + n] as f64 - zps[b] as f64) * scales[b] as f64
    };
    let mut y = vec![0f64; m * N];
    for r in 0..m {
        for n in 0..N {
            let p: f64 = (0..K).map(|k| x[r * K + k] as f64 * w(k, n)).sum();
            y[r * N + n] = p.max(0.0);
        }
    }
    y
}

fn load(kind: Kind, policy: BlockWeights, limit: Option<usize>, memory: Option<usize>) -> Session {
    Session::builder()
        .block_weights(policy)
        .weight_cache_limit(limit)
        .memory_limit(memory)
        .load_bytes(&model(kind))
        .unwrap()
}

fn input(m: usize, seed: u32) -> Vec<f32> {
    xorshift_data(m * K, seed)
}

fn run(s: &Session, x: &[f32], m: usize) -> nxrt::Result<Vec<f32>> {
    let t = Tensor::from_vec(&[m, K], x.to_vec()).unwrap();
    let out = s.run([("x", t)])?;
    Ok(out["y"].as_tensor().unwrap().to_f32_vec().unwrap())
}

fn check_close(kind: Kind, y: &[f32], x: &[f32], m: usize, what: &str) {
    let r = reference(kind, x, m);
    let scale = r.iter().fold(0f64, |a, v| a.max(v.abs()));
    for (i, (a, b)) in y.iter().zip(&r).enumerate() {
        assert!(
            (*a as f64 - b).abs() <= 1e-4 * scale,
            "{kind:?} {what}: y[{i}] = {a}, reference {b}"
        );
    }
}

fn dequantized(s: &Session) -> usize {
    s.memory_snapshot().tiers[0]
        .holders
        .iter()
        .find(|h| h.holder == Holder::Dequantized)
        .map_or(0, |h| h.in_use)
}

/// Bytes of one dense copy: at least K x N floats (the SGEMM's panels round N up).
const COPY: usize = 4 * K * N;

#[test]
fn the_cached_arm_gives_the_uncached_arms_bits_and_is_leased_as_dequantized() {
    let _one_at_a_time = serial();
    for kind in [Kind::Int8, Kind::Float] {
        let (m, x) = (32, input(32, 9));
        let codes = load(kind, BlockWeights::Codes, None, None);
        let auto = load(kind, BlockWeights::Auto, Some(64 << 20), None);
        let y_codes = run(&codes, &x, m).unwrap();
        check_close(kind, &y_codes, &x, m, "codes");
        let y_auto = run(&auto, &x, m).unwrap();
        let y_again = run(&auto, &x, m).unwrap();
        assert_eq!(
            y_auto, y_codes,
            "the cached copy feeds the SGEMM the same panels"
        );
        assert_eq!(y_again, y_codes);
        let w = auto.weight_cache();
        assert_eq!((w.fills, w.hits, w.copies), (1, 1, 1), "{w:?}");
        assert!(w.bytes >= COPY, "{w:?}");
        assert_eq!(
            dequantized(&auto),
            w.bytes,
            "the copy is leased as dequantized"
        );
        assert_eq!(codes.weight_cache().fills, 0);
        assert_eq!(dequantized(&codes), 0);
        // one row reads the codes under auto, the copy under cached
        let x1 = input(1, 10);
        let auto1 = load(kind, BlockWeights::Auto, None, None);
        check_close(kind, &run(&auto1, &x1, 1).unwrap(), &x1, 1, "auto, one row");
        assert_eq!(auto1.weight_cache().fills, 0);
        let cached = load(kind, BlockWeights::Cached, None, None);
        check_close(
            kind,
            &run(&cached, &x1, 1).unwrap(),
            &x1,
            1,
            "cached, one row",
        );
        assert_eq!(cached.weight_cache().fills, 1);
        // pre-expanded: dense float weights at load, nothing cached
        let expanded = load(kind, BlockWeights::Expanded, None, None);
        let w_exp = expanded.memory_snapshot().tiers[0].holders[0].in_use;
        assert!(
            w_exp >= COPY,
            "expanded weights are dense floats ({w_exp} bytes)"
        );
        check_close(kind, &run(&expanded, &x, m).unwrap(), &x, m, "expanded");
        assert_eq!(expanded.weight_cache().fills, 0);
    }
}

#[test]
fn the_limit_bounds_the_copies() {
    let _one_at_a_time = serial();
    for kind in [Kind::Int8, Kind::Float] {
        let (m, x) = (32, input(32, 11));
        let want = run(&load(kind, BlockWeights::Codes, None, None), &x, m).unwrap();
        let s = load(kind, BlockWeights::Cached, Some(COPY - 1), None);
        assert_eq!(
            run(&s, &x, m).unwrap(),
            want,
            "a declined copy: computed from the codes"
        );
        let w = s.weight_cache();
        assert_eq!((w.fills, w.copies, w.bytes), (0, 0, 0), "{w:?}");
        assert!(w.declined >= 1, "{w:?}");
        assert_eq!(dequantized(&s), 0);
    }
}

#[test]
fn release_and_a_refused_lease_give_the_copies_back() {
    let _one_at_a_time = serial();
    for kind in [Kind::Int8, Kind::Float] {
        let (m, x) = (32, input(32, 12));
        let want = run(&load(kind, BlockWeights::Codes, None, None), &x, m).unwrap();
        let s = load(kind, BlockWeights::Auto, None, None);
        run(&s, &x, m).unwrap();
        let held = dequantized(&s);
        assert!(held >= COPY);
        s.release_cached();
        assert_eq!(dequantized(&s), 0, "release_cached gives the copy back");
        assert_eq!(s.weight_cache().released, held);
        assert_eq!(
            run(&s, &x, m).unwrap(),
            want,
            "and the next run makes it again"
        );
        assert_eq!(s.weight_cache().fills, 2);

        // A probe without a limit: what the weights and the copy hold, and the most the
        // outputs of a run of 64 rows held at once (the product and the Relu's output, both
        // on the heap). Under a session limit one byte short of their sum, the run of 64 rows
        // has its Relu's output refused while the copy holds its bytes: the refusal gives the
        // copy back and the run goes on (the product, already made from the copy, is the
        // probe's to the bit).
        let x64 = input(64, 13);
        let probe = load(kind, BlockWeights::Auto, None, None);
        run(&probe, &x, m).unwrap();
        let y64 = run(&probe, &x64, 64).unwrap();
        let host = &probe.memory_snapshot().tiers[0];
        let outputs = host.holders.iter().find(|h| h.holder == Holder::Outputs);
        let total = host.in_use + outputs.unwrap().peak;
        let tight = load(kind, BlockWeights::Auto, None, Some(total - 1));
        run(&tight, &x, m).unwrap();
        assert!(dequantized(&tight) >= COPY, "the first run keeps its copy");
        let got = run(&tight, &x64, 64).expect("the copy is given back for the output");
        assert_eq!(got, y64);
        let w = tight.weight_cache();
        assert!(w.released >= COPY, "{w:?}");
        assert_eq!(dequantized(&tight), 0);
    }
}

/// The process's limit, put back to none when dropped (a failing test included).
struct ProcessLimit;

impl ProcessLimit {
    fn set(bytes: usize) -> ProcessLimit {
        nxrt::governor::set_process_limit(nxrt::governor::Tier::Host, Some(bytes));
        ProcessLimit
    }
}

impl Drop for ProcessLimit {
    fn drop(&mut self) {
        nxrt::governor::set_process_limit(nxrt::governor::Tier::Host, None);
    }
}

fn process_in_use() -> usize {
    nxrt::governor::process_snapshot().tiers[0].in_use
}

#[test]
fn a_process_refusal_gives_back_the_caches_charged_to_the_process() {
    let _one_at_a_time = serial();
    // a session's dense weight copy: as in the session-limit test above, under a process
    // limit one byte short of what the 64-row run needs with the copy held
    let kind = Kind::Int8;
    let (m, x, x64) = (32, input(32, 14), input(64, 15));
    let probe = load(kind, BlockWeights::Auto, None, None);
    run(&probe, &x, m).unwrap();
    let y64 = run(&probe, &x64, 64).unwrap();
    let host = &probe.memory_snapshot().tiers[0];
    let outputs = host.holders.iter().find(|h| h.holder == Holder::Outputs);
    let need = host.in_use + outputs.unwrap().peak;
    drop(probe);
    let s = load(kind, BlockWeights::Auto, None, None);
    run(&s, &x, m).unwrap();
    assert!(dequantized(&s) >= COPY);
    {
        let _limit = ProcessLimit::set(process_in_use() - host_in_use(&s) + need - 1);
        let got = run(&s, &x64, 64).expect("the copy is given back for the process's budget");
        assert_eq!(got, y64);
    }
    assert!(s.weight_cache().released >= COPY, "{:?}", s.weight_cache());
    drop(s);

    // a pool's arena cache: an arena of one size class kept by the pool, then a run needing
    // an arena of another class under a process limit that only fits it once the kept one is
    // given back
    use nxrt::governor::MemoryPool;
    use nxrt::mechanism::Mechanism;
    let pool = MemoryPool::new("process", None);
    let s = common::pool_chain_session(&pool);
    let chain = |n: usize| common::run_chain(&s, n);
    // (the first run records the sizes, the second runs from the plan's arena)
    chain(50_000).unwrap();
    chain(50_000).unwrap();
    s.release_cached();
    let kept = pool.arena_cache().cached_bytes();
    assert!(
        kept >= 200_000,
        "the pool keeps the released arena ({kept} bytes)"
    );
    {
        // room for the new arena (240 000 bytes) and the run's output, not with the kept one
        let _limit = ProcessLimit::set(process_in_use() - kept + 600_000);
        chain(60_000).expect("the pool's cache is given back for the process's budget");
    }
    assert_eq!(pool.arena_cache().cached_bytes(), 0);
}

fn host_in_use(s: &Session) -> usize {
    s.memory_snapshot().tiers[0].in_use
}
