//! The memory governor seen from the API and the CLI: budgets give typed errors before memory
//! is allocated and leave the session usable, every lease is returned, hostile sizes are errors
//! (never aborts), and `--memory-limit` bounds the command.

mod common;

use common::{chain_model, f32s, node, opset17_model, vi, xorshift_data};
use nxrt::governor::{Holder, Tier};
use nxrt::{Error, Session, Tensor};
use nxrt_core::proto::GraphProto;

/// `z = Relu(Pad(x, pads))` with `x` float `[n]` and `pads` int64 `[2]` both fed.
fn pad_model() -> Vec<u8> {
    opset17_model(GraphProto {
        name: "pad".into(),
        node: vec![
            node("Pad", &["x", "pads"], &["y"]),
            node("Relu", &["y"], &["z"]),
        ],
        input: vec![vi("x", 1, &["n"]), vi("pads", 7, &["2"])],
        output: vec![vi("z", 1, &["m"])],
        ..Default::default()
    })
}

/// `y = x * w` with a constant `w` of `n` floats (`4n` bytes of weights).
fn weights_model(n: usize) -> Vec<u8> {
    weights_model_seeded(n, 7)
}

/// [`weights_model`] with the weights drawn from `seed`.
fn weights_model_seeded(n: usize, seed: u32) -> Vec<u8> {
    opset17_model(GraphProto {
        name: "weights".into(),
        node: vec![node("Mul", &["x", "w"], &["y"])],
        input: vec![vi("x", 1, &["1", &n.to_string()])],
        output: vec![vi("y", 1, &["1", &n.to_string()])],
        initializer: vec![f32s("w", &[n as i64], &xorshift_data(n, seed))],
        ..Default::default()
    })
}

/// The storage of the session's first initializer.
fn first_weight(s: &Session) -> Tensor {
    match &s.core().graph().initializers[0].1 {
        nxrt::Value::Tensor(t) => t.clone(),
        v => panic!("{v:?}"),
    }
}

