//! Graph fusions for the CPU (`OptLevel::All`, the default level): each rewrites a pattern
//! into one node whose kernel does the work of several in one pass over memory.
//!
//! - **Conv + BatchNormalization** (inference form, all parameters constant): the scale and
//!   shift are folded into the convolution's weights and bias; the BatchNormalization node
//!   goes away.
//! - **Conv + Mul / Add of a constant** (one value per output channel, or one for all): folded
//!   into the weights and bias (separate bias Adds, the affine blocks PP-LCNet writes after a
//!   convolution).
//! - **Conv + Add + activation** into `com.microsoft:FusedConv` (the contrib op ONNX Runtime
//!   defines: `Y = act(Conv(X, W, B) + Z)`): a residual `Add` of a tensor of the convolution's
//!   own shape becomes the `Z` input, and a following Relu, LeakyRelu, Sigmoid, Tanh,
//!   HardSigmoid, Clip (or, as nxrt's extensions of the contrib op, HardSwish, and HardSwish
//!   spelled out as `x * Clip(x + 3, 0, 6) / 6`, which PaddlePaddle's exporter writes) becomes
//!   the epilogue the kernel applies to each output tile while it is still in cache.
//!
//! - **GELU spelled out** (`x * 0.5 * (1 + Erf(x / sqrt 2))`, as PyTorch exports the erf GELU
//!   of BERT-family encoders, in any of its usual operand orders and groupings) into one
//!   `Gelu` node (ONNX opset 20): one pass with a vector `1 + erf` instead of five.
//!
//! A fusion applies only where it cannot change what the graph computes or exposes: float32
//! tensors; an intermediate read by exactly one node, not a graph output and not read by a
//! subgraph; constants known at load. The fused kernel applies the same vector activations as
//! the standalone element-wise kernels, so results are bit-identical except for the folded
//! BatchNormalization (one rounding of `w * s` instead of a separate multiply) and the fused
//! GELU (its `1 + erf` is computed without the cancellation of adding 1 to a rounded erf near
//! -1: within a few ulp of the five-node chain, closer to the exact value).

use alloc::string::{String, ToString};
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;

use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::{AttrValue, Graph, Node, ValueId};
use crate::tensor::Tensor;
use crate::value::{Dim, TypeInfo, Value};

mod nchwc;
pub mod quant;
pub use nchwc::block_convolutions;

/// Domain and op of the fused convolution.
pub const FUSED_CONV: (&str, &str) = ("com.microsoft", "FusedConv");

/// Runs every fusion on `g` and, recursively, on its subgraphs (If branches, Loop and Scan
/// bodies). Returns how many nodes were folded away.
pub fn fuse_graph(g: &mut Graph) -> Result<usize> {
    let mut n = 0;
    for node in g.nodes.iter_mut() {
        for (_, a) in node.attrs.iter_mut() {
            match a {
                AttrValue::Graph(sub) => n += fuse_graph(Arc::make_mut(sub))?,
                AttrValue::Graphs(subs) => {
                    for sub in subs.iter_mut() {
                        n += fuse_graph(Arc::make_mut(sub))?;
                    }
                }
                _ => {}
            }
        }
    }
    Ok(n + conv_bn(g)? + conv_affine(g)? + conv_add(g) + conv_act(g)? + gelu(g))
}

/// Readers of each value: nodes (inputs and subgraph captures) and graph outputs.
fn reader_counts(g: &Graph) -> Vec<usize> {
    let mut n = vec![0usize; g.values.len()];
    for node in &g.nodes {
        for &i in node.inputs.iter().flatten() {
            n[i] += 1;
        }
        for &i in &node.implicit_inputs {
            n[i] += 1;
        }
    }
    for &o in &g.outputs {
        // a graph output must stay a value of its own
        n[o] += 2;
    }
    n
}

/// The node that writes each value (`None` for inputs, initializers and unwritten values).
fn producers(g: &Graph) -> Vec<Option<usize>> {
    let mut p = vec![None; g.values.len()];
    for (i, n) in g.nodes.iter().enumerate() {
        for &o in n.outputs.iter().flatten() {
            p[o] = Some(i);
        }
    }
    p
}

/// The index of the one node that reads `v`, if exactly one node (and nothing else) does.
fn sole_reader(g: &Graph, readers: &[usize], v: ValueId) -> Option<usize> {
    if readers[v] != 1 {
        return None;
    }
    g.nodes
        .iter()
        .position(|n| n.inputs.iter().flatten().any(|&i| i == v))
}

