//! Rewrites of quantized weight patterns, for every provider (they run before the partition).
//!
//! **Block-quantized MatMul**: a constant 2-D weight `[K, N]` dequantized in blocks along K
//! (DequantizeLinear with `block_size`, axis 0: MXFP4's FLOAT4E2M1 codes with E8M0 scales, or
//! int4/uint4/int8/uint8 codes with float scales and zero points) and read only by a MatMul
//! becomes one `com.microsoft:MatMulNBits` of 8-bit codes: every such weight is an integer
//! code times its block's scale (a FLOAT4E2M1 value is half an integer in -12..=12, so its
//! code is that integer and the scale is halved, exactly), so the product runs on the
//! block-quantized kernels (GEMV for one row, dequantize-and-SGEMM for many; WebGPU's too)
//! from 1 byte a weight instead of dequantizing K x N floats on every call. Answers differ
//! from the float product only by the order of f32 additions.
//!
//! **QDQ onto the integer kernels** (`qdq_ops`, a CPU fusion: WebGPU has no int8 kernels yet):
//! `DequantizeLinear -> op -> QuantizeLinear` with constant scales and zero points becomes
//! the op's integer form (QLinearConv, QLinearMatMul, com.microsoft QGemm, QLinearAdd,
//! QLinearMul, QLinearGlobalAveragePool, a 256-entry table for one-input activations and for
//! Add/Sub/Mul/Div/Max/Min by a one-element constant (chained tables composed into one), and
//! MaxPool/Reshape/Flatten on the codes where both sides share their scale and zero point).
//!
//! **Mixture of experts**: `MatMul(X, Gather(DequantizeLinear(W[E, K, N]), experts))`, the
//! expert-gather pattern of a router (TopK) in standard ops, becomes `nxrt:GatherMatMulNBits`
//! over every expert's 8-bit codes: each product reads only the selected expert's weights,
//! where the graph as written dequantizes all E experts and copies the selected ones.

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use super::{
    const_of, is_op, new_value, out0, producers, reader_counts, scalar_const, set_init, sole_reader,
};
use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::{AttrValue, Graph, Node, ValueId};
use crate::kernels::elementwise::decode_raw;
use crate::tensor::Tensor;
use crate::value::TypeInfo;

/// The 8-bit codes (column-major blocks, as MatMulNBits reads them), scales and zero points of
/// a blocked DequantizeLinear of `[K, N]`, or `None` where the pattern does not hold.
fn nbits_of(
    x: &Tensor,
    scale: &Tensor,
    zp: Option<&Tensor>,
    bs: usize,
) -> Option<(Vec<u8>, Vec<f32>, Vec<u8>)> {
    // [K, N], or [E, K, N]: E experts' weights one after another
    let r = x.rank();
    let (e, k, n) = match x.shape() {
        [k, n] => (1, *k, *n),
        [e, k, n] => (*e, *k, *n),
        _ => return None,
    };
    let blocks = k.div_ceil(bs);
    let mut sshape = x.shape()[..r - 2].to_vec();
    sshape.extend([blocks, n]);
    if scale.shape() != sshape.as_slice() || zp.is_some_and(|z| z.shape() != sshape.as_slice()) {
        return None;
    }
    // integer value of each code and the factor turning it into the dequantized value's unit
    let (ints, half, off): (Vec<i32>, bool, i32) = match x.dtype() {
        DataType::Float4E2M1 => {
            if zp.is_some() {
                return None;
            }
            let v = decode_raw(x).ok()?.to_f32_vec().ok()?;
            (v.iter().map(|&f| (2.0 * f) as i32).collect(), true, 12)
        }
        DataType::Int4 | DataType::Uint4 | DataType::Int8 | DataType::Uint8 => {
            let t = if crate::kernels::elementwise::is_raw(x.dtype()) {
                decode_raw(x).ok()?
            } else {
                x.clone()
            };
            let off = match x.dtype() {
                DataType::Int4 => 8,
                DataType::Int8 => 128,
                _ => 0,
            };
            (
                t.to_i64_vec().ok()?.iter().map(|&v| v as i32).collect(),
                false,
                off,
            )
        }
        _ => return None,
    };
    let sv = crate::kernels::quant::values_f64(scale, "DequantizeLinear").ok()?;
    let zv: Vec<i32> = match zp {
        Some(z) => {
            if z.dtype() != x.dtype() {
                return None;
            }
            let t = if crate::kernels::elementwise::is_raw(z.dtype()) {
                decode_raw(z).ok()?
            } else {
                z.clone()
            };
            t.to_i64_vec().ok()?.iter().map(|&v| v as i32).collect()
        }
        None => vec![0; e * blocks * n],
    };
    let mut codes = vec![0u8; e * n * blocks * bs];
    let mut scales = vec![0f32; e * n * blocks];
    let mut zps = vec![0u8; e * n * blocks];
    for ei in 0..e {
        let (sb, cb, wb) = (ei * blocks * n, ei * n * blocks * bs, ei * k * n);
        for j in 0..n {
            for b in 0..blocks {
                let z = zv[sb + b * n + j] + off;
                if !(0..=255).contains(&z) {
                    return None;
                }
                let s = sv[sb + b * n + j];
                scales[sb + j * blocks + b] = if half { (s * 0.5) as f32 } else { s as f32 };
                zps[sb + j * blocks + b] = z as u8;
                let at = cb + (j * blocks + b) * bs;
                for (i, c) in codes[at..at + bs].iter_mut().enumerate() {
                    let kk = b * bs + i;
                    *c = if kk < k {
                        (ints[wb + kk * n + j] + off) as u8
                    } else {
                        z as u8
                    };
                }
            }
        }
    }
    Some((codes, scales, zps))
}