fn pad_feeds(pads: [i64; 2]) -> [(&'static str, Tensor); 2] {
    [
        (
            "x",
            Tensor::from_vec(&[4], vec![1.0f32, -2.0, 3.0, -4.0]).unwrap(),
        ),
        ("pads", Tensor::from_vec(&[2], pads.to_vec()).unwrap()),
    ]
}

fn host_in_use(s: &Session, h: Holder) -> usize {
    let a = s.core().memory_account();
    a.holder(Tier::Host, h).in_use()
}

#[test]
fn a_run_over_the_session_budget_is_a_typed_error_and_the_session_stays_usable() {
    let bytes = pad_model();
    let free = Session::builder().load_bytes(&bytes).unwrap();
    let s = Session::builder()
        .memory_limit(Some(1 << 20))
        .load_bytes(&bytes)
        .unwrap();
    // 2^20 + 4 floats: 4 MiB, four times the session's budget
    let e = s.run(pad_feeds([0, 1 << 20])).expect_err("over the budget");
    match &e {
        Error::OutOfMemory {
            tier,
            requested,
            in_use,
            limit,
            holder,
        } => {
            assert!(tier.contains("session 'pad'"), "{e}");
            assert_eq!(*limit, 1 << 20, "{e}");
            assert!(*requested >= 4 << 20 && *in_use < 1 << 20, "{e}");
            assert!(holder.contains("Pad"), "names the node: {e}");
        }
        e => panic!("expected an out-of-memory error, got {e}"),
    }
    assert_eq!(e.kind(), "out_of_memory");
    assert_eq!(
        host_in_use(&s, Holder::Outputs),
        0,
        "the refused run holds nothing"
    );
    // the same session, a run that fits: the answer of a session without a budget
    // (outputs of at least governor::SMALL bytes: smaller ones take no lease)
    for pads in [[100, 2], [0, 300], [64, 0]] {
        let got = s.run(pad_feeds(pads)).expect("a run that fits");
        let want = free.run(pad_feeds(pads)).unwrap();
        let (g, w) = (
            got["z"].as_tensor().unwrap(),
            want["z"].as_tensor().unwrap(),
        );
        assert_eq!(g.shape(), w.shape());
        assert_eq!(g.to_f32_vec().unwrap(), w.to_f32_vec().unwrap());
        assert!(
            host_in_use(&s, Holder::Outputs) > 0,
            "the returned output is leased"
        );
    }
    assert_eq!(host_in_use(&s, Holder::Outputs), 0);
}

#[test]
fn hostile_pads_are_errors_not_aborts() {
    let s = Session::builder().load_bytes(&pad_model()).unwrap();
    for pads in [
        [0, 1 << 40],         // 4 TiB of output: the allocator refuses it
        [0, 1 << 61],         // its bytes overflow
        [i64::MAX, i64::MAX], // the length overflows
        [i64::MIN, 0],        // the crop overflows
        [-5, 0],              // crops more than the axis
    ] {
        let e = s.run(pad_feeds(pads)).expect_err("a hostile pad");
        assert!(
            matches!(
                e,
                Error::OutOfMemory { .. } | Error::Node { .. } | Error::Shape(_)
            ),
            "{pads:?}: {e}"
        );
    }
    // and the session still runs
    let ok = s.run(pad_feeds([0, 2])).unwrap();
    assert_eq!(ok["z"].as_tensor().unwrap().shape(), &[6]);
}

/// One node `op(inputs...) -> y` whose inputs are all fed (`(name, elem type, dims)`).
fn one_op(op: &str, inputs: &[(&str, i32, &[&str])]) -> Vec<u8> {
    let names: Vec<&str> = inputs.iter().map(|i| i.0).collect();
    opset17_model(GraphProto {
        name: op.into(),
        node: vec![node(op, &names, &["y"])],
        input: inputs.iter().map(|(n, t, d)| vi(n, *t, d)).collect(),
        output: vec![vi("y", 0, &[])],
        ..Default::default()
    })
}

#[test]
fn shapes_read_from_data_are_errors_when_absurd() {
    let i64s = |v: &[i64]| Tensor::from_vec(&[v.len()], v.to_vec()).unwrap();
    let scalar = |v: i64| Tensor::from_vec(&[], vec![v]).unwrap();
    let x = || Tensor::from_vec(&[1], vec![1.0f32]).unwrap();
    type Case = (Vec<u8>, Vec<(&'static str, Tensor)>);
    let cases: Vec<Case> = vec![
        (
            one_op("ConstantOfShape", &[("s", 7, &["1"])]),
            vec![("s", i64s(&[1 << 40]))],
        ),
        (
            one_op("ConstantOfShape", &[("s", 7, &["2"])]),
            vec![("s", i64s(&[1 << 31, 1 << 31]))],
        ),
        (
            one_op("Range", &[("a", 7, &[]), ("b", 7, &[]), ("c", 7, &[])]),
            vec![("a", scalar(0)), ("b", scalar(1 << 40)), ("c", scalar(1))],
        ),
        (
            one_op("Range", &[("a", 7, &[]), ("b", 7, &[]), ("c", 7, &[])]),
            vec![
                ("a", scalar(i64::MIN)),
                ("b", scalar(i64::MAX)),
                ("c", scalar(1)),
            ],
        ),
        (
            one_op("Expand", &[("x", 1, &["1"]), ("s", 7, &["1"])]),
            vec![("x", x()), ("s", i64s(&[1 << 40]))],
        ),
        (
            one_op("Tile", &[("x", 1, &["1"]), ("s", 7, &["1"])]),
            vec![("x", x()), ("s", i64s(&[1 << 40]))],
        ),
        (
            one_op("Reshape", &[("x", 1, &["1"]), ("s", 7, &["2"])]),
            vec![("x", x()), ("s", i64s(&[1 << 40, 0]))],
        ),
    ];
    for (model, feeds) in cases {
        for limit in [None, Some(1 << 30)] {
            let s = Session::builder()
                .memory_limit(limit)
                .load_bytes(&model)
                .unwrap();
            let e = s.run(feeds.clone()).err();
            assert!(
                matches!(
                    e,
                    Some(Error::OutOfMemory { .. } | Error::Node { .. } | Error::Shape(_))
                ),
                "{:?}: {e:?}",
                feeds
            );
        }
    }
}

#[test]
fn every_lease_is_returned_and_release_cached_gives_the_arena_back() {
    let n = 1 << 14;
    let s = Session::builder().load_bytes(&weights_model(n)).unwrap();
    let account = s.core().memory_account().clone();
    assert!(
        host_in_use(&s, Holder::Weights) >= 4 * n,
        "the weights are leased"
    );
    let x = Tensor::from_vec(&[1, n], xorshift_data(n, 3)).unwrap();
    for _ in 0..3 {
        s.run([("x", x.clone())]).unwrap();
    }
    let outs = s.run([("x", x.clone())]).unwrap();
    assert!(
        host_in_use(&s, Holder::Outputs) >= 4 * n,
        "the output is leased"
    );
    let snap = s.memory_snapshot();
    let host = snap.tiers.iter().find(|t| t.tier == Tier::Host).unwrap();
    assert!(host.peak >= host.in_use && host.in_use >= 8 * n, "{snap:?}");
    drop(outs);
    assert_eq!(
        host_in_use(&s, Holder::Outputs),
        0,
        "dropping the output returns it"
    );
    s.release_cached();
    assert_eq!(
        host_in_use(&s, Holder::Arena),
        0,
        "release_cached returns the arenas"
    );
    s.run([("x", x)]).expect("runs again after release_cached");
    drop(s);
    let b = account.budget(Tier::Host);
    assert_eq!((b.in_use(), b.leases()), (0, 0), "everything returned once");
}

#[test]
fn weights_over_the_budget_fail_at_load() {
    let e = Session::builder()
        .memory_limit(Some(100 << 10))
        .load_bytes(&weights_model(1 << 16))
        .err()
        .expect("256 KiB of weights under a 100 KiB budget");
    assert!(
        matches!(&e, Error::OutOfMemory { holder, requested, .. } if holder == "initializer 'w'" && *requested == 1 << 18),
        "{e}"
    );
    // with room, the same model loads and runs
    let s = Session::builder()
        .memory_limit(Some(1 << 20))
        .load_bytes(&weights_model(1 << 16))
        .unwrap();
    let x = Tensor::from_vec(&[1, 1 << 16], xorshift_data(1 << 16, 1)).unwrap();
    s.run([("x", x)]).unwrap();
}

#[test]
fn prepacked_weights_are_leased_as_weights() {
    let n = 64;
    let bytes = opset17_model(GraphProto {
        name: "mm".into(),
        node: vec![node("MatMul", &["x", "w"], &["y"])],
        input: vec![vi("x", 1, &["8", "64"])],
        output: vec![vi("y", 1, &["8", "64"])],
        initializer: vec![f32s("w", &[n, n], &xorshift_data((n * n) as usize, 5))],
        ..Default::default()
    });
    let s = Session::builder().load_bytes(&bytes).unwrap();
    let packed = s.partition().prepacked_bytes;
    assert!(packed > 0, "MatMul packs its constant B");
    assert_eq!(host_in_use(&s, Holder::Weights), 4 * 64 * 64 + packed);
    let unpacked = Session::builder()
        .prepack_weights(false)
        .load_bytes(&bytes)
        .unwrap();
    assert_eq!(host_in_use(&unpacked, Holder::Weights), 4 * 64 * 64);
}

#[test]
fn the_cli_memory_limit_bounds_the_command() {
    let dir = std::env::temp_dir().join(format!("nxrt-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("m.onnx");
    std::fs::write(&model, weights_model(1 << 16)).unwrap();
    let nxrt = env!("CARGO_BIN_EXE_nxrt");
    let run = |extra: &[&str], out: &str| {
        std::process::Command::new(nxrt)
            .arg("run")
            .arg(&model)
            .args(["--output-dir", dir.join(out).to_str().unwrap()])
            .args(extra)
            .output()
            .unwrap()
    };
    let low = run(&["--memory-limit", "100KiB"], "low");
    assert_eq!(
        low.status.code(),
        Some(1),
        "below the model's need: exit code 1"
    );
    let err = String::from_utf8_lossy(&low.stderr);
    assert!(
        err.contains("error[out_of_memory]") && err.contains("102400-byte limit"),
        "{err}"
    );
    let high = run(&["--memory-limit", "64MiB", "--memory-report"], "high");
    let report = String::from_utf8_lossy(&high.stdout);
    assert!(
        report.contains("memory mechanism (host): system heap"),
        "the report names the host mechanism: {report}"
    );
    let free = run(&[], "free");
    assert!(high.status.success() && free.status.success());
    let a = std::fs::read(dir.join("high/y.npy")).unwrap();
    let b = std::fs::read(dir.join("free/y.npy")).unwrap();
    assert_eq!(a, b, "above the need the outputs are unchanged");
    let bad = run(&["--memory-limit", "lots"], "bad");
    assert_eq!(bad.status.code(), Some(1));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn sessions_in_a_pool_hold_identical_weights_once_and_share_its_limit() {
    use nxrt::governor::MemoryPool;
    let n = 1 << 16; // 256 KiB of weights
    let w = 4 * n;
    let pool = MemoryPool::new("p", Some(3 * w + w / 2));
    let account = pool.account().clone();
    let in_pool = || Session::builder().pool(&pool);
    let weights = |a: &nxrt::governor::Account| a.holder(Tier::Host, Holder::Weights).in_use();
    let a = in_pool().load_bytes(&weights_model(n)).unwrap();
    let b = in_pool().load_bytes(&weights_model(n)).unwrap();
    let c = in_pool().load_bytes(&weights_model_seeded(n, 8)).unwrap();
    // the same model twice: one copy, charged to the pool, not to either session
    assert!(first_weight(&a).shares_storage(&first_weight(&b)));
    assert!(!first_weight(&a).shares_storage(&first_weight(&c)));
    assert_eq!(pool.shared_weights(), 2);
    assert_eq!(weights(&account), 2 * w);
    assert_eq!(host_in_use(&a, Holder::Weights), 0);
    // outputs agree with a session outside the pool
    let alone = Session::builder().load_bytes(&weights_model(n)).unwrap();
    let x = || [("x", Tensor::from_vec(&[1, n], xorshift_data(n, 3)).unwrap())];
    let want = alone.run(x()).unwrap()["y"].clone().into_tensor().unwrap();
    for s in [&a, &b] {
        let got = s.run(x()).unwrap()["y"].clone().into_tensor().unwrap();
        assert_eq!(
            got.as_slice::<f32>().unwrap(),
            want.as_slice::<f32>().unwrap()
        );
    }
    // the pool's limit binds its sessions together: 2w more weights do not fit
    let e = in_pool()
        .load_bytes(&weights_model_seeded(2 * n, 9))
        .err()
        .expect("over the pool's limit");
    assert!(
        matches!(&e, Error::OutOfMemory { tier, .. } if tier.contains("pool 'p'")),
        "{e}"
    );
    assert_eq!(weights(&account), 2 * w, "a refused load holds nothing");
    // the shared copy lives while any session holds it, whatever the order of the drops
    drop(a);
    assert_eq!(weights(&account), 2 * w);
    drop(pool);
    b.run(x()).unwrap();
    drop(b);
    assert_eq!(weights(&account), w);
    drop(c);
    let h = account.budget(Tier::Host);
    assert_eq!((h.in_use(), h.leases()), (0, 0));
}

#[test]
fn arenas_over_the_keep_limit_are_given_back_after_their_run() {
    let bytes = chain_model();
    let s = Session::builder()
        .keep_arena_limit(Some(64 << 10))
        .load_bytes(&bytes)
        .unwrap();
    let plain = Session::builder().load_bytes(&bytes).unwrap();
    let run = |s: &Session, n: usize| {
        let x = Tensor::from_vec(&[n], xorshift_data(n, 4)).unwrap();
        s.run([("x", x)]).unwrap()["z"]
            .as_tensor()
            .unwrap()
            .to_f32_vec()
            .unwrap()
    };
    for _ in 0..3 {
        assert_eq!(run(&s, 16), run(&plain, 16));
    }
    let small = host_in_use(&s, Holder::Arena);
    assert!(small > 0, "a small plan keeps its arena");
    for _ in 0..3 {
        assert_eq!(run(&s, 200_000), run(&plain, 200_000));
    }
    let arena = s.core().memory_account().holder(Tier::Host, Holder::Arena);
    assert!(
        arena.peak() > 800_000,
        "the large plan ran from an arena (peak {})",
        arena.peak()
    );
    assert_eq!(
        host_in_use(&s, Holder::Arena),
        small,
        "the large arena is given back after each run"
    );
    // without the option it stays
    assert!(host_in_use(&plain, Holder::Arena) > 800_000);
}

#[test]
fn subgraph_initializers_are_leased_as_weights() {
    use nxrt_core::proto::AttributeProto;
    let n = 4096;
    let branch = |name: &str, seed: u32| GraphProto {
        name: name.into(),
        node: vec![node(
            "Identity",
            &[&format!("w_{name}")],
            &[&format!("o_{name}")],
        )],
        output: vec![vi(&format!("o_{name}"), 1, &[&n.to_string()])],
        initializer: vec![f32s(
            &format!("w_{name}"),
            &[n as i64],
            &xorshift_data(n, seed),
        )],
        ..Default::default()
    };
    let mut if_node = node("If", &["c"], &["y"]);
    for (attr, g) in [
        ("then_branch", branch("then", 1)),
        ("else_branch", branch("else", 2)),
    ] {
        if_node.attribute.push(AttributeProto {
            name: attr.into(),
            r#type: 5,
            g: Some(Box::new(g)),
            ..Default::default()
        });
    }
    let bytes = opset17_model(GraphProto {
        name: "if".into(),
        node: vec![if_node],
        input: vec![vi("c", 9, &[])],
        output: vec![vi("y", 1, &[&n.to_string()])],
        ..Default::default()
    });
    let s = Session::builder().load_bytes(&bytes).unwrap();
    assert_eq!(
        host_in_use(&s, Holder::Weights),
        2 * 4 * n,
        "both branches' weights"
    );
    let y = s
        .run([("c", Tensor::from_vec(&[], vec![true]).unwrap())])
        .unwrap()["y"]
        .as_tensor()
        .unwrap()
        .to_f32_vec()
        .unwrap();
    assert_eq!(y, xorshift_data(n, 1));
    let account = s.core().memory_account().clone();
    drop(s);
    assert_eq!(account.budget(Tier::Host).in_use(), 0);
    let e = Session::builder()
        .memory_limit(Some(6 * n))
        .load_bytes(&bytes)
        .err()
        .expect("two 16 KiB branches under 24 KiB");
    assert!(
        matches!(&e, Error::OutOfMemory { holder, .. } if holder.contains("of a subgraph")),
        "{e}"
    );
}

#[test]
fn arenas_come_from_the_selected_mechanism_and_go_back_to_the_one_that_made_them() {
    use nxrt::governor::MemoryPool;
    use nxrt::mechanism::{BlockCache, HostMechanism, Mechanism};
    use std::sync::Arc;
    let bytes = chain_model();
    let pool = MemoryPool::new("shared-arenas", None);
    let shared: Arc<dyn HostMechanism> = pool.arena_cache().clone();
    let load = || {
        Session::builder()
            .pool(&pool)
            .host_mechanism(shared.clone())
            .load_bytes(&bytes)
            .unwrap()
    };
    let (s1, s2) = (load(), load());
    let plain = Session::builder().load_bytes(&bytes).unwrap();
    let n = 50_000;
    let run = |s: &Session| {
        let x = Tensor::from_vec(&[n], xorshift_data(n, 5)).unwrap();
        s.run([("x", x)]).unwrap()["z"]
            .as_tensor()
            .unwrap()
            .to_f32_vec()
            .unwrap()
    };
    // the first run of new shapes records the plan; the arena serves the runs after it
    for s in [&s1, &s2] {
        run(s);
    }
    let want = run(&plain);
    let cache = pool.arena_cache();
    // s1's arena is new; once s1 gives it back the pool keeps it, charged as its cache ...
    assert_eq!(run(&s1), want);
    assert_eq!((cache.hits(), cache.misses()), (0, 1));
    s1.release_cached();
    let kept = cache.cached_bytes();
    assert!(kept >= 4 * n, "the pool keeps the arena ({kept} bytes)");
    let pool_cache = pool.account().holder(Tier::Host, Holder::Cache).in_use();
    assert_eq!(pool_cache, kept, "kept blocks are the pool's cache");
    // ... and s2's arena is that block: nothing allocated
    assert_eq!(run(&s2), want);
    assert_eq!((cache.hits(), cache.misses()), (1, 1));
    assert_eq!(cache.cached_bytes(), 0);

    // Switching affects later arenas only: s2's arena (from the pool's cache) stays in its
    // plan, and goes back to the pool's cache when freed, not to the one selected now.
    let other = BlockCache::new("other", usize::MAX, None);
    s2.select_host_mechanism(other.clone()).unwrap();
    assert_eq!(run(&s2), want, "the kept arena serves the next run");
    assert_eq!(
        other.misses(),
        0,
        "nothing allocated from the new selection yet"
    );
    s2.release_cached();
    assert_eq!(
        cache.cached_bytes(),
        kept,
        "freed through the mechanism that made it"
    );
    assert_eq!(other.cached_bytes(), 0);
    run(&s2); // records the plan again
    assert_eq!(run(&s2), want);
    assert_eq!(
        other.misses(),
        1,
        "the next arena comes from the new selection"
    );
    assert_eq!(s2.mechanisms()[0].current, other.name());

    // The selected mechanism dies: the one selected before it is restored, never left dead.
    other.close("closed by the test");
    s2.release_cached(); // its arena goes back to `other`, which now frees it
    assert_eq!(other.cached_bytes(), 0);
    run(&s2);
    assert_eq!(
        run(&s2),
        want,
        "the next arena comes from the restored mechanism"
    );
    let rep = &s2.mechanisms()[0];
    assert_eq!(rep.current, cache.name());
    assert_eq!(rep.restores, 1);
    assert!(
        rep.last_failure
            .as_deref()
            .is_some_and(|f| f.contains("closed by the test")),
        "{rep:?}"
    );
    assert!(
        s2.select_host_mechanism(other.clone()).is_err(),
        "a dead mechanism cannot be selected"
    );
    assert_eq!(
        (cache.hits(), cache.misses()),
        (2, 1),
        "the restored cache served it"
    );

    // Dropping everything returns every byte: the pool's cache is freed with the pool.
    drop((s1, s2));
    assert!(pool.release_cached() > 0);
    let b = pool.account().budget(Tier::Host);
    assert_eq!((b.in_use(), b.leases()), (0, 0));
}

#[test]
fn a_pool_cache_filling_the_pool_limit_is_given_back_for_an_arena() {
    use nxrt::governor::MemoryPool;
    use nxrt::mechanism::Mechanism;
    let bytes = chain_model();
    let s0 = Session::builder().load_bytes(&bytes).unwrap();
    let w = s0.memory_snapshot().tiers[0].in_use; // the session's own (weights etc.)
                                                  // room for the weights of one session and one arena of 50 000 floats, not two
    let pool = MemoryPool::new("tight", Some(w + 600_000));
    let s = common::pool_chain_session(&pool);
    let run = |n: usize| common::run_chain(&s, n);
    run(50_000).unwrap();
    run(50_000).unwrap();
    s.release_cached();
    assert!(pool.arena_cache().cached_bytes() >= 200_000);
    // a different size class: the kept block is no use, and it fills the pool's limit
    run(60_000).expect("the cache is given back so the new arena fits");
    run(60_000).expect("and so does the run from it");
    assert_eq!(pool.arena_cache().cached_bytes(), 0);
}
