//! Element-wise kernels: unary activations, binary arithmetic with numpy broadcasting, Where,
//! Clip, and the identity-like ops (views of their input's buffer, no dispatch).
//!
//! Unary and binary ops are fused: each returns a tensor whose contents are a [`Pending`]
//! expression over up to three materialised tensors (its leaves, read with broadcast strides),
//! and an op over a pending input extends that expression instead of reading its bytes. The
//! expression runs as one dispatch when something needs the bytes (another kernel, a read-back),
//! so `Add -> Relu`, `Sigmoid -> Mul` or a longer chain costs one dispatch and no intermediate
//! buffer writes.

use std::collections::BTreeMap;

use nxrt_core::ir::Node;
use nxrt_core::kernels::{broadcast_shapes, opt_tensor_in, tensor_in};
use nxrt_core::{DataType, Error, Result, Tensor};

use super::module_header;
use super::{dev_buf, dev_in, host_f32, out1, shader_1d, view_of, Exec, Gpu, OpDef, Store};

/// Leaves one fused dispatch reads at most (plus params and output: within the 8 storage
/// bindings every adapter has).
const MAX_LEAVES: usize = 3;
/// Past this much WGSL an operand is computed on its own first.
const MAX_EXPR: usize = 4000;

/// An element-wise result not computed yet: `expr` (WGSL, `$k` standing for leaf `k`'s
/// element) over `leaves`, each a materialised device tensor read with element strides over the
/// result's shape (0 where it broadcasts); `funcs` are the WGSL functions `expr` calls, by name.
#[derive(Clone)]
pub(crate) struct Pending {
    /// The result's element type (float32 or float16; the leaves may differ).
    dtype: DataType,
    shape: Vec<usize>,
    leaves: Vec<(Tensor, Vec<u32>)>,
    funcs: BTreeMap<String, String>,
    expr: String,
}

/// A stable name for a WGSL function body (FNV-1a of its text).
fn fname(prefix: &str, body: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in body.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{prefix}{h:016x}")
}

/// Operand `t` as an expression over its own shape: its pending expression, or itself as the
/// one leaf.
fn operand(t: &Tensor) -> Result<Pending> {
    let b = dev_buf(t)?;
    if let Some(p) = b.pending() {
        // a view (Reshape, Unsqueeze, ...) shares the buffer under another shape: its
        // expression is over the original shape, so compute it and read the bytes instead
        if p.expr.len() <= MAX_EXPR && p.shape == t.shape() {
            return Ok(p);
        }
        b.raw();
    }
    Ok(leaf(t))
}

/// `p` over `from` re-expressed over the broadcast shape `to`.
fn broadcast_to(mut p: Pending, from: &[usize], to: &[usize]) -> Pending {
    let off = to.len() - from.len();
    for (_, s) in p.leaves.iter_mut() {
        let mut ns = vec![0u32; to.len()];
        for i in 0..from.len() {
            if !(from[i] == 1 && to[off + i] != 1) {
                ns[off + i] = s[i];
            }
        }
        *s = ns;
    }
    p.shape = to.to_vec();
    p
}

/// Renumbers `$k` to `$(k + by)` (leaves are at most single digits).
fn shift(expr: &str, by: usize) -> String {
    let mut out = String::with_capacity(expr.len());
    let mut it = expr.chars().peekable();
    while let Some(c) = it.next() {
        out.push(c);
        if c == '$' {
            if let Some(d) = it.next() {
                let k = d.to_digit(10).unwrap_or(0) as usize + by;
                out.push_str(&k.to_string());
            }
        }
    }
    out
}

/// An element-wise chain applied inside another kernel as it stores each value: `expr` (WGSL,
/// `pv` the kernel's value, `v0..` the other leaves' elements) over the output's shape.
pub(crate) struct Epilogue {
    shape: Vec<usize>,
    leaves: Vec<(Tensor, Vec<u32>)>,
    funcs: String,
    expr: String,
}

impl Epilogue {
    /// The pipeline-cache key part.
    fn key(&self) -> String {
        format!("{}:{}:{}", self.leaves.len(), self.expr, self.funcs)
    }