pub(crate) fn is_f32(g: &Graph, v: ValueId) -> bool {
    matches!(
        &g.values[v].ty,
        TypeInfo::Tensor {
            dtype: Some(DataType::Float),
            ..
        }
    )
}

fn const_of(g: &Graph, v: ValueId) -> Option<&Tensor> {
    g.initializers.iter().find_map(|(id, val)| match val {
        Value::Tensor(t) if *id == v => Some(t),
        _ => None,
    })
}

fn is_conv(n: &Node) -> bool {
    is_op(n, "Conv") || (n.domain == FUSED_CONV.0 && n.op_type == FUSED_CONV.1)
}

/// A plain Conv, or a FusedConv with no activation yet (its epilogue is still open).
fn conv_open(n: &Node) -> bool {
    is_conv(n) && n.attr("activation").is_none()
}

fn out0(n: &Node) -> Option<ValueId> {
    n.outputs.first().copied().flatten()
}

/// Removes the nodes marked in `drop`, keeping the order of the others.
fn remove_nodes(g: &mut Graph, drop: &[bool]) {
    let mut i = 0;
    g.nodes.retain(|_| {
        let keep = !drop[i];
        i += 1;
        keep
    });
}

fn set_init(g: &mut Graph, v: ValueId, t: Tensor) {
    g.values[v].ty = Value::Tensor(t.clone()).type_info();
    match g.initializers.iter_mut().find(|(id, _)| *id == v) {
        Some(slot) => slot.1 = Value::Tensor(t),
        None => g.initializers.push((v, Value::Tensor(t))),
    }
}

/// A fresh value id for a new initializer.
fn new_value(g: &mut Graph, name: String) -> ValueId {
    g.values.push(crate::ir::ValueInfo {
        name,
        ty: TypeInfo::Unknown,
    });
    g.values.len() - 1
}

/// For a Conv (or a FusedConv without an epilogue yet) with at most three inputs at node `ci`:
/// its output and the one node that reads it.
fn conv_and_reader(g: &Graph, readers: &[usize], ci: usize) -> Option<(ValueId, usize)> {
    let conv = &g.nodes[ci];
    if !conv_open(conv) || conv.inputs.len() > 3 {
        return None;
    }
    let y = out0(conv)?;
    Some((y, sole_reader(g, readers, y)?))
}

/// Gives the Conv at `ci` the bias `nb` (into its bias initializer, or a new one) and makes
/// `out` its output (the folded node's).
fn set_bias_and_output(g: &mut Graph, ci: usize, nb: Vec<f32>, out: ValueId) -> Result<()> {
    let m = nb.len();
    let b_new = match g.nodes[ci].inputs.get(2).copied().flatten() {
        Some(b) => b,
        None => {
            let name = alloc::format!("{}/bias", g.nodes[ci].name);
            new_value(g, name)
        }
    };
    set_init(g, b_new, Tensor::from_vec(&[m], nb)?);
    let conv = &mut g.nodes[ci];
    conv.inputs.resize(3, None);
    conv.inputs[2] = Some(b_new);
    conv.outputs[0] = Some(out);
    Ok(())
}

// ---------------------------------------------------------------- Conv + BatchNormalization

