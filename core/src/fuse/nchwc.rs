//! The blocked channel layout (NCHWc) for chains of 2-D convolutions, on the CPU.
//!
//! A depthwise convolution over NCHW planes reads each channel's plane on its own, through
//! stride phases and padding; a pointwise one is a GEMM whose output must be scattered back
//! into planes. Held as [N, C/16, H, W, 16] (16 channels of a position side by side, see
//! `simd::nchwc`), every tap of a depthwise convolution is one vector multiply-add and a
//! pointwise or full convolution broadcasts each input value against a vector of 16 output
//! channels. The rewrite here moves convolution chains into that layout:
//!
//! - A convolution (`Conv`, `com.microsoft:FusedConv`) with constant 4-D weights becomes
//!   `nxrt:Conv` when it is group 1 and its input is already blocked, its output feeds another
//!   such convolution or it has fewer than 16 input channels (a stem: a group-1 convolution
//!   reads plain NCHW too), or when it is depthwise and its input is already blocked. Its
//!   weights and bias are blocked once, here. It writes the blocked form of its output when a
//!   reader may take it (a convolution or one of the ops below), else the plain form itself
//!   (`plain_output`), row segment by row segment from cache, with no blocked tensor between.
//! - Element-wise activations, and Add/Mul/Sub/Div of two blocked values with the same
//!   channels (or of a blocked value and a one-element constant, in either order), run on
//!   the blocked values
//!   (the layout is the same for both operands, so broadcasting over N, H, W is unchanged);
//!   GlobalAveragePool becomes `nxrt:GlobalAveragePool`.
//! - Any other reader of a value, a graph output, or a subgraph capture gets the plain value
//!   back through one `nxrt:ReorderOutput`, made once, before its first such reader.
//!
//! The padding channels of a block are written by every producer (zero weights and bias give
//! `act(0)`) and read by no kernel that mixes channels: a group-1 convolution sums over the real
//! input channels only.

use super::*;
use crate::simd::NCHWC;

const DOMAIN: &str = "nxrt";

/// Element-wise ops that run unchanged on the blocked form.
const UNARY: &[&str] = &[
    "Relu",
    "Sigmoid",
    "Tanh",
    "HardSigmoid",
    "HardSwish",
    "LeakyRelu",
    "Clip",
];
const BINARY: &[&str] = &["Add", "Mul", "Sub", "Div"];

#[derive(Clone, Copy, PartialEq, Eq)]
enum ConvKind {
    GroupOne,
    Depthwise,
}

fn rank_of(g: &Graph, v: ValueId) -> Option<usize> {
    match &g.values[v].ty {
        TypeInfo::Tensor {
            shape: Some(s),
            dtype: Some(DataType::Float),
        } => Some(s.len()),
        _ => None,
    }
}

/// Whether `n` is a 2-D float convolution with constant weights (and bias) that the blocked
/// kernels take, and which kind.
fn conv_kind(g: &Graph, n: &Node) -> Option<ConvKind> {
    if !is_conv(n) || n.outputs.len() != 1 || n.inputs.len() > 4 {
        return None;
    }
    if n.inputs.len() == 4 && n.domain.is_empty() {
        return None;
    }
    let x = n.inputs.first().copied().flatten()?;
    let y = out0(n)?;
    if rank_of(g, x) != Some(4) || !is_f32(g, y) {
        return None;
    }
    let w = const_of(g, n.inputs.get(1).copied().flatten()?)?;
    let ws = w.shape();
    if w.dtype() != DataType::Float || ws.len() != 4 || ws.contains(&0) {
        return None;
    }
    if let Some(b) = n.inputs.get(2).copied().flatten() {
        let b = const_of(g, b)?;
        if b.dtype() != DataType::Float || b.len() != ws[0] {
            return None;
        }
    }
    match n.get_i("group", 1).ok()? {
        1 => Some(ConvKind::GroupOne),
        gr if gr as usize == ws[0] && ws[1] == 1 => Some(ConvKind::Depthwise),
        _ => None,
    }
}