    /// Parameter words (read from word `base` on): [0, n, rank, dims.., leaf strides..].
    fn params(&self) -> Result<Vec<u32>> {
        let mut v = vec![0, numel_u32(&self.shape)?, self.shape.len() as u32];
        v.extend(self.shape.iter().map(|&d| d as u32));
        for (_, st) in &self.leaves {
            v.extend(st);
        }
        Ok(v)
    }
}

fn numel_u32(shape: &[usize]) -> Result<u32> {
    u32::try_from(shape.iter().product::<usize>())
        .map_err(|_| Error::Other("tensor too large".into()))
}

/// A kernel's epilogue: the WGSL (bindings from `first`, parameters from word `base`, and `fn
/// epi(pv: f32, i: u32) -> f32`), its cache key, parameter words and buffers. With no chain it
/// is the identity.
pub(crate) struct EpiParts<'a> {
    pub wgsl: String,
    pub key: String,
    pub params: Vec<u32>,
    pub bufs: Vec<&'a wgpu::Buffer>,
}

pub(crate) fn epilogue<'a>(
    gpu: &Gpu,
    epi: Option<&'a Epilogue>,
    first: u32,
    base: usize,
) -> Result<EpiParts<'a>> {
    let Some(e) = epi else {
        return Ok(EpiParts {
            wgsl: "fn epi(pv: f32, i: u32) -> f32 { return pv; }\n".into(),
            key: "id".into(),
            params: Vec::new(),
            bufs: Vec::new(),
        });
    };
    let m = e.leaves.len();
    let mut w = String::new();
    for (k, (t, _)) in e.leaves.iter().enumerate() {
        w.push_str(&format!(
            "@group(0) @binding({}) var<storage, read> ex{k}: array<{}>;\n",
            first + k as u32,
            leaf_ty(gpu, t)?
        ));
    }
    w.push_str(ERF);
    w.push_str(&e.funcs);
    w.push_str("\nfn epi(pv: f32, i: u32) -> f32 {\n");
    let classes = leaf_classes(&e.shape, &e.leaves);
    if m > 0 {
        w.push_str(&offsets_code_at(&classes, base));
        for k in 0..m {
            w.push_str(&format!("  let v{k} = f32(ex{k}[o{k}]);\n"));
        }
    }
    w.push_str(&format!("  return {};\n}}\n", e.expr));
    let mut bufs = Vec::with_capacity(m);
    for (t, _) in &e.leaves {
        bufs.push(dev_buf(t)?.raw());
    }
    let tys: Vec<&str> = e
        .leaves
        .iter()
        .map(|(t, _)| leaf_ty(gpu, t))
        .collect::<Result<_>>()?;
    Ok(EpiParts {
        wgsl: w,
        key: format!("{base}:{}:{classes}:{}", tys.join(","), e.key()),
        params: e.params()?,
        bufs,
    })
}

/// The WGSL storage type of a leaf (float, or a 32-bit word for the integer types).
fn leaf_ty(gpu: &Gpu, t: &Tensor) -> Result<&'static str> {
    match t.dtype() {
        DataType::Float | DataType::Float16 => Ok(gpu.store(t.dtype())?.ty()),
        dt => Err(Error::Other(format!(
            "the WebGPU element-wise kernels read float tensors, not {dt}"
        ))),
    }
}