/// The rewrite of the module's note. Returns how many DequantizeLinear + MatMul pairs became
/// MatMulNBits nodes.
pub fn block_matmuls(g: &mut Graph) -> Result<usize> {
    let readers = reader_counts(g);
    let mut count = 0;
    let mut drop = vec![false; g.nodes.len()];
    for mi in 0..g.nodes.len() {
        let mm = &g.nodes[mi];
        if mm.op_type != "MatMul" || !mm.domain.is_empty() || mm.inputs.len() != 2 {
            continue;
        }
        let (Some(a), Some(bv)) = (mm.inputs[0], mm.inputs[1]) else {
            continue;
        };
        let Some(mut di) = g
            .nodes
            .iter()
            .position(|n| n.outputs.first() == Some(&Some(bv)))
        else {
            continue;
        };
        // MatMul(X, Gather(DQ(W[E, K, N]), experts)): only the selected experts' products
        let mut gather: Option<(usize, ValueId)> = None;
        {
            let gn = &g.nodes[di];
            if gn.op_type == "Gather" && gn.domain.is_empty() && gn.get_i("axis", 0)? == 0 {
                if let (Some(Some(data)), Some(Some(idx))) = (gn.inputs.first(), gn.inputs.get(1)) {
                    if sole_reader(g, &readers, bv) == Some(mi) {
                        if let Some(d2) = g
                            .nodes
                            .iter()
                            .position(|n| n.outputs.first() == Some(&Some(*data)))
                        {
                            gather = Some((di, *idx));
                            di = d2;
                        }
                    }
                }
            }
        }
        let dq_out = match gather {
            Some((gi, _)) => g.nodes[gi].inputs[0].unwrap_or(bv),
            None => bv,
        };
        let reader = gather.map_or(mi, |(gi, _)| gi);
        let dq = &g.nodes[di];
        if dq.op_type != "DequantizeLinear"
            || !dq.domain.is_empty()
            || sole_reader(g, &readers, dq_out) != Some(reader)
            || drop[di]
        {
            continue;
        }
        let bs = dq.get_i("block_size", 0)?;
        let axis = dq.get_i("axis", 1)?;
        let out_dt = dq.get_i("output_dtype", 0)?;
        // blocks along K: axis 0 of [K, N], axis 1 of [E, K, N]
        let k_axis = if gather.is_some() { 1 } else { 0 };
        if bs < 16 || (bs & (bs - 1)) != 0 || !(axis == k_axis || axis == -2) || out_dt > 1 {
            continue;
        }
        let c = |i: usize| {
            dq.inputs
                .get(i)
                .copied()
                .flatten()
                .and_then(|v| const_of(g, v))
        };
        let (Some(x), Some(scale)) = (c(0), c(1)) else {
            continue;
        };
        if x.rank() != 2 + gather.is_some() as usize
            || dq.inputs.get(2).copied().flatten().is_some() && c(2).is_none()
        {
            continue;
        }
        let Some((codes, scales, zps)) = nbits_of(x, scale, c(2), bs as usize) else {
            continue;
        };
        let r = x.rank();
        let (k, n) = (x.shape()[r - 2], x.shape()[r - 1]);
        let lead = x.shape()[..r - 2].to_vec();
        let blocks = k.div_ceil(bs as usize);
        let name = g.nodes[mi].name.clone();
        let add = |g: &mut Graph, suffix: &str, t: Tensor| -> ValueId {
            let v = new_value(g, alloc::format!("{name}/{suffix}"));
            set_init(g, v, t);
            v
        };
        let with = |v: &[usize]| {
            lead.iter()
                .copied()
                .chain(v.iter().copied())
                .collect::<Vec<_>>()
        };
        let b_new = add(
            g,
            "B_q8",
            Tensor::from_vec(&with(&[n, blocks, bs as usize]), codes)?,
        );
        let s_new = add(g, "scales", Tensor::from_vec(&with(&[n, blocks]), scales)?);
        let z_new = add(
            g,
            "zero_points",
            Tensor::from_vec(&with(&[n * blocks]), zps)?,
        );
        let out = g.nodes[mi].outputs.clone();
        let (op, domain, mut inputs) = match gather {
            // the selected experts' indices ride along as the last input
            Some(_) => (
                "GatherMatMulNBits",
                crate::kernels::nn::nchwc::DOMAIN,
                vec![Some(a)],
            ),
            None => ("MatMulNBits", "com.microsoft", vec![Some(a)]),
        };
        inputs.extend([Some(b_new), Some(s_new), Some(z_new)]);
        if let Some((gi, idx)) = gather {
            inputs.push(Some(idx));
            drop[gi] = true;
        }
        g.nodes[mi] = Node {
            name: String::from(name.as_str()),
            op_type: op.into(),
            domain: domain.into(),
            opset: 1,
            inputs,
            outputs: out,
            attrs: vec![
                ("K".into(), AttrValue::Int(k as i64)),
                ("N".into(), AttrValue::Int(n as i64)),
                ("bits".into(), AttrValue::Int(8)),
                ("block_size".into(), AttrValue::Int(bs)),
            ],
            implicit_inputs: vec![],
        };
        drop[di] = true;
        count += 1;
    }
    if count > 0 {
        super::remove_nodes(g, &drop);
        // the dequantized inputs nothing reads any more
        let mut live = vec![false; g.values.len()];
        for n in &g.nodes {
            for &i in n.inputs.iter().flatten().chain(&n.implicit_inputs) {
                live[i] = true;
            }
        }
        for &o in &g.outputs {
            live[o] = true;
        }
        g.initializers.retain(|(id, _)| live[*id]);
    }
    Ok(count)
}

