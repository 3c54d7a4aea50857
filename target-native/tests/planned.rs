//! Planned execution and the profiling gates, through the public API.
//!
//! - A planned run gives exactly the eager run's outputs, from its first (recording) run, from
//!   the arena, after a shape change and back, and from two threads at once.
//! - Outputs handed to the caller never live in the arena: a later run cannot overwrite them.
//! - The phase profiler and the planner's diagnostics have separate gates: switching the
//!   profiler on (every way it can be) never builds a memory plan in an eager run.
//! - `GateGuard` restores the gates when dropped, also when a test panics.

use nxrt::{ExecMode, GateGuard, Phase, Session, Tensor};
use nxrt_core::proto::{GraphProto, ValueInfoProto};

mod common;
use common::{f32s, i64s, node};

fn vi(name: &str, dims: &[&str]) -> ValueInfoProto {
    common::vi(name, 1, dims)
}

/// x[N,64] -> Relu -> Add(bias) -> Reshape[-1] -> Sigmoid -> Mul(self) -> Reshape[N,64]
/// -> MatMul(W[64,16]) -> Sub(x2) with x2 = Relu(x)[.., :16] via MatMul(I) ... -> y[N,16], and a
/// second output z = Relu(x) (an activation that is also a graph output).
fn chain_model() -> Vec<u8> {
    let bias: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) / 16.0).collect();
    let w: Vec<f32> = (0..64 * 16)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 200.0)
        .collect();
    let graph = GraphProto {
        name: "chain".into(),
        node: vec![
            node("Relu", &["x"], &["a"]),
            node("Add", &["a", "bias"], &["b"]),
            node("Reshape", &["b", "flat"], &["c"]),
            node("Sigmoid", &["c"], &["d"]),
            node("Mul", &["d", "d"], &["e"]),
            node("Reshape", &["e", "rows"], &["f"]),
            node("MatMul", &["f", "w"], &["g"]),
            node("Relu", &["g"], &["h"]),
            node("Neg", &["x"], &["nx"]),
            node("Relu", &["nx"], &["z"]),
            node("Sub", &["h", "h2"], &["y"]),
            node("MatMul", &["a", "w"], &["h2"]),
        ],
        initializer: vec![
            f32s("bias", &[64], &bias),
            f32s("w", &[64, 16], &w),
            i64s("flat", &[-1]),
            i64s("rows", &[-1, 64]),
        ],
        input: vec![vi("x", &["N", "64"])],
        output: vec![vi("y", &["N", "16"]), vi("z", &["N", "64"])],
        ..Default::default()
    };
    // topological order: h2 must come before y
    let mut graph = graph;
    let y = graph.node.remove(10);
    graph.node.push(y);
    common::opset17_model(graph)
}

fn input(n: usize, seed: u32) -> Tensor {
    let v: Vec<f32> = (0..n * 64)
        .map(|i| {
            (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) >> 20) as f32) / 2048.0 - 1.0
        })
        .collect();
    Tensor::from_vec(&[n, 64], v).unwrap()
}

fn outputs(s: &Session, x: Tensor) -> Vec<Vec<f32>> {
    let o = s.run([("x", x)]).unwrap();
    ["y", "z"]
        .iter()
        .map(|n| {
            o[*n]
                .as_tensor()
                .unwrap()
                .as_slice::<f32>()
                .unwrap()
                .to_vec()
        })
        .collect()
}

/// Every test here takes the gates (serialised, all off, restored on drop): a gate another test
/// switches on must not change what this one sees.
fn gates() -> GateGuard {
    let g = GateGuard::acquire();
    g.clear();
    g
}

fn load(mode: ExecMode) -> Session {
    Session::builder()
        .mode(mode)
        .load_bytes(&chain_model())
        .unwrap()
}

#[test]
fn planned_runs_match_eager_runs_across_shape_changes() {
    let _g = gates();
    let eager = load(ExecMode::Eager);
    let planned = load(ExecMode::Planned);
    for (k, n) in [2usize, 2, 2, 5, 5, 2, 1, 5].into_iter().enumerate() {
        let x = input(n, k as u32);
        assert_eq!(
            outputs(&planned, x.clone()),
            outputs(&eager, x),
            "run {k} with N={n}"
        );
    }
    // N=2, N=5, N=1: one plan each; returning to a known shape re-uses its plan
    assert_eq!(planned.memory_plans_built(), 3);
    assert_eq!(eager.memory_plans_built(), 0);
}