/// The leaf of `p` a producer kernel can compute with the rest of `p` as its epilogue: one
/// whose buffer is still to be produced, read element for element (same shape, no broadcast),
/// and referenced by nothing but this expression (so it is never needed on its own). Returns
/// the producer and the epilogue.
fn fusable(gpu: &Gpu, p: &Pending) -> Option<(std::sync::Arc<dyn super::Producer>, Epilogue)> {
    let own = bcast_strides(&p.shape, &p.shape);
    let numel: usize = p.shape.iter().product();
    for (t, _) in &p.leaves {
        let arc = t.device_buffer()?;
        let b = dev_buf(t).ok()?;
        // the producer's module declares one storage type: every leaf must share it
        let Some(k) = b.producer() else {
            continue;
        };
        if t.len() != numel || p.leaves.iter().any(|(u, _)| u.dtype() != t.dtype()) {
            continue;
        }
        // every use of this buffer in the expression must read it element for element
        let uses: Vec<usize> = p
            .leaves
            .iter()
            .enumerate()
            .filter(|(_, (u, _))| {
                u.device_buffer()
                    .is_some_and(|ua| std::sync::Arc::ptr_eq(ua, arc))
            })
            .map(|(k, _)| k)
            .collect();
        if uses.iter().any(|&k| p.leaves[k].1 != own)
            || std::sync::Arc::strong_count(arc) != uses.len()
        {
            continue;
        }
        let rest = p.leaves.len() - uses.len();
        let slots = gpu.limits.max_storage_buffers_per_shader_stage as usize;
        // the producer's own bindings plus the epilogue's must fit
        if k.bindings() + rest > slots {
            continue;
        }
        // taken: this buffer is never computed, its producer runs into the chain's output
        b.take_producer();
        let mut expr = p.expr.clone();
        let mut leaves = Vec::with_capacity(rest);
        let mut names = vec![String::new(); p.leaves.len()];
        for (k, (lt, ls)) in p.leaves.iter().enumerate() {
            if uses.contains(&k) {
                // the producer's own float16 output is rounded before the chain reads it
                names[k] = if t.dtype() == DataType::Float16 {
                    "q16_(pv)".into()
                } else {
                    "pv".into()
                };
            } else {
                names[k] = format!("v{}", leaves.len());
                leaves.push((lt.clone(), ls.clone()));
            }
        }
        for k in (0..p.leaves.len()).rev() {
            expr = expr.replace(&format!("${k}"), &names[k]);
        }
        let mut funcs = p.funcs.clone();
        if t.dtype() == DataType::Float16 {
            funcs.insert("q16_".into(), Q16.into());
        }
        let funcs = funcs.values().cloned().collect::<Vec<_>>().join("\n");
        return Some((
            k,
            Epilogue {
                shape: p.shape.clone(),
                leaves,
                funcs,
                expr,
            },
        ));
    }
    None
}

/// Computes a pending expression into `out` (one dispatch): inside the kernel that produces
/// one of its leaves when that can be fused, on its own otherwise.
pub(crate) fn materialize(gpu: &Gpu, out: &wgpu::Buffer, p: Pending) -> Result<()> {
    if let Some((k, epi)) = fusable(gpu, &p) {
        // the fused leaf's buffer is released with `p`
        return k.run(gpu, out, Some(&epi));
    }
    let n_leaves = p.leaves.len();
    let dims: &[usize] = &p.shape;
    if dims.len() > MAX_RANK {
        return Err(Error::Other(format!(
            "the WebGPU element-wise kernels take rank {MAX_RANK} at most, not {}",
            dims.len()
        )));
    }
    let n: usize = dims.iter().product();
    if n == 0 {
        return Ok(());
    }
    let mut params = vec![0, n as u32, dims.len() as u32];
    params.extend(dims.iter().map(|&d| d as u32));
    for (_, s) in &p.leaves {
        params.extend(s);
    }
    let mut bufs: Vec<&wgpu::Buffer> = Vec::with_capacity(n_leaves + 1);
    for (t, _) in &p.leaves {
        bufs.push(dev_buf(t)?.raw());
    }
    bufs.push(out);
    let mut expr = p.expr.clone();
    for k in (0..n_leaves).rev() {
        expr = expr.replace(&format!("${k}"), &format!("v{k}"));
    }
    let funcs: String = p.funcs.values().cloned().collect::<Vec<_>>().join("\n");
    let key = format!("fused:{n_leaves}:{expr}:{funcs}");
    let out_store = gpu.store(p.dtype)?;
    let tys: Vec<&str> = p
        .leaves
        .iter()
        .map(|(t, _)| leaf_ty(gpu, t))
        .collect::<Result<_>>()?;
    let classes = leaf_classes(&p.shape, &p.leaves);
    let key = format!("{key}:{}:{}:{classes}", out_store.key(), tys.join(","));
    let pipe = gpu.pipeline(&key, || {
        let mut decl: Vec<(String, &str, &str)> = (0..n_leaves)
            .map(|k| (format!("x{k}"), "read", tys[k]))
            .collect();
        decl.push(("y".into(), "read_write", "T"));
        let decl_ref: Vec<(&str, &str, &str)> =
            decl.iter().map(|(a, b, c)| (a.as_str(), *b, *c)).collect();
        let mut body = format!(
            "  if (i >= p[1]) {{ return; }}\n{}",
            offsets_code_at(&classes, 0)
        );
        for k in 0..n_leaves {
            body.push_str(&format!("  let v{k} = f32(x{k}[o{k}]);\n"));
        }
        body.push_str(&format!("  y[i] = st({expr});"));
        let leaf_stores: Vec<Store> = p
            .leaves
            .iter()
            .filter_map(|(t, _)| gpu.store(t.dtype()).ok())
            .chain([out_store])
            .collect();
        format!(
            "{}{}",
            module_header(&leaf_stores, out_store),
            shader_1d(&decl_ref, WG, &format!("{ERF}\n{funcs}\n"), &body)
        )
    })?;
    gpu.dispatch(&pipe, &mut params, &bufs, n as u64, WG)
}

