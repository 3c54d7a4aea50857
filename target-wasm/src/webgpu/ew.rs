//! Element-wise kernels: unary activations, binary arithmetic with numpy broadcasting, Where,
//! Clip, and the identity-like ops (views of their input's buffer, no dispatch).

use nxrt_core::ir::Node;
use nxrt_core::kernels::{broadcast_shapes, tensor_in};
use nxrt_core::{DataType, Error, Result};

use super::{dev_in, host_f32, out1, shader_1d, view_of, Exec, Gpu, OpDef};

const WG: u32 = 256;
/// Broadcasting handles ranks up to this.
pub(crate) const MAX_RANK: usize = 8;

macro_rules! unary {
    ($($op:literal, $since:literal;)*) => {
        &[$(OpDef { op: $op, since: $since, type_input: 0, host: &[], build: build_unary },)*]
    };
}

pub(crate) const OPS: &[OpDef] = &[
    OpDef {
        op: "Add",
        since: 7,
        type_input: 0,
        host: &[],
        build: build_binary,
    },
    OpDef {
        op: "Sub",
        since: 7,
        type_input: 0,
        host: &[],
        build: build_binary,
    },
    OpDef {
        op: "Mul",
        since: 7,
        type_input: 0,
        host: &[],
        build: build_binary,
    },
    OpDef {
        op: "Div",
        since: 7,
        type_input: 0,
        host: &[],
        build: build_binary,
    },
    OpDef {
        op: "Pow",
        since: 7,
        type_input: 0,
        host: &[],
        build: build_binary,
    },
    OpDef {
        op: "PRelu",
        since: 9,
        type_input: 0,
        host: &[],
        build: build_binary,
    },
    OpDef {
        op: "Max",
        since: 8,
        type_input: 0,
        host: &[],
        build: build_binary,
    },
    OpDef {
        op: "Min",
        since: 8,
        type_input: 0,
        host: &[],
        build: build_binary,
    },
    OpDef {
        op: "Where",
        since: 9,
        type_input: 1,
        host: &[],
        build: build_where,
    },
    OpDef {
        op: "Clip",
        since: 11,
        type_input: 0,
        host: &[1, 2],
        build: build_unary,
    },
    OpDef {
        op: "Identity",
        since: 1,
        type_input: 0,
        host: &[],
        build: build_view,
    },
    OpDef {
        op: "Dropout",
        since: 12,
        type_input: 0,
        host: &[1, 2],
        build: build_view,
    },
];

pub(crate) const UNARY: &[OpDef] = unary! {
    "Relu", 6; "Sigmoid", 6; "Tanh", 6; "Exp", 6; "Log", 6; "Sqrt", 6; "Neg", 6; "Abs", 6;
    "Reciprocal", 6; "Floor", 6; "Ceil", 6; "Sin", 7; "Cos", 7; "Erf", 9; "LeakyRelu", 6;
    "Elu", 6; "Selu", 6; "Celu", 12; "HardSigmoid", 6; "HardSwish", 14; "Softplus", 1;
    "Softsign", 1; "Gelu", 20; "Round", 11; "Sign", 9; "Mish", 18;
};

