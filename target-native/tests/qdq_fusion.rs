//! QDQ graphs onto the integer kernels (`nxrt_core::fuse::quant::qdq_ops`, a CPU fusion at
//! `OptLevel::Extended` and `All`): `DequantizeLinear -> op -> QuantizeLinear` becomes the
//! op's integer form. Each model runs fused and at `OptLevel::Basic` (float ops between the
//! Q/DQ pairs, as written); the fused graph must hold the integer ops and give the same codes
//! but for an occasional one-step difference where a float sum lands near a rounding tie.

use nxrt::{OptLevel, Session, Tensor};
use nxrt_core::proto::{AttributeProto, GraphProto, TensorProto};

mod common;
use common::{f32s, node, vi, xorshift_data};

fn u8s(name: &str, v: &[u8]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: vec![],
        data_type: 2,
        raw_data: v.to_vec().into(),
        ..Default::default()
    }
}

fn i8s(name: &str, dims: &[i64], v: &[i8]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 3,
        raw_data: v.iter().map(|&b| b as u8).collect::<Vec<u8>>().into(),
        ..Default::default()
    }
}

fn i32s(name: &str, dims: &[i64], v: &[i32]) -> TensorProto {
    TensorProto {
        name: name.into(),
        dims: dims.to_vec(),
        data_type: 6,
        int32_data: v.to_vec(),
        ..Default::default()
    }
}

fn scalar(name: &str, v: f32) -> TensorProto {
    f32s(name, &[], &[v])
}

/// `x -> Q -> DQ -> Conv(DQ(w), DQ(b)) -> Q -> DQ -> {HardSigmoid -> Q -> DQ} -> Mul -> Q ->
/// DQ -> GlobalAveragePool -> Q -> DQ -> Add(DQ(Q(.)) of itself) -> Q -> DQ -> y`: every
/// pattern of the fusion once, MobileNetV3's hard-swish and squeeze parts among them.
fn qdq_model(c: usize, m: usize, k: usize) -> Vec<u8> {
    let kk = (c * k * k) as i64;
    let w: Vec<i8> = xorshift_data(m * c * k * k, 3)
        .iter()
        .map(|v| (v * 127.0) as i8)
        .collect();
    let sw: Vec<f32> = (0..m).map(|i| 0.004 + 0.0005 * i as f32).collect();
    let sx = 0.0078f32;
    let sb: Vec<f32> = sw.iter().map(|s| sx * s).collect();
    let b: Vec<i32> = (0..m).map(|i| (i as i32 * 37) % 200 - 100).collect();
    let mut conv = node("Conv", &["xd", "wd", "bd"], &["c"]);
    conv.attribute = vec![
        AttributeProto::ints("kernel_shape", &[k as i64, k as i64]),
        AttributeProto::ints("pads", &[(k / 2) as i64; 4]),
    ];
    let mut wdq = node("DequantizeLinear", &["w", "sw"], &["wd"]);
    wdq.attribute = vec![AttributeProto::int("axis", 0)];
    let mut bdq = node("DequantizeLinear", &["b", "sb"], &["bd"]);
    bdq.attribute = vec![AttributeProto::int("axis", 0)];
    let mut hs = node("HardSigmoid", &["cd"], &["h"]);
    hs.attribute = vec![
        AttributeProto::float("alpha", 1.0 / 6.0),
        AttributeProto::float("beta", 0.5),
    ];
    let _ = kk;
    let nodes = vec![
        node("QuantizeLinear", &["x", "sx", "zx"], &["xq"]),
        node("DequantizeLinear", &["xq", "sx", "zx"], &["xd"]),
        wdq,
        bdq,
        conv,
        node("QuantizeLinear", &["c", "sc", "zc"], &["cq"]),
        node("DequantizeLinear", &["cq", "sc", "zc"], &["cd"]),
        hs,
        node("QuantizeLinear", &["h", "sh", "zh"], &["hq"]),
        node("DequantizeLinear", &["hq", "sh", "zh"], &["hd0"]),
        // elementwise ops by a constant (openWakeWord's maximum after LeakyRelu), each
        // quantized: three more tables, composed with HardSigmoid's into one
        node("Max", &["hd0", "cmax"], &["hm"]),
        node("QuantizeLinear", &["hm", "sh", "zh"], &["hmq"]),
        node("DequantizeLinear", &["hmq", "sh", "zh"], &["hmd"]),
        node("Sub", &["cone", "hmd"], &["hs1"]),
        node("QuantizeLinear", &["hs1", "sh", "zh"], &["hsq"]),
        node("DequantizeLinear", &["hsq", "sh", "zh"], &["hsd"]),
        node("Div", &["hsd", "ctwo"], &["hv"]),
        node("QuantizeLinear", &["hv", "sh", "zh"], &["hvq"]),
        node("DequantizeLinear", &["hvq", "sh", "zh"], &["hd"]),
        node("Mul", &["cd", "hd"], &["mu"]),
        node("QuantizeLinear", &["mu", "sm", "zm"], &["mq"]),
        node("DequantizeLinear", &["mq", "sm", "zm"], &["md"]),
        node("GlobalAveragePool", &["md"], &["gp"]),
        node("QuantizeLinear", &["gp", "sg", "zg"], &["gq"]),
        node("DequantizeLinear", &["gq", "sg", "zg"], &["gd"]),
        node("Add", &["gd", "gd"], &["ad"]),
        node("QuantizeLinear", &["ad", "sa", "za"], &["aq"]),
        node("DequantizeLinear", &["aq", "sa", "za"], &["y"]),
    ];
    let init = vec![
        scalar("sx", sx),
        u8s("zx", &[128]),
        i8s("w", &[m as i64, c as i64, k as i64, k as i64], &w),
        f32s("sw", &[m as i64], &sw),
        i32s("b", &[m as i64], &b),
        f32s("sb", &[m as i64], &sb),
        scalar("sc", 0.021),
        u8s("zc", &[100]),
        scalar("sh", 1.0 / 255.0),
        scalar("cmax", 0.3),
        f32s("cone", &[1], &[1.0]),
        scalar("ctwo", 0.75),
        u8s("zh", &[0]),
        scalar("sm", 0.017),
        u8s("zm", &[20]),
        scalar("sg", 0.006),
        u8s("zg", &[30]),
        scalar("sa", 0.011),
        u8s("za", &[10]),
    ];
    common::opset17_model(GraphProto {
        node: nodes,
        initializer: init,
        input: vec![vi("x", 1, &["1", &c.to_string(), "9", "9"])],
        output: vec![vi("y", 1, &["1", &m.to_string(), "1", "1"])],
        ..Default::default()
    })
}