/// Rounds an f32 to the nearest f16 value (infinite past f16's range, NaN kept): a float16
/// chain applies it after every op, as the CPU rounds every op's float16 output, so fusing
/// does not change a float16 result. The same on both stores.
const Q16: &str = "fn q16_(v: f32) -> f32 {
  let h = unpack2x16float(pack2x16float(vec2<f32>(v, 0.0))).x;
  let inf = bitcast<f32>((bitcast<u32>(v) & 0x80000000u) | 0x7f800000u);
  return select(select(h, inf, abs(v) >= 65520.0), v, v != v);
}";

/// `expr` of element type `dt`, rounded to f16 when `dt` is float16 (`funcs` gains `q16_`).
fn rounded(dt: DataType, expr: String, funcs: &mut BTreeMap<String, String>) -> String {
    if dt != DataType::Float16 {
        return expr;
    }
    funcs.insert("q16_".into(), Q16.into());
    format!("q16_({expr})")
}

const WG: u32 = 256;
/// Broadcasting handles ranks up to this.
pub(crate) const MAX_RANK: usize = 8;

macro_rules! unary {
    ($($op:literal, $since:literal;)*) => {
        &[$(OpDef { op: $op, since: $since, type_input: 0, half: true, host: &[], build: build_unary },)*]
    };
}

macro_rules! ms_act {
    ($($op:literal),*) => {
        &[$(OpDef { op: $op, since: 1, type_input: 0, half: false, host: &[], build: build_ms_act },)*]
    };
}

