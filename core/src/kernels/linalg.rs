//! Kernel family linalg: MatMul, Gemm, MatMulInteger, QLinearMatMul, Einsum and Det.

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::Node;
use crate::kernels::types::{FLOATS, INT8, NUMERIC};
use crate::kernels::{
    bad_type, broadcast_shapes, def, opt_tensor_in, out1, tensor_in, Prepacked, LATEST, PREPACK_MAX,
};
use crate::provider::{Gemm, Kernel, KernelCx, KernelDef, Operand};
use crate::tensor::{gather_strided, Elem, Tensor};
use crate::value::Value;
use crate::{bail, unsupported};

pub(crate) const KERNELS: &[KernelDef] = &[
    def("MatMul", 1, LATEST, build_matmul).types(NUMERIC),
    def("Gemm", 1, LATEST, build_gemm).types(NUMERIC),
    def("MatMulInteger", 10, LATEST, build_matmul_integer_q).types(INT8),
    // scales and zero points are checked by the kernel
    def("QLinearMatMul", 10, LATEST, build_qlinear_matmul_q).types(INT8),
    def("Einsum", 12, LATEST, build_einsum).types(NUMERIC),
    def("Det", 11, LATEST, build_det).types(FLOATS),
];

// ----------------------------------------------------------------------------- numeric trait

/// Element types the matrix kernels compute in directly: `f32` (through the backend's SGEMM),
/// `f64` and the integers (wrapping arithmetic, like numpy). f16/bf16 are widened to f32.
pub(crate) trait Num: Elem + Copy + Send + Sync + PartialOrd + bytemuck::Pod {
    const ZERO: Self;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    /// The slice as `f32` when `Self` is `f32` (for kernels with an f32-only fast path).
    #[inline]
    fn as_f32(_s: &[Self]) -> Option<&[f32]> {
        None
    }
    /// [`as_f32`](Self::as_f32), mutably.
    #[inline]
    fn as_f32_mut(_s: &mut [Self]) -> Option<&mut [f32]> {
        None
    }
    /// `C = alpha*A*B + beta*C` (see [`Gemm`]); `f32` overrides this with the backend SGEMM.
    #[inline]
    fn gemm(_cx: &KernelCx<'_>, g: &Gemm, a: &[Self], b: &[Self], c: &mut [Self]) {
        gemm_generic(g, a, b, c)
    }
    /// `acc[i] = bias + sum over taps t of ws[t] * src[offs[t] + i]` (a direct convolution's
    /// taps over a padded plane); `f32` overrides this with the SIMD layer.
    #[inline]
    fn taps(ws: &[Self], offs: &[usize], src: &[Self], bias: Self, acc: &mut [Self]) {
        for (i, o) in acc.iter_mut().enumerate() {
            let mut a = bias;
            for (&w, &off) in ws.iter().zip(offs) {
                a = a.add(w.mul(src[off + i]));
            }
            *o = a;
        }
    }
}

impl Num for f32 {
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self + o
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        self * o
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    #[inline]
    fn as_f32(s: &[Self]) -> Option<&[f32]> {
        Some(s)
    }
    #[inline]
    fn as_f32_mut(s: &mut [Self]) -> Option<&mut [f32]> {
        Some(s)
    }
    #[inline]
    fn gemm(cx: &KernelCx<'_>, g: &Gemm, a: &[Self], b: &[Self], c: &mut [Self]) {
        if g.m == 0 || g.n == 0 {
            return;
        }
        cx.cpu.sgemm(g, a, b, c)
    }
    #[inline]
    fn taps(ws: &[Self], offs: &[usize], src: &[Self], bias: Self, acc: &mut [Self]) {
        crate::simd::conv_taps(ws, offs, src, bias, acc)
    }
}

impl Num for f64 {
    const ZERO: Self = 0.0;
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self + o
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        self * o
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v
    }
}

macro_rules! num_int {
    ($($t:ty),*) => {$(
        impl Num for $t {
            const ZERO: Self = 0;
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
        }
    )*};
}
num_int!(i8, i16, i32, i64, u8, u16, u32, u64);

/// Portable strided GEMM for any [`Num`] (rows of C are updated contiguously).
pub(crate) fn gemm_generic<T: Num>(g: &Gemm, a: &[T], b: &[T], c: &mut [T]) {
    let (m, n, k) = (g.m, g.n, g.k);
    if m == 0 || n == 0 {
        return;
    }
    let alpha_one = g.alpha == 1.0;
    let mut tmp = if alpha_one {
        Vec::new()
    } else {
        vec![T::ZERO; n]
    };
    for i in 0..m {
        let crow = &mut c[i * g.ldc..i * g.ldc + n];
        if g.beta == 0.0 {
            crow.iter_mut().for_each(|x| *x = T::ZERO);
        } else if g.beta != 1.0 {
            let beta = g.beta as f64;
            crow.iter_mut()
                .for_each(|x| *x = T::from_f64(beta * x.to_f64()));
        }
        let acc: &mut [T] = if alpha_one {
            crow
        } else {
            tmp.iter_mut().for_each(|x| *x = T::ZERO);
            &mut tmp
        };
        for p in 0..k {
            let av = a[(i as isize * g.a_rs + p as isize * g.a_cs) as usize];
            let base = p as isize * g.b_rs;
            if g.b_cs == 1 {
                let brow = &b[base as usize..base as usize + n];
                for (cv, &bv) in acc.iter_mut().zip(brow) {
                    *cv = cv.add(av.mul(bv));
                }
            } else {
                for (j, cv) in acc.iter_mut().enumerate() {
                    let bv = b[(base + j as isize * g.b_cs) as usize];
                    *cv = cv.add(av.mul(bv));
                }
            }
        }
        if !alpha_one {
            let alpha = g.alpha as f64;
            let crow = &mut c[i * g.ldc..i * g.ldc + n];
            for (cv, t) in crow.iter_mut().zip(&tmp) {
                *cv = T::from_f64(cv.to_f64() + alpha * t.to_f64());
            }
        }
    }
}

// ----------------------------------------------------------------------------- helpers

/// A float tensor widened to an f32 tensor of the same shape.
pub(crate) fn widen_f32(t: &Tensor) -> Result<Tensor> {
    Tensor::from_vec(t.shape(), t.to_f32_vec()?)
}

/// An f32 result narrowed back to `dt` (f16 or bf16).
pub(crate) fn narrow_f32(t: Tensor, dt: DataType) -> Result<Tensor> {
    let shape = t.shape().to_vec();
    let v = t.into_vec::<f32>()?;
    match dt {
        DataType::Float => Tensor::from_vec(&shape, v),
        DataType::Float16 => Tensor::from_vec(
            &shape,
            v.into_iter().map(half::f16::from_f32).collect::<Vec<_>>(),
        ),
        DataType::Bfloat16 => Tensor::from_vec(
            &shape,
            v.into_iter().map(half::bf16::from_f32).collect::<Vec<_>>(),
        ),
        other => unsupported!("cannot narrow f32 to {other}"),
    }
}

/// The matrices (last two axes) of a tensor of rank >= 2 as a contiguous tensor plus the
/// (row, column) strides that address them in it: contiguous tensors and transposed views
/// (last two axes swapped) are used in place, anything else is copied.
fn mat_layout(t: &Tensor) -> Result<(Tensor, isize, isize)> {
    let r = t.rank();
    let (rows, cols) = (t.shape()[r - 2], t.shape()[r - 1]);
    if t.is_contiguous() {
        return Ok((t.clone(), cols as isize, 1));
    }
    let mut perm: Vec<usize> = (0..r).collect();
    perm.swap(r - 2, r - 1);
    let sw = t.permute(&perm)?;
    if sw.is_contiguous() {
        return Ok((sw, 1, rows as isize));
    }
    Ok((t.contiguous()?, cols as isize, 1))
}