/// A DequantizeLinear of `v`'s producer with one scale and zero point (constants): `(x, scale,
/// The unblocked DequantizeLinear producing `v`: the node, its input, scale and zero point.
fn dq_parts<'g>(
    g: &'g Graph,
    producer: &[Option<usize>],
    v: ValueId,
) -> Option<(&'g Node, ValueId, ValueId, Option<ValueId>)> {
    let n = &g.nodes[producer[v]?];
    if !is_op(n, "DequantizeLinear") || n.get_i("block_size", 0).ok()? != 0 {
        return None;
    }
    let x = n.inputs.first().copied().flatten()?;
    let s = n.inputs.get(1).copied().flatten()?;
    Some((n, x, s, n.inputs.get(2).copied().flatten()))
}

/// zero point)`.
fn dq_scalar(
    g: &Graph,
    producer: &[Option<usize>],
    v: ValueId,
) -> Option<(ValueId, ValueId, Option<ValueId>)> {
    let (_, x, s, z) = dq_parts(g, producer, v)?;
    let st = const_of(g, s)?;
    if st.dtype() != DataType::Float || st.len() != 1 {
        return None;
    }
    if let Some(z) = z {
        let zt = const_of(g, z)?;
        if zt.len() != 1 || !matches!(zt.dtype(), DataType::Uint8 | DataType::Int8) {
            return None;
        }
    }
    if !q8_value(g, x) {
        return None;
    }
    Some((x, s, z))
}

/// `v`'s element type, where inference knows it.
fn dtype_of(g: &Graph, v: ValueId) -> Option<DataType> {
    match &g.values[v].ty {
        TypeInfo::Tensor { dtype, .. } => *dtype,
        _ => None,
    }
}

/// Removes DequantizeLinear nodes whose outputs nothing reads, and initializers nothing reads.
fn remove_dead(g: &mut Graph) {
    let readers = reader_counts(g);
    g.nodes.retain(|n| {
        !(is_op(n, "DequantizeLinear") && n.outputs.iter().flatten().all(|&o| readers[o] == 0))
    });
    let readers = reader_counts(g);
    g.initializers.retain(|(id, _)| readers[*id] > 0);
}

/// Whether `v` is known to be an int8 or uint8 tensor.
fn q8_value(g: &Graph, v: ValueId) -> bool {
    matches!(
        &g.values[v].ty,
        TypeInfo::Tensor {
            dtype: Some(DataType::Uint8 | DataType::Int8),
            ..
        }
    )
}

/// A DequantizeLinear of a constant weight (int8/uint8) with scales per tensor or along
/// `axis`: `(w, scale, zero point)`, and the scales.
fn dq_weight(
    g: &Graph,
    producer: &[Option<usize>],
    v: ValueId,
    axis: usize,
) -> Option<(ValueId, ValueId, Option<ValueId>, Vec<f32>)> {
    let (n, w, s, z) = dq_parts(g, producer, v)?;
    let wt = const_of(g, w)?;
    if !matches!(wt.dtype(), DataType::Uint8 | DataType::Int8) {
        return None;
    }
    let st = const_of(g, s)?;
    let rank = wt.rank() as i64;
    let a = n.get_i("axis", 1).ok()?;
    let a = if a < 0 { a + rank } else { a };
    if st.dtype() != DataType::Float
        || !(st.len() == 1 || (st.rank() == 1 && a == axis as i64 && st.len() == wt.shape()[axis]))
    {
        return None;
    }
    if let Some(z) = z {
        let zt = const_of(g, z)?;
        if zt.dtype() != wt.dtype() || zt.len() != st.len() {
            return None;
        }
    }
    Some((w, s, z, st.as_slice::<f32>().ok()?.into_owned()))
}

/// A QuantizeLinear with one constant scale and a constant int8/uint8 zero point: `(scale,
/// zero point, output)`.
fn q_scalar(g: &Graph, n: &Node) -> Option<(ValueId, ValueId, ValueId)> {
    if !is_op(n, "QuantizeLinear") || n.get_i("block_size", 0).ok()? != 0 {
        return None;
    }
    let s = n.inputs.get(1).copied().flatten()?;
    let z = n.inputs.get(2).copied().flatten()?;
    scalar_const(g, Some(s))?;
    let zt = const_of(g, z)?;
    if zt.len() != 1 || !matches!(zt.dtype(), DataType::Uint8 | DataType::Int8) {
        return None;
    }
    Some((s, z, out0(n)?))
}