pub(crate) const OPS: &[OpDef] = &[
    OpDef {
        op: "Add",
        since: 7,
        type_input: 0,
        half: true,
        host: &[],
        build: build_binary,
    },
    OpDef {
        op: "Sub",
        since: 7,
        type_input: 0,
        half: true,
        host: &[],
        build: build_binary,
    },
    OpDef {
        op: "Mul",
        since: 7,
        type_input: 0,
        half: true,
        host: &[],
        build: build_binary,
    },
    OpDef {
        op: "Div",
        since: 7,
        type_input: 0,
        half: true,
        host: &[],
        build: build_binary,
    },
    OpDef {
        op: "Pow",
        since: 7,
        type_input: 0,
        half: true,
        host: &[],
        build: build_binary,
    },
    OpDef {
        op: "PRelu",
        since: 9,
        type_input: 0,
        half: true,
        host: &[],
        build: build_binary,
    },
    OpDef {
        op: "Max",
        since: 8,
        type_input: 0,
        half: true,
        host: &[],
        build: build_binary,
    },
    OpDef {
        op: "Min",
        since: 8,
        type_input: 0,
        half: true,
        host: &[],
        build: build_binary,
    },
    OpDef {
        op: "Where",
        since: 9,
        type_input: 1,
        half: true,
        host: &[],
        build: build_where,
    },
    OpDef {
        op: "Clip",
        since: 11,
        type_input: 0,
        half: true,
        host: &[1, 2],
        build: build_unary,
    },
    OpDef {
        op: "Identity",
        since: 1,
        type_input: 0,
        half: true,
        host: &[],
        build: build_view,
    },
    OpDef {
        op: "Dropout",
        since: 12,
        type_input: 0,
        half: true,
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

/// com.microsoft activations ([`super::WebGpuProvider`] matches them by domain): fused
/// element-wise expressions like the ONNX ones, a bias (one value per element of the last axis)
/// added first where the op takes one.
pub(crate) const MS_OPS: &[OpDef] = ms_act!["Gelu", "FastGelu", "BiasGelu", "QuickGelu", "BiasAdd"];

/// Gelu (erf), FastGelu (tanh form, optional bias), BiasGelu (erf, bias), QuickGelu
/// (`x * sigmoid(alpha * x)`) and BiasAdd (`x + bias + skip`), the CPU kernels' formulas
/// (core/src/kernels/contrib_enc.rs).
fn build_ms_act(node: &Node) -> Result<Exec> {
    let op = node.op_type.clone();
    let act = match op.as_str() {
        "Gelu" | "BiasGelu" => ERF_GELU.to_string(),
        "FastGelu" => TANH_GELU.to_string(),
        "QuickGelu" => {
            let alpha = node.get_f("alpha", 1.702)?;
            format!("x / (1.0 + exp(-(bitcast<f32>({}u) * x)))", alpha.to_bits())
        }
        _ => "x".to_string(),
    };
    let one = format!("fn NAME(x: f32) -> f32 {{ return {act}; }}");
    let two = format!("fn NAME(a: f32, b: f32) -> f32 {{ let x = a + b; return {act}; }}");
    let three = "fn NAME(a: f32, b: f32, c: f32) -> f32 { return (a + b) + c; }".to_string();
    let named = |def: String| {
        let name = fname("m", &def);
        (name.clone(), def.replace("NAME", &name))
    };
    let (one, two, three) = (named(one), named(two), named(three));
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, _) = dev_in(inputs, 0)?;
        let bias = opt_tensor_in(inputs, 1)?;
        if bias.is_none() && matches!(op.as_str(), "BiasGelu" | "BiasAdd") {
            return Err(Error::Other(format!("{op} needs a bias")));
        }
        if let Some(b) = bias {
            let c = x.shape().last().copied().unwrap_or(0);
            if x.rank() == 0 || b.len() != c || b.shape().last() != Some(&c) {
                return Err(Error::Shape(format!(
                    "{op}: bias of shape {:?} for input {:?} (one value per element of the last axis)",
                    b.shape(),
                    x.shape()
                )));
            }
            dev_buf(b)?;
        }
        let t = match (op.as_str(), bias) {
            ("BiasAdd", Some(b)) => {
                let (skip, _) = dev_in(inputs, 2)?;
                if x.rank() != 3 || skip.shape() != x.shape() {
                    return Err(Error::Shape(format!(
                        "BiasAdd: X {:?} and skip {:?} must both be (batch, sequence, channels)",
                        x.shape(),
                        skip.shape()
                    )));
                }
                fuse(gpu, &[x, b, skip], &three.0, &three.1)?
            }
            (_, Some(b)) => fuse(gpu, &[x, b], &two.0, &two.1)?,
            (_, None) => fuse(gpu, &[x], &one.0, &one.1)?,
        };
        out1(t)
    }))
}