fn conv_bn(g: &mut Graph) -> Result<usize> {
    let mut count = 0;
    let mut drop = vec![false; g.nodes.len()];
    let readers = reader_counts(g);
    for ci in 0..g.nodes.len() {
        let Some((y, bi)) = conv_and_reader(g, &readers, ci) else {
            continue;
        };
        let conv = &g.nodes[ci];
        let bn = &g.nodes[bi];
        if !is_op(bn, "BatchNormalization")
            || bn.inputs.first() != Some(&Some(y))
            || bn.outputs.iter().skip(1).any(|o| o.is_some())
            || bn.get_i("training_mode", 0)? != 0
            || !is_f32(g, y)
        {
            continue;
        }
        let Some(w_id) = conv.inputs.get(1).copied().flatten() else {
            continue;
        };
        let b_id = conv.inputs.get(2).copied().flatten();
        // W and B must be read by this Conv alone (their folded forms replace them)
        if readers[w_id] != 1 || b_id.is_some_and(|b| readers[b] != 1) {
            continue;
        }
        let params: Option<Vec<&Tensor>> = (1..5)
            .map(|k| {
                bn.inputs
                    .get(k)
                    .copied()
                    .flatten()
                    .and_then(|v| const_of(g, v))
            })
            .collect();
        let (Some(params), Some(w)) = (params, const_of(g, w_id)) else {
            continue;
        };
        let m = w.shape().first().copied().unwrap_or(0);
        if w.dtype() != DataType::Float
            || m == 0
            || params
                .iter()
                .any(|p| p.dtype() != DataType::Float || p.len() != m)
        {
            continue;
        }
        let b = match b_id {
            Some(b) => match const_of(g, b) {
                Some(t) if t.dtype() == DataType::Float && t.len() == m => Some(t),
                _ => continue,
            },
            None => None,
        };
        let eps = bn.get_f("epsilon", 1e-5)?;
        let (scale, shift, mean, var) = (
            params[0].as_slice::<f32>()?,
            params[1].as_slice::<f32>()?,
            params[2].as_slice::<f32>()?,
            params[3].as_slice::<f32>()?,
        );
        // the same arithmetic as the BatchNormalization kernel: y = (x - mean) * s + shift,
        // s = scale / sqrt(var + eps)
        let s: Vec<f32> = (0..m)
            .map(|c| scale[c] / libm::sqrtf(var[c] + eps))
            .collect();
        let wv = w.as_slice::<f32>()?;
        let per = wv.len() / m;
        let mut nw = Vec::with_capacity(wv.len());
        for (c, row) in wv.chunks(per).enumerate() {
            nw.extend(row.iter().map(|&x| x * s[c]));
        }
        let bv: Vec<f32> = match b {
            Some(b) => b.as_slice::<f32>()?.to_vec(),
            None => vec![0.0; m],
        };
        let nb: Vec<f32> = (0..m)
            .map(|c| (bv[c] - mean[c]) * s[c] + shift[c])
            .collect();
        let (w_shape, bn_out) = (w.shape().to_vec(), out0(bn));
        let Some(bn_out) = bn_out else { continue };
        set_init(g, w_id, Tensor::from_vec(&w_shape, nw)?);
        set_bias_and_output(g, ci, nb, bn_out)?;
        drop[bi] = true;
        count += 1;
    }
    remove_nodes(g, &drop);
    Ok(count)
}

// ---------------------------------------------------------------- Conv + constant affine

/// A constant that holds one value for all channels or one per channel of a rank-`rank`
/// output with `m` channels (shape `[]`, `[1]`, `[M, 1, 1]`, `[1, M, 1, 1]`, ...): its values,
/// expanded to `m`.
fn per_channel(g: &Graph, v: Option<ValueId>, m: usize, rank: usize) -> Option<Vec<f32>> {
    let c = const_of(g, v?)?;
    let cs = c.shape();
    if c.dtype() != DataType::Float || m == 0 || rank < 2 || cs.len() > rank {
        return None;
    }
    let vals = c.as_slice::<f32>().ok()?;
    if c.len() == 1 {
        return Some(vec![vals[0]; m]);
    }
    let aligned = c.len() == m
        && cs
            .iter()
            .enumerate()
            .all(|(i, &d)| d == if i + rank - cs.len() == 1 { m } else { 1 });
    aligned.then(|| vals.to_vec())
}

/// `Mul(Conv(X, W[, B]), s)` and `Add(Conv(X, W[, B]), c)` with `s`, `c` constants of one
/// value per output channel or one for all: `s` scales W and B, `c` joins B (the affine
/// blocks and separate bias Adds exporters write after a convolution). Repeated while the
/// next node is another such Mul or Add. The bias is then added before the products instead
/// of after them, and `W * s` is rounded once: within a rounding or two of the chain.
fn conv_affine(g: &mut Graph) -> Result<usize> {
    let mut count = 0;
    let readers = reader_counts(g);
    let mut drop = vec![false; g.nodes.len()];
    for ci in 0..g.nodes.len() {
        while let Some((y, ni)) = conv_and_reader(g, &readers, ci) {
            let conv = &g.nodes[ci];
            let op = &g.nodes[ni];
            let is_mul = is_op(op, "Mul");
            if !(is_mul || is_op(op, "Add")) || op.inputs.len() != 2 || !is_f32(g, y) {
                break;
            }
            let other = if op.inputs[0] == Some(y) {
                op.inputs[1]
            } else {
                op.inputs[0]
            };
            let Some(w_id) = conv.inputs.get(1).copied().flatten() else {
                break;
            };
            let Some(w) = const_of(g, w_id) else { break };
            let m = w.shape().first().copied().unwrap_or(0);
            let rank = g.values[y].ty.tensor_shape().map_or(0, |s| s.len());
            let Some(cv) = per_channel(g, other, m, rank) else {
                break;
            };
            let b_id = conv.inputs.get(2).copied().flatten();
            // a bias made by an earlier fold of this loop is newer than `readers`: this Conv
            // alone reads it
            if b_id.is_some_and(|b| readers.get(b).is_some_and(|&r| r != 1))
                || (is_mul && (readers[w_id] != 1 || w.dtype() != DataType::Float))
            {
                break;
            }
            let mut nb: Vec<f32> = match b_id {
                Some(b) => match const_of(g, b) {
                    Some(t) if t.dtype() == DataType::Float && t.len() == m => {
                        t.as_slice::<f32>()?.to_vec()
                    }
                    _ => break,
                },
                None => vec![0.0; m],
            };
            let (Some(out), w_shape) = (out0(op), w.shape().to_vec()) else {
                break;
            };
            if is_mul {
                let wv = w.as_slice::<f32>()?;
                let per = wv.len() / m;
                let nw: Vec<f32> = wv
                    .chunks(per)
                    .zip(&cv)
                    .flat_map(|(row, &s)| row.iter().map(move |&x| x * s))
                    .collect();
                set_init(g, w_id, Tensor::from_vec(&w_shape, nw)?);
                nb.iter_mut().zip(&cv).for_each(|(b, &s)| *b *= s);
            } else {
                nb.iter_mut().zip(&cv).for_each(|(b, &c)| *b += c);
            }
            set_bias_and_output(g, ci, nb, out)?;
            drop[ni] = true;
            count += 1;
        }
    }
    remove_nodes(g, &drop);
    Ok(count)
}

