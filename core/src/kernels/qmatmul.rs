//! MatMulInteger, QLinearMatMul, com.microsoft QGemm and com.microsoft MatMulIntegerToFloat
//! (the integer product scaled to float, plus a bias) on the integer product ([`simd::qgemm`])
//! for the shapes
//! quantized models use: `A` of any rank times a 2-D `B` (the weights, packed at load when
//! constant), scalar zero point and scale of `A`, per-tensor or per-column ones of `B`.
//! Everything else (batched `B`, per-row scales of `A`) goes to the general kernels.
//!
//! `A`'s rows are the signed operand (uint8 moved by -128 with its zero point), `B`'s columns
//! the unsigned one (int8 moved by +128), so every sum is exact; see [`simd::qgemm`].

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::Node;
use crate::kernels::nn::{q8_bytes, q8_key};
use crate::kernels::par::par_chunks_mut;
use crate::kernels::{opt_tensor_in, out1, tensor_in};
use crate::provider::{Kernel, KernelCx};
use crate::simd::{self, qcols_pack, qrows_pack_on, Isa, QEpi, QGemm, QGeom, QOut, QVec};
use crate::tensor::Tensor;
use crate::value::Value;

/// `B` packed for the products: its geometry, bytes, column sums and zero points (moved like
/// the bytes), all per-column vectors padded to whole groups.
struct PackedB {
    g: QGeom,
    b: Vec<u8>,
    colsum: Vec<i32>,
    zp: Vec<i32>,
}

impl PackedB {
    /// `b` is `[K, N]`, or `[N, K]` with `trans`.
    fn new(b: &Tensor, zp: Option<&Tensor>, isa: Isa, trans: bool) -> Option<PackedB> {
        if b.rank() != 2 {
            return None;
        }
        let (k, n) = if trans {
            (b.shape()[1], b.shape()[0])
        } else {
            (b.shape()[0], b.shape()[1])
        };
        let (bytes, signed) = q8_bytes(b).ok()?;
        let bytes = if trans {
            transposed(&bytes, n, k)
        } else {
            bytes.into_owned()
        };
        let z: Vec<i64> = match zp {
            None => vec![0],
            Some(z) if z.dtype() == b.dtype() && (z.len() == 1 || z.shape() == [n]) => {
                z.to_i64_vec().ok()?
            }
            Some(_) => return None,
        };
        let g = simd::qgeom(isa, k, n);
        let flip = if signed { 0x80 } else { 0 };
        let mut packed = vec![0u8; g.packed_len()];
        let mut colsum = vec![0i32; g.np()];
        qcols_pack(&g, &bytes, n, flip, &mut packed, Some(&mut colsum));
        let shift = if signed { 128 } else { 0 };
        let mut zpv: Vec<i32> = (0..n)
            .map(|j| z[if z.len() == 1 { 0 } else { j }] as i32 + shift)
            .collect();
        zpv.resize(g.np(), 0);
        Some(PackedB {
            g,
            b: packed,
            colsum,
            zp: zpv,
        })
    }
}

/// The `cols x rows` transpose of `rows x cols` bytes.
fn transposed(v: &[u8], rows: usize, cols: usize) -> Vec<u8> {
    let mut t = vec![0u8; v.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = v[r * cols + c];
        }
    }
    t
}

/// [`q8_key`] of an optional input (`(0, 0)` for none).
fn key_of(t: Option<&Tensor>) -> Option<(usize, usize)> {
    t.map_or(Some((0, 0)), q8_key)
}

/// com.microsoft QGemm's attributes.
#[derive(Clone, Copy)]
struct GemmAttrs {
    alpha: f32,
    trans_a: bool,
    trans_b: bool,
}

/// MatMulInteger (`qlinear` false), QLinearMatMul, or QGemm (`gemm`).
#[allow(clippy::type_complexity)]
pub(crate) struct QMatMul {
    qlinear: bool,
    /// com.microsoft MatMulIntegerToFloat: inputs `A, B, a_scale, b_scale, a_zero_point,
    /// b_zero_point, bias`.
    to_float: bool,
    gemm: Option<GemmAttrs>,
    /// What takes the shapes the integer product does not (QGemm has none).
    general: Option<Box<dyn Kernel>>,
    /// `B` packed at load: the keys of B and its zero point, the instruction set it was
    /// packed for, the packing.
    packed: Option<([(usize, usize); 2], Isa, PackedB)>,
}