/// An int8/uint8 scalar constant's value.
fn zp_value(g: &Graph, z: Option<ValueId>) -> Option<f32> {
    match z {
        None => Some(0.0),
        Some(z) => const_of(g, z)?.to_i64_vec().ok().map(|v| v[0] as f32),
    }
}

/// The table of a one-input float op between a DequantizeLinear and a QuantizeLinear (or of a
/// two-input one whose other operand is the constant `c`, `(value, whether it comes first)`):
/// each of the 256 input codes' answer, or `None` for ops it does not know.
fn lookup_table(
    n: &Node,
    c: Option<(f32, bool)>,
    (sx, zx, signed): (f32, f32, bool),
    (sy, zy, out_signed): (f32, f32, bool),
) -> Option<Vec<u8>> {
    type F = alloc::boxed::Box<dyn Fn(f32) -> f32>;
    if let Some((c, first)) = c {
        // one operand constant: the op's float arithmetic on each dequantized code
        let f: F = match (n.op_type.as_str(), first) {
            ("Add", _) => alloc::boxed::Box::new(move |x: f32| x + c),
            ("Mul", _) => alloc::boxed::Box::new(move |x: f32| x * c),
            ("Sub", false) => alloc::boxed::Box::new(move |x: f32| x - c),
            ("Sub", true) => alloc::boxed::Box::new(move |x: f32| c - x),
            ("Div", false) => alloc::boxed::Box::new(move |x: f32| x / c),
            ("Div", true) => alloc::boxed::Box::new(move |x: f32| c / x),
            ("Max", _) => alloc::boxed::Box::new(move |x: f32| x.max(c)),
            ("Min", _) => alloc::boxed::Box::new(move |x: f32| x.min(c)),
            _ => return None,
        };
        return Some(tabulate(&*f, (sx, zx, signed), (sy, zy, out_signed)));
    }
    let f: F = match n.op_type.as_str() {
        "Relu" => alloc::boxed::Box::new(|x: f32| x.max(0.0)),
        "Sigmoid" => alloc::boxed::Box::new(|x: f32| 1.0 / (1.0 + libm::expf(-x))),
        "Tanh" => alloc::boxed::Box::new(libm::tanhf),
        "LeakyRelu" => {
            let a = n.get_f("alpha", 0.01).ok()?;
            alloc::boxed::Box::new(move |x: f32| if x >= 0.0 { x } else { a * x })
        }
        "HardSigmoid" => {
            let (a, b) = (n.get_f("alpha", 0.2).ok()?, n.get_f("beta", 0.5).ok()?);
            alloc::boxed::Box::new(move |x: f32| (a * x + b).clamp(0.0, 1.0))
        }
        "HardSwish" => alloc::boxed::Box::new(|x: f32| x * (x / 6.0 + 0.5).clamp(0.0, 1.0)),
        _ => return None,
    };
    Some(tabulate(&*f, (sx, zx, signed), (sy, zy, out_signed)))
}

/// `Q(f(DQ(code)))` for each of the 256 codes (a NaN quantizes to the lowest code).
fn tabulate(
    f: &dyn Fn(f32) -> f32,
    (sx, zx, signed): (f32, f32, bool),
    (sy, zy, out_signed): (f32, f32, bool),
) -> Vec<u8> {
    let (lo, hi) = if out_signed {
        (-128.0, 127.0)
    } else {
        (0.0, 255.0)
    };
    (0..=255u8)
        .map(|b| {
            let v = if signed { b as i8 as f32 } else { b as f32 };
            let y = f((v - zx) * sx) / sy;
            if y.is_nan() {
                lo as i32 as u8
            } else {
                crate::kernels::qlinear::requant(y, zy, lo, hi)
            }
        })
        .collect()
}

/// The operand roles of an elementwise op a lookup table can replace: `(index of the
/// dequantized input, the constant operand)`. One input; or two, one of them a finite
/// one-element float constant of a rank no higher than the other's (so the broadcast keeps
/// the other's shape), for Add, Sub, Mul, Div, Max and Min.
fn lookup_operands(g: &Graph, n: &Node) -> Option<(usize, Option<(f32, bool)>)> {
    match n.inputs.len() {
        1 => Some((0, None)),
        2 if matches!(
            n.op_type.as_str(),
            "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min"
        ) =>
        {
            let (a, b) = (n.inputs[0]?, n.inputs[1]?);
            let constant = |c: ValueId, x: ValueId| -> Option<f32> {
                let v = scalar_const(g, Some(c)).filter(|v| v.is_finite())?;
                let rank = const_of(g, c)?.rank();
                let x_rank = match &g.values[x].ty {
                    TypeInfo::Tensor { shape: Some(s), .. } => s.len(),
                    _ => 0,
                };
                (rank == 0 || rank <= x_rank).then_some(v)
            };
            if let Some(v) = constant(b, a) {
                Some((0, Some((v, false))))
            } else {
                constant(a, b).map(|v| (1, Some((v, true))))
            }
        }
        _ => None,
    }
}