fn run(bytes: &[u8], level: OptLevel, c: usize) -> (Vec<f32>, Vec<String>) {
    let s = Session::builder()
        .optimization(level)
        .load_bytes(bytes)
        .unwrap();
    let x = Tensor::from_vec(&[1, c, 9, 9], xorshift_data(c * 81, 11)).unwrap();
    let out = s.run(vec![("x", x)]).unwrap();
    let y = out["y"]
        .as_tensor()
        .unwrap()
        .as_slice::<f32>()
        .unwrap()
        .to_vec();
    (y, op_types(&s))
}

/// The op types of a session's graph after its rewrites.
fn op_types(s: &Session) -> Vec<String> {
    s.core()
        .graph()
        .nodes
        .iter()
        .map(|n| n.op_type.clone())
        .collect()
}

#[test]
fn qdq_patterns_run_on_the_integer_kernels_with_the_same_codes() {
    for &(c, m, k) in &[(3, 8, 3), (16, 24, 1), (5, 7, 3)] {
        let bytes = qdq_model(c, m, k);
        let (want, plain) = run(&bytes, OptLevel::Basic, c);
        let (got, ops) = run(&bytes, OptLevel::Extended, c);
        assert!(plain.iter().any(|o| o == "Conv"), "{plain:?}");
        for op in [
            "QLinearConv",
            "QLookup",
            "QLinearGlobalAveragePool",
            "QLinearAdd",
        ] {
            assert!(ops.iter().any(|o| o == op), "{op} missing from {ops:?}");
        }
        // the four tables in a row are one, and the product of the convolution's codes with
        // that table's answer for them (hard-swish) is one table too
        assert_eq!(ops.iter().filter(|o| *o == "QLookup").count(), 1, "{ops:?}");
        assert!(!ops.iter().any(|o| o == "QLinearMul"), "{ops:?}");
        // only the input's quantization and the output's dequantization stay
        assert_eq!(
            ops.iter()
                .filter(|o| o.ends_with("uantizeLinear") || *o == "Conv")
                .count(),
            2,
            "float ops left: {ops:?}"
        );
        let step = 0.011f32;
        let mut off = 0;
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            let d = ((a - b) / step).abs().round() as i32;
            assert!(d <= 1, "{c}x{m}x{k} at {i}: {a} vs {b}");
            off += (d != 0) as usize;
        }
        assert!(off * 4 <= got.len(), "{off} of {} codes differ", got.len());
    }
}