/// Weights [M, C/group, kh, kw] as [ceil(M/16), C/group, kh, kw, 16], the bias as ceil(M/16)*16
/// values, zero past M.
fn block_weights(w: &Tensor, b: Option<&Tensor>) -> Result<(Tensor, Tensor)> {
    let ws = w.shape();
    let (m, per) = (ws[0], ws[1] * ws[2] * ws[3]);
    let mb = m.div_ceil(NCHWC);
    let wv = w.as_slice::<f32>()?;
    let mut out = vec![0f32; mb * per * NCHWC];
    for oc in 0..m {
        let (blk, lane) = (oc / NCHWC, oc % NCHWC);
        for k in 0..per {
            out[(blk * per + k) * NCHWC + lane] = wv[oc * per + k];
        }
    }
    let mut bias = vec![0f32; mb * NCHWC];
    if let Some(b) = b {
        bias[..m].copy_from_slice(&b.as_slice::<f32>()?);
    }
    Ok((
        Tensor::from_vec(&[mb, ws[1], ws[2], ws[3], NCHWC], out)?,
        Tensor::from_vec(&[mb * NCHWC], bias)?,
    ))
}

fn blocked_value(g: &mut Graph, of: ValueId) -> ValueId {
    let name = alloc::format!("{}/nchwc", g.values[of].name);
    g.values.push(crate::ir::ValueInfo {
        name,
        ty: TypeInfo::Tensor {
            dtype: Some(DataType::Float),
            shape: None,
        },
    });
    g.values.len() - 1
}

fn layout_node(name: String, op: &str, inputs: Vec<Option<ValueId>>, out: ValueId) -> Node {
    Node {
        name,
        op_type: op.to_string(),
        domain: DOMAIN.to_string(),
        opset: 1,
        inputs,
        outputs: vec![Some(out)],
        attrs: Vec::new(),
        implicit_inputs: Vec::new(),
    }
}