/// Linear indices into `from` (broadcast to `to`, both batch shapes) for every index of `to`.
fn broadcast_index_map(from: &[usize], to: &[usize]) -> Vec<usize> {
    let n: usize = to.iter().product();
    let pad = to.len() - from.len();
    let mut strides = vec![0usize; to.len()];
    let mut acc = 1;
    for i in (0..from.len()).rev() {
        strides[pad + i] = if from[i] == 1 { 0 } else { acc };
        acc *= from[i];
    }
    let mut out = Vec::with_capacity(n);
    let mut idx = vec![0usize; to.len()];
    let mut lin = 0usize;
    for _ in 0..n {
        out.push(lin);
        for ax in (0..to.len()).rev() {
            idx[ax] += 1;
            lin += strides[ax];
            if idx[ax] < to[ax] {
                break;
            }
            lin -= strides[ax] * to[ax];
            idx[ax] = 0;
        }
    }
    out
}

// ----------------------------------------------------------------------------- MatMul

/// One GEMM per batch: `out[b] = A[a_off[b]..] · B[b_off[b]..]` (C blocks of `m*n`), batches
/// spread over the backend's threads.
fn gemm_batches<T: Num>(
    cx: &KernelCx<'_>,
    g: &Gemm,
    a: &[T],
    a_off: &[usize],
    b: &[T],
    b_off: &[usize],
    out: &mut [T],
) {
    let mn = g.m * g.n;
    if mn == 0 {
        return;
    }
    crate::kernels::par::par_chunks_mut(cx.cpu, out, mn, g.k, &|bi, c| {
        T::gemm(cx, g, &a[a_off[bi]..], &b[b_off[bi]..], c)
    });
}

/// Numpy `matmul` of two tensors of element type `T`.
pub(crate) fn matmul_t<T: Num>(cx: &KernelCx<'_>, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    matmul_packed::<T>(cx, a, b, None)
}

/// [`matmul_t`] with B's panels packed at load (`bp`: for this very B, see [`Prepacked`]).
fn matmul_packed<T: Num>(
    cx: &KernelCx<'_>,
    a: &Tensor,
    b: &Tensor,
    bp: Option<&[f32]>,
) -> Result<Tensor> {
    let (ra, rb) = (a.rank(), b.rank());
    if ra == 0 || rb == 0 {
        bail!(
            "MatMul inputs must have rank >= 1 (got {:?} and {:?})",
            a.shape(),
            b.shape()
        );
    }
    let a2 = if ra == 1 {
        a.reshape(&[1, a.shape()[0]])?
    } else {
        a.clone()
    };
    let b2 = if rb == 1 {
        b.reshape(&[b.shape()[0], 1])?
    } else {
        b.clone()
    };
    let (sa, sb) = (a2.shape(), b2.shape());
    let (m, k) = (sa[sa.len() - 2], sa[sa.len() - 1]);
    let (k2, n) = (sb[sb.len() - 2], sb[sb.len() - 1]);
    if k != k2 {
        bail!(
            "MatMul: inner dimensions differ ({:?} x {:?})",
            a.shape(),
            b.shape()
        );
    }
    let ba = &sa[..sa.len() - 2];
    let bb = &sb[..sb.len() - 2];
    let batch = broadcast_shapes(ba, bb)?;
    let mut out_shape = batch.clone();
    if ra > 1 {
        out_shape.push(m);
    }
    if rb > 1 {
        out_shape.push(n);
    }
    let nb: usize = batch.iter().product();
    let mut out = cx.output::<T>(0, &out_shape)?;
    if nb == 0 || m == 0 || n == 0 || k == 0 {
        // an empty product is zero (an arena region holds whatever was there)
        out.fill(T::ZERO);
        return Ok(out.into_tensor());
    }
    let (ta, a_rs, a_cs) = mat_layout(&a2)?;
    let (tb, b_rs, b_cs) = mat_layout(&b2)?;
    let (ad, bd) = (ta.as_slice::<T>()?, tb.as_slice::<T>()?);
    let nba: usize = ba.iter().product();
    let nbb: usize = bb.iter().product();
    // One tall GEMM when B is a single matrix and A's rows are uniformly strided.
    if nbb == 1 && a_cs == 1 && nba == nb {
        let g = Gemm {
            m: nb * m,
            n,
            k,
            a_rs,
            a_cs: 1,
            b_rs,
            b_cs,
            ldc: n,
            alpha: 1.0,
            beta: 0.0,
        };
        gemm_b(cx, &g, &ad, &bd, bp, &mut out);
        return Ok(out.into_tensor());
    }
    let ia = broadcast_index_map(ba, &batch);
    let ib = broadcast_index_map(bb, &batch);
    let g = Gemm {
        m,
        n,
        k,
        a_rs,
        a_cs,
        b_rs,
        b_cs,
        ldc: n,
        alpha: 1.0,
        beta: 0.0,
    };
    let ao: Vec<usize> = ia.iter().map(|&i| i * m * k).collect();
    let bo: Vec<usize> = ib.iter().map(|&i| i * k * n).collect();
    gemm_batches(cx, &g, &ad, &ao, &bd, &bo, &mut out);
    Ok(out.into_tensor())
}

/// Numpy `matmul` for any supported element type.
pub(crate) fn matmul(cx: &KernelCx<'_>, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.dtype() != b.dtype() {
        bail!(
            "MatMul: input types differ ({} and {})",
            a.dtype(),
            b.dtype()
        );
    }
    match a.dtype() {
        DataType::Float16 | DataType::Bfloat16 => {
            let r = matmul_t::<f32>(cx, &widen_f32(a)?, &widen_f32(b)?)?;
            narrow_f32(r, a.dtype())
        }
        dt => crate::dispatch_numeric!(dt, T => matmul_t::<T>(cx, a, b),
            else Err(bad_type("MatMul", dt))),
    }
}

/// Packs a constant 2-D B (`trans`: stored as B^T, [N, K]) into the SGEMM's B panels.
fn pack_matrix_b(b: &Tensor, trans: bool) -> Option<Prepacked> {
    Prepacked::new(b, |v, s| {
        if s.len() != 2 || s[0] * s[1] == 0 || s[0] * s[1] > PREPACK_MAX {
            return None;
        }
        let (k, n, rs, cs) = if trans {
            (s[1], s[0], 1, s[1])
        } else {
            (s[0], s[1], s[1], 1)
        };
        let (_, nr) = crate::simd::gemm_tile();
        Some(crate::simd::gemm::pack_b(
            k,
            n,
            v,
            rs as isize,
            cs as isize,
            nr,
        ))
    })
}

/// `C = alpha A·B + beta C`, B from its packed panels (`bp`) when f32 has them and the
/// product's shape makes them pay (`simd::b_panels_pay`).
fn gemm_b<T: Num>(cx: &KernelCx<'_>, g: &Gemm, a: &[T], b: &[T], bp: Option<&[f32]>, c: &mut [T]) {
    let pays = crate::simd::b_panels_pay(g.m, g.n);
    if let (Some(bp), true, Some(a32), Some(c32)) = (bp, pays, T::as_f32(a), T::as_f32_mut(c)) {
        let panel = crate::simd::gemm_tile().1;
        let b = Operand::Panels { data: bp, panel };
        return cx.cpu.sgemm_ops(g, Operand::Strided(a32), b, c32);
    }
    T::gemm(cx, g, a, b, c)
}

/// `MatMul`, with a constant 2-D B packed at load.
struct MatMulKernel {
    packed: Option<Prepacked>,
}