#[test]
fn the_plan_shares_memory_through_views_and_in_place_writes() {
    let _g = gates();
    let s = load(ExecMode::Planned);
    s.run([("x", input(4, 1))]).unwrap();
    let st = s
        .activation_memory_plan_stats()
        .expect("a planned run builds a plan");
    assert!(st.planned_values >= 8, "{st:?}");
    assert!(st.views >= 2, "the two Reshapes are views: {st:?}");
    // Add over Relu's dying output, Sigmoid over the flat view, Relu over g
    assert!(st.in_place >= 2, "{st:?}");
    assert!(st.arena_bytes < st.activation_bytes, "{st:?}");
    assert!(st.arena_bytes >= st.live_peak_bytes, "{st:?}");
    // y and z are graph outputs: never in the arena
    assert_eq!(st.heap_values, 2, "{st:?}");
}

#[test]
fn outputs_outlive_later_runs() {
    let _g = gates();
    let s = load(ExecMode::Planned);
    let eager = load(ExecMode::Eager);
    s.run([("x", input(3, 7))]).unwrap();
    let kept = s.run([("x", input(3, 8))]).unwrap();
    let want = outputs(&eager, input(3, 8));
    for _ in 0..3 {
        s.run([("x", input(3, 9))]).unwrap();
    }
    for (k, n) in ["y", "z"].iter().enumerate() {
        let got = kept[*n]
            .as_tensor()
            .unwrap()
            .as_slice::<f32>()
            .unwrap()
            .to_vec();
        assert_eq!(got, want[k], "output {n} changed after later runs");
    }
}

#[test]
fn concurrent_planned_runs_do_not_share_an_arena() {
    let _g = gates();
    let s = std::sync::Arc::new(load(ExecMode::Planned));
    let eager = load(ExecMode::Eager);
    s.run([("x", input(6, 0))]).unwrap();
    let want: Vec<_> = (0..4).map(|t| outputs(&eager, input(6, t))).collect();
    std::thread::scope(|sc| {
        for t in 0..4u32 {
            let s = s.clone();
            let want = &want[t as usize];
            sc.spawn(move || {
                for _ in 0..50 {
                    assert_eq!(&outputs(&s, input(6, t)), want);
                }
            });
        }
    });
}

#[test]
fn profiler_gate_never_builds_a_memory_plan_in_an_eager_run() {
    let _g = gates();
    // every way the profiler alone can be switched on
    nxrt::enable_exec_phase_profile_for_process();
    let s = Session::builder()
        .mode(ExecMode::Eager)
        .phase_profile(true)
        .load_bytes(&chain_model())
        .unwrap();
    for k in 0..3 {
        s.run([("x", input(2, k))]).unwrap();
    }
    assert!(!nxrt::activation_memory_plan_enabled());
    assert_eq!(
        s.memory_plans_built(),
        0,
        "the profiler switched the planner on"
    );
    assert!(s.activation_memory_plan_stats().is_none());
    let p = s.phase_profile().expect("the profiler was on");
    assert_eq!(p.runs, 3);
    assert_eq!(
        p.phase_total_ns(Phase::Plan),
        0,
        "an unprofiled eager run builds no plan, so a profiled one must not either"
    );
    assert!(p.by_op.iter().any(|o| o.op == "MatMul" && o.calls == 6));
}

#[test]
fn planner_diagnostics_gate_replans_every_eager_run_without_profiling() {
    let _g = gates();
    nxrt::enable_activation_memory_plan_for_process();
    let s = Session::builder()
        .mode(ExecMode::Eager)
        .load_bytes(&chain_model())
        .unwrap();
    for k in 0..3 {
        s.run([("x", input(2, k))]).unwrap();
    }
    assert_eq!(s.memory_plans_built(), 3);
    let st = s.activation_memory_plan_stats().unwrap();
    assert!(st.arena_bytes > 0 && st.activation_bytes > st.arena_bytes);
    assert!(!nxrt::exec_phase_profile_enabled());
    assert!(
        s.phase_profile().is_none(),
        "the planner's gate turned the profiler on"
    );
}