pub(crate) fn build(general: Box<dyn Kernel>, _node: &Node, qlinear: bool) -> Box<dyn Kernel> {
    Box::new(QMatMul {
        qlinear,
        to_float: false,
        gemm: None,
        general: Some(general),
        packed: None,
    })
}

pub(crate) const KERNELS: &[crate::provider::KernelDef] = &[
    crate::kernels::def_in("com.microsoft", "QGemm", 1, 1, build_qgemm)
        .types(&[DataType::Uint8, DataType::Int8]),
    crate::kernels::def_in(
        "com.microsoft",
        "MatMulIntegerToFloat",
        1,
        1,
        build_to_float,
    )
    .types(&[DataType::Uint8, DataType::Int8]),
];

/// com.microsoft MatMulIntegerToFloat: `(A - a_zero_point) (B - b_zero_point)` as
/// MatMulInteger computes it, times `a_scale * b_scale` (`a_scale` one value, `b_scale` one
/// or one per column of the output), plus `bias` (one per column). The float epilogue
/// converts the exact int32 sum, multiplies by the scale product and adds the bias: the same
/// roundings as MatMulInteger followed by Cast, Mul and Add.
fn build_to_float(node: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(QMatMul {
        qlinear: false,
        to_float: true,
        gemm: None,
        general: Some(crate::kernels::linalg::build_matmul_integer(node)?),
        packed: None,
    }))
}

/// MatMulIntegerToFloat's per-column scale (`a_scale * b_scale`, `n` values) and bias (`n`
/// values, zero without one), or an error naming what does not fit.
fn to_float_params(inputs: &[Option<&Value>], n: usize) -> Result<(Vec<f32>, Vec<f32>)> {
    let a_s = tensor_in(inputs, 2)?;
    let b_s = tensor_in(inputs, 3)?;
    let bias = opt_tensor_in(inputs, 6)?;
    let float = |t: &Tensor| t.dtype() == DataType::Float;
    if !float(a_s) || a_s.len() != 1 {
        crate::unsupported!(
            "MatMulIntegerToFloat: a_scale of type {} and shape {:?} (one float32 value)",
            a_s.dtype(),
            a_s.shape()
        )
    }
    if !float(b_s) || !(b_s.len() == 1 || b_s.shape() == [n]) {
        crate::unsupported!(
            "MatMulIntegerToFloat: b_scale of type {} and shape {:?} for {n} columns",
            b_s.dtype(),
            b_s.shape()
        )
    }
    if let Some(b) = bias.filter(|b| !float(b) || b.shape() != [n]) {
        crate::unsupported!(
            "MatMulIntegerToFloat: bias of type {} and shape {:?} for {n} columns",
            b.dtype(),
            b.shape()
        )
    }
    let a_s = a_s.as_slice::<f32>()?[0];
    let b_s = b_s.as_slice::<f32>()?;
    let scale = (0..n)
        .map(|j| a_s * b_s[if b_s.len() == 1 { 0 } else { j }])
        .collect();
    let bias = match bias {
        Some(b) => b.as_slice::<f32>()?.to_vec(),
        None => vec![0.0; n],
    };
    Ok((scale, bias))
}

fn build_qgemm(node: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(QMatMul {
        qlinear: true,
        to_float: false,
        gemm: Some(GemmAttrs {
            alpha: node.get_f("alpha", 1.0)?,
            trans_a: node.get_i("transA", 0)? != 0,
            trans_b: node.get_i("transB", 0)? != 0,
        }),
        general: None,
        packed: None,
    }))
}

impl QMatMul {
    fn b_inputs(&self) -> (usize, usize) {
        if self.qlinear {
            (3, 5)
        } else if self.to_float {
            (1, 5)
        } else {
            (1, 3)
        }
    }

