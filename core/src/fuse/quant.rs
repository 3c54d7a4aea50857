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
//! **Mixture of experts**: `MatMul(X, Gather(DequantizeLinear(W[E, K, N]), experts))`, the
//! expert-gather pattern of a router (TopK) in standard ops, becomes `nxrt:GatherMatMulNBits`
//! over every expert's 8-bit codes: each product reads only the selected expert's weights,
//! where the graph as written dequantizes all E experts and copies the selected ones.

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use super::{const_of, new_value, reader_counts, set_init, sole_reader};
use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::{AttrValue, Graph, Node, ValueId};
use crate::kernels::elementwise::decode_raw;
use crate::tensor::Tensor;

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