impl Kernel for MatMulKernel {
    fn compute(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        let a = tensor_in(inputs, 0)?;
        let b = tensor_in(inputs, 1)?;
        let bp = self.packed.as_ref().and_then(|p| p.for_tensor(b));
        match (bp, a.dtype()) {
            (Some(bp), DataType::Float) => out1(matmul_packed::<f32>(cx, a, b, Some(bp))?),
            _ => out1(matmul(cx, a, b)?),
        }
    }

    fn prepare(&mut self, consts: &[Option<&Tensor>]) -> usize {
        if let Some(Some(b)) = consts.get(1) {
            self.packed = pack_matrix_b(b, false);
        }
        self.packed.as_ref().map_or(0, Prepacked::bytes)
    }
}

fn build_matmul(_node: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(MatMulKernel { packed: None }))
}

// ----------------------------------------------------------------------------- Gemm

#[allow(clippy::too_many_arguments)]
fn gemm_t<T: Num>(
    cx: &KernelCx<'_>,
    a: &Tensor,
    (b, bp): (&Tensor, Option<&[f32]>),
    c: Option<&Tensor>,
    trans_a: bool,
    trans_b: bool,
    alpha: f32,
    beta: f32,
) -> Result<Tensor> {
    if a.rank() != 2 || b.rank() != 2 {
        bail!(
            "Gemm inputs must be matrices (got {:?} and {:?})",
            a.shape(),
            b.shape()
        );
    }
    let (m, k) = if trans_a {
        (a.shape()[1], a.shape()[0])
    } else {
        (a.shape()[0], a.shape()[1])
    };
    let (k2, n) = if trans_b {
        (b.shape()[1], b.shape()[0])
    } else {
        (b.shape()[0], b.shape()[1])
    };
    if k != k2 {
        bail!(
            "Gemm: inner dimensions differ ({:?}{} x {:?}{})",
            a.shape(),
            if trans_a { "ᵀ" } else { "" },
            b.shape(),
            if trans_b { "ᵀ" } else { "" }
        );
    }
    let mut out = cx.output::<T>(0, &[m, n])?;
    if out.in_arena() && (k == 0 || c.is_none() || beta == 0.0) {
        // the product overwrites (beta 0) unless it is empty; C is copied in below
        out.fill(T::ZERO);
    }
    let mut have_c = false;
    if let Some(c) = c {
        if beta != 0.0 {
            let cb = c.broadcast_to(&[m, n]).map_err(|_| {
                crate::error::Error::Other(alloc::format!(
                    "Gemm: C of shape {:?} does not broadcast to [{m}, {n}]",
                    c.shape()
                ))
            })?;
            let cv = cb.as_slice::<T>()?;
            if beta == 1.0 {
                out.copy_from_slice(&cv);
            } else {
                let bf = beta as f64;
                for (o, &x) in out.iter_mut().zip(cv.iter()) {
                    *o = T::from_f64(bf * x.to_f64());
                }
            }
            have_c = true;
        }
    }
    if m == 0 || n == 0 {
        return Ok(out.into_tensor());
    }
    let (ta, ars, acs) = mat_layout(a)?;
    let (tb, brs, bcs) = mat_layout(b)?;
    let (ad, bd) = (ta.as_slice::<T>()?, tb.as_slice::<T>()?);
    let (a_rs, a_cs) = if trans_a { (acs, ars) } else { (ars, acs) };
    let (b_rs, b_cs) = if trans_b { (bcs, brs) } else { (brs, bcs) };
    if k > 0 {
        let g = Gemm {
            m,
            n,
            k,
            a_rs,
            a_cs,
            b_rs,
            b_cs,
            ldc: n,
            alpha,
            beta: if have_c { 1.0 } else { 0.0 },
        };
        gemm_b(cx, &g, &ad, &bd, bp, &mut out);
    }
    Ok(out.into_tensor())
}

/// `Gemm`, with a constant B packed at load.
struct GemmKernel {
    trans_a: bool,
    trans_b: bool,
    alpha: f32,
    beta: f32,
    packed: Option<Prepacked>,
}

impl Kernel for GemmKernel {
    fn compute(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        let (trans_a, trans_b, alpha, beta) = (self.trans_a, self.trans_b, self.alpha, self.beta);
        let a = tensor_in(inputs, 0)?;
        let b = tensor_in(inputs, 1)?;
        let c = opt_tensor_in(inputs, 2)?;
        if a.dtype() != b.dtype() || c.is_some_and(|c| c.dtype() != a.dtype()) {
            bail!("Gemm: input types differ");
        }
        let r = match a.dtype() {
            DataType::Float16 | DataType::Bfloat16 => {
                let cw = match c {
                    Some(c) => Some(widen_f32(c)?),
                    None => None,
                };
                let (aw, bw) = (widen_f32(a)?, widen_f32(b)?);
                let r = gemm_t::<f32>(
                    cx,
                    &aw,
                    (&bw, None),
                    cw.as_ref(),
                    trans_a,
                    trans_b,
                    alpha,
                    beta,
                )?;
                narrow_f32(r, a.dtype())?
            }
            DataType::Float => {
                let bp = self.packed.as_ref().and_then(|p| p.for_tensor(b));
                gemm_t::<f32>(cx, a, (b, bp), c, trans_a, trans_b, alpha, beta)?
            }
            dt => crate::dispatch_numeric!(dt, T =>
                gemm_t::<T>(cx, a, (b, None), c, trans_a, trans_b, alpha, beta)?,
                else return Err(bad_type("Gemm", dt))),
        };
        out1(r)
    }

    fn prepare(&mut self, consts: &[Option<&Tensor>]) -> usize {
        if let Some(Some(b)) = consts.get(1) {
            self.packed = pack_matrix_b(b, self.trans_b);
        }
        self.packed.as_ref().map_or(0, Prepacked::bytes)
    }
}

fn build_gemm(node: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(GemmKernel {
        trans_a: node.get_i("transA", 0)? != 0,
        trans_b: node.get_i("transB", 0)? != 0,
        alpha: node.get_f("alpha", 1.0)?,
        beta: node.get_f("beta", 1.0)?,
        packed: None,
    }))
}

// ----------------------------------------------------------------------------- integer matmul

/// An int8/uint8 tensor's values as i32 minus its zero point: a scalar, a tensor that
/// broadcasts against the input, or (`per_row`) a 1-D per-row vector of an [.., M, K] input.
fn int_minus_zp(t: &Tensor, zp: Option<&Tensor>, per_row: bool) -> Result<Tensor> {
    if !matches!(t.dtype(), DataType::Int8 | DataType::Uint8) {
        return Err(bad_type("integer MatMul", t.dtype()));
    }
    let v = t.to_i64_vec()?;
    let Some(zp) = zp else {
        return Tensor::from_vec(t.shape(), v.into_iter().map(|x| x as i32).collect());
    };
    if zp.dtype() != t.dtype() {
        bail!(
            "zero point type {} differs from the input type {}",
            zp.dtype(),
            t.dtype()
        );
    }
    let z = if zp.len() == 1 {
        zp.reshape(&[])?
    } else if per_row && zp.rank() == 1 && t.rank() >= 2 {
        // A per-row zero point [M] of an [.., M, K] input.
        zp.reshape(&[zp.len(), 1])?
    } else {
        zp.clone()
    };
    let zb = z.broadcast_to(t.shape()).map_err(|_| {
        crate::error::Error::Other(alloc::format!(
            "zero point of shape {:?} does not fit input of shape {:?}",
            zp.shape(),
            t.shape()
        ))
    })?;
    let zv = zb.to_i64_vec()?;
    Tensor::from_vec(
        t.shape(),
        v.iter().zip(&zv).map(|(&x, &z)| (x - z) as i32).collect(),
    )
}