/// GELU over `x` in WGSL: the erf form and the tanh approximation (ONNX Gelu's `approximate`
/// modes; com.microsoft Gelu / BiasGelu and FastGelu).
const ERF_GELU: &str = "0.5 * x * (1.0 + erf_(x * 0.70710678118654752))";
const TANH_GELU: &str =
    "0.5 * x * (1.0 + tanh(clamp(0.7978845608028654 * (x + 0.044715 * x * x * x), -30.0, 30.0)))";

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
        "Elu" => format!(
            "select(x, {} * (exp(x) - 1.0), x < 0.0)",
            lit(f("alpha", 1.0)?)
        ),
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
            "none" => ERF_GELU.into(),
            "tanh" => TANH_GELU.into(),
            a => return Err(Error::Other(format!("Gelu approximate='{a}'"))),
        },
        // the bounds are run-time host values: build_unary bakes them in per run
        "Clip" => "x".into(),
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
    let body = unary_expr(node)?;
    let clip = node.op_type == "Clip";
    let fixed = (!clip).then(|| {
        let def = format!("fn NAME(x: f32) -> f32 {{ return {body}; }}");
        let name = fname("u", &def);
        (name.clone(), def.replace("NAME", &name))
    });
    Ok(Box::new(move |_gpu: &Gpu, inputs| {
        let (x, _) = dev_in(inputs, 0)?;
        let (name, def) = match &fixed {
            Some(f) => f.clone(),
            None => {
                // Clip: the bounds are this run's host values, baked into the function
                // WGSL constants cannot be infinite (Chromium's compiler rejects even a
                // bitcast to inf): an unbounded side is left out
                let lo = host_f32(inputs, 1)?.filter(|v| v.is_finite());
                let hi = host_f32(inputs, 2)?.filter(|v| v.is_finite());
                let lit = |v: f32| format!("bitcast<f32>({}u)", v.to_bits());
                let e = match (lo, hi) {
                    (Some(l), Some(h)) => format!("clamp(x, {}, {})", lit(l), lit(h)),
                    (Some(l), None) => format!("max(x, {})", lit(l)),
                    (None, Some(h)) => format!("min(x, {})", lit(h)),
                    (None, None) => "x".to_string(),
                };
                let def = format!("fn NAME(x: f32) -> f32 {{ return {e}; }}");
                let name = fname("c", &def);
                (name.clone(), def.replace("NAME", &name))
            }
        };
        let mut p = operand(x)?;
        p.expr = rounded(x.dtype(), format!("{name}({})", p.expr), &mut p.funcs);
        p.funcs.insert(name, def);
        let gpu = _gpu;
        out1(gpu.alloc_pending(x.dtype(), x.shape(), p)?)
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
    offsets_code_at(&"g".repeat(inputs), 0)
}

/// How leaf `k` is read, by its strides over `shape` (one letter each, part of the pipeline
/// key): `z` every element is the same one (a scalar), `s` element for element, `c<d>` one
/// value per index of axis `d` (a per-channel bias, scale or slope), `g` general broadcasting.
/// The special forms skip the per-axis division loop, which dominated small fused epilogues.
fn leaf_classes(shape: &[usize], leaves: &[(Tensor, Vec<u32>)]) -> String {
    let own = bcast_strides(shape, shape);
    let mut out = String::new();
    for (_, st) in leaves {
        let nz: Vec<usize> = (0..st.len()).filter(|&d| st[d] != 0).collect();
        if nz.is_empty() {
            out.push('z');
        } else if *st == own {
            out.push('s');
        } else if nz.len() == 1 && st[nz[0]] == 1 && nz[0] < 10 {
            out.push_str(&format!("c{}", nz[0]));
        } else {
            out.push('g');
        }
    }
    out
}

/// [`offsets_code`] for leaves of the given classes ([`leaf_classes`]), over parameters laid
/// out from word `base` ([0, n, rank, dims.., strides..]).
fn offsets_code_at(classes: &str, base: usize) -> String {
    let mut s = format!("  let r = p[{}u];\n", base + 2);
    let mut general = Vec::new();
    let mut chars = classes.chars().peekable();
    let mut k = 0usize;
    while let Some(c) = chars.next() {
        match c {
            'z' => s.push_str(&format!("  let o{k} = 0u;\n")),
            's' => s.push_str(&format!("  let o{k} = i;\n")),
            'c' => {
                let d = chars.next().and_then(|d| d.to_digit(10)).unwrap_or(0);
                // the product of the dims after d, then one division and one remainder
                s.push_str(&format!(
                    "  var in{k} = 1u;\n  for (var e = {d}u + 1u; e < r; e++) {{ in{k} *= p[{b}u + e]; }}\n  let o{k} = (i / in{k}) % p[{b}u + {d}u];\n",
                    b = base + 3
                ));
            }
            _ => {
                s.push_str(&format!("  var o{k} = 0u;\n"));
                general.push(k);
            }
        }
        k += 1;
    }
    if !general.is_empty() {
        s.push_str(&format!("  var rem = i;\n  for (var d = r; d > 0u; d--) {{\n    let dim = p[{}u + d];\n    let c = rem % dim;\n    rem = rem / dim;\n", base + 2));
        for &k in &general {
            s.push_str(&format!(
                "    o{k} += c * p[{}u + r * {} + d - 1u];\n",
                base + 3,
                k + 1
            ));
        }
        s.push_str("  }\n");
    }
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
    let body = binary_expr(&node.op_type)?;
    let variadic = matches!(node.op_type.as_str(), "Max" | "Min");
    if variadic && node.inputs.len() != 2 {
        return Err(Error::Other(format!(
            "the WebGPU {} kernel takes 2 inputs, not {}",
            node.op_type,
            node.inputs.len()
        )));
    }
    let def = format!("fn NAME(a: f32, b: f32) -> f32 {{ return {body}; }}");
    let name = fname("b", &def);
    let def = def.replace("NAME", &name);
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (a, _) = dev_in(inputs, 0)?;
        let (b, _) = dev_in(inputs, 1)?;
        out1(fuse(gpu, &[a, b], &name, &def)?)
    }))
}