#[test]
fn with_every_gate_off_nothing_is_recorded() {
    let _g = gates();
    let s = load(ExecMode::Eager);
    s.run([("x", input(2, 0))]).unwrap();
    assert!(s.phase_profile().is_none());
    assert_eq!(s.memory_plans_built(), 0);
}

#[test]
fn a_profiled_run_reports_each_phase_and_kernel() {
    let _g = gates();
    let s = Session::builder()
        .phase_profile(true)
        .load_bytes(&chain_model())
        .unwrap();
    s.run([("x", input(2, 0))]).unwrap();
    s.run([("x", input(2, 1))]).unwrap();
    let p = s.phase_profile().unwrap();
    assert_eq!(p.runs, 2);
    let load: Vec<Phase> = p.load_ns.iter().map(|x| x.0).collect();
    assert_eq!(load, [Phase::Load, Phase::Optimise, Phase::Plan]);
    // the planned mode's first run builds its memory plan, the second re-uses it
    let plan_spans: Vec<u32> = p
        .spans
        .iter()
        .filter(|s| s.phase == Phase::Plan && s.run > 0)
        .map(|s| s.run)
        .collect();
    assert_eq!(plan_spans, [1]);
    let kernels = p.spans.iter().filter(|s| s.phase == Phase::Kernel).count();
    assert_eq!(kernels, 2 * 12);
    for ph in [Phase::Bind, Phase::Kernel, Phase::Readback, Phase::Run] {
        assert!(p.phase_ns.iter().any(|x| x.0 == ph), "{ph:?} missing");
    }
    let kern = p.phase_total_ns(Phase::Kernel);
    assert!(kern > 0 && kern <= p.phase_total_ns(Phase::Run));
    let trace = p.chrome_trace();
    let v: serde_json::Value = serde_json::from_str(&trace).expect("valid trace JSON");
    let ev = v["traceEvents"].as_array().unwrap();
    assert_eq!(ev.len(), p.spans.len());
    assert!(ev.iter().any(|e| e["name"] == "MatMul_g" && e["ph"] == "X"));
    assert!(p.table(5).contains("MatMul"));
}

#[test]
fn gate_guard_restores_the_gates_after_a_panic() {
    {
        let g = GateGuard::acquire();
        g.clear();
    }
    let before = (
        nxrt::exec_phase_profile_enabled(),
        nxrt::activation_memory_plan_enabled(),
    );
    let r = std::panic::catch_unwind(|| {
        let _g = GateGuard::acquire();
        nxrt::enable_exec_phase_profile_for_process();
        nxrt::enable_activation_memory_plan_for_process();
        panic!("a test failing with the gates on");
    });
    assert!(r.is_err());
    let _g = GateGuard::acquire();
    assert_eq!(
        (
            nxrt::exec_phase_profile_enabled(),
            nxrt::activation_memory_plan_enabled()
        ),
        before
    );
}