/// MatMulInteger on the integer kernels where the shapes fit, the general one otherwise.
fn build_matmul_integer_q(node: &Node) -> Result<Box<dyn Kernel>> {
    Ok(crate::kernels::qmatmul::build(
        build_matmul_integer(node)?,
        node,
        false,
    ))
}

/// QLinearMatMul on the integer kernels where the shapes fit, the general one otherwise.
fn build_qlinear_matmul_q(node: &Node) -> Result<Box<dyn Kernel>> {
    Ok(crate::kernels::qmatmul::build(
        build_qlinear_matmul(node)?,
        node,
        true,
    ))
}

pub(crate) fn build_matmul_integer(_node: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(
        |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let a = int_minus_zp(tensor_in(inputs, 0)?, opt_tensor_in(inputs, 2)?, true)?;
            let b = int_minus_zp(tensor_in(inputs, 1)?, opt_tensor_in(inputs, 3)?, false)?;
            out1(matmul_t::<i32>(cx, &a, &b)?)
        },
    ))
}

/// Scale values as f32, plus whether they are f16 (whose products numpy rounds to f16).
fn scale_values(t: &Tensor) -> Result<(Vec<f32>, DataType)> {
    match t.dtype() {
        DataType::Float | DataType::Float16 | DataType::Bfloat16 => {
            Ok((t.to_f32_vec()?, t.dtype()))
        }
        dt => Err(bad_type("QLinearMatMul scale", dt)),
    }
}

/// Rounds an f32 to the precision of a scale type (so products behave like numpy's).
fn round_to(v: f32, dt: DataType) -> f32 {
    match dt {
        DataType::Float16 => half::f16::from_f32(v).to_f32(),
        DataType::Bfloat16 => half::bf16::from_f32(v).to_f32(),
        _ => v,
    }
}

fn build_qlinear_matmul(_node: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(
        |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let a_t = tensor_in(inputs, 0)?;
            let b_t = tensor_in(inputs, 3)?;
            let (a_s, a_dt) = scale_values(tensor_in(inputs, 1)?)?;
            let (b_s, _) = scale_values(tensor_in(inputs, 4)?)?;
            let (y_s, _) = scale_values(tensor_in(inputs, 6)?)?;
            let y_zp = opt_tensor_in(inputs, 7)?;
            let a = int_minus_zp(a_t, opt_tensor_in(inputs, 2)?, true)?;
            let b = int_minus_zp(b_t, opt_tensor_in(inputs, 5)?, false)?;
            let acc = matmul_t::<i32>(cx, &a, &b)?;
            let shape = acc.shape().to_vec();
            let m = if a_t.rank() >= 2 {
                a_t.shape()[a_t.rank() - 2]
            } else {
                1
            };
            let n = if b_t.rank() >= 2 {
                b_t.shape()[b_t.rank() - 1]
            } else {
                1
            };
            if y_s.len() != 1 {
                unsupported!("QLinearMatMul: y_scale must be a scalar");
            }
            if !(a_s.len() == 1 || a_s.len() == m) || !(b_s.len() == 1 || b_s.len() == n) {
                unsupported!(
                    "QLinearMatMul: scales must be per tensor or per row of a / column of b"
                );
            }
            let out_dt = y_zp.map(|t| t.dtype()).unwrap_or(a_t.dtype());
            let zp = match y_zp {
                Some(z) if z.len() == 1 => z.to_i64_vec()?[0] as f64,
                Some(_) => unsupported!("QLinearMatMul: y_zero_point must be a scalar"),
                None => 0.0,
            };
            let (lo, hi) = match out_dt {
                DataType::Uint8 => (0.0, 255.0),
                DataType::Int8 => (-128.0, 127.0),
                dt => return Err(bad_type("QLinearMatMul", dt)),
            };
            let accv = acc.into_vec::<i32>()?;
            let a_per_row = a_s.len() > 1;
            let b_per_col = b_s.len() > 1;
            let rows_n = if b_t.rank() >= 2 { n } else { 1 };
            let q: Vec<f64> = accv
                .iter()
                .enumerate()
                .map(|(i, &c)| {
                    let col = i % rows_n;
                    let row = (i / rows_n) % m;
                    let sa = a_s[if a_per_row { row } else { 0 }];
                    let sb = b_s[if b_per_col { col } else { 0 }];
                    let mult = round_to(round_to(sa * sb, a_dt) / y_s[0], a_dt);
                    let d = c as f64 * mult as f64 + zp;
                    libm::rint(d).clamp(lo, hi)
                })
                .collect();
            let t = match out_dt {
                DataType::Uint8 => Tensor::from_vec(&shape, q.iter().map(|&x| x as u8).collect())?,
                _ => Tensor::from_vec(&shape, q.iter().map(|&x| x as i8).collect())?,
            };
            out1(t)
        },
    ))
}

// ----------------------------------------------------------------------------- Einsum

/// One term of an einsum equation: letters and at most one ellipsis.
#[derive(Clone, Debug, PartialEq)]
enum Tok {
    Letter(u8),
    Ellipsis,
}

#[derive(Clone, Debug)]
struct Equation {
    inputs: Vec<Vec<Tok>>,
    /// `None` for implicit mode.
    output: Option<Vec<Tok>>,
}

fn parse_term(s: &str) -> Result<Vec<Tok>> {
    let b = s.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let mut seen_ell = false;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_alphabetic() {
            out.push(Tok::Letter(c));
            i += 1;
        } else if c == b'.' {
            if i + 3 > b.len() || &b[i..i + 3] != b"..." || seen_ell {
                bail!("Einsum: malformed ellipsis in term '{s}'");
            }
            seen_ell = true;
            out.push(Tok::Ellipsis);
            i += 3;
        } else {
            bail!("Einsum: unexpected character '{}' in term '{s}'", c as char);
        }
    }
    Ok(out)
}

fn parse_equation(eq: &str) -> Result<Equation> {
    let eq: alloc::string::String = eq.chars().filter(|c| !c.is_whitespace()).collect();
    let (lhs, rhs) = match eq.find("->") {
        Some(p) => (&eq[..p], Some(&eq[p + 2..])),
        None => (&eq[..], None),
    };
    let inputs = lhs.split(',').map(parse_term).collect::<Result<Vec<_>>>()?;
    let output = rhs.map(parse_term).transpose()?;
    Ok(Equation { inputs, output })
}

/// Label ids: letters keep their ASCII code; ellipsis dimension `j` is `ELL + j`.
const ELL: u32 = 1000;

/// An operand during contraction: contiguous data with one label per axis.
struct Opnd<T> {
    data: Vec<T>,
    shape: Vec<usize>,
    labels: Vec<u32>,
}

impl<T: Num> Opnd<T> {
    /// Axes reordered by `perm` (copies unless `perm` is the identity).
    fn permuted(self, perm: &[usize]) -> Opnd<T> {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return self;
        }
        let strides = crate::tensor::contiguous_strides(&self.shape);
        let shape: Vec<usize> = perm.iter().map(|&p| self.shape[p]).collect();
        let st: Vec<isize> = perm.iter().map(|&p| strides[p]).collect();
        let data = gather_strided(&self.data, &shape, &st, 0);
        Opnd {
            data,
            shape,
            labels: perm.iter().map(|&p| self.labels[p]).collect(),
        }
    }

    /// Sums out every axis whose label `keep` rejects.
    fn sum_out(self, keep: &dyn Fn(u32) -> bool) -> Opnd<T> {
        let kept: Vec<usize> = (0..self.labels.len())
            .filter(|&i| keep(self.labels[i]))
            .collect();
        if kept.len() == self.labels.len() {
            return self;
        }
        let dropped: Vec<usize> = (0..self.labels.len())
            .filter(|&i| !keep(self.labels[i]))
            .collect();
        let perm: Vec<usize> = kept.iter().chain(&dropped).copied().collect();
        let inner: usize = dropped.iter().map(|&i| self.shape[i]).product();
        let p = self.permuted(&perm);
        let nk = kept.len();
        let outer: usize = p.shape[..nk].iter().product();
        let mut data = Vec::with_capacity(outer);
        if inner == 0 {
            data.resize(outer, T::ZERO);
        } else {
            for ch in p.data.chunks(inner) {
                data.push(ch.iter().fold(T::ZERO, |s, &x| s.add(x)));
            }
            data.resize(outer, T::ZERO);
        }
        Opnd {
            data,
            shape: p.shape[..nk].to_vec(),
            labels: p.labels[..nk].to_vec(),
        }
    }
}