/// The WGSL expression of a unary op over `x` (attributes baked in as constants).
fn unary_expr(node: &Node) -> Result<String> {
    let f = |name: &str, d: f32| node.get_f(name, d);
    let lit = |v: f32| {
        if v.is_finite() {
            format!("{v:?}f")
        } else if v > 0.0 {
            "3.4028235e38f".to_string()
        } else {
            "-3.4028235e38f".to_string()
        }
    };
    Ok(match node.op_type.as_str() {
        "Relu" => "max(x, 0.0)".into(),
        "Sigmoid" => "1.0 / (1.0 + exp(-x))".into(),
        "Tanh" => "tanh(clamp(x, -30.0, 30.0))".into(),
        "Exp" => "exp(x)".into(),
        "Log" => "log(x)".into(),
        "Sqrt" => "sqrt(x)".into(),
        "Neg" => "-x".into(),
        "Abs" => "abs(x)".into(),
        "Reciprocal" => "1.0 / x".into(),
        "Floor" => "floor(x)".into(),
        "Ceil" => "ceil(x)".into(),
        "Sin" => "sin(x)".into(),
        "Cos" => "cos(x)".into(),
        "Round" => "round(x)".into(),
        "Sign" => "sign(x)".into(),
        "Erf" => "erf_(x)".into(),
        "Softsign" => "x / (1.0 + abs(x))".into(),
        "Softplus" => "max(x, 0.0) + log(1.0 + exp(-abs(x)))".into(),
        "Mish" => "x * tanh(clamp(max(x, 0.0) + log(1.0 + exp(-abs(x))), -30.0, 30.0))".into(),
        "LeakyRelu" => format!("select(x, x * {}, x < 0.0)", lit(f("alpha", 0.01)?)),
        "Elu" => format!("select(x, {} * (exp(x) - 1.0), x < 0.0)", lit(f("alpha", 1.0)?)),
        "Celu" => {
            let a = f("alpha", 1.0)?;
            format!(
                "max(x, 0.0) + min(0.0, {} * (exp(x / {}) - 1.0))",
                lit(a),
                lit(a)
            )
        }
        "Selu" => format!(
            "{} * select(x, {} * (exp(x) - 1.0), x <= 0.0)",
            lit(f("gamma", 1.050_701)?),
            lit(f("alpha", 1.673_263_2)?)
        ),
        "HardSigmoid" => format!(
            "clamp({} * x + {}, 0.0, 1.0)",
            lit(f("alpha", 0.2)?),
            lit(f("beta", 0.5)?)
        ),
        "HardSwish" => "x * clamp(x / 6.0 + 0.5, 0.0, 1.0)".into(),
        "Gelu" => match node.get_s("approximate", "none")?.as_str() {
            "none" => "0.5 * x * (1.0 + erf_(x * 0.70710678118654752))".into(),
            "tanh" => "0.5 * x * (1.0 + tanh(clamp(0.7978845608028654 * (x + 0.044715 * x * x * x), -30.0, 30.0)))".into(),
            a => return Err(Error::Other(format!("Gelu approximate='{a}'"))),
        },
        // bounds arrive as params words 2 and 3
        "Clip" => "clamp(x, bitcast<f32>(p[2]), bitcast<f32>(p[3]))".into(),
        op => return Err(Error::Other(format!("no WebGPU kernel for {op}"))),
    })
}

/// erf to about 1e-7 (Abramowitz and Stegun 7.1.26 is not enough near 0; this is the
/// complementary-error-function series of Numerical Recipes' erfc, accurate to 1.2e-7).
const ERF: &str = "
fn erf_(x: f32) -> f32 {
  let z = abs(x);
  let t = 1.0 / (1.0 + 0.5 * z);
  let r = t * exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
    t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
    t * (-0.82215223 + t * 0.17087277)))))))));
  return select(1.0 - r, r - 1.0, x < 0.0);
}
";

fn build_unary(node: &Node) -> Result<Exec> {
    let expr = unary_expr(node)?;
    let key = format!("unary:{expr}");
    let (cmin, cmax) = if node.op_type == "Clip" {
        (f32::NEG_INFINITY, f32::INFINITY)
    } else {
        (0.0, 0.0)
    };
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, xb) = dev_in(inputs, 0)?;
        let lo = host_f32(inputs, 1)?.unwrap_or(cmin);
        let hi = host_f32(inputs, 2)?.unwrap_or(cmax);
        let (y, yb) = gpu.alloc(DataType::Float, x.shape())?;
        let pipe = gpu.pipeline(&key, || {
            shader_1d(
                &[("a", "read", "f32"), ("y", "read_write", "f32")],
                WG,
                ERF,
                &format!("  if (i >= p[1]) {{ return; }}\n  let x = a[i];\n  y[i] = {expr};"),
            )
        })?;
        let n = x.len() as u64;
        let mut params = [0, n as u32, lo.to_bits(), hi.to_bits()];
        gpu.dispatch(&pipe, &mut params, &[xb.raw(), yb.raw()], n, WG)?;
        out1(y)
    }))
}

/// Element strides of `shape` broadcast to `out` (0 where a dimension repeats).
pub(crate) fn bcast_strides(shape: &[usize], out: &[usize]) -> Vec<u32> {
    let mut s = vec![0u32; out.len()];
    let mut acc = 1u32;
    let off = out.len() - shape.len();
    for i in (0..shape.len()).rev() {
        if shape[i] != 1 {
            s[off + i] = acc;
        }
        acc = acc.wrapping_mul(shape[i] as u32);
    }
    s
}

/// Params for an n-ary broadcast: [row, n, rank, dims.., strides of each input..].
fn bcast_params(out: &[usize], ins: &[&[usize]]) -> Result<Vec<u32>> {
    if out.len() > MAX_RANK {
        return Err(Error::Other(format!(
            "the WebGPU element-wise kernels take rank {MAX_RANK} at most, not {}",
            out.len()
        )));
    }
    let n: usize = out.iter().product();
    let n32 = u32::try_from(n).map_err(|_| Error::Other("tensor too large".into()))?;
    let mut p = vec![0, n32, out.len() as u32];
    p.extend(out.iter().map(|&d| d as u32));
    for s in ins {
        p.extend(bcast_strides(s, out));
    }
    Ok(p)
}