/// `name(t0, t1, ..)` element by element over the operands broadcast together (numpy rules),
/// as a pending expression extending the operands' own; `def` is the WGSL function. The
/// result has the first operand's type.
fn fuse(gpu: &Gpu, ts: &[&Tensor], name: &str, def: &str) -> Result<Tensor> {
    if ts.is_empty() || ts.len() > MAX_LEAVES {
        return Err(Error::Other(format!(
            "a fused element-wise WebGPU kernel of {} operands",
            ts.len()
        )));
    }
    let mut out: Vec<usize> = Vec::new();
    for t in ts {
        out = broadcast_shapes(&out, t.shape())?;
    }
    if out.len() > MAX_RANK {
        return Err(Error::Other(format!(
            "the WebGPU element-wise kernels take rank {MAX_RANK} at most, not {}",
            out.len()
        )));
    }
    let mut ps = ts.iter().map(|t| operand(t)).collect::<Result<Vec<_>>>()?;
    // too many leaves for one dispatch: compute the biggest operand on its own first, until
    // they fit (operands that are single leaves already always fit)
    while ps.iter().map(|p| p.leaves.len()).sum::<usize>() > MAX_LEAVES {
        let (k, _) = ps
            .iter()
            .enumerate()
            .max_by_key(|(_, p)| p.leaves.len())
            .expect("operands");
        dev_buf(ts[k])?.raw();
        ps[k] = leaf(ts[k]);
    }
    let dtype = ps[0].dtype;
    let mut funcs = BTreeMap::new();
    let mut leaves = Vec::new();
    let mut args = Vec::with_capacity(ps.len());
    for (p, t) in ps.into_iter().zip(ts) {
        let p = broadcast_to(p, t.shape(), &out);
        args.push(shift(&p.expr, leaves.len()));
        funcs.extend(p.funcs);
        leaves.extend(p.leaves);
    }
    funcs.insert(name.to_string(), def.to_string());
    let expr = rounded(dtype, format!("{name}({})", args.join(", ")), &mut funcs);
    let p = Pending {
        dtype,
        shape: out.clone(),
        leaves,
        funcs,
        expr,
    };
    gpu.check()?;
    gpu.alloc_pending(ts[0].dtype(), &out, p)
}

/// `t` (already computed) as the single leaf of an expression.
fn leaf(t: &Tensor) -> Pending {
    Pending {
        dtype: t.dtype(),
        shape: t.shape().to_vec(),
        leaves: vec![(t.clone(), bcast_strides(t.shape(), t.shape()))],
        funcs: BTreeMap::new(),
        expr: "$0".into(),
    }
}

fn build_where(_node: &Node) -> Result<Exec> {
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (c, cb) = dev_in(inputs, 0)?;
        let (a, ab) = dev_in(inputs, 1)?;
        let (b, bb) = dev_in(inputs, 2)?;
        let out = broadcast_shapes(&broadcast_shapes(c.shape(), a.shape())?, b.shape())?;
        if a.dtype() != b.dtype() {
            return Err(Error::Other("Where of two element types".into()));
        }
        let st = gpu.store(a.dtype())?;
        let (y, yb) = gpu.alloc(a.dtype(), &out)?;
        let mut params = bcast_params(&out, &[c.shape(), a.shape(), b.shape()])?;
        let pipe = gpu.pipeline(&format!("where:{}", st.key()), || {
            let body = shader_1d(
                &[
                    ("c", "read", "u32"),
                    ("xa", "read", "T"),
                    ("xb", "read", "T"),
                    ("y", "read_write", "T"),
                ],
                WG,
                "",
                &format!(
                    "  if (i >= p[1]) {{ return; }}\n{}  y[i] = select(xb[o2], xa[o1], c[o0] != 0u);",
                    offsets_code(3)
                ),
            );
            format!("{}{body}", st.header())
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