/// Contracts two operands over their shared labels that `needed` rejects, keeping the rest.
fn contract_pair<T: Num>(
    cx: &KernelCx<'_>,
    l: Opnd<T>,
    r: Opnd<T>,
    needed: &dyn Fn(u32) -> bool,
) -> Opnd<T> {
    let in_r = |x: u32| r.labels.contains(&x);
    let in_l = |x: u32| l.labels.contains(&x);
    let batch: Vec<u32> = l
        .labels
        .iter()
        .copied()
        .filter(|&x| in_r(x) && needed(x))
        .collect();
    let contr: Vec<u32> = l
        .labels
        .iter()
        .copied()
        .filter(|&x| in_r(x) && !needed(x))
        .collect();
    let lonly: Vec<u32> = l.labels.iter().copied().filter(|&x| !in_r(x)).collect();
    let ronly: Vec<u32> = r.labels.iter().copied().filter(|&x| !in_l(x)).collect();
    let pos = |labels: &[u32], x: u32| labels.iter().position(|&y| y == x).unwrap();
    let lperm: Vec<usize> = batch
        .iter()
        .chain(&lonly)
        .chain(&contr)
        .map(|&x| pos(&l.labels, x))
        .collect();
    let rperm: Vec<usize> = batch
        .iter()
        .chain(&contr)
        .chain(&ronly)
        .map(|&x| pos(&r.labels, x))
        .collect();
    let size_l = |x: u32| l.shape[pos(&l.labels, x)];
    let size_r = |x: u32| r.shape[pos(&r.labels, x)];
    let nb: usize = batch.iter().map(|&x| size_l(x)).product();
    let m: usize = lonly.iter().map(|&x| size_l(x)).product();
    let k: usize = contr.iter().map(|&x| size_l(x)).product();
    let n: usize = ronly.iter().map(|&x| size_r(x)).product();
    let mut shape: Vec<usize> = batch.iter().map(|&x| size_l(x)).collect();
    shape.extend(lonly.iter().map(|&x| size_l(x)));
    shape.extend(ronly.iter().map(|&x| size_r(x)));
    let labels: Vec<u32> = batch.iter().chain(&lonly).chain(&ronly).copied().collect();
    let lp = l.permuted(&lperm);
    let rp = r.permuted(&rperm);
    let mut data = vec![T::ZERO; nb * m * n];
    if m > 0 && n > 0 && k > 0 {
        let g = Gemm::row_major(m, n, k);
        let ao: Vec<usize> = (0..nb).map(|i| i * m * k).collect();
        let bo: Vec<usize> = (0..nb).map(|i| i * k * n).collect();
        gemm_batches(cx, &g, &lp.data, &ao, &rp.data, &bo, &mut data);
    }
    Opnd {
        data,
        shape,
        labels,
    }
}

fn einsum_t<T: Num>(cx: &KernelCx<'_>, eq: &Equation, ts: &[&Tensor]) -> Result<Tensor> {
    if ts.len() != eq.inputs.len() {
        bail!(
            "Einsum: equation has {} operands but {} inputs were given",
            eq.inputs.len(),
            ts.len()
        );
    }
    // Resolve ellipses into labels.
    let mut ell_ranks = Vec::with_capacity(ts.len());
    for (term, t) in eq.inputs.iter().zip(ts) {
        let letters = term.iter().filter(|x| matches!(x, Tok::Letter(_))).count();
        let has_ell = term.contains(&Tok::Ellipsis);
        if (has_ell && t.rank() < letters) || (!has_ell && t.rank() != letters) {
            bail!(
                "Einsum: term of {} subscripts does not match input of shape {:?}",
                term.len(),
                t.shape()
            );
        }
        ell_ranks.push(t.rank() - letters);
    }
    let ell_max = ell_ranks.iter().copied().max().unwrap_or(0);
    let mut ops: Vec<Opnd<T>> = Vec::with_capacity(ts.len());
    for ((term, t), &er) in eq.inputs.iter().zip(ts).zip(&ell_ranks) {
        let mut labels = Vec::with_capacity(t.rank());
        for tok in term {
            match tok {
                Tok::Letter(c) => labels.push(*c as u32),
                Tok::Ellipsis => labels.extend((0..er).map(|j| ELL + (ell_max - er + j) as u32)),
            }
        }
        ops.push(Opnd {
            data: t.as_slice::<T>()?.into_owned(),
            shape: t.shape().to_vec(),
            labels,
        });
    }
    // Output labels.
    let out_labels: Vec<u32> = match &eq.output {
        Some(term) => {
            let mut v = Vec::new();
            for tok in term {
                match tok {
                    Tok::Letter(c) => v.push(*c as u32),
                    Tok::Ellipsis => v.extend((0..ell_max).map(|j| ELL + j as u32)),
                }
            }
            v
        }
        None => {
            let mut v: Vec<u32> = (0..ell_max).map(|j| ELL + j as u32).collect();
            let mut letters: Vec<u32> = Vec::new();
            for op in &ops {
                for &l in &op.labels {
                    if l < ELL {
                        letters.push(l);
                    }
                }
            }
            let mut once: Vec<u32> = letters
                .iter()
                .copied()
                .filter(|&l| letters.iter().filter(|&&x| x == l).count() == 1)
                .collect();
            once.sort_unstable();
            v.extend(once);
            v
        }
    };
    for (i, &l) in out_labels.iter().enumerate() {
        if out_labels[..i].contains(&l) {
            bail!("Einsum: output subscript repeated");
        }
        if !ops.iter().any(|o| o.labels.contains(&l)) {
            bail!("Einsum: output subscript does not appear in any input");
        }
    }
    // Label sizes (1 broadcasts).
    let mut sizes: Vec<(u32, usize)> = Vec::new();
    for op in &ops {
        for (&l, &d) in op.labels.iter().zip(&op.shape) {
            match sizes.iter_mut().find(|(x, _)| *x == l) {
                Some((_, s)) => {
                    if *s == 1 {
                        *s = d;
                    } else if d != 1 && d != *s {
                        bail!("Einsum: subscript sizes {} and {} differ", *s, d);
                    }
                }
                None => sizes.push((l, d)),
            }
        }
    }
    let size_of = |l: u32| {
        sizes
            .iter()
            .find(|(x, _)| *x == l)
            .map(|p| p.1)
            .unwrap_or(1)
    };
    // Diagonals, then drop broadcast (size-1) axes of labels that are larger elsewhere.
    let ops: Vec<Opnd<T>> = ops
        .into_iter()
        .map(|op| {
            let mut uniq: Vec<u32> = Vec::new();
            for &l in &op.labels {
                if !uniq.contains(&l) {
                    uniq.push(l);
                }
            }
            let op = if uniq.len() != op.labels.len() {
                let strides = crate::tensor::contiguous_strides(&op.shape);
                let mut shape = Vec::new();
                let mut st = Vec::new();
                for &u in &uniq {
                    let mut s = 0isize;
                    let mut d = 0;
                    for (i, &l) in op.labels.iter().enumerate() {
                        if l == u {
                            s += strides[i];
                            d = op.shape[i];
                        }
                    }
                    shape.push(d);
                    st.push(s);
                }
                Opnd {
                    data: gather_strided(&op.data, &shape, &st, 0),
                    shape,
                    labels: uniq,
                }
            } else {
                op
            };
            let mut shape = Vec::new();
            let mut labels = Vec::new();
            for (&l, &d) in op.labels.iter().zip(&op.shape) {
                if !(d == 1 && size_of(l) != 1) {
                    shape.push(d);
                    labels.push(l);
                }
            }
            Opnd {
                data: op.data,
                shape,
                labels,
            }
        })
        .collect();
    // Contract left to right, summing out labels as soon as nothing else needs them.
    let mut rest: Vec<Opnd<T>> = ops;
    rest.reverse();
    let Some(mut acc) = rest.pop() else {
        bail!("Einsum needs at least one operand");
    };
    while let Some(next) = rest.pop() {
        let mut later: Vec<u32> = out_labels.clone();
        for o in &rest {
            later.extend_from_slice(&o.labels);
        }
        acc = acc.sum_out(&|l| later.contains(&l) || next.labels.contains(&l));
        let acc_labels = acc.labels.clone();
        let next = next.sum_out(&|l| later.contains(&l) || acc_labels.contains(&l));
        acc = contract_pair(cx, acc, next, &|l| later.contains(&l));
    }
    let acc = acc.sum_out(&|l| out_labels.contains(&l));
    let perm: Vec<usize> = out_labels
        .iter()
        .map(|&l| acc.labels.iter().position(|&x| x == l).unwrap())
        .collect();
    let acc = acc.permuted(&perm);
    Tensor::from_vec(&acc.shape, acc.data)
}