// ---------------------------------------------------------------- Conv + Add (residual)

fn same_known_shape(a: &TypeInfo, b: &TypeInfo) -> bool {
    match (a.tensor_shape(), b.tensor_shape()) {
        (Some(x), Some(y)) => {
            x.len() == y.len()
                && x.iter().zip(y).all(|(p, q)| match (p, q) {
                    (Dim::Known(p), Dim::Known(q)) => p == q,
                    (Dim::Sym(p), Dim::Sym(q)) => p == q,
                    _ => false,
                })
        }
        _ => false,
    }
}

fn conv_add(g: &mut Graph) -> usize {
    let mut count = 0;
    let readers = reader_counts(g);
    let mut drop = vec![false; g.nodes.len()];
    for ci in 0..g.nodes.len() {
        let Some((y, ai)) = conv_and_reader(g, &readers, ci) else {
            continue;
        };
        let add = &g.nodes[ai];
        if drop[ci] || !is_op(add, "Add") || add.inputs.len() != 2 {
            continue;
        }
        let (Some(l), Some(r)) = (add.inputs[0], add.inputs[1]) else {
            continue;
        };
        let z = if l == y { r } else { l };
        let Some(sum) = out0(add) else { continue };
        // no broadcast: Z has the convolution's own shape (and so does the sum)
        if z == y
            || !is_f32(g, y)
            || !is_f32(g, z)
            || !same_known_shape(&g.values[y].ty, &g.values[z].ty)
            || !same_known_shape(&g.values[y].ty, &g.values[sum].ty)
        {
            continue;
        }
        // The fused node takes the Add's place (Z may be computed after the Conv; the Conv's
        // own inputs are all defined before the Add too).
        let mut fused = g.nodes[ci].clone();
        fused.domain = FUSED_CONV.0.to_string();
        fused.op_type = FUSED_CONV.1.to_string();
        fused.opset = 1;
        fused.inputs.resize(3, None);
        fused.inputs.push(Some(z));
        fused.outputs = vec![Some(sum)];
        g.nodes[ai] = fused;
        drop[ci] = true;
        count += 1;
    }
    remove_nodes(g, &drop);
    count
}

// ---------------------------------------------------------------- Conv + activation

/// The activation a node applies to its only input, as FusedConv's `activation` and
/// `activation_params`; `None` if it is not one (or its parameters are not constant).
fn activation_of(g: &Graph, n: &Node) -> Result<Option<(&'static str, Vec<f32>)>> {
    if !n.domain.is_empty() {
        return Ok(None);
    }
    Ok(Some(match n.op_type.as_str() {
        "Relu" => ("Relu", vec![]),
        "Sigmoid" => ("Sigmoid", vec![]),
        "Tanh" => ("Tanh", vec![]),
        "HardSwish" => ("HardSwish", vec![]),
        "LeakyRelu" => ("LeakyRelu", vec![n.get_f("alpha", 0.01)?]),
        "HardSigmoid" => (
            "HardSigmoid",
            vec![n.get_f("alpha", 0.2)?, n.get_f("beta", 0.5)?],
        ),
        "Clip" => match clip_bounds(g, n)? {
            Some((lo, hi)) => ("Clip", vec![lo, hi]),
            None => return Ok(None),
        },
        _ => return Ok(None),
    }))
}

