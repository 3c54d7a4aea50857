//! Stress: 8 threads x 4 sessions x 200 runs sharing the process's host budget and one shared
//! pool (`MemoryPool`, whose limit binds the four together and which holds their identical
//! weights once, and whose arena cache three of them take their activation arenas from), each
//! session with its own, random `release_cached` calls, inputs whose outputs sometimes fit and
//! sometimes do not. No budget is ever over-subscribed (peaks stay under the limits), every
//! run either answers exactly as a single-threaded session without budgets or is refused with
//! `OutOfMemory`, and when everything is dropped every lease has been returned.
//!
//! Its own test binary: it sets the process-wide limit.

mod common;

use common::{node, opset17_model, vi};
use nxrt::governor::{process_budget, set_process_limit, MemoryPool, Tier};
use nxrt::{Error, ExecMode, Session, Tensor};
use nxrt_core::proto::GraphProto;

/// `z = Relu(Pad(x, pads)) + 1`, `x` float `[n]`.
fn model() -> Vec<u8> {
    let mut add = node("Add", &["y2", "one"], &["z"]);
    add.name = "add".into();
    opset17_model(GraphProto {
        name: "stress".into(),
        node: vec![
            node("Pad", &["x", "pads"], &["y"]),
            node("Relu", &["y"], &["y2"]),
            add,
        ],
        input: vec![vi("x", 1, &["n"]), vi("pads", 7, &["2"])],
        output: vec![vi("z", 1, &["m"])],
        initializer: vec![common::f32s("one", &[1], &[1.0])],
        ..Default::default()
    })
}

const PADS: [[i64; 2]; 6] = [
    [0, 0],
    [1, 2],
    [100, 7],
    [5000, 0],
    [0, 30000],
    [60000, 60000],
];

fn feeds(p: [i64; 2]) -> [(&'static str, Tensor); 2] {
    let x: Vec<f32> = (0..64).map(|i| i as f32 - 20.0).collect();
    [
        ("x", Tensor::from_vec(&[64], x).unwrap()),
        ("pads", Tensor::from_vec(&[2], p.to_vec()).unwrap()),
    ]
}

#[test]
fn threads_sessions_and_releases_never_oversubscribe() {
    let bytes = model();
    let reference: Vec<Vec<f32>> = {
        let s = Session::builder().load_bytes(&bytes).unwrap();
        PADS.iter()
            .map(|&p| {
                s.run(feeds(p)).unwrap()["z"]
                    .as_tensor()
                    .unwrap()
                    .to_f32_vec()
                    .unwrap()
            })
            .collect()
    };
    const PROCESS: usize = 1 << 20;
    const SESSION: usize = 400 << 10;
    const POOL: usize = 800 << 10;
    let pool = MemoryPool::new("stress", Some(POOL));
    let base = process_budget(Tier::Host).in_use();
    set_process_limit(Tier::Host, Some(base + PROCESS));
    let sessions: Vec<Session> = (0..4)
        .map(|i| {
            Session::builder()
                .mode(if i % 2 == 0 {
                    ExecMode::Planned
                } else {
                    ExecMode::Eager
                })
                .memory_limit(Some(SESSION))
                .pool(&pool)
                .host_mechanism(if i != 3 {
                    pool.arena_cache().clone()
                } else {
                    nxrt::mechanism::SystemHeap::shared()
                })
                .load_bytes(&bytes)
                .unwrap()
        })
        .collect();
    assert_eq!(
        pool.shared_weights(),
        1,
        "the four sessions hold their weight once"
    );
    let accounts: Vec<_> = sessions
        .iter()
        .map(|s| s.core().memory_account().clone())
        .collect();
    let (ok, refused) = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..8u64)
            .map(|t| {
                let (sessions, reference, pool) = (&sessions, &reference, &pool);
                sc.spawn(move || {
                    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1);
                    let mut next = move || {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        rng
                    };
                    let (mut ok, mut refused) = (0, 0);
                    for _ in 0..200 {
                        let s = &sessions[(next() % 4) as usize];
                        let k = (next() % PADS.len() as u64) as usize;
                        match s.run(feeds(PADS[k])) {
                            Ok(out) => {
                                let z = out["z"].as_tensor().unwrap().to_f32_vec().unwrap();
                                assert_eq!(z, reference[k], "pads {:?}", PADS[k]);
                                ok += 1;
                            }
                            Err(Error::OutOfMemory { .. }) => refused += 1,
                            Err(e) => panic!("{e}"),
                        }
                        assert!(process_budget(Tier::Host).in_use() <= base + PROCESS);
                        assert!(pool.account().budget(Tier::Host).in_use() <= POOL);
                        if next() % 16 == 0 {
                            s.release_cached();
                        }
                    }
                    (ok, refused)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    });
    println!("stress: {ok} runs answered, {refused} refused over a budget");
    assert_eq!(ok + refused, 8 * 200);
    assert!(
        ok > 0 && refused > 0,
        "both outcomes exercised: {ok} ok, {refused} refused"
    );
    for a in &accounts {
        let b = a.budget(Tier::Host);
        assert!(
            b.peak() <= SESSION,
            "session peak {} over its limit",
            b.peak()
        );
    }
    assert!(process_budget(Tier::Host).peak() <= base + PROCESS);
    let pb = pool.account().budget(Tier::Host);
    assert!(pb.peak() <= POOL, "pool peak {} over its limit", pb.peak());
    drop(sessions);
    let cache = pool.arena_cache();
    println!(
        "stress: pool arena cache {} hits, {} misses",
        cache.hits(),
        cache.misses()
    );
    assert!(cache.hits() > 0, "arenas were shared through the pool");
    pool.release_cached();
    assert_eq!(
        (pb.in_use(), pb.leases()),
        (0, 0),
        "every pool lease returned"
    );
    for a in &accounts {
        let b = a.budget(Tier::Host);
        assert_eq!((b.in_use(), b.leases()), (0, 0), "every lease returned");
    }
    assert_eq!(process_budget(Tier::Host).in_use(), base);
    set_process_limit(Tier::Host, None);
}