/// WGSL that turns flat output index `i` into the offsets `o0..` of each broadcast input.
fn offsets_code(inputs: usize) -> String {
    let mut s = String::from("  let r = p[2];\n  var rem = i;\n");
    for k in 0..inputs {
        s.push_str(&format!("  var o{k} = 0u;\n"));
    }
    s.push_str("  for (var d = r; d > 0u; d--) {\n    let dim = p[2u + d];\n    let c = rem % dim;\n    rem = rem / dim;\n");
    for k in 0..inputs {
        s.push_str(&format!(
            "    o{k} += c * p[3u + r * {} + d - 1u];\n",
            k + 1
        ));
    }
    s.push_str("  }\n");
    s
}

fn binary_expr(op: &str) -> Result<&'static str> {
    Ok(match op {
        "Add" => "a + b",
        "Sub" => "a - b",
        "Mul" => "a * b",
        "Div" => "a / b",
        // pow of a negative base is defined for integral exponents
        "Pow" => "select(pow(abs(a), b) * select(1.0, -1.0, fract(b * 0.5) != 0.0), pow(a, b), a >= 0.0 || fract(b) != 0.0)",
        "PRelu" => "select(a, a * b, a < 0.0)",
        "Max" => "max(a, b)",
        "Min" => "min(a, b)",
        op => return Err(Error::Other(format!("no WebGPU kernel for {op}"))),
    })
}

fn build_binary(node: &Node) -> Result<Exec> {
    let expr = binary_expr(&node.op_type)?;
    let variadic = matches!(node.op_type.as_str(), "Max" | "Min");
    if variadic && node.inputs.len() != 2 {
        return Err(Error::Other(format!(
            "the WebGPU {} kernel takes 2 inputs, not {}",
            node.op_type,
            node.inputs.len()
        )));
    }
    let key = format!("binary:{}", node.op_type);
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (a, ab) = dev_in(inputs, 0)?;
        let (b, bb) = dev_in(inputs, 1)?;
        let out = broadcast_shapes(a.shape(), b.shape())?;
        let (y, yb) = gpu.alloc(DataType::Float, &out)?;
        let mut params = bcast_params(&out, &[a.shape(), b.shape()])?;
        let pipe = gpu.pipeline(&key, || {
            shader_1d(
                &[
                    ("xa", "read", "f32"),
                    ("xb", "read", "f32"),
                    ("y", "read_write", "f32"),
                ],
                WG,
                "",
                &format!(
                    "  if (i >= p[1]) {{ return; }}\n{}  let a = xa[o0];\n  let b = xb[o1];\n  y[i] = {expr};",
                    offsets_code(2)
                ),
            )
        })?;
        gpu.dispatch(
            &pipe,
            &mut params,
            &[ab.raw(), bb.raw(), yb.raw()],
            y.len() as u64,
            WG,
        )?;
        out1(y)
    }))
}

fn build_where(_node: &Node) -> Result<Exec> {
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (c, cb) = dev_in(inputs, 0)?;
        let (a, ab) = dev_in(inputs, 1)?;
        let (b, bb) = dev_in(inputs, 2)?;
        let out = broadcast_shapes(&broadcast_shapes(c.shape(), a.shape())?, b.shape())?;
        let (y, yb) = gpu.alloc(DataType::Float, &out)?;
        let mut params = bcast_params(&out, &[c.shape(), a.shape(), b.shape()])?;
        let pipe = gpu.pipeline("where", || {
            shader_1d(
                &[
                    ("c", "read", "u32"),
                    ("xa", "read", "f32"),
                    ("xb", "read", "f32"),
                    ("y", "read_write", "f32"),
                ],
                WG,
                "",
                &format!(
                    "  if (i >= p[1]) {{ return; }}\n{}  y[i] = select(xb[o2], xa[o1], c[o0] != 0u);",
                    offsets_code(3)
                ),
            )
        })?;
        gpu.dispatch(
            &pipe,
            &mut params,
            &[cb.raw(), ab.raw(), bb.raw(), yb.raw()],
            y.len() as u64,
            WG,
        )?;
        out1(y)
    }))
}

/// Identity and inference-mode Dropout: the output is the input's buffer.
fn build_view(node: &Node) -> Result<Exec> {
    if node.op_type == "Dropout" && node.outputs.get(1).is_some_and(|o| o.is_some()) {
        return Err(Error::Other(
            "Dropout's mask output stays on the CPU".into(),
        ));
    }
    Ok(Box::new(|_gpu: &Gpu, inputs| {
        if super::host_i64s(inputs, 2)?.is_some_and(|v| v.first() == Some(&1)) {
            return Err(Error::Other(
                "Dropout in training mode stays on the CPU".into(),
            ));
        }
        let x = tensor_in(inputs, 0)?;
        out1(view_of(x, x.shape().to_vec())?)
    }))
}