/// A float32 scalar constant.
fn scalar_const(g: &Graph, v: Option<ValueId>) -> Option<f32> {
    let t = const_of(g, v?)?;
    if t.dtype() != DataType::Float || t.len() != 1 {
        return None;
    }
    t.as_slice::<f32>().ok().map(|s| s[0])
}

/// Clip's bounds when they are constants (attributes before opset 11, inputs after; a missing
/// bound is unbounded).
fn clip_bounds(g: &Graph, n: &Node) -> Result<Option<(f32, f32)>> {
    if n.opset < 11 {
        // as the Clip kernel: opset 6 defaults to the f32 range, opset 1 to no bound
        let (lo, hi) = if n.opset >= 6 {
            (f32::MIN, f32::MAX)
        } else {
            (f32::NEG_INFINITY, f32::INFINITY)
        };
        return Ok(Some((n.get_f("min", lo)?, n.get_f("max", hi)?)));
    }
    let bound = |k: usize, default: f32| match n.inputs.get(k).copied().flatten() {
        None => Some(default),
        v => scalar_const(g, v),
    };
    Ok(bound(1, f32::NEG_INFINITY).zip(bound(2, f32::INFINITY)))
}

/// The bounds `(lo, hi)` a node applies to `x` when it is a Clip of `x` with constant bounds, or
/// a Max (lo) or Min (hi) of `x` and a float32 one-element constant whose rank is at most
/// `x`'s (so that broadcasting it leaves `x`'s shape).
fn clamp_of(g: &Graph, n: &Node, x: ValueId) -> Result<Option<(f32, f32)>> {
    if !n.domain.is_empty() {
        return Ok(None);
    }
    match n.op_type.as_str() {
        "Clip" if n.inputs.first() == Some(&Some(x)) => clip_bounds(g, n),
        op @ ("Max" | "Min") => {
            let Some(other) = other_input(n, x) else {
                return Ok(None);
            };
            let x_rank = g.values[x].ty.tensor_shape().map_or(0, |s| s.len());
            let rank_ok = other
                .and_then(|v| const_of(g, v))
                .is_some_and(|t| t.shape().len() <= x_rank);
            Ok(match scalar_const(g, other) {
                Some(c) if rank_ok && op == "Max" => Some((c, f32::INFINITY)),
                Some(c) if rank_ok => Some((f32::NEG_INFINITY, c)),
                _ => None,
            })
        }
        _ => Ok(None),
    }
}

fn is_op(n: &Node, op: &str) -> bool {
    n.domain.is_empty() && n.op_type == op
}

/// HardSwish as exporters spell it out after a convolution's output `y`:
/// `Div(Mul(y, Clip(Add(y, shift), lo, hi)), div)` (either operand order in Add and Mul), with
/// `y` read by the Add and the Mul only. Returns the four nodes (Add, Clip, Mul, Div) and the
/// parameters (shift, lo, hi, div).
fn hardswish_parts(
    g: &Graph,
    readers: &[usize],
    y: ValueId,
) -> Result<Option<([usize; 4], Vec<f32>)>> {
    if readers[y] != 2 {
        return Ok(None);
    }
    let rd: Vec<usize> = (0..g.nodes.len())
        .filter(|&i| g.nodes[i].inputs.iter().flatten().any(|&v| v == y))
        .collect();
    let (ai, mi) = match *rd.as_slice() {
        [p, q] if is_op(&g.nodes[p], "Add") && is_op(&g.nodes[q], "Mul") => (p, q),
        [p, q] if is_op(&g.nodes[q], "Add") && is_op(&g.nodes[p], "Mul") => (q, p),
        _ => return Ok(None),
    };
    let other = |n: &Node| -> Option<ValueId> {
        match (
            n.inputs.first().copied().flatten(),
            n.inputs.get(1).copied().flatten(),
        ) {
            (Some(a), Some(b)) if n.inputs.len() == 2 && a == y && b != y => Some(b),
            (Some(a), Some(b)) if n.inputs.len() == 2 && b == y && a != y => Some(a),
            _ => None,
        }
    };
    let Some(shift) = scalar_const(g, other(&g.nodes[ai])) else {
        return Ok(None);
    };
    let Some(a) = out0(&g.nodes[ai]) else {
        return Ok(None);
    };
    let Some(ki) = sole_reader(g, readers, a) else {
        return Ok(None);
    };
    let clip = &g.nodes[ki];
    if !is_op(clip, "Clip") || clip.inputs.first() != Some(&Some(a)) {
        return Ok(None);
    }
    let Some((lo, hi)) = clip_bounds(g, clip)? else {
        return Ok(None);
    };
    let k = out0(clip);
    if k.is_none() || other(&g.nodes[mi]) != k {
        return Ok(None);
    }
    let Some(m) = out0(&g.nodes[mi]) else {
        return Ok(None);
    };
    let Some(di) = sole_reader(g, readers, m) else {
        return Ok(None);
    };
    let div = &g.nodes[di];
    if !is_op(div, "Div") || div.inputs.len() != 2 || div.inputs[0] != Some(m) {
        return Ok(None);
    }
    let Some(d) = scalar_const(g, div.inputs[1]) else {
        return Ok(None);
    };
    let all_f32 = [Some(a), k, Some(m), out0(div)]
        .iter()
        .all(|v| v.is_some_and(|v| is_f32(g, v)));
    if !all_f32 {
        return Ok(None);
    }
    Ok(Some(([ai, ki, mi, di], vec![shift, lo, hi, d])))
}