#[test]
fn a_bias_at_another_scale_keeps_the_float_convolution() {
    // the bias's scale is not x_scale * w_scale: the integer kernel cannot add it exactly
    let mut bytes = qdq_model(3, 8, 3);
    let mut m = <nxrt_core::proto::ModelProto as prost::Message>::decode(bytes.as_slice()).unwrap();
    let g = m.graph.as_mut().unwrap();
    let sb = g.initializer.iter_mut().find(|t| t.name == "sb").unwrap();
    for v in sb.float_data.iter_mut() {
        *v *= 1.5;
    }
    bytes = prost::Message::encode_to_vec(&m);
    let (_, ops) = run(&bytes, OptLevel::Extended, 3);
    assert!(ops.iter().any(|o| o == "Conv"), "{ops:?}");
    assert!(!ops.iter().any(|o| o == "QLinearConv"), "{ops:?}");
}

/// A QOperator-format hard-swish (ONNX Runtime's QOperator MobileNetV3): `QLinearConv ->
/// DequantizeLinear -> HardSigmoid -> QuantizeLinear`, then com.microsoft `QLinearMul` of the
/// convolution's codes and those. The table fusion needs the QLinear ops' output types from
/// shape inference: without them the float HardSigmoid and its Q/DQ pair stayed. With them
/// the hard-sigmoid becomes a table, and the product of the codes with that table's answer
/// for them one table: the same bytes, since it is computed by the QLinearMul kernel.
#[test]
fn qoperator_outputs_feed_the_table_fusion() {
    use nxrt_core::proto::{ModelProto, OperatorSetIdProto};
    use prost::Message;
    let (c, m) = (3usize, 8usize);
    let w: Vec<i8> = xorshift_data(m * c * 9, 5)
        .iter()
        .map(|v| (v * 127.0) as i8)
        .collect();
    let mut conv = node(
        "QLinearConv",
        &["xq", "sx", "zx", "w", "sw", "zw", "sc", "zc"],
        &["cq"],
    );
    conv.attribute = vec![
        AttributeProto::ints("kernel_shape", &[3, 3]),
        AttributeProto::ints("pads", &[1; 4]),
    ];
    let mut hs = node("HardSigmoid", &["cd"], &["h"]);
    hs.attribute = vec![
        AttributeProto::float("alpha", 1.0 / 6.0),
        AttributeProto::float("beta", 0.5),
    ];
    let mut mul = node(
        "QLinearMul",
        &["cq", "sc", "zc", "hq", "sh", "zh", "sm", "zm"],
        &["mq"],
    );
    mul.domain = "com.microsoft".into();
    let graph = GraphProto {
        node: vec![
            node("QuantizeLinear", &["x", "sx", "zx"], &["xq"]),
            conv,
            node("DequantizeLinear", &["cq", "sc", "zc"], &["cd"]),
            hs,
            node("QuantizeLinear", &["h", "sh", "zh"], &["hq"]),
            mul,
            node("DequantizeLinear", &["mq", "sm", "zm"], &["y"]),
        ],
        initializer: vec![
            scalar("sx", 0.0078),
            u8s("zx", &[128]),
            i8s("w", &[m as i64, c as i64, 3, 3], &w),
            scalar("sw", 0.004),
            i8s("zw", &[], &[0]),
            scalar("sc", 0.021),
            u8s("zc", &[100]),
            scalar("sh", 1.0 / 255.0),
            u8s("zh", &[0]),
            scalar("sm", 0.017),
            u8s("zm", &[20]),
        ],
        input: vec![vi("x", 1, &["1", &c.to_string(), "9", "9"])],
        output: vec![vi("y", 1, &["1", &m.to_string(), "9", "9"])],
        ..Default::default()
    };
    let bytes = ModelProto {
        ir_version: 9,
        opset_import: vec![
            OperatorSetIdProto {
                domain: String::new(),
                version: 17,
            },
            OperatorSetIdProto {
                domain: "com.microsoft".into(),
                version: 1,
            },
        ],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec();
    let (want, plain) = run(&bytes, OptLevel::Basic, c);
    let (got, ops) = run(&bytes, OptLevel::Extended, c);
    assert!(plain.iter().any(|o| o == "HardSigmoid"), "{plain:?}");
    assert_eq!(
        ops,
        [
            "QuantizeLinear",
            "QLinearConv",
            "QLookup",
            "DequantizeLinear"
        ],
        "{ops:?}"
    );
    // the table is the float ops' own arithmetic on each code: the same codes
    for (i, (a, b)) in got.iter().zip(&want).enumerate() {
        assert_eq!(a, b, "at {i}");
    }
}

/// ONNX Runtime's dynamic quantization of a float MatMul: `x -> DynamicQuantizeLinear ->
/// MatMulInteger(w, per-column zero points) -> Cast(float) -> Mul(x_scale * w_scale)`, then
/// `Add(bias)` when `bias`, and `scale_rows` makes the scale one per row instead (`[M, 1]`,
/// which the fused op cannot take).
fn dynamic_matmul_model(m: usize, k: usize, n: usize, bias: bool, scale_rows: bool) -> Vec<u8> {
    let w: Vec<i8> = xorshift_data(k * n, 5)
        .iter()
        .map(|v| (v * 127.0) as i8)
        .collect();
    let wz: Vec<i8> = (0..n).map(|j| (j as i8 % 7) - 3).collect();
    let ws: Vec<f32> = (0..n).map(|j| 0.003 + 0.0002 * j as f32).collect();
    let mut cast = node("Cast", &["p"], &["pf"]);
    cast.attribute = vec![AttributeProto::int("to", 1)];
    let mut nodes = vec![
        node("DynamicQuantizeLinear", &["x"], &["xq", "xs", "xz"]),
        node("MatMulInteger", &["xq", "w", "xz", "wz"], &["p"]),
        cast,
    ];
    let mut init = vec![
        i8s("w", &[k as i64, n as i64], &w),
        i8s("wz", &[n as i64], &wz),
    ];
    if scale_rows {
        let rs: Vec<f32> = (0..m).map(|i| 1.0 + 0.25 * i as f32).collect();
        init.push(f32s("ws", &[m as i64, 1], &rs));
    } else {
        init.push(f32s("ws", &[n as i64], &ws));
    }
    nodes.push(node("Mul", &["xs", "ws"], &["s"]));
    let scaled = if bias { "ps" } else { "y" };
    nodes.push(node("Mul", &["pf", "s"], &[scaled]));
    if bias {
        let b: Vec<f32> = xorshift_data(n, 9);
        init.push(f32s("bias", &[n as i64], &b));
        nodes.push(node("Add", &["bias", "ps"], &["y"]));
    }
    common::opset17_model(GraphProto {
        node: nodes,
        initializer: init,
        input: vec![vi("x", 1, &[&m.to_string(), &k.to_string()])],
        output: vec![vi("y", 1, &[&m.to_string(), &n.to_string()])],
        ..Default::default()
    })
}

#[test]
fn dynamic_quantization_products_write_floats_with_the_same_bits() {
    for &(m, k, n, bias, rows) in &[
        (5, 37, 19, true, false),
        (32, 64, 40, false, false),
        (3, 16, 8, true, true),
    ] {
        let bytes = dynamic_matmul_model(m, k, n, bias, rows);
        let run = |level: OptLevel| {
            let s = Session::builder()
                .optimization(level)
                .load_bytes(&bytes)
                .unwrap();
            let x = Tensor::from_vec(&[m, k], xorshift_data(m * k, 13)).unwrap();
            let out = s.run(vec![("x", x)]).unwrap();
            let y = out["y"]
                .as_tensor()
                .unwrap()
                .as_slice::<f32>()
                .unwrap()
                .to_vec();
            (y, op_types(&s))
        };
        let (want, plain) = run(OptLevel::Basic);
        let (got, ops) = run(OptLevel::Extended);
        assert!(plain.iter().any(|o| o == "Cast"), "{plain:?}");
        if rows {
            // a scale per row is not the fused op's: left as written
            assert!(!ops.iter().any(|o| o == "MatMulIntegerToFloat"), "{ops:?}");
        } else {
            assert!(ops.iter().any(|o| o == "MatMulIntegerToFloat"), "{ops:?}");
            for gone in ["MatMulInteger", "Cast", "Add"] {
                assert!(!ops.iter().any(|o| o == gone), "{gone} left in {ops:?}");
            }
        }
        // the same conversions, products and sums: bit for bit
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{m}x{k}x{n} at {i}: {a} vs {b}");
        }
    }
}