/// Rewrites the convolution chains of `g` (not its subgraphs) into the blocked layout.
/// Returns how many convolutions now run blocked.
pub fn block_convolutions(g: &mut Graph) -> Result<usize> {
    let nv = g.values.len();
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); nv];
    for (i, n) in g.nodes.iter().enumerate() {
        for &v in n.inputs.iter().flatten().chain(&n.implicit_inputs) {
            readers[v].push(i);
        }
    }
    let kinds: Vec<Option<ConvKind>> = g.nodes.iter().map(|n| conv_kind(g, n)).collect();
    // the nodes that may run on blocked values (see the rules above)
    let may_block: Vec<bool> = g
        .nodes
        .iter()
        .zip(&kinds)
        .map(|(n, k)| {
            k.is_some()
                || (n.domain.is_empty()
                    && (UNARY.contains(&n.op_type.as_str())
                        || BINARY.contains(&n.op_type.as_str())
                        || n.op_type == "GlobalAveragePool"))
        })
        .collect();
    // the blocked form of a value (its id, its channels) and whether the plain one is made
    let mut blocked: Vec<Option<(ValueId, usize)>> = vec![None; nv];
    let mut plain = vec![true; nv];
    let mut replaced: Vec<ValueId> = Vec::new();
    let mut count = 0;
    let nodes = core::mem::take(&mut g.nodes);
    let mut out: Vec<Node> = Vec::with_capacity(nodes.len() + 8);
    for (i, node) in nodes.into_iter().enumerate() {
        let in0 = node.inputs.first().copied().flatten();
        let b0 = in0.and_then(|v| blocked[v]);
        let y = out0(&node);
        // a convolution into the blocked layout
        if let (Some(kind), Some(x), Some(y)) = (kinds[i], in0, y) {
            let feeds_conv = readers[y].iter().any(|&r| kinds[r].is_some());
            // whether a reader may take the blocked form; if none, the convolution writes its
            // output plain itself
            let blocked_reader = readers[y].iter().any(|&r| may_block[r]);
            let z = node.inputs.get(3).copied().flatten();
            let zb = z.and_then(|z| blocked[z]);
            // fewer input channels than a block (a stem): its register tiles read the plain
            // input directly and beat the plain kernel even with nothing blocked around it
            let stem = node.inputs[1]
                .and_then(|w| const_of(g, w))
                .is_some_and(|w| w.shape()[1] < NCHWC);
            let take = match kind {
                ConvKind::GroupOne => b0.is_some() || feeds_conv || stem,
                ConvKind::Depthwise => b0.is_some(),
            } && (z.is_none() || zb.is_some());
            if take {
                let w_id = node.inputs[1].expect("conv_kind checked W");
                let b_id = node.inputs.get(2).copied().flatten();
                let w = const_of(g, w_id).expect("conv_kind checked W").clone();
                let m = w.shape()[0];
                let b = b_id.and_then(|b| const_of(g, b)).cloned();
                let (wb, bb) = block_weights(&w, b.as_ref())?;
                let wv = new_value(g, alloc::format!("{}/nchwc_w", node.name));
                set_init(g, wv, wb);
                let bv = new_value(g, alloc::format!("{}/nchwc_b", node.name));
                set_init(g, bv, bb);
                replaced.push(w_id);
                replaced.extend(b_id);
                let plain_out = !blocked_reader;
                let yb = if plain_out { y } else { blocked_value(g, y) };
                let xin = b0.map_or(x, |(v, _)| v);
                let mut inputs = vec![Some(xin), Some(wv), Some(bv)];
                if let Some((zv, _)) = zb {
                    inputs.push(Some(zv));
                }
                let mut n = layout_node(node.name.clone(), "Conv", inputs, yb);
                n.attrs = node.attrs.clone();
                n.attrs
                    .push(("channels".to_string(), AttrValue::Int(m as i64)));
                if plain_out {
                    n.attrs
                        .push(("plain_output".to_string(), AttrValue::Int(1)));
                } else {
                    blocked[y] = Some((yb, m));
                    plain[y] = false;
                }
                out.push(n);
                count += 1;
                continue;
            }
        }
        // element-wise ops and GlobalAveragePool on blocked values; a binary op's blocked
        // operand may be either one when the other is a one-element constant (`Mul(a, x)`)
        let scalar = |v: Option<ValueId>| {
            v.and_then(|v| const_of(g, v))
                .is_some_and(|t| t.len() == 1 && t.shape().len() <= 4)
        };
        let binary_op = node.domain.is_empty()
            && BINARY.contains(&node.op_type.as_str())
            && node.inputs.len() == 2;
        let in1 = node.inputs.get(1).copied().flatten();
        // (the blocked operand's position, its blocked form and channels)
        let lead = match (b0, in1.and_then(|v| blocked[v])) {
            (Some(b), _) => Some((0, b)),
            (None, Some(b)) if binary_op && scalar(in0) => Some((1, b)),
            _ => None,
        };
        if let (Some((pos, (xb, ch))), Some(y), true) = (lead, y, node.outputs.len() == 1) {
            let op = node.op_type.as_str();
            let unary = pos == 0 && node.domain.is_empty() && UNARY.contains(&op);
            let other = node.inputs.get(1 - pos).copied().flatten();
            let binary = binary_op
                && (scalar(other)
                    || other.is_some_and(|o| blocked[o].is_some_and(|(_, c)| c == ch)));
            let gap = pos == 0 && is_op(&node, "GlobalAveragePool");
            if unary || binary || gap {
                let yb = blocked_value(g, y);
                let mut n = node.clone();
                n.inputs[pos] = Some(xb);
                if binary {
                    let o = other.expect("checked");
                    if let Some((ob, _)) = blocked[o] {
                        n.inputs[1 - pos] = Some(ob);
                    }
                }
                if gap {
                    n.domain = DOMAIN.to_string();
                    n.opset = 1;
                }
                n.outputs = vec![Some(yb)];
                out.push(n);
                blocked[y] = Some((yb, ch));
                plain[y] = false;
                continue;
            }
        }
        // any other node reads plain values
        for &v in node.inputs.iter().flatten().chain(&node.implicit_inputs) {
            materialize(g, &mut out, &blocked, &mut plain, v);
        }
        out.push(node);
    }
    for k in 0..g.outputs.len() {
        let v = g.outputs[k];
        materialize(g, &mut out, &blocked, &mut plain, v);
    }
    g.nodes = out;
    // the plain weights that only blocked convolutions read are dropped
    if !replaced.is_empty() {
        let mut read = vec![false; g.values.len()];
        for n in &g.nodes {
            for &v in n.inputs.iter().flatten().chain(&n.implicit_inputs) {
                read[v] = true;
            }
        }
        for &v in g.outputs.iter().chain(&g.inputs) {
            read[v] = true;
        }
        g.initializers
            .retain(|(id, _)| read[*id] || !replaced.contains(id));
    }
    Ok(count)
}

/// Makes the plain form of `v` (from its blocked form) if it is not made yet.
fn materialize(
    g: &mut Graph,
    out: &mut Vec<Node>,
    blocked: &[Option<(ValueId, usize)>],
    plain: &mut [bool],
    v: ValueId,
) {
    if plain[v] {
        return;
    }
    let (vb, ch) = blocked[v].expect("a value without its plain form has a blocked one");
    let name = alloc::format!("{}/reorder", g.values[v].name);
    let mut n = layout_node(name, "ReorderOutput", vec![Some(vb)], v);
    n.attrs
        .push(("channels".to_string(), AttrValue::Int(ch as i64)));
    out.push(n);
    plain[v] = true;
}