fn conv_act(g: &mut Graph) -> Result<usize> {
    let mut count = 0;
    let readers = reader_counts(g);
    let mut drop = vec![false; g.nodes.len()];
    for ci in 0..g.nodes.len() {
        let conv = &g.nodes[ci];
        if !conv_open(conv) {
            continue;
        }
        let Some(y) = out0(conv) else { continue };
        if !is_f32(g, y) {
            continue;
        }
        let (gone, name, params, out) =
            if let Some((nodes, params)) = hardswish_parts(g, &readers, y)? {
                let Some(out) = out0(&g.nodes[nodes[3]]) else {
                    continue;
                };
                (nodes.to_vec(), "HardSwish", params, out)
            } else {
                let Some(ai) = sole_reader(g, &readers, y) else {
                    continue;
                };
                let act = &g.nodes[ai];
                if act.inputs.first() != Some(&Some(y)) {
                    continue;
                }
                let Some((name, params)) = activation_of(g, act)? else {
                    continue;
                };
                let Some(out) = out0(act) else { continue };
                let (mut gone, mut name, mut params, mut out) = (vec![ai], name, params, out);
                // bounds after a piecewise-linear activation (Max/Min/Clip with constants)
                // fold into it
                while matches!(name, "Relu" | "LeakyRelu" | "Clip") {
                    let Some(ri) = sole_reader(g, &readers, out) else {
                        break;
                    };
                    let Some((c, d)) = clamp_of(g, &g.nodes[ri], out)? else {
                        break;
                    };
                    let Some(next) = out0(&g.nodes[ri]) else {
                        break;
                    };
                    // the bounds the activation has so far
                    let (lo, hi) = match (name, params.as_slice()) {
                        ("Relu", _) => (0.0, f32::INFINITY),
                        ("Clip", &[lo, hi]) | ("LeakyRelu", &[_, lo, hi]) => (lo, hi),
                        _ => (f32::NEG_INFINITY, f32::INFINITY),
                    };
                    // (clamping [lo, hi] to [c, d] is the composition where both are ordered)
                    if !(c <= d && lo <= hi) {
                        break;
                    }
                    let (lo, hi) = (lo.clamp(c, d), hi.clamp(c, d));
                    params = if name == "LeakyRelu" {
                        vec![params[0], lo, hi]
                    } else {
                        name = "Clip";
                        vec![lo, hi]
                    };
                    gone.push(ri);
                    out = next;
                }
                (gone, name, params, out)
            };
        if gone.iter().any(|&i| drop[i]) {
            continue;
        }
        let conv = &mut g.nodes[ci];
        if conv.domain.is_empty() {
            conv.domain = FUSED_CONV.0.to_string();
            conv.op_type = FUSED_CONV.1.to_string();
            conv.opset = 1;
        }
        conv.attrs.push((
            "activation".to_string(),
            AttrValue::String(name.as_bytes().to_vec()),
        ));
        if !params.is_empty() {
            conv.attrs
                .push(("activation_params".to_string(), AttrValue::Floats(params)));
        }
        conv.outputs[0] = Some(out);
        for i in gone {
            drop[i] = true;
        }
        count += 1;
    }
    remove_nodes(g, &drop);
    Ok(count)
}

// ---------------------------------------------------------------- GELU