/// QDQ patterns onto the integer kernels (CPU fusions): `DequantizeLinear -> op ->
/// QuantizeLinear`, every scale and zero point a constant, becomes the op's integer form:
/// Conv -> QLinearConv (weights per tensor or per output channel, an int32 bias whose scale
/// is `x_scale * w_scale`), MatMul -> QLinearMatMul, Gemm -> com.microsoft QGemm,
/// Add/Mul -> com.microsoft QLinearAdd/QLinearMul, GlobalAveragePool ->
/// com.microsoft QLinearGlobalAveragePool, a one-input activation or an elementwise op by a
/// one-element constant -> a 256-entry table (`nxrt:QLookup`; a table reading another's
/// codes, and nothing else reading them, takes the composition of both), and
/// MaxPool/Reshape/Flatten with the same scale and zero point on both sides run on the codes
/// directly. The DequantizeLinear nodes nothing reads any more go.
pub fn qdq_ops(g: &mut Graph) -> Result<usize> {
    let readers = reader_counts(g);
    let producer = producers(g);
    let mut replace: Vec<(usize, Node)> = Vec::new();
    let mut drop = vec![false; g.nodes.len()];
    let mut tables: Vec<(usize, Vec<u8>, bool)> = Vec::new();
    for ni in 0..g.nodes.len() {
        let n = &g.nodes[ni];
        if !n.domain.is_empty() || drop[ni] {
            continue;
        }
        let Some(y) = out0(n) else { continue };
        if n.outputs.len() != 1 {
            continue;
        }
        let Some(qi) = sole_reader(g, &readers, y) else {
            continue;
        };
        let Some((sy, zy, out)) = q_scalar(g, &g.nodes[qi]) else {
            continue;
        };
        let inp = |k: usize| n.inputs.get(k).copied().flatten();
        let mk = |op: &str,
                  domain: &str,
                  inputs: Vec<Option<ValueId>>,
                  attrs: Vec<(String, AttrValue)>| Node {
            name: n.name.clone(),
            op_type: op.into(),
            domain: domain.into(),
            opset: if domain.is_empty() { n.opset } else { 1 },
            inputs,
            outputs: vec![Some(out)],
            attrs,
            implicit_inputs: vec![],
        };
        // Add/Mul of two dequantized inputs (by a constant, they become a table below)
        let dq_pair = match n.op_type.as_str() {
            "Add" | "Mul" => inp(0)
                .and_then(|v| dq_scalar(g, &producer, v))
                .zip(inp(1).and_then(|v| dq_scalar(g, &producer, v))),
            _ => None,
        };
        let new = match (n.op_type.as_str(), dq_pair) {
            ("Conv" | "Gemm" | "MatMul", _) => {
                let Some((x, sx, zx)) = inp(0).and_then(|v| dq_scalar(g, &producer, v)) else {
                    continue;
                };
                let gemm = n.op_type == "Gemm";
                let trans_b = gemm && n.get_i("transB", 0)? != 0;
                let axis = match n.op_type.as_str() {
                    "Conv" => 0,
                    _ if trans_b => 0,
                    _ => 1,
                };
                let Some((w, sw, zw, swv)) = inp(1).and_then(|v| dq_weight(g, &producer, v, axis))
                else {
                    continue;
                };
                if readers[inp(1).unwrap_or(0)] != 1 {
                    continue;
                }
                // the bias: an int32 DequantizeLinear whose scales are x_scale * w_scale
                let bias = match inp(2) {
                    None => None,
                    Some(b) => {
                        let Some(bn) = producer[b].map(|i| &g.nodes[i]) else {
                            continue;
                        };
                        let (Some(bq), Some(bs)) = (
                            bn.inputs.first().copied().flatten(),
                            bn.inputs.get(1).copied().flatten(),
                        ) else {
                            continue;
                        };
                        let (Some(bt), Some(bst), Some(sxv)) =
                            (const_of(g, bq), const_of(g, bs), scalar_const(g, Some(sx)))
                        else {
                            continue;
                        };
                        let zero_zp = match bn.inputs.get(2).copied().flatten() {
                            None => true,
                            Some(z) => const_of(g, z)
                                .and_then(|t| t.to_i64_vec().ok())
                                .is_some_and(|v| v.iter().all(|&x| x == 0)),
                        };
                        let Ok(bsv) = bst.to_f32_vec() else { continue };
                        let m = bt.len();
                        let fits = is_op(bn, "DequantizeLinear")
                            && bt.dtype() == DataType::Int32
                            && zero_zp
                            && (bsv.len() == 1 || bsv.len() == m)
                            && (0..m).all(|i| {
                                let s = bsv[if bsv.len() == 1 { 0 } else { i }];
                                let w = swv[if swv.len() == 1 {
                                    0
                                } else {
                                    i.min(swv.len() - 1)
                                }];
                                s == sxv * w
                            });
                        if !fits {
                            continue;
                        }
                        Some(bq)
                    }
                };
                // x, w and y with their scales and zero points, in the QLinear ops' order
                let mut ins = vec![
                    Some(x),
                    Some(sx),
                    zx,
                    Some(w),
                    Some(sw),
                    zw,
                    Some(sy),
                    Some(zy),
                ];
                match n.op_type.as_str() {
                    "Conv" => {
                        if bias.is_some() {
                            ins.push(bias);
                        }
                        mk("QLinearConv", "", ins, n.attrs.clone())
                    }
                    "MatMul" => mk("QLinearMatMul", "", ins, vec![]),
                    _ => {
                        if n.get_f("alpha", 1.0)? != 1.0
                            || n.get_f("beta", 1.0)? != 1.0
                            || n.get_i("transA", 0)? != 0
                        {
                            continue;
                        }
                        // QGemm takes the bias before y's scale and zero point
                        ins.insert(6, bias);
                        mk(
                            "QGemm",
                            "com.microsoft",
                            ins,
                            vec![("transB".into(), AttrValue::Int(trans_b as i64))],
                        )
                    }
                }
            }
            ("Add" | "Mul", Some((a, b))) => {
                if dtype_of(g, a.0) != dtype_of(g, b.0) {
                    continue;
                }
                let op = if n.op_type == "Add" {
                    "QLinearAdd"
                } else {
                    "QLinearMul"
                };
                mk(
                    op,
                    "com.microsoft",
                    vec![
                        Some(a.0),
                        Some(a.1),
                        a.2,
                        Some(b.0),
                        Some(b.1),
                        b.2,
                        Some(sy),
                        Some(zy),
                    ],
                    vec![],
                )
            }
            ("GlobalAveragePool", _) => {
                let Some((x, sx, zx)) = inp(0).and_then(|v| dq_scalar(g, &producer, v)) else {
                    continue;
                };
                mk(
                    "QLinearGlobalAveragePool",
                    "com.microsoft",
                    vec![Some(x), Some(sx), zx, Some(sy), Some(zy)],
                    vec![("channels_last".into(), AttrValue::Int(0))],
                )
            }
            ("MaxPool" | "Reshape" | "Flatten", _) => {
                let Some((x, sx, zx)) = inp(0).and_then(|v| dq_scalar(g, &producer, v)) else {
                    continue;
                };
                let same = scalar_const(g, Some(sx)) == scalar_const(g, Some(sy))
                    && zp_value(g, zx) == zp_value(g, Some(zy))
                    && zx.map(|z| const_of(g, z).map(|t| t.dtype()))
                        == Some(const_of(g, zy).map(|t| t.dtype()));
                if !same || (n.op_type == "MaxPool" && n.outputs.len() > 1) {
                    continue;
                }
                let mut ins = n.inputs.clone();
                ins[0] = Some(x);
                mk(&n.op_type.clone(), "", ins, n.attrs.clone())
            }
            (_, _) => {
                let Some((xi, c)) = lookup_operands(g, n) else {
                    continue;
                };
                let Some((x, sx, zx)) = inp(xi).and_then(|v| dq_scalar(g, &producer, v)) else {
                    continue;
                };
                let (Some(sxv), Some(zxv), Some(syv), Some(zyv)) = (
                    scalar_const(g, Some(sx)),
                    zp_value(g, zx),
                    scalar_const(g, Some(sy)),
                    zp_value(g, Some(zy)),
                ) else {
                    continue;
                };
                let x_signed = dtype_of(g, x) == Some(DataType::Int8);
                let y_signed = const_of(g, zy).is_some_and(|t| t.dtype() == DataType::Int8);
                let Some(table) = lookup_table(n, c, (sxv, zxv, x_signed), (syv, zyv, y_signed))
                else {
                    continue;
                };
                tables.push((replace.len(), table, y_signed));
                mk(
                    "QLookup",
                    crate::kernels::nn::nchwc::DOMAIN,
                    vec![Some(x)],
                    vec![],
                )
            }
        };
        replace.push((ni, new));
        drop[qi] = true;
    }
    let count = replace.len();
    if count == 0 {
        return Ok(0);
    }
    // a lookup whose input is another lookup's output, read by nothing else (through its
    // DequantizeLinear, also read by nothing else), takes one composed table: t2[t1[code]]
    let mut gone = vec![false; replace.len()];
    for t in 0..tables.len() {
        let ri = tables[t].0;
        let Some(x) = replace[ri].1.inputs[0] else {
            continue;
        };
        let Some(p) = tables[..t]
            .iter()
            .position(|&(rp, _, _)| !gone[rp] && replace[rp].1.outputs[0] == Some(x))
        else {
            continue;
        };
        let Some(dq) = sole_reader(g, &readers, x) else {
            continue;
        };
        if out0(&g.nodes[dq]).is_none_or(|d| readers[d] != 1) {
            continue;
        }
        let rp = tables[p].0;
        let composed: Vec<u8> = tables[p]
            .1
            .iter()
            .map(|&b| tables[t].1[b as usize])
            .collect();
        tables[t].1 = composed;
        replace[ri].1.inputs[0] = replace[rp].1.inputs[0];
        gone[rp] = true;
        drop[replace[rp].0] = true;
    }
    let tables: Vec<_> = tables.into_iter().filter(|&(ri, _, _)| !gone[ri]).collect();
    for (ri, table, signed) in tables {
        let name = alloc::format!("{}/table", replace[ri].1.name);
        let v = new_value(g, name);
        set_init(g, v, table_tensor(table, signed)?);
        replace[ri].1.inputs.push(Some(v));
    }
    for (ri, (ni, node)) in replace.into_iter().enumerate() {
        if !gone[ri] {
            g.nodes[ni] = node;
        }
    }
    super::remove_nodes(g, &drop);
    remove_dead(g);
    Ok(count + self_products(g)?)
}