/// x[N,8] with the shape arithmetic exporters emit: n = Gather(Shape(x), 0);
/// y = Reshape(x, Concat(Unsqueeze(n), [2, 4])); ones = ConstantOfShape(Concat(Unsqueeze(n),
/// [8])) as float; v = x * ones; w = (x + Cast(Unsqueeze(Range(0, n, 1), 1))) * ones (each
/// row plus its index, through an activation that is not a graph output).
fn shape_arithmetic_model() -> Vec<u8> {
    let scalar = |name: &str, v: i64| nxrt_core::proto::TensorProto {
        name: name.into(),
        data_type: 7,
        int64_data: vec![v],
        ..Default::default()
    };
    let mut cast = node("Cast", &["r"], &["rf"]);
    cast.attribute.push(nxrt_core::proto::AttributeProto {
        name: "to".into(),
        r#type: 2,
        i: 1,
        ..Default::default()
    });
    let graph = GraphProto {
        name: "shapes".into(),
        node: vec![
            node("Shape", &["x"], &["s"]),
            node("Gather", &["s", "zero"], &["n"]),
            node("Unsqueeze", &["n", "ax0"], &["nu"]),
            node("Concat", &["nu", "two_four"], &["shape3"]),
            node("Reshape", &["x", "shape3"], &["y"]),
            node("Range", &["zero", "n", "one"], &["r"]),
            cast,
            node("Unsqueeze", &["rf", "ax1"], &["col"]),
            node("Add", &["x", "col"], &["a"]),
            node("Concat", &["nu", "eight"], &["shape2"]),
            node("ConstantOfShape", &["shape2"], &["ones"]),
            node("Cast", &["ones"], &["onesf"]),
            node("Mul", &["x", "onesf"], &["v"]),
            node("Mul", &["a", "onesf"], &["w"]),
        ],
        initializer: vec![
            scalar("zero", 0),
            scalar("one", 1),
            i64s("ax0", &[0]),
            i64s("ax1", &[1]),
            i64s("two_four", &[2, 4]),
            i64s("eight", &[8]),
        ],
        input: vec![vi("x", &["N", "8"])],
        output: vec![
            vi("y", &["N", "2", "4"]),
            vi("w", &["N", "8"]),
            vi("v", &["N", "8"]),
        ],
        ..Default::default()
    };
    let mut graph = graph;
    // ConstantOfShape's default value is float 0: make it 1 (int64) and cast
    graph.node[10]
        .attribute
        .push(nxrt_core::proto::AttributeProto {
            name: "value".into(),
            r#type: 4,
            t: Some(nxrt_core::proto::TensorProto {
                dims: vec![1],
                data_type: 7,
                int64_data: vec![1],
                ..Default::default()
            }),
            ..Default::default()
        });
    for k in [3, 9] {
        graph.node[k]
            .attribute
            .push(nxrt_core::proto::AttributeProto {
                name: "axis".into(),
                r#type: 2,
                i: 0,
                ..Default::default()
            });
    }
    graph.node[11]
        .attribute
        .push(nxrt_core::proto::AttributeProto {
            name: "to".into(),
            r#type: 2,
            i: 1,
            ..Default::default()
        });
    common::opset17_model(graph)
}

#[test]
fn a_plan_keeps_shape_arithmetic_per_set_of_shapes() {
    let _g = gates();
    let model = shape_arithmetic_model();
    let opts = |mode| {
        Session::builder()
            .mode(mode)
            .optimization(nxrt::OptLevel::None)
            .phase_profile(true)
            .load_bytes(&model)
            .unwrap()
    };
    let planned = opts(ExecMode::Planned);
    let eager = opts(ExecMode::Eager);
    let outs = |s: &Session, n: usize, seed: u32| -> Vec<(Vec<usize>, Vec<f32>)> {
        let x = Tensor::from_vec(&[n, 8], common::xorshift_data(n * 8, seed)).unwrap();
        let o = s.run([("x", x)]).unwrap();
        ["y", "w", "v"]
            .iter()
            .map(|k| {
                let t = o[*k].as_tensor().unwrap();
                (t.shape().to_vec(), t.as_slice::<f32>().unwrap().to_vec())
            })
            .collect()
    };
    // shapes change and come back: every run matches the eager run of the same input
    for (k, n) in [3usize, 3, 5, 3, 1, 5, 5, 1].into_iter().enumerate() {
        let got = outs(&planned, n, k as u32);
        let want = outs(&eager, n, k as u32);
        assert_eq!(got, want, "run {k}, N = {n}");
        assert_eq!(got[0].0, [n, 2, 4]);
        let rows: Vec<f32> = (0..n * 8).map(|i| (i / 8) as f32).collect();
        let x = common::xorshift_data(n * 8, k as u32);
        let w: Vec<f32> = x.iter().zip(&rows).map(|(a, b)| a + b).collect();
        assert_eq!(got[1].1, w, "w = x + row index, N = {n}");
    }
    assert_eq!(planned.memory_plans_built(), 3);
    let st = planned.activation_memory_plan_stats().unwrap();
    // Shape, Gather, both Unsqueezes, both Concats, Range, both Casts, ConstantOfShape
    assert_eq!(st.folded_steps, 10, "{st:?}");
    // runs that re-use a plan run only Reshape, Add and the Muls; recording runs all 14 nodes
    let p = planned.phase_profile().unwrap();
    let per_run = |r: u32| {
        p.spans
            .iter()
            .filter(|s| s.phase == Phase::Kernel && s.run == r)
            .count()
    };
    assert_eq!(per_run(1), 14, "the recording run runs every node");
    assert_eq!(
        per_run(2),
        4,
        "a planned run skips the kept shape arithmetic"
    );
    assert_eq!(per_run(4), 4);
    assert_eq!(per_run(5), 14, "N = 1 is new: recorded");
}