/// Whether `v` is a float32 one-element constant within `1e-4` (relative) of `want` whose rank
/// is at most `x`'s (0 when `x`'s rank is unknown), so that broadcasting it leaves `x`'s shape.
fn const_near(g: &Graph, v: Option<ValueId>, want: f32, x: ValueId) -> bool {
    let x_rank = g.values[x].ty.tensor_shape().map_or(0, |s| s.len());
    let rank_ok = v
        .and_then(|v| const_of(g, v))
        .is_some_and(|t| t.shape().len() <= x_rank);
    rank_ok && scalar_const(g, v).is_some_and(|c| (c - want).abs() <= 1e-4 * want.abs())
}

/// A two-input node's other operand: the one that is not `v`.
fn other_input(n: &Node, v: ValueId) -> Option<Option<ValueId>> {
    match n.inputs.as_slice() {
        [Some(a), b] if *a == v => Some(*b),
        [a, Some(b)] if *b == v => Some(*a),
        _ => None,
    }
}

/// The sole reader of `v` if it is the two-input op `op`, with its other operand.
fn binary_reader(
    g: &Graph,
    readers: &[usize],
    v: ValueId,
    op: &str,
) -> Option<(usize, Option<ValueId>)> {
    let i = sole_reader(g, readers, v)?;
    let n = &g.nodes[i];
    if !is_op(n, op) || n.inputs.len() != 2 {
        return None;
    }
    Some((i, other_input(n, v)?))
}

/// The erf GELU spelled out around an `Erf` node at `ei`: `d = x / sqrt2` (or `x * 1/sqrt2`),
/// `e = Erf(d)`, `a = e + 1`, then either `(x * a) * 0.5`, `(x * 0.5) * a` or `x * (a * 0.5)`
/// (operands in either order). Every intermediate is read only inside the chain. Returns `x`,
/// the chain's nodes (the last one writes the result) and the result.
///
/// The tanh approximation the same way around a `Tanh` node: its input is `sqrt(2/pi) * (x +
/// 0.044715 x^3)`, the cube spelled any way [`monomial`] reads (`x * x * x * c`, `Pow(x, 3)`,
/// in any grouping). Returns also whether it is the tanh form.
fn gelu_parts(
    g: &Graph,
    readers: &[usize],
    ei: usize,
) -> Option<(ValueId, Vec<usize>, ValueId, bool)> {
    let erf = &g.nodes[ei];
    let tanh = is_op(erf, "Tanh");
    if !is_op(erf, "Erf") && !tanh {
        return None;
    }
    let d = erf.inputs.first().copied().flatten()?;
    let e = out0(erf)?;
    // the scaling of x: the only producer of d
    let di = g.nodes.iter().position(|n| out0(n) == Some(d))?;
    let dn = &g.nodes[di];
    if readers[d] != 1 || dn.inputs.len() != 2 {
        return None;
    }
    let mut head = vec![di, ei];
    let x = if tanh {
        // sqrt(2/pi) * (x + 0.044715 x^3), operands in either order
        const K: f32 = 0.797_884_6; // sqrt(2 / pi)
        let (k, s) = match dn.inputs.as_slice() {
            [a, Some(b)] if scalar_const(g, *a).is_some() => (*a, *b),
            [Some(a), b] => (*b, *a),
            _ => return None,
        };
        let si = g.nodes.iter().position(|n| out0(n) == Some(s))?;
        let sn = &g.nodes[si];
        if !is_op(dn, "Mul") || !is_op(sn, "Add") || readers[s] != 1 || sn.inputs.len() != 2 {
            return None;
        }
        // x is the Add operand whose partner is 0.044715 x^3
        let [Some(p), Some(q)] = sn.inputs[..] else {
            return None;
        };
        let (x, cube) = [(p, q), (q, p)].into_iter().find_map(|(x, c)| {
            let (coef, pow, nodes) = monomial(g, readers, c, x, 0)?;
            let ok = pow == 3 && (coef - 0.044_715).abs() <= 1e-4 * 0.044_715;
            ok.then_some((x, nodes))
        })?;
        if !const_near(g, k, K, x) {
            return None;
        }
        head.extend(cube);
        head.push(si);
        x
    } else {
        let x = dn.inputs[0]?;
        let scaled = (is_op(dn, "Div")
            && const_near(g, dn.inputs[1], core::f32::consts::SQRT_2, x))
            || (is_op(dn, "Mul")
                && const_near(g, dn.inputs[1], core::f32::consts::FRAC_1_SQRT_2, x));
        if !scaled {
            return None;
        }
        x
    };
    if !is_f32(g, x) {
        return None;
    }
    let (ai, one) = binary_reader(g, readers, e, "Add")?;
    let a = out0(&g.nodes[ai])?;
    if !const_near(g, one, 1.0, x) {
        return None;
    }
    let (mi, other) = binary_reader(g, readers, a, "Mul")?;
    let m = out0(&g.nodes[mi])?;
    let tail = if other == Some(x) {
        // (x * a) * 0.5
        let (li, half) = binary_reader(g, readers, m, "Mul")?;
        const_near(g, half, 0.5, x).then_some(vec![mi, li])
    } else if const_near(g, other, 0.5, x) {
        // x * (a * 0.5)
        let (li, xx) = binary_reader(g, readers, m, "Mul")?;
        (xx == Some(x)).then_some(vec![mi, li])
    } else {
        // (x * 0.5) * a: `other` is x * 0.5, read only here
        let h = other?;
        let hi = g.nodes.iter().position(|n| out0(n) == Some(h))?;
        let hn = &g.nodes[hi];
        let half = other_input(hn, x)?;
        (readers[h] == 1 && is_op(hn, "Mul") && const_near(g, half, 0.5, x)).then_some(vec![hi, mi])
    }?;
    let last = *tail.last()?;
    let y = out0(&g.nodes[last])?;
    let mut nodes = head;
    nodes.push(ai);
    nodes.extend(tail);
    // the result must be the last of the chain in graph order (it replaces that node)
    if nodes.iter().any(|&i| i > last) || !is_f32(g, y) {
        return None;
    }
    Some((x, nodes, y, tanh))
}