fn build_einsum(node: &Node) -> Result<Box<dyn Kernel>> {
    let eq = parse_equation(&node.get_s("equation", "")?)?;
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let ts = (0..inputs.len())
                .map(|i| tensor_in(inputs, i))
                .collect::<Result<Vec<_>>>()?;
            let Some(first) = ts.first() else {
                bail!("Einsum needs at least one input");
            };
            let dt = first.dtype();
            if ts.iter().any(|t| t.dtype() != dt) {
                bail!("Einsum: input types differ");
            }
            let r = match dt {
                DataType::Float16 | DataType::Bfloat16 => {
                    let w = ts
                        .iter()
                        .map(|t| widen_f32(t))
                        .collect::<Result<Vec<_>>>()?;
                    let wr: Vec<&Tensor> = w.iter().collect();
                    narrow_f32(einsum_t::<f32>(cx, &eq, &wr)?, dt)?
                }
                dt => crate::dispatch_numeric!(dt, T => einsum_t::<T>(cx, &eq, &ts)?,
                    else return Err(bad_type("Einsum", dt))),
            };
            out1(r)
        },
    ))
}

// ----------------------------------------------------------------------------- Det

/// Determinant of an n×n row-major matrix by LU decomposition with partial pivoting.
fn det_f64(mut a: Vec<f64>, n: usize) -> f64 {
    let mut det = 1.0;
    for col in 0..n {
        let mut piv = col;
        let mut best = libm::fabs(a[col * n + col]);
        for r in col + 1..n {
            let v = libm::fabs(a[r * n + col]);
            if v > best {
                best = v;
                piv = r;
            }
        }
        if best == 0.0 {
            return 0.0;
        }
        if piv != col {
            for j in 0..n {
                a.swap(col * n + j, piv * n + j);
            }
            det = -det;
        }
        let p = a[col * n + col];
        det *= p;
        for r in col + 1..n {
            let f = a[r * n + col] / p;
            if f != 0.0 {
                for j in col + 1..n {
                    a[r * n + j] -= f * a[col * n + j];
                }
            }
        }
    }
    det
}