/// A `QLookup` table of 256 codes as a tensor of the codes' type (int8 where `signed`).
fn table_tensor(codes: Vec<u8>, signed: bool) -> Result<Tensor> {
    if signed {
        Tensor::from_vec(
            &[256],
            codes.into_iter().map(|b| b as i8).collect::<Vec<i8>>(),
        )
    } else {
        Tensor::from_vec(&[256], codes)
    }
}

/// com.microsoft QLinearMul/QLinearAdd of codes `x` and a table's answer for the same codes
/// (`QLinearMul(x, QLookup(x))`: hard-swish as x times its hard-sigmoid), every scale and zero
/// point a one-element constant, the table read by nothing else: one table, each code's
/// answer computed by the QLinear kernel itself on the 256 codes and their looked-up values
/// (so the same bytes as the two ops).
fn self_products(g: &mut Graph) -> Result<usize> {
    let readers = reader_counts(g);
    let producer = producers(g);
    let lookup = |v: ValueId| -> Option<(usize, ValueId, &Tensor)> {
        let li = producer[v]?;
        let l = &g.nodes[li];
        if l.op_type != "QLookup" || l.domain != crate::kernels::nn::nchwc::DOMAIN {
            return None;
        }
        let t = const_of(g, l.inputs.get(1).copied().flatten()?)?;
        (readers[v] == 1 && t.len() == 256).then_some((li, l.inputs[0]?, t))
    };
    let mut drop = vec![false; g.nodes.len()];
    let mut tables: Vec<(usize, ValueId, Tensor)> = Vec::new();
    for (ni, n) in g.nodes.iter().enumerate() {
        let mul = match (n.domain.as_str(), n.op_type.as_str()) {
            ("com.microsoft", "QLinearMul") => true,
            ("com.microsoft", "QLinearAdd") => false,
            _ => continue,
        };
        let inp = |k: usize| n.inputs.get(k).copied().flatten();
        let (Some(a), Some(b)) = (inp(0), inp(3)) else {
            continue;
        };
        // which operand is the table's answer for the other
        let (li, table, a_is_x) = match (lookup(a), lookup(b)) {
            (_, Some((li, x, t))) if x == a => (li, t, true),
            (Some((li, x, t)), _) if x == b => (li, t, false),
            _ => continue,
        };
        if drop[li] {
            continue;
        }
        let dt = table.dtype();
        if dtype_of(g, a) != Some(dt) || dtype_of(g, b) != Some(dt) {
            continue;
        }
        let zp = |k: usize| match inp(k) {
            None => Some(0.0),
            Some(z) => {
                let t = const_of(g, z)?;
                (t.len() == 1 && t.dtype() == dt)
                    .then(|| t.to_i64_vec().ok().map(|v| v[0] as f32))?
            }
        };
        let (Some(sa), Some(sb), Some(sc), Some(za), Some(zb), Some(zc)) = (
            scalar_const(g, inp(1)),
            scalar_const(g, inp(4)),
            scalar_const(g, inp(6)),
            zp(2),
            zp(5),
            zp(7),
        ) else {
            continue;
        };
        let Ok(tb) = table.to_i64_vec() else { continue };
        // the kernel's own parameters and arithmetic (kernels::qlinear)
        let p = crate::simd::QBin {
            mul,
            za,
            zb,
            ra: if mul { sa * sb / sc } else { sa / sc },
            rb: if mul { 0.0 } else { sb / sc },
        };
        let signed = dt == DataType::Int8;
        let (lo, hi) = if signed {
            (-128.0, 127.0)
        } else {
            (0.0, 255.0)
        };
        let codes: Vec<u8> = (0..=255u8).collect();
        let looked: Vec<u8> = tb.iter().map(|&v| v as u8).collect();
        let (av, bv) = if a_is_x {
            (&codes, &looked)
        } else {
            (&looked, &codes)
        };
        let mut out = vec![0u8; 256];
        crate::simd::qbinary_q8(
            p,
            av,
            bv,
            1,
            signed,
            crate::simd::Q8 { zp: zc, lo, hi },
            &mut out,
        );
        let t = table_tensor(out, signed)?;
        drop[li] = true;
        tables.push((ni, if a_is_x { a } else { b }, t));
    }
    let count = tables.len();
    for (ni, x, t) in tables {
        let name = alloc::format!("{}/table", g.nodes[ni].name);
        let v = new_value(g, name);
        set_init(g, v, t);
        let n = &mut g.nodes[ni];
        n.op_type = "QLookup".into();
        n.domain = crate::kernels::nn::nchwc::DOMAIN.into();
        n.opset = 1;
        n.inputs = vec![Some(x), Some(v)];
        n.attrs = vec![];
    }
    if count > 0 {
        super::remove_nodes(g, &drop);
        remove_dead(g);
    }
    Ok(count)
}