/// `v` as `coef * x^pow` when it is computed from `x` and one-element constants (of rank at most
/// x's) by `Mul`, `Div` by a constant and `Pow` by a small integer constant only, each
/// intermediate read once: `(coef, pow, the nodes)`.
fn monomial(
    g: &Graph,
    readers: &[usize],
    v: ValueId,
    x: ValueId,
    depth: usize,
) -> Option<(f32, u32, Vec<usize>)> {
    if v == x {
        return Some((1.0, 1, Vec::new()));
    }
    if let Some(c) = scalar_const(g, Some(v)) {
        return const_near(g, Some(v), c, x).then_some((c, 0, Vec::new()));
    }
    if depth > 6 || readers[v] != 1 {
        return None;
    }
    let ni = g.nodes.iter().position(|n| out0(n) == Some(v))?;
    let n = &g.nodes[ni];
    let [Some(a), Some(b)] = n.inputs[..] else {
        return None;
    };
    let (ca, pa, mut na) = monomial(g, readers, a, x, depth + 1)?;
    let (coef, pow, nb) = if is_op(n, "Mul") {
        let (cb, pb, nb) = monomial(g, readers, b, x, depth + 1)?;
        (ca * cb, pa + pb, nb)
    } else if is_op(n, "Div") {
        let c = scalar_const(g, Some(b)).filter(|&c| c != 0.0 && const_near(g, Some(b), c, x))?;
        (ca / c, pa, Vec::new())
    } else if is_op(n, "Pow") {
        let e = scalar_const(g, Some(b)).filter(|&e| [1.0, 2.0, 3.0, 4.0].contains(&e))?;
        let e = e as u32;
        ((0..e).fold(1.0, |p, _| p * ca), pa * e, Vec::new())
    } else {
        return None;
    };
    na.extend(nb);
    na.push(ni);
    Some((coef, pow, na))
}

fn gelu(g: &mut Graph) -> usize {
    let mut count = 0;
    let readers = reader_counts(g);
    let mut drop = vec![false; g.nodes.len()];
    for ei in 0..g.nodes.len() {
        let Some((x, nodes, y, tanh)) = gelu_parts(g, &readers, ei) else {
            continue;
        };
        if nodes.iter().any(|&i| drop[i]) {
            continue;
        }
        let last = *nodes.last().expect("a chain of five nodes");
        let fused = Node {
            name: alloc::format!("{}/Gelu", g.nodes[ei].name),
            op_type: "Gelu".to_string(),
            domain: String::new(),
            opset: 20,
            inputs: vec![Some(x)],
            outputs: vec![Some(y)],
            attrs: if tanh {
                vec![(
                    "approximate".to_string(),
                    AttrValue::String(b"tanh".to_vec()),
                )]
            } else {
                Vec::new()
            },
            implicit_inputs: Vec::new(),
        };
        for &i in &nodes {
            drop[i] = true;
        }
        drop[last] = false;
        g.nodes[last] = fused;
        count += nodes.len() - 1;
    }
    remove_nodes(g, &drop);
    count
}