fn build_det(_node: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(
        |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let r = x.rank();
            if r < 2 || x.shape()[r - 1] != x.shape()[r - 2] {
                bail!("Det needs square matrices, got shape {:?}", x.shape());
            }
            let n = x.shape()[r - 1];
            let out_shape = &x.shape()[..r - 2];
            let vals: Vec<f64> = match x.dtype() {
                DataType::Double => x.as_slice::<f64>()?.into_owned(),
                DataType::Float | DataType::Float16 | DataType::Bfloat16 => {
                    x.to_f32_vec()?.into_iter().map(|v| v as f64).collect()
                }
                dt => return Err(bad_type("Det", dt)),
            };
            let dets: Vec<f64> = if n == 0 {
                vec![1.0; out_shape.iter().product()]
            } else {
                vals.chunks(n * n).map(|m| det_f64(m.to_vec(), n)).collect()
            };
            let t = match x.dtype() {
                DataType::Double => Tensor::from_vec(out_shape, dets)?,
                dt => narrow_f32(
                    Tensor::from_vec(out_shape, dets.into_iter().map(|v| v as f32).collect())?,
                    dt,
                )?,
            };
            out1(t)
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::AttrValue;
    use crate::kernels::test_util::{close, i64s, node, run, seq, t32};

    fn mm(a: Tensor, b: Tensor) -> Tensor {
        run(&node("MatMul", 13, vec![], 1), &[Some(a), Some(b)])
            .unwrap()
            .remove(0)
    }

    #[test]
    fn constant_b_packed_at_load_gives_the_same_product_and_only_for_its_tensor() {
        use crate::provider::ReferenceCpu;
        // MatMul with a batch of A rows (one tall product), and Gemm with B transposed, alpha
        // and a broadcast C; a second B of the same shape must not use the packed one
        let cx = KernelCx::new(&ReferenceCpu);
        let eval = |k: &dyn Kernel, ins: &[Tensor]| -> Vec<f32> {
            let vals: Vec<Value> = ins.iter().cloned().map(Value::Tensor).collect();
            let refs: Vec<Option<&Value>> = vals.iter().map(Some).collect();
            match k.compute(&cx, &refs).unwrap().remove(0) {
                Value::Tensor(t) => t.to_f32_vec().unwrap(),
                _ => panic!("not a tensor"),
            }
        };
        let (m, k, n) = (9usize, 300usize, 40usize);
        let a = t32(&[3, m, k], seq(3 * m * k, 7, 11, 0.25));
        let b = t32(&[k, n], seq(k * n, 5, 13, 0.125));
        let b2 = t32(&[k, n], seq(k * n, 3, 17, 0.5));
        let mut km = build_matmul(&node("MatMul", 13, vec![], 1)).unwrap();
        km.prepare(&[None, Some(&b)]);
        let fresh = build_matmul(&node("MatMul", 13, vec![], 1)).unwrap();
        for bb in [&b, &b2] {
            let ins = [a.clone(), bb.clone()];
            assert_eq!(eval(&*km, &ins), eval(&*fresh, &ins), "MatMul");
        }
        let gnode = node(
            "Gemm",
            13,
            vec![
                ("transB", AttrValue::Int(1)),
                ("alpha", AttrValue::Float(0.5)),
                ("beta", AttrValue::Float(2.0)),
            ],
            1,
        );
        let a = t32(&[m, k], seq(m * k, 7, 11, 0.25));
        let bt = t32(&[n, k], seq(k * n, 5, 13, 0.125));
        let bt2 = t32(&[n, k], seq(k * n, 3, 17, 0.5));
        let c = t32(&[n], seq(n, 3, 7, 0.5));
        let mut kg = build_gemm(&gnode).unwrap();
        kg.prepare(&[None, Some(&bt), None]);
        let fresh = build_gemm(&gnode).unwrap();
        for bb in [&bt, &bt2] {
            let ins = [a.clone(), bb.clone(), c.clone()];
            assert_eq!(eval(&*kg, &ins), eval(&*fresh, &ins), "Gemm");
        }
    }

    #[test]
    fn matmul_2d_and_transposed_view() {
        let a = t32(&[3, 4], seq(12, 7, 11, 0.25));
        let b = t32(&[4, 5], seq(20, 5, 13, 0.25));
        let want = [
            -0.0625, 0.25, 2.1875, 0.0625, 0.375, -0.625, 0.3125, -2.0, -0.25, 0.6875, 1.5625,
            -0.3125, -1.375, 0.8125, -1.0625,
        ];
        let y = mm(a.clone(), b.clone());
        assert_eq!(y.shape(), &[3, 5]);
        close(&y.to_f32_vec().unwrap(), &want, 1e-6);
        // Same product through transposed views (no copy path).
        let at = t32(&[4, 3], a.permute(&[1, 0]).unwrap().to_f32_vec().unwrap());
        let bt = t32(&[5, 4], b.permute(&[1, 0]).unwrap().to_f32_vec().unwrap());
        let y2 = mm(at.permute(&[1, 0]).unwrap(), bt.permute(&[1, 0]).unwrap());
        close(&y2.to_f32_vec().unwrap(), &want, 1e-6);
    }

    #[test]
    fn matmul_broadcast_and_vectors() {
        let a = t32(&[2, 1, 3, 4], seq(24, 7, 11, 0.25));
        let b = t32(&[3, 4, 2], seq(24, 5, 13, 0.25));
        let y = mm(a, b);
        assert_eq!(y.shape(), &[2, 3, 3, 2]);
        close(
            &y.to_f32_vec().unwrap(),
            &[
                -1.4375, -1.9375, -1.5625, 2.625, 2.4375, -1.0625, -1.375, 0.5625, -1.375, 0.375,
                2.0625, 0.1875, -1.3125, 0.625, -1.1875, 0.5625, 1.6875, -0.1875, -1.8125, 2.8125,
                2.1875, -0.875, 0.0, 1.625, -1.375, 0.0, 2.0625, -0.1875, 0.0, -2.4375, -0.9375,
                0.4375, 1.9375, -0.3125, 0.0, -2.4375,
            ],
            1e-6,
        );
        let y = mm(
            t32(&[4], seq(4, 7, 11, 0.25)),
            t32(&[2, 4, 3], seq(24, 5, 13, 0.25)),
        );
        assert_eq!(y.shape(), &[2, 3]);
        close(
            &y.to_f32_vec().unwrap(),
            &[-0.4375, 2.3125, -0.625, -2.375, -0.4375, 2.3125],
            1e-6,
        );
        let y = mm(
            t32(&[2, 3, 4], seq(24, 7, 11, 0.25)),
            t32(&[4], seq(4, 5, 13, 0.25)),
        );
        assert_eq!(y.shape(), &[2, 3]);
        close(
            &y.to_f32_vec().unwrap(),
            &[0.8125, 0.5625, -1.0625, 0.0625, -1.5625, 1.625],
            1e-6,
        );
        let y = mm(
            t32(&[5], seq(5, 7, 11, 0.25)),
            t32(&[5], seq(5, 5, 13, 0.25)),
        );
        assert_eq!(y.shape(), &[] as &[usize]);
        close(&y.to_f32_vec().unwrap(), &[1.8125], 1e-6);
        assert!(run(
            &node("MatMul", 13, vec![], 1),
            &[
                Some(t32(&[2, 3], seq(6, 1, 5, 1.0))),
                Some(t32(&[2, 3], seq(6, 1, 5, 1.0)))
            ]
        )
        .is_err());
    }

    #[test]
    fn matmul_other_types() {
        let a: Vec<i64> = (0..12).map(|i| ((i * 7 + 3) % 11) - 5).collect();
        let b: Vec<i64> = (0..8).map(|i| ((i * 5 + 3) % 13) - 6).collect();
        let y = mm(i64s(&[3, 4], a.clone()), i64s(&[4, 2], b.clone()));
        assert_eq!(
            &*y.as_slice::<i64>().unwrap(),
            &[-23, -31, -25, 42, 39, -17]
        );
        let a32: Vec<i32> = a.iter().map(|&x| x as i32).collect();
        let b32: Vec<i32> = b.iter().map(|&x| x as i32).collect();
        let y = mm(
            Tensor::from_vec(&[3, 4], a32).unwrap(),
            Tensor::from_vec(&[4, 2], b32).unwrap(),
        );
        assert_eq!(
            &*y.as_slice::<i32>().unwrap(),
            &[-23, -31, -25, 42, 39, -17]
        );
        let af: Vec<f64> = a.iter().map(|&x| x as f64).collect();
        let bf: Vec<f64> = b.iter().map(|&x| x as f64).collect();
        let y = mm(
            Tensor::from_vec(&[3, 4], af.clone()).unwrap(),
            Tensor::from_vec(&[4, 2], bf.clone()).unwrap(),
        );
        assert_eq!(
            &*y.as_slice::<f64>().unwrap(),
            &[-23., -31., -25., 42., 39., -17.]
        );
        let ah: Vec<half::f16> = af.iter().map(|&x| half::f16::from_f64(x)).collect();
        let bh: Vec<half::f16> = bf.iter().map(|&x| half::f16::from_f64(x)).collect();
        let y = mm(
            Tensor::from_vec(&[3, 4], ah).unwrap(),
            Tensor::from_vec(&[4, 2], bh).unwrap(),
        );
        assert_eq!(y.dtype(), DataType::Float16);
        close(
            &y.to_f32_vec().unwrap(),
            &[-23., -31., -25., 42., 39., -17.],
            0.0,
        );
    }

    #[test]
    fn gemm_attributes_and_bias() {
        let n = node(
            "Gemm",
            13,
            vec![
                ("alpha", AttrValue::Float(0.25)),
                ("beta", AttrValue::Float(0.35)),
                ("transA", AttrValue::Int(1)),
                ("transB", AttrValue::Int(1)),
            ],
            1,
        );
        let y = run(
            &n,
            &[
                Some(t32(&[4, 3], seq(12, 7, 11, 0.25))),
                Some(t32(&[5, 4], seq(20, 5, 13, 0.25))),
                Some(t32(&[5], seq(5, 3, 7, 0.25))),
            ],
        )
        .unwrap()
        .remove(0);
        assert_eq!(y.shape(), &[3, 5]);
        close(
            &y.to_f32_vec().unwrap(),
            &[
                0.453125, -0.20625, 0.146875, 0.503125, -0.159375, -0.421875, 0.559375, -0.290625,
                0.284375, -0.159375, 0.078125, 0.121875, -0.040625, 0.409375, -0.159375,
            ],
            1e-6,
        );
        let y = run(
            &node("Gemm", 13, vec![], 1),
            &[
                Some(t32(&[2, 3], seq(6, 7, 11, 0.25))),
                Some(t32(&[3, 4], seq(12, 5, 13, 0.25))),
                Some(Tensor::scalar(2.0f32)),
            ],
        )
        .unwrap()
        .remove(0);
        close(
            &y.to_f32_vec().unwrap(),
            &[3.5, 0.6875, 2.75, 4.0, 3.5625, 0.625, 3.375, 3.6875],
            1e-6,
        );
        // No C (opset 11+), f64.
        let a: Vec<f64> = seq(6, 7, 11, 0.25).iter().map(|&x| x as f64).collect();
        let b: Vec<f64> = seq(12, 5, 13, 0.25).iter().map(|&x| x as f64).collect();
        let y = run(
            &node("Gemm", 13, vec![], 1),
            &[
                Some(Tensor::from_vec(&[2, 3], a).unwrap()),
                Some(Tensor::from_vec(&[3, 4], b).unwrap()),
            ],
        )
        .unwrap()
        .remove(0);
        assert_eq!(
            &*y.as_slice::<f64>().unwrap(),
            &[1.5, -1.3125, 0.75, 2.0, 1.5625, -1.375, 1.375, 1.6875]
        );
    }

    fn einsum(eq: &str, ins: Vec<Tensor>) -> Tensor {
        let n = node(
            "Einsum",
            12,
            vec![("equation", AttrValue::String(eq.as_bytes().to_vec()))],
            1,
        );
        let ins: Vec<Option<Tensor>> = ins.into_iter().map(Some).collect();
        run(&n, &ins).unwrap().remove(0)
    }

    #[test]
    fn einsum_equations() {
        let a23 = || t32(&[2, 3], seq(6, 7, 11, 0.25));
        let b34 = || t32(&[3, 4], seq(12, 5, 13, 0.25));
        let want_ik = [1.5, -1.3125, 0.75, 2.0, 1.5625, -1.375, 1.375, 1.6875];
        let y = einsum("ij,jk->ik", vec![a23(), b34()]);
        assert_eq!(y.shape(), &[2, 4]);
        close(&y.to_f32_vec().unwrap(), &want_ik, 1e-6);
        let y = einsum("ij,jk", vec![a23(), b34()]);
        assert_eq!(y.shape(), &[2, 4]);
        close(&y.to_f32_vec().unwrap(), &want_ik, 1e-6);
        let y = einsum(
            "bij, bjk -> bik",
            vec![
                t32(&[2, 3, 4], seq(24, 7, 11, 0.25)),
                t32(&[2, 4, 2], seq(16, 5, 13, 0.25)),
            ],
        );
        assert_eq!(y.shape(), &[2, 3, 2]);
        close(
            &y.to_f32_vec().unwrap(),
            &[
                -1.4375, -1.9375, -1.5625, 2.625, 2.4375, -1.0625, -1.375, 0.0, 2.0625, -0.1875,
                0.0, -2.4375,
            ],
            1e-6,
        );
        let y = einsum("ii->i", vec![t32(&[4, 4], seq(16, 7, 11, 0.25))]);
        close(&y.to_f32_vec().unwrap(), &[-0.5, 0.0, 0.5, 1.0], 0.0);
        let y = einsum("...ij->...ji", vec![t32(&[2, 3, 4], seq(24, 7, 11, 0.25))]);
        assert_eq!(y.shape(), &[2, 4, 3]);
        close(
            &y.to_f32_vec().unwrap(),
            &[
                -0.5, 1.0, -0.25, 1.25, 0.0, -1.25, 0.25, -1.0, 0.5, -0.75, 0.75, -0.5, 1.25, 0.0,
                -1.25, 0.25, -1.0, 0.5, -0.75, 0.75, -0.5, 1.0, -0.25, 1.25,
            ],
            0.0,
        );
        let y = einsum(
            "i,i",
            vec![
                t32(&[5], seq(5, 7, 11, 0.25)),
                t32(&[5], seq(5, 5, 13, 0.25)),
            ],
        );
        assert_eq!(y.shape(), &[] as &[usize]);
        close(&y.to_f32_vec().unwrap(), &[1.8125], 1e-6);
        let y = einsum(
            "ij,jk,kl->il",
            vec![a23(), b34(), t32(&[4, 2], seq(8, 3, 7, 0.25))],
        );
        close(
            &y.to_f32_vec().unwrap(),
            &[-1.546875, 0.65625, -1.609375, 0.828125],
            1e-6,
        );
        let y = einsum(
            "...ij,...jk->...ik",
            vec![
                t32(&[2, 3, 4], seq(24, 7, 11, 0.25)),
                t32(&[4, 5], seq(20, 5, 13, 0.25)),
            ],
        );
        assert_eq!(y.shape(), &[2, 3, 5]);
        close(
            &y.to_f32_vec().unwrap(),
            &[
                -0.0625, 0.25, 2.1875, 0.0625, 0.375, -0.625, 0.3125, -2.0, -0.25, 0.6875, 1.5625,
                -0.3125, -1.375, 0.8125, -1.0625, -1.75, 0.4375, -1.4375, -0.875, 1.3125, 0.4375,
                -0.1875, -0.8125, 0.1875, -0.4375, -0.8125, -0.8125, 3.25, -0.8125, -0.8125,
            ],
            1e-6,
        );
        let y = einsum("bij->j", vec![t32(&[2, 3, 4], seq(24, 7, 11, 0.25))]);
        close(&y.to_f32_vec().unwrap(), &[0.25, -0.25, -0.75, 1.5], 1e-6);
        let y = einsum("bii->bi", vec![t32(&[2, 3, 3], seq(18, 7, 11, 0.25))]);
        close(
            &y.to_f32_vec().unwrap(),
            &[-0.5, 1.0, -0.25, -1.25, 0.25, -1.0],
            0.0,
        );
        let y = einsum("ij,k->ikj", vec![a23(), t32(&[4], seq(4, 5, 13, 0.25))]);
        assert_eq!(y.shape(), &[2, 4, 3]);
        close(
            &y.to_f32_vec().unwrap(),
            &[
                0.375, -0.9375, -0.1875, -0.25, 0.625, 0.125, 0.75, -1.875, -0.375, 0.125, -0.3125,
                -0.0625, 0.5625, -0.75, 0.0, -0.375, 0.5, 0.0, 1.125, -1.5, 0.0, 0.1875, -0.25,
                0.0,
            ],
            1e-6,
        );
        let y = einsum(
            "aij,aj->ia",
            vec![
                t32(&[2, 3, 4], seq(24, 7, 11, 0.25)),
                t32(&[2, 4], seq(8, 5, 13, 0.25)),
            ],
        );
        close(
            &y.to_f32_vec().unwrap(),
            &[0.8125, 2.3125, 0.5625, 0.8125, -1.0625, 0.0],
            1e-6,
        );
        // f64 and scalar
        let y = einsum("->", vec![Tensor::scalar(2.5f64)]);
        assert_eq!(&*y.as_slice::<f64>().unwrap(), &[2.5]);
    }

    #[test]
    fn det_batched() {
        let mut v = seq(18, 5, 13, 0.5);
        for b in 0..2 {
            for i in 0..3 {
                v[b * 9 + i * 4] += 1.0;
            }
        }
        let y = run(&node("Det", 11, vec![], 1), &[Some(t32(&[2, 3, 3], v))])
            .unwrap()
            .remove(0);
        assert_eq!(y.shape(), &[2]);
        close(&y.to_f32_vec().unwrap(), &[5.0, 23.75], 1e-5);
    }

    #[test]
    fn matmul_integer_per_row_zero_points() {
        let a: Vec<u8> = (0..12).map(|i| ((i * 7 + 3) % 256) as u8).collect();
        let b: Vec<u8> = (0..8).map(|i| ((i * 37 + 11) % 256) as u8).collect();
        let y = run(
            &node("MatMulInteger", 10, vec![], 1),
            &[
                Some(Tensor::from_vec(&[3, 4], a).unwrap()),
                Some(Tensor::from_vec(&[4, 2], b).unwrap()),
                Some(Tensor::from_vec(&[3], vec![3u8, 100, 7]).unwrap()),
                Some(Tensor::from_vec(&[2], vec![20u8, 9]).unwrap()),
            ],
        )
        .unwrap()
        .remove(0);
        assert_eq!(
            &*y.as_slice::<i32>().unwrap(),
            &[6874, 3514, -21278, -20222, 28090, 21402]
        );
    }
}