    /// The product on the integer kernels, or `None` for shapes it does not take.
    fn fast(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Option<Tensor>> {
        let (bi, bzi) = self.b_inputs();
        let a0 = tensor_in(inputs, 0)?;
        let b = tensor_in(inputs, bi)?;
        let bzp = opt_tensor_in(inputs, bzi)?;
        let azp = opt_tensor_in(inputs, if self.to_float { 4 } else { 2 })?;
        let g = self.gemm;
        let trans_b = g.is_some_and(|g| g.trans_b);
        let a_t;
        let a = match g {
            Some(GemmAttrs { trans_a: true, .. }) if a0.rank() == 2 => {
                a_t = a0.permute(&[1, 0])?.contiguous()?;
                &a_t
            }
            _ => a0,
        };
        let kb = if trans_b { 1 } else { 0 };
        if a.rank() == 0 || b.rank() != 2 || a.shape()[a.rank() - 1] != b.shape()[kb] {
            return Ok(None);
        }
        if azp.is_some_and(|z| z.len() != 1 || z.dtype() != a.dtype()) {
            return Ok(None);
        }
        let q_isa = simd::q4_isa().0;
        let owned;
        let pb = match &self.packed {
            Some((keys, i, p))
                if *i == q_isa && [key_of(Some(b)), key_of(bzp)] == keys.map(Some) =>
            {
                p
            }
            _ => match PackedB::new(b, bzp, q_isa, trans_b) {
                Some(p) => {
                    owned = p;
                    &owned
                }
                None => return Ok(None),
            },
        };
        let (k, n) = (pb.g.k, pb.g.n);
        let m = a.len() / k.max(1);
        // requantization of QLinearMatMul: scalar scales of A and Y, B's per tensor or column
        // QGemm: bias (int32, per column or one), optional output scale and zero point
        let (ys_i, yzp_i) = if g.is_some() { (7, 8) } else { (6, 7) };
        let bias: Option<Vec<i32>> =
            match g.map(|_| opt_tensor_in(inputs, 6)).transpose()?.flatten() {
                Some(c) if c.dtype() == DataType::Int32 && (c.len() == 1 || c.len() == n) => {
                    let v = c.as_slice::<i32>()?;
                    Some(
                        (0..n)
                            .map(|j| v[if v.len() == 1 { 0 } else { j }])
                            .collect(),
                    )
                }
                Some(c) => {
                    crate::unsupported!(
                        "QGemm: bias C of type {} and shape {:?}",
                        c.dtype(),
                        c.shape()
                    )
                }
                None => None,
            };
        let y_s = if self.qlinear {
            opt_tensor_in(inputs, ys_i)?
        } else {
            None
        };
        let alpha = g.map_or(1.0, |g| g.alpha);
        let mut float_bias = None;
        let col_scale = if self.qlinear {
            let a_s = tensor_in(inputs, 1)?;
            let b_s = tensor_in(inputs, 4)?;
            if [a_s, b_s].iter().any(|t| t.dtype() != DataType::Float)
                || a_s.len() != 1
                || !(b_s.len() == 1 || b_s.shape() == [n])
                || y_s.is_some_and(|y| y.len() != 1 || y.dtype() != DataType::Float)
            {
                return Ok(None);
            }
            let a_s = a_s.to_f32_vec()?[0];
            let b_s = b_s.to_f32_vec()?;
            let y_s = y_s.map_or(Ok(1.0), |y| y.to_f32_vec().map(|v| v[0]))?;
            let mut mult: Vec<f32> = (0..n)
                .map(|j| alpha * a_s * b_s[if b_s.len() == 1 { 0 } else { j }] / y_s)
                .collect();
            mult.resize(pb.g.np(), 0.0);
            Some(mult)
        } else if self.to_float {
            let (mut scale, mut bias) = to_float_params(inputs, n)?;
            scale.resize(pb.g.np(), 0.0);
            bias.resize(pb.g.np(), 0.0);
            float_bias = Some(bias);
            Some(scale)
        } else {
            None
        };
        let rq = if let (Some(mult), Some(_)) = (&col_scale, y_s) {
            let mult = mult.clone();
            let y_zp = opt_tensor_in(inputs, yzp_i)?;
            if y_zp.is_some_and(|z| z.len() != 1) {
                return Ok(None);
            }
            let out_dt = y_zp.map_or(a.dtype(), |z| z.dtype());
            let zp = y_zp.map_or(Ok(0.0), |z| z.to_i64_vec().map(|v| v[0] as f32))?;
            let (lo, hi) = match out_dt {
                DataType::Uint8 => (0.0, 255.0),
                DataType::Int8 => (-128.0, 127.0),
                _ => return Ok(None),
            };
            Some((mult, zp, lo, hi, out_dt))
        } else {
            None
        };
        let (ab, a_signed) = q8_bytes(a)?;
        let za = azp.map_or(Ok(0), |z| z.to_i64_vec().map(|v| v[0] as i32))?;
        let (flip, za) = if a_signed { (0, za) } else { (0x80, za - 128) };
        let mut rows = vec![0u8; m * pb.g.ka()];
        let mut rowsum = vec![0i32; m];
        qrows_pack_on(q_isa, &pb.g, &ab, m, k, flip, &mut rows, &mut rowsum);
        // -za * colsum(B) + K * za * zb, and -zb * rowsum(A)
        let col_add: Vec<i32> = (0..pb.g.np())
            .map(|j| {
                -za * pb.colsum[j]
                    + k as i32 * za * pb.zp[j]
                    + bias.as_ref().and_then(|b| b.get(j)).copied().unwrap_or(0)
            })
            .collect();
        let nzb: Vec<i32> = pb.zp.iter().map(|z| -z).collect();
        let p = QGemm {
            m,
            g: pb.g,
            a: &rows,
            b: &pb.b,
        };
        let mut e = QEpi {
            col_add: Some(&col_add),
            cross: Some((&nzb, &rowsum)),
            ..Default::default()
        };
        let mut shape = a.shape()[..a.rank() - 1].to_vec();
        shape.push(n);
        let per = (m.div_ceil(cx.cpu.threads().max(1))).max(1);
        let chunk = per * n;
        // multiply-adds per output (the unit of the pool's wake-up threshold)
        let work = k.max(1);
        Ok(Some(match rq {
            Some((mult, zp, lo, hi, out_dt)) => {
                e.scale = Some(QVec::Col(&mult));
                let mut y = vec![0u8; m * n];
                par_chunks_mut(cx.cpu, &mut y, chunk, work, &|ci, c| {
                    let r0 = ci * per;
                    let r1 = r0 + c.len() / n;
                    let out = QOut::Q8 { y: c, zp, lo, hi };
                    simd::qgemm_rows_on(q_isa, &p, &e, r0, r1, out, n);
                });
                crate::kernels::qlinear::q8_tensor(out_dt, &shape, y)?
            }
            None if col_scale.is_some() => {
                // QGemm without an output scale, MatMulIntegerToFloat: float
                e.scale = col_scale.as_deref().map(QVec::Col);
                e.bias = float_bias.as_deref().map(QVec::Col);
                let mut y = vec![0f32; m * n];
                par_chunks_mut(cx.cpu, &mut y, chunk, work, &|ci, c| {
                    let r0 = ci * per;
                    let r1 = r0 + c.len() / n;
                    simd::qgemm_rows_on(q_isa, &p, &e, r0, r1, QOut::F32(c), n);
                });
                Tensor::from_vec(&shape, y)?
            }
            None => {
                let mut y = vec![0i32; m * n];
                par_chunks_mut(cx.cpu, &mut y, chunk, work, &|ci, c| {
                    let r0 = ci * per;
                    let r1 = r0 + c.len() / n;
                    simd::qgemm_rows_on(q_isa, &p, &e, r0, r1, QOut::I32(c), n);
                });
                Tensor::from_vec(&shape, y)?
            }
        }))
    }
}

impl Kernel for QMatMul {
    fn prepare(&mut self, consts: &[Option<&Tensor>]) -> usize {
        let (bi, bzi) = self.b_inputs();
        let c = |i: usize| consts.get(i).copied().flatten();
        let Some(b) = c(bi) else { return 0 };
        let isa = simd::q4_isa().0;
        let (Some(kb), Some(kz)) = (key_of(Some(b)), key_of(c(bzi))) else {
            return 0;
        };
        let trans_b = self.gemm.is_some_and(|g| g.trans_b);
        let Some(p) = PackedB::new(b, c(bzi), isa, trans_b) else {
            return 0;
        };
        let bytes = p.b.len() + 8 * p.colsum.len();
        self.packed = Some(([kb, kz], isa, p));
        bytes
    }

    fn compute(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        match (self.fast(cx, inputs)?, &self.general) {
            (Some(t), _) => out1(t),
            (None, Some(g)) if self.to_float => {
                // the integer product of the general kernel, then the float epilogue
                let ins = [0, 1, 4, 5].map(|i| inputs.get(i).copied().flatten());
                let y = g.compute(cx, &ins)?;
                let Some(y) = y.first() else {
                    crate::bail!("MatMulIntegerToFloat: no product")
                };
                let y = y.as_tensor()?;
                let n = y.shape().last().copied().unwrap_or(1).max(1);
                let (scale, bias) = to_float_params(inputs, n)?;
                let f: Vec<f32> = y
                    .as_slice::<i32>()?
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| v as f32 * scale[i % n] + bias[i % n])
                    .collect();
                out1(Tensor::from_vec(y.shape(), f)?)
            }
            (None, Some(g)) => g.compute(cx, inputs),
            (None, None) => crate::unsupported!(
                "QGemm: these shapes and quantization parameters are not supported"
            ),
        }
    }
}