fn known_dim(d: &crate::value::Dim) -> Option<usize> {
    match d {
        crate::value::Dim::Known(n) => Some(*n),
        _ => None,
    }
}

/// `v`'s shape where inference knows every dimension.
fn known_shape(g: &Graph, v: ValueId) -> Option<Vec<usize>> {
    g.values[v]
        .ty
        .tensor_shape()?
        .iter()
        .map(known_dim)
        .collect()
}

/// The number of columns of `v`'s last dimension, where inference knows it.
fn last_dim(g: &Graph, v: ValueId) -> Option<usize> {
    known_dim(g.values[v].ty.tensor_shape()?.last()?)
}

/// The dynamic quantization of a float MatMul (ONNX Runtime's `quantize_dynamic`):
/// `MatMulInteger -> Cast(to float) -> Mul(s)`, `s` a float of one value or one per output
/// column (`a_scale * b_scale`, computed in the graph), then optionally `Add` of a constant
/// bias (one value, or one per column), becomes one com.microsoft MatMulIntegerToFloat with
/// `a_scale = 1` and `b_scale = s`: the integer product writes floats, scaled and biased while
/// each tile is in registers, instead of an int32 tensor and three passes over it. The same
/// roundings: the exact int32 sum converted, times `1 * s` (exact), one multiply, one add.
/// Each intermediate must be read by the next node only; the fused node takes the place of the
/// last one (where `s` is known to be computed).
pub fn integer_to_float(g: &mut Graph) -> Result<usize> {
    let readers = reader_counts(g);
    let mut drop = vec![false; g.nodes.len()];
    // (index of the node replaced, its new inputs, output, bias, name)
    type Rewrite = (usize, Vec<Option<ValueId>>, ValueId, Option<Tensor>, String);
    let mut rewrites: Vec<Rewrite> = Vec::new();
    for (mi, m) in g.nodes.iter().enumerate() {
        if !is_op(m, "MatMulInteger") || m.inputs.len() < 2 {
            continue;
        }
        let (Some(y), Some(b)) = (out0(m), m.inputs[1]) else {
            continue;
        };
        // a 2-D (or batched) B: the product's last dimension is B's columns
        let Some(n) = last_dim(g, y) else { continue };
        if !known_shape(g, b).is_some_and(|s| s.len() >= 2 && s[s.len() - 1] == n) {
            continue;
        }
        let Some(ci) = sole_reader(g, &readers, y) else {
            continue;
        };
        let c = &g.nodes[ci];
        if !is_op(c, "Cast") || c.get_i("to", 0).ok() != Some(DataType::Float as i64) {
            continue;
        }
        let Some(cy) = out0(c) else { continue };
        let Some(ui) = sole_reader(g, &readers, cy) else {
            continue;
        };
        let u = &g.nodes[ui];
        if !is_op(u, "Mul") || u.inputs.len() != 2 {
            continue;
        }
        let s = match (u.inputs[0], u.inputs[1]) {
            (Some(p), Some(q)) if p == cy && q != cy => q,
            (Some(p), Some(q)) if q == cy && p != cy => p,
            _ => continue,
        };
        // one value or one per column, on the last axis (the product's shape unchanged)
        if !super::is_f32(g, s)
            || !known_shape(g, s).is_some_and(|sh| {
                sh.len() <= 1 && matches!(sh.iter().product::<usize>(), k if k == 1 || k == n)
            })
        {
            continue;
        }
        let Some(mut out) = out0(u) else { continue };
        let mut last = ui;
        let mut bias = None;
        if let Some(ai) = sole_reader(g, &readers, out) {
            let a = &g.nodes[ai];
            let other = match (
                a.inputs.first().copied().flatten(),
                a.inputs.get(1).copied().flatten(),
            ) {
                (Some(p), Some(q)) if p == out && q != out => Some(q),
                (Some(p), Some(q)) if q == out && p != out => Some(p),
                _ => None,
            };
            let t = other.and_then(|o| const_of(g, o));
            if let (true, Some(t), Some(ao)) = (is_op(a, "Add") && a.inputs.len() == 2, t, out0(a))
            {
                if t.dtype() == DataType::Float && t.rank() <= 1 && (t.len() == n || t.len() == 1) {
                    let v = t.to_f32_vec()?;
                    let full: Vec<f32> = (0..n)
                        .map(|j| v[if v.len() == 1 { 0 } else { j }])
                        .collect();
                    bias = Some(Tensor::from_vec(&[n], full)?);
                    out = ao;
                    drop[ui] = true;
                    last = ai;
                }
            }
        }
        let inp = |k: usize| m.inputs.get(k).copied().flatten();
        let ins = vec![inp(0), inp(1), None, Some(s), inp(2), inp(3), None];
        drop[mi] = true;
        drop[ci] = true;
        rewrites.push((last, ins, out, bias, m.name.clone()));
    }
    let count = rewrites.len();
    if count == 0 {
        return Ok(0);
    }
    let one = new_value(g, "nxrt/one".into());
    set_init(g, one, Tensor::from_vec(&[], vec![1.0f32])?);
    for (at, mut ins, out, bias, name) in rewrites {
        ins[2] = Some(one);
        if let Some(t) = bias {
            let v = new_value(g, alloc::format!("{name}/bias"));
            set_init(g, v, t);
            ins[6] = Some(v);
        } else {
            ins.pop();
        }
        let n = &mut g.nodes[at];
        *n = Node {
            name,
            op_type: "MatMulIntegerToFloat".into(),
            domain: "com.microsoft".into(),
            opset: 1,
            inputs: ins,
            outputs: vec![Some(out)],
            attrs: vec![],
            implicit_inputs: vec![],
        };
        drop[at] = false;
    }
    super::remove_nodes(g, &drop);
    remove_dead(g);
    Ok(count)
}
