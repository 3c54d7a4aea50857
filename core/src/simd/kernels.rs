//! The generic bodies behind `simd`'s dispatched functions. Each is `#[inline(always)]` so it
//! is compiled inside the ISA-specific wrapper that instantiates it.

use super::gemm::{scale_c, Gemm, GemmEpi, Operand};
use super::VF32;
use alloc::vec::Vec;

pub use super::nbits::{nbits_dequant, nbits_fits, nbits_permute, nbits_rows, x16_rows};
pub use super::nchwc::{nchwc_conv_seg, nchwc_dw_seg};

/// An element-wise binary f32 operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
    Min,
}

/// An element-wise f32 activation: what the unary kernels, fused epilogues and recurrent gates
/// apply (every one is NaN-propagating, like the ONNX ops of the same name).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Act {
    Identity,
    Relu,
    /// `x < 0 ? alpha * x : x`
    LeakyRelu(f32),
    /// `min(max(leaky_relu(x, alpha), lo), hi)`: LeakyRelu and the Max/Min/Clip with
    /// constants after it (an exporter's bounded LeakyRelu), in one pass.
    LeakyReluClip {
        alpha: f32,
        lo: f32,
        hi: f32,
    },
    Sigmoid,
    Tanh,
    /// `clamp(alpha * x + beta, 0, 1)`
    HardSigmoid(f32, f32),
    /// `x * clamp(x / 6 + 1/2, 0, 1)`
    HardSwish,
    /// `x * sigmoid(alpha * x)` (SiLU at alpha = 1)
    Swish(f32),
    /// `x < 0 ? alpha * (e^x - 1) : x`
    Elu(f32),
    /// `x / 2 * (1 + erf(x / sqrt 2))`
    Gelu,
    /// `x / 2 * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3)))`
    GeluTanh,
    /// `min(max(x, lo), hi)`
    Clip(f32, f32),
    /// `x * clip(x + shift, lo, hi) / div` computed op by op, as exporters spell HardSwish out
    /// (Add, Clip, Mul, Div): the fused form gives the unfused chain's bits.
    HardSwishParts {
        shift: f32,
        lo: f32,
        hi: f32,
        div: f32,
    },
    Exp,
    Erf,
}

/// What a kernel does to a vector of results before it stores them (a trait rather than a
/// closure: closures do not inherit the instruction set a kernel is compiled for, so their
/// intrinsics would not inline).
pub(crate) trait Then: Copy {
    fn then<V: VF32>(self, v: V) -> V;
    /// The same on one value.
    fn then1(self, v: f32) -> f32;
}

/// Stores results as they are.
#[derive(Clone, Copy)]
pub(crate) struct Keep;

impl Then for Keep {
    #[inline(always)]
    fn then<V: VF32>(self, v: V) -> V {
        v
    }
    #[inline(always)]
    fn then1(self, v: f32) -> f32 {
        v
    }
}

/// `min(max(v, lo), hi)` (`v` first: a NaN stays): Relu, Clip and Relu6 in registers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Clamp {
    pub lo: f32,
    pub hi: f32,
}

impl Clamp {
    /// Values as they are (a NaN, -0.0 and the infinities too).
    pub const IDENTITY: Clamp = Clamp {
        lo: f32::NEG_INFINITY,
        hi: f32::INFINITY,
    };

    /// The clamp that computes `a` bit for bit, where there is one.
    pub fn of(a: Act) -> Option<Clamp> {
        match a {
            Act::Relu => Some(Clamp {
                lo: 0.0,
                hi: f32::INFINITY,
            }),
            Act::Clip(lo, hi) => Some(Clamp { lo, hi }),
            Act::Identity => Some(Clamp::IDENTITY),
            _ => None,
        }
    }
}

impl Then for Clamp {
    #[inline(always)]
    fn then<V: VF32>(self, v: V) -> V {
        v.max(V::splat(self.lo)).min(V::splat(self.hi))
    }
    #[inline(always)]
    fn then1(self, v: f32) -> f32 {
        // comparisons, so that a NaN stays as the vector max/min keep it
        if v < self.lo {
            self.lo
        } else if v > self.hi {
            self.hi
        } else {
            v
        }
    }
}

/// Applies `act` to a vector.
/// The whole vectors of an element-wise pass: `$store(i, act(a, $load(i)))` for each
/// `i = 0, LANES, ..` below `$n`, with the activation matched once outside the loop for the
/// costly ones (a `match` per vector costs an indirect jump and keeps the polynomials'
/// constants from being hoisted). The load and store forms are written inline (no closures:
/// they would not inherit the caller's target features).
macro_rules! each_act {
    ($V:ty, $a:expr, $n:expr, |$i:ident, $y:ident| $load:expr => $store:expr) => {{
        let l = <$V>::LANES;
        macro_rules! run {
            ($act:expr) => {{
                let mut k = 0;
                while k + l <= $n {
                    let $i = k;
                    let $y = act::<$V>($act, $load);
                    $store;
                    k += l;
                }
            }};
        }
        match $a {
            Act::Gelu => run!(Act::Gelu),
            Act::Sigmoid => run!(Act::Sigmoid),
            Act::Tanh => run!(Act::Tanh),
            Act::Exp => run!(Act::Exp),
            Act::Erf => run!(Act::Erf),
            Act::GeluTanh => run!(Act::GeluTanh),
            other => run!(other),
        }
    }};
}

#[inline(always)]
pub fn act<V: VF32>(act: Act, v: V) -> V {
    let zero = V::splat(0.0);
    match act {
        Act::Identity => v,
        Act::Relu => v.max(zero),
        Act::LeakyRelu(a) => v.max(zero).add(V::splat(a).mul(v.min(zero))),
        Act::LeakyReluClip { alpha, lo, hi } => v
            .max(zero)
            .add(V::splat(alpha).mul(v.min(zero)))
            .max(V::splat(lo))
            .min(V::splat(hi)),
        Act::Sigmoid => v.sigmoid(),
        Act::Tanh => v.tanh(),
        Act::HardSigmoid(a, b) => V::splat(a).fma(v, V::splat(b)).max(zero).min(V::splat(1.0)),
        Act::HardSwish => {
            let y = V::splat(1.0 / 6.0).fma(v, V::splat(0.5));
            v.mul(y.max(zero).min(V::splat(1.0)))
        }
        Act::Swish(a) => v.mul(V::splat(a).mul(v).sigmoid()),
        Act::Elu(a) => {
            let neg = v.min(zero).exp().sub(V::splat(1.0));
            v.max(zero).add(V::splat(a).mul(neg))
        }
        Act::Gelu => {
            let e = v
                .mul(V::splat(core::f32::consts::FRAC_1_SQRT_2))
                .one_plus_erf();
            V::splat(0.5).mul(v).mul(e)
        }
        Act::GeluTanh => {
            let x3 = v.mul(v).mul(v);
            let inner = V::splat(0.044_715).fma(x3, v).mul(V::splat(0.797_884_6));
            V::splat(0.5).mul(v).mul(V::splat(1.0).add(inner.tanh()))
        }
        Act::Clip(lo, hi) => v.max(V::splat(lo)).min(V::splat(hi)),
        Act::HardSwishParts { shift, lo, hi, div } => {
            let k = v.add(V::splat(shift)).max(V::splat(lo)).min(V::splat(hi));
            v.mul(k).div(V::splat(div))
        }
        Act::Exp => v.exp(),
        Act::Erf => v.erf(),
    }
}

/// `out[i] = act(x[i])`.
#[inline(always)]
pub fn unary<V: VF32>(a: Act, x: &[f32], out: &mut [f32]) {
    map::<V>(a, x, out);
}

/// `x[i] = act(x[i])` in place.
#[inline(always)]
pub fn unary_inplace<V: VF32>(a: Act, x: &mut [f32]) {
    let n = x.len();
    each_act!(V, a, n, |i, y| V::load(&x[i..]) => y.store(&mut x[i..]));
    let i = n - n % V::LANES;
    if i < n {
        let mut buf = [0f32; 16];
        buf[..n - i].copy_from_slice(&x[i..n]);
        act(a, V::load(&buf)).store(&mut buf);
        x[i..n].copy_from_slice(&buf[..n - i]);
    }
}

#[inline(always)]
fn apply<V: VF32>(op: BinOp, a: V, b: V) -> V {
    match op {
        BinOp::Add => a.add(b),
        BinOp::Sub => a.sub(b),
        BinOp::Mul => a.mul(b),
        BinOp::Div => a.div(b),
        BinOp::Max => a.max(b),
        BinOp::Min => a.min(b),
    }
}

#[inline(always)]
fn apply1(op: BinOp, a: f32, b: f32) -> f32 {
    match op {
        BinOp::Add => a + b,
        BinOp::Sub => a - b,
        BinOp::Mul => a * b,
        BinOp::Div => a / b,
        BinOp::Max => {
            if a.is_nan() || a >= b {
                a
            } else {
                b
            }
        }
        BinOp::Min => {
            if a.is_nan() || a <= b {
                a
            } else {
                b
            }
        }
    }
}

/// `out = a op b` over equal-length chunks, with vector main loop and scalar tail.
#[inline(always)]
fn zip_chunk<V: VF32>(op: BinOp, a: &[f32], b: &[f32], out: &mut [f32]) {
    let l = V::LANES;
    let n = out.len().min(a.len()).min(b.len());
    let mut i = 0;
    while i + l <= n {
        apply(op, V::load(&a[i..]), V::load(&b[i..])).store(&mut out[i..]);
        i += l;
    }
    while i < n {
        out[i] = apply1(op, a[i], b[i]);
        i += 1;
    }
}

/// `out = a op splat(s)` (or `splat(s) op a` when `swap`).
#[inline(always)]
fn scalar_chunk<V: VF32>(op: BinOp, a: &[f32], s: f32, swap: bool, out: &mut [f32]) {
    let l = V::LANES;
    let n = out.len().min(a.len());
    let sv = V::splat(s);
    let mut i = 0;
    while i + l <= n {
        let x = V::load(&a[i..]);
        let r = if swap {
            apply(op, sv, x)
        } else {
            apply(op, x, sv)
        };
        r.store(&mut out[i..]);
        i += l;
    }
    while i < n {
        out[i] = if swap {
            apply1(op, s, a[i])
        } else {
            apply1(op, a[i], s)
        };
        i += 1;
    }
}

#[inline(always)]
pub fn binary_repeat<V: VF32>(op: BinOp, a: &[f32], b: &[f32], out: &mut [f32]) {
    assert!(!b.is_empty() && a.len().is_multiple_of(b.len()) && out.len() == a.len());
    if b.len() == 1 {
        return scalar_chunk::<V>(op, a, b[0], false, out);
    }
    for (o, x) in out.chunks_mut(b.len()).zip(a.chunks(b.len())) {
        zip_chunk::<V>(op, x, b, o);
    }
}

#[inline(always)]
pub fn binary_repeat_lhs<V: VF32>(op: BinOp, a: &[f32], b: &[f32], out: &mut [f32]) {
    assert!(!a.is_empty() && b.len().is_multiple_of(a.len()) && out.len() == b.len());
    if a.len() == 1 {
        return scalar_chunk::<V>(op, b, a[0], true, out);
    }
    for (o, y) in out.chunks_mut(a.len()).zip(b.chunks(a.len())) {
        zip_chunk::<V>(op, a, y, o);
    }
}

/// `out[i] = act(x[i])`: a vector main loop, and the tail through the vector code too
/// (padded), so every element gets the same math. (No closures here: a closure is compiled
/// without the caller's target features, so its intrinsics would not inline.)
#[inline(always)]
fn map<V: VF32>(a: Act, x: &[f32], out: &mut [f32]) {
    let n = x.len().min(out.len());
    each_act!(V, a, n, |i, y| V::load(&x[i..]) => y.store(&mut out[i..]));
    let i = n - n % V::LANES;
    if i < n {
        let mut buf = [0f32; 16];
        buf[..n - i].copy_from_slice(&x[i..n]);
        act(a, V::load(&buf)).store(&mut buf);
        out[i..n].copy_from_slice(&buf[..n - i]);
    }
}

/// `acc[i] = bias + sum over taps t of ws[t] * src[offs[t] + i]`: four vectors of outputs at
/// a time held in registers over all taps (the last four ending at the end); fewer than four
/// vectors in all as that many chains; scalars only for fewer outputs than one vector.
#[inline(always)]
pub fn conv_taps<V: VF32>(ws: &[f32], offs: &[usize], src: &[f32], bias: f32, acc: &mut [f32]) {
    conv_taps_then::<V>(ws, offs, src, bias, Keep, acc)
}

/// [`conv_taps`] with `epi` applied to each vector of sums before it is stored (an
/// activation while the sums are in registers).
#[inline(always)]
fn conv_taps_then<V: VF32>(
    ws: &[f32],
    offs: &[usize],
    src: &[f32],
    bias: f32,
    epi: impl Then,
    acc: &mut [f32],
) {
    // the common kernels (3x3, 5x5) keep their weights and offsets in registers
    match ws.len().min(offs.len()) {
        9 => conv_taps_n::<V, 9>(ws, offs, src, bias, epi, acc),
        25 => conv_taps_n::<V, 25>(ws, offs, src, bias, epi, acc),
        _ => conv_taps_any::<V>(ws, offs, src, bias, epi, acc),
    }
}

/// [`conv_taps`] for exactly `T` taps: the weights splatted once, every read checked once up
/// front (the largest offset plus the outputs' length lies inside `src`).
#[inline(always)]
fn conv_taps_n<V: VF32, const T: usize>(
    ws: &[f32],
    offs: &[usize],
    src: &[f32],
    bias: f32,
    epi: impl Then,
    acc: &mut [f32],
) {
    let l = V::LANES;
    let n = acc.len();
    // (loops, not `array::from_fn`: its closure would not inherit the kernel's instruction
    // set, leaving the splats as calls)
    let mut of = [0usize; T];
    of.copy_from_slice(&offs[..T]);
    if n < 4 * l {
        // fewer than four vectors: one chain per vector, the last ending at n (before the
        // weights are splatted into registers that this path would not use)
        return conv_taps_short::<V>(&ws[..T], &of, src, bias, epi, acc);
    }
    let mut wv = [V::splat(0.0); T];
    for (v, &w) in wv.iter_mut().zip(&ws[..T]) {
        *v = V::splat(w);
    }
    let reach = of.iter().max().map_or(0, |&o| o + n);
    assert!(reach <= src.len(), "conv taps read past their source");
    let bv = V::splat(bias);
    let mut i = 0;
    while i < n {
        // the last block of four vectors ends at n, overlapping the one before it (the
        // outputs are stored, not added: recomputed ones are the same), so that no output is
        // left to the one-vector loop, whose single chain of FMAs waits on each one
        i = i.min(n - 4 * l);
        let mut a = [bv; 4];
        for q in 0..T {
            // SAFETY: of[q] + i + 4l <= of[q] + n <= reach <= src.len() (asserted above)
            let s = unsafe { src.get_unchecked(of[q] + i..of[q] + i + 4 * l) };
            a[0] = wv[q].fma(V::load(s), a[0]);
            a[1] = wv[q].fma(V::load(&s[l..]), a[1]);
            a[2] = wv[q].fma(V::load(&s[2 * l..]), a[2]);
            a[3] = wv[q].fma(V::load(&s[3 * l..]), a[3]);
        }
        for (q, &v) in a.iter().enumerate() {
            epi.then(v).store(&mut acc[i + q * l..]);
        }
        i += 4 * l;
    }
}

/// [`conv_taps`] for fewer than four vectors of outputs: one independent chain of FMAs per
/// vector, the last vector ending at the end (overlapping the one before it: outputs are
/// stored, not added, so recomputed ones are the same), so that neither a lone chain waiting
/// on each FMA nor scalar sums take the outputs past the whole vectors; scalars only for
/// fewer outputs than one vector.
#[inline(always)]
fn conv_taps_short<V: VF32>(
    ws: &[f32],
    of: &[usize],
    src: &[f32],
    bias: f32,
    epi: impl Then,
    acc: &mut [f32],
) {
    let (l, n) = (V::LANES, acc.len());
    let reach = of.iter().max().map_or(0, |&o| o + n);
    assert!(
        reach <= src.len() && ws.len() == of.len(),
        "conv taps read past their source"
    );
    let bv = V::splat(bias);
    match n.div_ceil(l) {
        _ if n < l => {
            for (j, o) in acc.iter_mut().enumerate() {
                *o = ws
                    .iter()
                    .zip(of)
                    .fold(bias, |a, (&w, &q)| a + w * src[q + j]);
            }
            scalars_then::<V>(acc, epi);
        }
        // as many chains as vectors (a latency-bound chain costs as much as four at once)
        1 => taps_block::<V>(ws, of, src, bv, [0; 4], epi, acc),
        2 => taps_block::<V>(ws, of, src, bv, [0, n - l, 0, n - l], epi, acc),
        3 => taps_block::<V>(ws, of, src, bv, [0, l, n - l, l], epi, acc),
        _ => taps_block::<V>(ws, of, src, bv, [0, l, 2 * l, n - l], epi, acc),
    }
}

/// Four vectors of outputs starting at `at` (not necessarily distinct: a repeated start
/// stores the same values twice), all taps, as four independent chains. The caller checked
/// every read: each `at[k] + LANES <= acc.len()` and every offset plus `acc.len()` inside
/// `src`.
#[inline(always)]
fn taps_block<V: VF32>(
    ws: &[f32],
    of: &[usize],
    src: &[f32],
    bv: V,
    at: [usize; 4],
    epi: impl Then,
    acc: &mut [f32],
) {
    let l = V::LANES;
    let (mut a0, mut a1, mut a2, mut a3) = (bv, bv, bv, bv);
    for (&w, &o) in ws.iter().zip(of) {
        let w = V::splat(w);
        // SAFETY: o + at[k] + l <= o + acc.len() <= src.len() (checked by the caller)
        unsafe {
            a0 = w.fma(V::load(src.get_unchecked(o + at[0]..o + at[0] + l)), a0);
            a1 = w.fma(V::load(src.get_unchecked(o + at[1]..o + at[1] + l)), a1);
            a2 = w.fma(V::load(src.get_unchecked(o + at[2]..o + at[2] + l)), a2);
            a3 = w.fma(V::load(src.get_unchecked(o + at[3]..o + at[3] + l)), a3);
        }
    }
    epi.then(a0).store(&mut acc[at[0]..at[0] + l]);
    epi.then(a1).store(&mut acc[at[1]..at[1] + l]);
    epi.then(a2).store(&mut acc[at[2]..at[2] + l]);
    epi.then(a3).store(&mut acc[at[3]..at[3] + l]);
}

/// Applies a vector epilogue to a few values (fewer than a vector, or any number) through a
/// zero-padded vector, so that scalars get exactly the vector path's results.
#[inline(always)]
fn scalars_then<V: VF32>(vals: &mut [f32], epi: impl Then) {
    let l = V::LANES;
    let mut buf = [0.0f32; 64];
    for chunk in vals.chunks_mut(l) {
        buf[..chunk.len()].copy_from_slice(chunk);
        epi.then(V::load(&buf[..l])).store(&mut buf[..l]);
        chunk.copy_from_slice(&buf[..chunk.len()]);
    }
}

/// One plane of a depthwise convolution whose taps step one input column per output column
/// (horizontal stride 1), for [`dw_plane_rows`]: input `ih x iw`, output `oh x ow`, kernel
/// `kh x kw`, vertical stride `sh`, dilations `dh`, `dw`, leading pads `ph`, `pw` (output
/// `(i, j)` reads input `(i*sh + ki*dh - ph, j + kj*dw - pw)`, zero outside the plane).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DwPlane {
    pub ih: usize,
    pub iw: usize,
    pub oh: usize,
    pub ow: usize,
    pub kh: usize,
    pub kw: usize,
    pub sh: usize,
    pub dh: usize,
    pub dw: usize,
    pub ph: isize,
    pub pw: isize,
}

impl DwPlane {
    /// The output columns `jl..jh` whose taps all lie inside the input row (the rest read
    /// padding).
    pub fn inner_cols(&self) -> (usize, usize) {
        let ow = self.ow as isize;
        let jl = self.pw.clamp(0, ow);
        let reach = ((self.kw.max(1) - 1) * self.dw) as isize;
        let jh = (self.iw as isize + self.pw - reach).clamp(jl, ow);
        (jl as usize, jh as usize)
    }
}

/// Output rows `r0..r0 + y.len() / ow` of one plane of a depthwise convolution read straight
/// from its input plane `x` (no padded copy): `y = act(bias + sum of taps)`. The columns whose
/// taps all lie inside the row are whole vectors ([`conv_taps`]'s kernels, over the taps of
/// the input rows that exist: padding rows are left out), the few at the edges scalar sums of
/// the taps inside the plane; `clamp` (Relu, Clip) runs on the sums in registers.
#[inline(always)]
pub fn dw_plane_rows<V: VF32>(
    g: &DwPlane,
    x: &[f32],
    w: &[f32],
    bias: f32,
    clamp: Option<Clamp>,
    r0: usize,
    y: &mut [f32],
) {
    match clamp {
        None => dw_plane_rows_then::<V>(g, x, w, bias, Keep, r0, y),
        Some(c) => dw_plane_rows_then::<V>(g, x, w, bias, c, r0, y),
    }
}

#[inline(always)]
fn dw_plane_rows_then<V: VF32>(
    g: &DwPlane,
    x: &[f32],
    w: &[f32],
    bias: f32,
    epi: impl Then,
    r0: usize,
    y: &mut [f32],
) {
    let DwPlane {
        ih,
        iw,
        oh,
        ow,
        kh,
        kw,
        sh,
        dh,
        dw,
        ph,
        pw,
    } = *g;
    if ow == 0 || y.is_empty() {
        return;
    }
    assert!(
        x.len() >= ih * iw && w.len() >= kh * kw && y.len().is_multiple_of(ow),
        "dw_plane_rows: plane, kernel or rows short"
    );
    assert!(
        r0 + y.len() / ow <= oh,
        "dw_plane_rows: rows past the plane"
    );
    let x = &x[..ih * iw];
    let l = V::LANES;
    let (jl, jh) = g.inner_cols();
    // the vector path takes columns jl..jh when they fill a vector; every other column is an
    // edge column, summed over its taps kj in lo..hi (those inside the row)
    let vector = jh - jl >= l;
    let edges: Vec<(usize, usize, usize)> = (0..ow)
        .filter(|&j| !(vector && (jl..jh).contains(&j)))
        .map(|j| {
            let c0 = j as isize - pw;
            let lo = (0..kw).find(|&kj| c0 + (kj * dw) as isize >= 0);
            let hi = (0..kw)
                .rev()
                .find(|&kj| c0 + ((kj * dw) as isize) < iw as isize);
            match (lo, hi) {
                (Some(lo), Some(hi)) if lo <= hi => (j, lo, hi + 1),
                _ => (j, 0, 0),
            }
        })
        .collect();
    // the taps of a row whose kernel rows all lie inside the plane, relative to its top row
    let full: Vec<usize> = (0..kh * kw)
        .map(|t| (t / kw) * dh * iw + (t % kw) * dw)
        .collect();
    let w = &w[..kh * kw];
    // the edge columns' taps in a row whose kernel rows all lie inside the plane, as
    // (weight, offset from the row's top-left input) runs, one run per edge column: a
    // flat loop per column with two sums, not a walk over the kernel's rows and columns
    let mut etaps: Vec<(f32, usize)> = Vec::with_capacity(edges.len() * kh * kw);
    let mut eruns: Vec<(usize, usize, usize)> = Vec::with_capacity(edges.len());
    for &(j, lo, hi) in &edges {
        let start = etaps.len();
        let c0 = j as isize - pw;
        for ki in 0..kh {
            for kj in lo..hi {
                let col = (c0 + (kj * dw) as isize) as usize;
                etaps.push((w[ki * kw + kj], ki * dh * iw + col));
            }
        }
        eruns.push((j, start, etaps.len()));
    }
    // the taps of a row at the top or bottom (those of the kernel rows inside the plane)
    let mut ws: Vec<f32> = Vec::with_capacity(kh * kw);
    let mut offs: Vec<usize> = Vec::with_capacity(kh * kw);
    let mut rows: Vec<usize> = Vec::with_capacity(kh);
    let last = ((kh.max(1) - 1) * dh) as isize;
    // a 3x3 kernel at vertical stride and dilation 1 computes two output rows per pass where
    // both lie inside: the four input rows they read are loaded once for both (48 loads for
    // 72 multiply-adds per block instead of 72: the single row's unaligned loads, each across
    // two cache lines, were what bounded it)
    let pv = if V::GEMM_MR >= 8 { 4 } else { 2 };
    let pairs = vector && kh == 3 && kw == 3 && sh == 1 && dh == 1 && jh - jl >= pv * l;
    let nrows = y.len() / ow;
    let mut r = 0;
    while r < nrows {
        let top = ((r0 + r) * sh) as isize - ph;
        if pairs && r + 1 < nrows && top >= 0 && top + 3 < ih as isize {
            let at = top as usize * iw;
            let (ya, yb) = y[r * ow..(r + 2) * ow].split_at_mut(ow);
            let base = at + (jl as isize - pw) as usize;
            let src = &x[base..];
            if pv == 4 {
                conv_taps_pair::<V, 4>(w, dw, iw, src, bias, epi, &mut ya[jl..jh], &mut yb[jl..jh]);
            } else {
                conv_taps_pair::<V, 2>(w, dw, iw, src, bias, epi, &mut ya[jl..jh], &mut yb[jl..jh]);
            }
            edge_runs(&etaps, &eruns, &x[at..], bias, epi, ya);
            edge_runs(&etaps, &eruns, &x[at + iw..], bias, epi, yb);
            r += 2;
            continue;
        }
        let yrow = &mut y[r * ow..(r + 1) * ow];
        r += 1;
        rows.clear();
        let inside = top >= 0 && top + last < ih as isize;
        // (an inside row's edge columns take the runs made above; `rows`, `ws` and `offs`
        // are a border row's)
        if !inside {
            ws.clear();
            offs.clear();
            for ki in 0..kh {
                let ir = top + (ki * dh) as isize;
                if ir < 0 || ir >= ih as isize {
                    continue;
                }
                rows.push(ir as usize * iw);
                for kj in 0..kw {
                    ws.push(w[ki * kw + kj]);
                    offs.push(ir as usize * iw + kj * dw);
                }
            }
        }
        let (ws, offs, at) = if inside {
            (w, &full[..], top as usize * iw)
        } else {
            (&ws[..], &offs[..], 0)
        };
        if vector {
            if ws.is_empty() {
                yrow[jl..jh].fill(bias);
                scalars_then::<V>(&mut yrow[jl..jh], epi);
            } else {
                // column jl reads input column jl - pw (>= 0) at tap kj = 0
                let base = at + (jl as isize - pw) as usize;
                conv_taps_then::<V>(ws, offs, &x[base..], bias, epi, &mut yrow[jl..jh]);
            }
        }
        // the edge columns
        if inside {
            edge_runs(&etaps, &eruns, &x[at..], bias, epi, yrow);
            continue;
        }
        for &(j, lo, hi) in &edges {
            let c0 = j as isize - pw;
            let mut s = bias;
            for (q, &row) in rows.iter().enumerate() {
                let wr = &ws[q * kw..q * kw + kw];
                for kj in lo..hi {
                    s += wr[kj] * x[row + (c0 + (kj * dw) as isize) as usize];
                }
            }
            yrow[j] = epi.then1(s);
        }
    }
}

/// The edge columns of a row whose kernel rows lie inside the plane: `y[j] = epi(bias + sum
/// of the run's taps)` per run `(j, t0, t1)` of `etaps` (weight, offset from `xr`'s start), in
/// two sums.
#[inline(always)]
fn edge_runs(
    etaps: &[(f32, usize)],
    eruns: &[(usize, usize, usize)],
    xr: &[f32],
    bias: f32,
    epi: impl Then,
    y: &mut [f32],
) {
    for &(j, t0, t1) in eruns {
        let (mut s0, mut s1) = (bias, 0.0f32);
        let mut pairs = etaps[t0..t1].chunks_exact(2);
        for t in &mut pairs {
            s0 += t[0].0 * xr[t[0].1];
            s1 += t[1].0 * xr[t[1].1];
        }
        if let [(wt, o)] = pairs.remainder() {
            s0 += wt * xr[*o];
        }
        y[j] = epi.then1(s0 + s1);
    }
}

/// Two consecutive output rows of a 3x3 kernel (`w`, row-major) at vertical stride and
/// dilation 1: `y0[i] = epi(bias + sum of w[ki][kj] src[ki iw + kj dw + i])`, `y1` the same one
/// input row down. Each of the four input rows' vectors is loaded once and feeds both rows'
/// sums, in blocks of `NV` vectors (the last ending at the rows' end, overlapping the one
/// before it: outputs are stored, so recomputed ones are the same). Needs `NV` vectors of
/// outputs at least.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn conv_taps_pair<V: VF32, const NV: usize>(
    w: &[f32],
    dw: usize,
    iw: usize,
    src: &[f32],
    bias: f32,
    epi: impl Then,
    y0: &mut [f32],
    y1: &mut [f32],
) {
    let l = V::LANES;
    let n = y0.len();
    assert!(
        n >= NV * l && y1.len() == n && w.len() >= 9 && 3 * iw + 2 * dw + n <= src.len(),
        "conv_taps_pair: rows short or reads past the source"
    );
    let mut wv = [V::splat(0.0); 9];
    for (v, &wt) in wv.iter_mut().zip(&w[..9]) {
        *v = V::splat(wt);
    }
    let bv = V::splat(bias);
    let mut i = 0;
    while i < n {
        i = i.min(n - NV * l);
        let mut a0 = [bv; NV];
        let mut a1 = [bv; NV];
        for ir in 0..4 {
            for kj in 0..3 {
                let o = ir * iw + kj * dw + i;
                // SAFETY: o + NV l <= 3 iw + 2 dw + n <= src.len() (asserted above)
                let s = unsafe { src.get_unchecked(o..o + NV * l) };
                for v in 0..NV {
                    let xv = V::load(&s[v * l..]);
                    if ir < 3 {
                        a0[v] = wv[ir * 3 + kj].fma(xv, a0[v]);
                    }
                    if ir > 0 {
                        a1[v] = wv[(ir - 1) * 3 + kj].fma(xv, a1[v]);
                    }
                }
            }
        }
        for v in 0..NV {
            epi.then(a0[v]).store(&mut y0[i + v * l..]);
            epi.then(a1[v]).store(&mut y1[i + v * l..]);
        }
        i += NV * l;
    }
}

/// `dst[c * ldd + r] = src[r * lds + c]` for `r < rows`, `c < cols`, a `LANES x LANES` block
/// at a time through registers ([`VF32::transpose`]); a ragged block is padded with zeros on
/// the way in and only its part stored.
#[inline(always)]
pub fn transpose_matrix<V: VF32>(
    src: &[f32],
    lds: usize,
    rows: usize,
    cols: usize,
    dst: &mut [f32],
    ldd: usize,
) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(
        (cols - 1) * ldd + rows <= dst.len(),
        "transpose: destination too short"
    );
    transpose_blocks::<V>(src, lds, rows, cols, |c, r0, hr, v: V, part| {
        let at = c * ldd + r0;
        if hr == V::LANES {
            v.store(&mut dst[at..]);
        } else {
            v.store(part);
            dst[at..at + hr].copy_from_slice(&part[..hr]);
        }
    })
}

/// [`transpose_matrix`] into separate rows: `dst[c][r] = src[r * lds + c]` for `r < rows`,
/// `c < cols` (each row at least `rows` long; rows past `cols` are not touched). The rows may
/// lie anywhere, such as the channel rows of a plain NCHW tensor at one span of positions.
#[inline(always)]
pub fn transpose_to_rows<V: VF32>(
    src: &[f32],
    lds: usize,
    rows: usize,
    cols: usize,
    dst: &mut [&mut [f32]],
) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(
        dst.len() >= cols && dst[..cols].iter().all(|d| d.len() >= rows),
        "transpose: destination rows too short"
    );
    let l = V::LANES;
    let (full_r, full_c) = (rows / l * l, cols / l * l);
    // whole blocks: loops of fixed counts, so that the block stays in registers
    for c0 in (0..full_c).step_by(l) {
        let d = &mut dst[c0..c0 + l];
        for r0 in (0..full_r).step_by(l) {
            let mut blk = [V::splat(0.0); 16];
            for (q, v) in blk.iter_mut().enumerate().take(l) {
                *v = V::load(&src[(r0 + q) * lds + c0..]);
            }
            V::transpose(&mut blk[..l]);
            for (q, v) in blk.iter().enumerate().take(l) {
                v.store(&mut d[q][r0..r0 + l]);
            }
        }
    }
    // the ragged rest: the last rows of every column, then the last columns of the rows above
    let put = |dst: &mut [&mut [f32]], c: usize, r: usize, hr: usize, v: V, part: &mut [f32]| {
        let d = &mut dst[c][r..];
        if hr == V::LANES {
            v.store(d);
        } else {
            v.store(part);
            d[..hr].copy_from_slice(&part[..hr]);
        }
    };
    if full_r < rows {
        let rest = &src[full_r * lds..];
        transpose_blocks::<V>(rest, lds, rows - full_r, cols, |c, r0, hr, v: V, part| {
            put(dst, c, full_r + r0, hr, v, part)
        });
    }
    if full_c < cols && full_r > 0 {
        let rest = &src[full_c..];
        transpose_blocks::<V>(rest, lds, full_r, cols - full_c, |c, r0, hr, v: V, part| {
            put(dst, full_c + c, r0, hr, v, part)
        });
    }
}

/// The register blocks of a transpose: for each `LANES x LANES` block of `src` (rows `r0..`,
/// columns `c0..`), the transposed vectors handed to `store(c, r0, hr, vector, scratch)`, one
/// per real column `c`, of which the first `hr` lanes are rows of `src`.
#[inline(always)]
fn transpose_blocks<V: VF32>(
    src: &[f32],
    lds: usize,
    rows: usize,
    cols: usize,
    mut store: impl FnMut(usize, usize, usize, V, &mut [f32]),
) {
    let l = V::LANES;
    assert!(
        (rows - 1) * lds + cols <= src.len(),
        "transpose: source too short"
    );
    let zero = V::splat(0.0);
    let mut blk = [zero; 16];
    let blk = &mut blk[..l];
    let mut part = [0f32; 16];
    for r0 in (0..rows).step_by(l) {
        let hr = l.min(rows - r0);
        for c0 in (0..cols).step_by(l) {
            let wc = l.min(cols - c0);
            for (q, v) in blk.iter_mut().enumerate() {
                let at = (r0 + q) * lds + c0;
                *v = if q >= hr {
                    zero
                } else if wc == l {
                    V::load(&src[at..])
                } else {
                    part[..wc].copy_from_slice(&src[at..at + wc]);
                    part[wc..l].fill(0.0);
                    V::load(&part)
                };
            }
            V::transpose(blk);
            for (q, v) in blk.iter().take(wc).enumerate() {
                store(c0 + q, r0, hr, *v, &mut part);
            }
        }
    }
}

/// `out[j]` = the larger of `src[2j]` and `src[2j + 1]` as max pooling folds them: from
/// -inf, `if v > acc { v } else { acc }` (a NaN never replaces a number).
#[inline(always)]
pub fn pair_max<V: VF32>(src: &[f32], out: &mut [f32]) {
    let l = V::LANES;
    let n = out.len();
    assert!(src.len() >= 2 * n, "pair_max: short source");
    let lowest = V::splat(f32::NEG_INFINITY);
    let mut j = 0;
    while j + l <= n {
        let (e, o) = V::load(&src[2 * j..]).deinterleave(V::load(&src[2 * j + l..]));
        // (V::max keeps self where either is NaN: acc.max(v) is the fold's step)
        lowest.max(e).max(o).store(&mut out[j..]);
        j += l;
    }
    for j in j..n {
        let a = if src[2 * j] > f32::NEG_INFINITY {
            src[2 * j]
        } else {
            f32::NEG_INFINITY
        };
        out[j] = if src[2 * j + 1] > a {
            src[2 * j + 1]
        } else {
            a
        };
    }
}

/// The two stride-2 phases of a zero-padded row, written straight from the row: `ph0[q] =
/// src[2q - pad]` and `ph1[q] = src[2q + 1 - pad]`, zero where that index is outside `src`
/// (no padded copy in between: the rows of a strided convolution are split this way once per
/// row, so what is not a vector here shows in the conv's time).
#[inline(always)]
pub fn phases2<V: VF32>(src: &[f32], pad: isize, ph0: &mut [f32], ph1: &mut [f32]) {
    phase2_one::<V>(src, pad, ph0);
    phase2_one::<V>(src, pad - 1, ph1);
}

/// `out[q] = src[2q - pad]`, zero outside `src`.
#[inline(always)]
fn phase2_one<V: VF32>(src: &[f32], pad: isize, out: &mut [f32]) {
    let l = V::LANES;
    // q in lo..hi read src[j0 + 2 (q - lo)]; the rest is padding
    let lo = (pad.max(0) as usize).div_ceil(2).min(out.len());
    let hi = ((src.len() as isize + pad).max(0) as usize)
        .div_ceil(2)
        .clamp(lo, out.len());
    // the padding: short runs at either end, stored as whole vectors before the values are
    // written over them (a `fill` here is a libc call per row)
    let z = V::splat(0.0);
    let len = out.len();
    if len >= l && lo <= l && len - hi <= l {
        z.store(&mut out[..l]);
        z.store(&mut out[len - l..]);
    } else {
        out[..lo].fill(0.0);
        out[hi..].fill(0.0);
    }
    if hi == lo {
        return;
    }
    let j0 = (2 * lo as isize - pad) as usize;
    let mut q = lo;
    while q + l <= hi && j0 + 2 * (q - lo) + 2 * l <= src.len() {
        let j = j0 + 2 * (q - lo);
        let (e, _) = V::load(&src[j..]).deinterleave(V::load(&src[j + l..]));
        e.store(&mut out[q..]);
        q += l;
    }
    if q < hi && hi - lo >= l {
        // the last vector overlaps the one before; where its second load would pass the end
        // of the row, it loads one value earlier and takes the odd lanes instead
        let ql = hi - l;
        let j = j0 + 2 * (ql - lo);
        let v = if j + 2 * l <= src.len() {
            Some(V::load(&src[j..]).deinterleave(V::load(&src[j + l..])).0)
        } else if j >= 1 {
            let (a, b) = (V::load(&src[j - 1..]), V::load(&src[j - 1 + l..]));
            Some(a.deinterleave(b).1)
        } else {
            None
        };
        if let Some(v) = v {
            v.store(&mut out[ql..]);
            return;
        }
    }
    for (k, o) in out[q..hi].iter_mut().enumerate() {
        *o = src[j0 + 2 * (q - lo + k)];
    }
}

/// Channels per block of the channel-interleaved depthwise layout (a whole number of vectors
/// on every instruction set: 1 x 16, 2 x 8 or 4 x 4 lanes).
pub const DW_BLOCK: usize = 16;

/// Depthwise taps over channel-interleaved rows (`DW_BLOCK` channels per position): for each
/// row `r` of `out` (`n` values, a whole number of positions) and each `i < n`,
/// `out[r * n + i] = bias[i % DW_BLOCK] + sum over taps t of
/// w[t * DW_BLOCK + i % DW_BLOCK] * src[r * pitch + offs[t] + i]`. Eight vectors of outputs at
/// a time stay in registers over all taps (enough independent sums to cover the FMA latency),
/// then the rest of the row in one go.
#[inline(always)]
pub fn dw_rows<V: VF32>(
    w: &[f32],
    bias: &[f32],
    offs: &[usize],
    src: &[f32],
    pitch: usize,
    n: usize,
    out: &mut [f32],
) {
    const B: usize = DW_BLOCK;
    let l = V::LANES;
    let t = offs.len();
    if n == 0 || out.is_empty() {
        return;
    }
    assert!(
        n.is_multiple_of(B) && B.is_multiple_of(l) && out.len().is_multiple_of(n),
        "dw_rows: whole blocks"
    );
    assert!(
        w.len() >= t * B && bias.len() >= B,
        "dw_rows: a weight block per tap"
    );
    let rows = out.len() / n;
    let reach = offs.iter().max().map_or(0, |&o| o + (rows - 1) * pitch + n);
    assert!(reach <= src.len(), "dw_rows: taps read past their source");
    let w = &w[..t * B];
    for (r, orow) in out.chunks_exact_mut(n).enumerate() {
        let base = r * pitch;
        let mut i = 0;
        while i + 8 * l <= n {
            dw_chunk::<V, 8>(w, bias, offs, src, base, i, orow);
            i += 8 * l;
        }
        match (n - i) / l {
            0 => {}
            1 => dw_chunk::<V, 1>(w, bias, offs, src, base, i, orow),
            2 => dw_chunk::<V, 2>(w, bias, offs, src, base, i, orow),
            3 => dw_chunk::<V, 3>(w, bias, offs, src, base, i, orow),
            4 => dw_chunk::<V, 4>(w, bias, offs, src, base, i, orow),
            5 => dw_chunk::<V, 5>(w, bias, offs, src, base, i, orow),
            6 => dw_chunk::<V, 6>(w, bias, offs, src, base, i, orow),
            _ => dw_chunk::<V, 7>(w, bias, offs, src, base, i, orow),
        }
    }
}

/// `K` vectors of [`dw_rows`]'s outputs from `i` on (the caller checked the reach of every read).
#[inline(always)]
fn dw_chunk<V: VF32, const K: usize>(
    w: &[f32],
    bias: &[f32],
    offs: &[usize],
    src: &[f32],
    base: usize,
    i: usize,
    orow: &mut [f32],
) {
    const B: usize = DW_BLOCK;
    let l = V::LANES;
    let lane = |q: usize| (i + q * l) % B;
    let mut a: [V; K] = core::array::from_fn(|q| V::load(&bias[lane(q)..]));
    for (wt, &off) in w.chunks_exact(B).zip(offs) {
        let o = base + off + i;
        // SAFETY: o + K*l <= base + off + n <= the reach dw_rows asserted to lie in `src`
        let s = unsafe { src.get_unchecked(o..o + K * l) };
        for q in 0..K {
            a[q] = V::load(&wt[lane(q)..]).fma(V::load(&s[q * l..]), a[q]);
        }
    }
    for (q, v) in a.iter().enumerate() {
        v.store(&mut orow[i + q * l..]);
    }
}

/// [`conv_taps`] for any number of taps.
#[inline(always)]
fn conv_taps_any<V: VF32>(
    ws: &[f32],
    offs: &[usize],
    src: &[f32],
    bias: f32,
    epi: impl Then,
    acc: &mut [f32],
) {
    let (l, n) = (V::LANES, acc.len());
    let t = ws.len().min(offs.len());
    let (ws, offs) = (&ws[..t], &offs[..t]);
    if n < 4 * l {
        return conv_taps_short::<V>(ws, offs, src, bias, epi, acc);
    }
    let reach = offs.iter().max().map_or(0, |&o| o + n);
    assert!(reach <= src.len(), "conv taps read past their source");
    let bv = V::splat(bias);
    let mut i = 0;
    while i < n {
        // the last block overlaps the one before it (as in conv_taps_n)
        i = i.min(n - 4 * l);
        taps_block::<V>(
            ws,
            offs,
            src,
            bv,
            [i, i + l, i + 2 * l, i + 3 * l],
            epi,
            acc,
        );
        i += 4 * l;
    }
}

#[inline(always)]
pub fn relu<V: VF32>(x: &[f32], out: &mut [f32]) {
    // max(x, 0) with x first keeps NaN
    map::<V>(Act::Relu, x, out);
}

#[inline(always)]
pub fn sigmoid<V: VF32>(x: &[f32], out: &mut [f32]) {
    map::<V>(Act::Sigmoid, x, out);
}

#[inline(always)]
pub fn exp<V: VF32>(x: &[f32], out: &mut [f32]) {
    map::<V>(Act::Exp, x, out);
}

/// `out[t] = dot(q, keys[t * ld..][..q.len()])` with 8 partial sums (see
/// [`super::dots_lanes8`]); `V::LANES` must divide 8.
#[inline(always)]
pub fn dots_lanes8<V: VF32>(keys: &[f32], ld: usize, q: &[f32], out: &mut [f32]) {
    let l = V::LANES;
    assert!(8 % l == 0, "dots_lanes8: {l} lanes");
    let (h, nv) = (q.len(), 8 / l);
    let h8 = h / 8 * 8;
    for (t, o) in out.iter_mut().enumerate() {
        let key = &keys[t * ld..t * ld + h];
        let mut acc = [V::splat(0.0); 2];
        for c in (0..h8).step_by(8) {
            for (v, a) in acc.iter_mut().enumerate().take(nv) {
                let e = c + v * l;
                *a = a.add(V::load(&q[e..]).mul(V::load(&key[e..])));
            }
        }
        let mut s = [0f32; 8];
        for (v, a) in acc.iter().enumerate().take(nv) {
            a.store(&mut s[v * l..]);
        }
        for e in h8..h {
            s[e - h8] += q[e] * key[e];
        }
        *o = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    }
}

/// `(a, b) <- (a cos - b sin, a sin + b cos)` over `a = x[..n]`, `b = x[n..2n]` for `n =
/// cos.len()` (see [`super::rotate_halves`]).
#[inline(always)]
pub fn rotate_halves<V: VF32>(x: &mut [f32], cos: &[f32], sin: &[f32]) {
    let (l, n) = (V::LANES, cos.len().min(sin.len()));
    let (a, b) = x[..2 * n].split_at_mut(n);
    let mut i = 0;
    while i + l <= n {
        let (va, vb) = (V::load(&a[i..]), V::load(&b[i..]));
        let (c, s) = (V::load(&cos[i..]), V::load(&sin[i..]));
        let na = va.fma(c, V::splat(0.0).sub(vb.mul(s)));
        let nb = va.fma(s, vb.mul(c));
        na.store(&mut a[i..]);
        nb.store(&mut b[i..]);
        i += l;
    }
    for j in i..n {
        let (xa, xb) = (a[j], b[j]);
        a[j] = libm::fmaf(xa, cos[j], -(xb * sin[j]));
        b[j] = libm::fmaf(xa, sin[j], xb * cos[j]);
    }
}

/// `out[i] = e^(x[i] + shift)` (see [`super::exp_shifted`]).
#[inline(always)]
pub fn exp_shifted<V: VF32>(x: &[f32], shift: f32, out: &mut [f32]) {
    let (l, n) = (V::LANES, x.len().min(out.len()));
    let sv = V::splat(shift);
    let mut i = 0;
    while i + l <= n {
        V::load(&x[i..])
            .add(sv)
            .exp_nonpositive()
            .store(&mut out[i..]);
        i += l;
    }
    if i < n {
        let mut buf = [0f32; 16];
        buf[..n - i].copy_from_slice(&x[i..n]);
        V::load(&buf[..])
            .add(sv)
            .exp_nonpositive()
            .store(&mut buf[..]);
        out[i..n].copy_from_slice(&buf[..n - i]);
    }
}

/// `out[j] = sum_k q[k] * kt[k * ld + j]`, one fused chain per j in order of k (see
/// [`super::fma_chains`]); `V::LANES` values of j at a time.
#[inline(always)]
pub fn fma_chains<V: VF32>(kt: &[f32], ld: usize, q: &[f32], out: &mut [f32]) {
    let (l, n) = (V::LANES, out.len());
    let mut j = 0;
    while j + l <= n {
        let mut acc = V::splat(0.0);
        for (k, &qk) in q.iter().enumerate() {
            acc = V::load(&kt[k * ld + j..]).fma(V::splat(qk), acc);
        }
        acc.store(&mut out[j..]);
        j += l;
    }
    for (jj, o) in out.iter_mut().enumerate().skip(j) {
        let mut acc = 0f32;
        for (k, &qk) in q.iter().enumerate() {
            acc = libm::fmaf(qk, kt[k * ld + jj], acc);
        }
        *o = acc;
    }
}

/// `out[r] = sum_e m[r * ld + e] * x[e]` for `r < out.len()`, `e < x.len()` (attention
/// scores: a query against rows of keys).
#[inline(always)]
pub fn dot_rows<V: VF32>(m: &[f32], ld: usize, x: &[f32], out: &mut [f32]) {
    let (l, h) = (V::LANES, x.len());
    let full = h - h % l;
    for (r, o) in out.iter_mut().enumerate() {
        let row = &m[r * ld..r * ld + h];
        let (mut a0, mut a1) = (V::splat(0.0), V::splat(0.0));
        let mut e = 0;
        while e + 2 * l <= full {
            a0 = V::load(&row[e..]).fma(V::load(&x[e..]), a0);
            a1 = V::load(&row[e + l..]).fma(V::load(&x[e + l..]), a1);
            e += 2 * l;
        }
        if e < full {
            a0 = V::load(&row[e..]).fma(V::load(&x[e..]), a0);
        }
        let mut d = a0.add(a1).hsum();
        for i in full..h {
            d += row[i] * x[i];
        }
        *o = d;
    }
}

/// `out[e] += sum_t p[t] * m[t * ld + e]` for `t < p.len()`, `e < out.len()` (attention's
/// weighted sum of value rows), `4 * LANES` outputs held in registers at a time.
#[inline(always)]
pub fn axpy_rows<V: VF32>(p: &[f32], m: &[f32], ld: usize, out: &mut [f32]) {
    let (l, h) = (V::LANES, out.len());
    let mut e0 = 0;
    while e0 + l <= h {
        let w = ((h - e0) / l).min(4);
        let mut acc = [V::splat(0.0); 4];
        for (a, o) in acc.iter_mut().zip(out[e0..].chunks_exact(l)).take(w) {
            *a = V::load(o);
        }
        for (t, &pt) in p.iter().enumerate() {
            let pv = V::splat(pt);
            let row = &m[t * ld + e0..];
            for (k, a) in acc.iter_mut().enumerate().take(w) {
                *a = V::load(&row[k * l..]).fma(pv, *a);
            }
        }
        for (k, a) in acc.iter().enumerate().take(w) {
            a.store(&mut out[e0 + k * l..]);
        }
        e0 += w * l;
    }
    for e in e0..h {
        let mut s = out[e];
        for (t, &pt) in p.iter().enumerate() {
            s += pt * m[t * ld + e];
        }
        out[e] = s;
    }
}

#[inline(always)]
pub fn sum<V: VF32>(x: &[f32]) -> f32 {
    let l = V::LANES;
    let mut acc = [V::splat(0.0); 4];
    let mut i = 0;
    while i + 4 * l <= x.len() {
        for (k, a) in acc.iter_mut().enumerate() {
            *a = a.add(V::load(&x[i + k * l..]));
        }
        i += 4 * l;
    }
    while i + l <= x.len() {
        acc[0] = acc[0].add(V::load(&x[i..]));
        i += l;
    }
    let mut s = acc[0].add(acc[1]).add(acc[2].add(acc[3])).hsum();
    for &v in &x[i..] {
        s += v;
    }
    s
}

/// Mean and (population) variance of a slice, two passes: lanes accumulate in f32 over blocks
/// of [`MOMENT_BLOCK`] elements, blocks in f64, so the error does not grow with the length.
/// The second pass sums deviations from the f32-rounded mean and corrects for its rounding.
#[inline(always)]
pub fn moments<V: VF32>(x: &[f32]) -> (f64, f64) {
    let n = x.len();
    if n == 0 {
        return (0.0, 0.0);
    }
    let s: f64 = x.chunks(MOMENT_BLOCK).map(|c| sum::<V>(c) as f64).sum();
    let mean = s / n as f64;
    let mf = mean as f32;
    let mv = V::splat(mf);
    let l = V::LANES;
    let (mut q, mut d) = (0f64, 0f64);
    for c in x.chunks(MOMENT_BLOCK) {
        let (mut a0, mut a1) = (V::splat(0.0), V::splat(0.0));
        let (mut d0, mut d1) = (V::splat(0.0), V::splat(0.0));
        let mut i = 0;
        while i + 2 * l <= c.len() {
            let e0 = V::load(&c[i..]).sub(mv);
            let e1 = V::load(&c[i + l..]).sub(mv);
            a0 = e0.fma(e0, a0);
            a1 = e1.fma(e1, a1);
            d0 = d0.add(e0);
            d1 = d1.add(e1);
            i += 2 * l;
        }
        let (mut qs, mut ds) = (a0.add(a1).hsum(), d0.add(d1).hsum());
        for &v in &c[i..] {
            let e = v - mf;
            qs += e * e;
            ds += e;
        }
        q += qs as f64;
        d += ds as f64;
    }
    let (nf, dm) = (n as f64, d / n as f64);
    // clamped at zero against rounding, but a NaN (from a NaN or an infinity in x) stays NaN
    let var = q / nf - dm * dm;
    (mf as f64 + dm, if var < 0.0 { 0.0 } else { var })
}

/// Block length of [`moments`]' f32 partial sums.
pub const MOMENT_BLOCK: usize = 512;

/// Maximum of the row's non-NaN values (a NaN may or may not win, by ISA); one pass.
#[inline(always)]
fn max_lanes<V: VF32>(x: &[f32]) -> f32 {
    let l = V::LANES;
    let mut m = f32::NEG_INFINITY;
    let mut i = 0;
    if x.len() >= l {
        let mut acc = V::load(x);
        i = l;
        while i + l <= x.len() {
            acc = V::load(&x[i..]).max(acc);
            i += l;
        }
        m = acc.hmax();
    }
    for &v in &x[i..] {
        if v > m {
            m = v;
        }
    }
    m
}

#[inline(always)]
pub fn max<V: VF32>(x: &[f32]) -> f32 {
    // a fold, not `any`: no early exit, so it compiles to vector compares
    if x.iter().fold(false, |n, v| n | v.is_nan()) {
        return f32::NAN;
    }
    max_lanes::<V>(x)
}

#[inline(always)]
pub fn softmax_row<V: VF32>(x: &[f32], y: &mut [f32]) {
    // no NaN pass needed: a NaN in x makes its exp, and so the sum and every output, NaN
    let m = max_lanes::<V>(x);
    let l = V::LANES;
    let n = x.len().min(y.len());
    let mv = V::splat(m);
    // two sums, so the additions do not wait on each other
    let (mut acc, mut acc2) = (V::splat(0.0), V::splat(0.0));
    let mut i = 0;
    while i + 2 * l <= n {
        let e = V::load(&x[i..]).sub(mv).exp();
        let e2 = V::load(&x[i + l..]).sub(mv).exp();
        e.store(&mut y[i..]);
        e2.store(&mut y[i + l..]);
        acc = acc.add(e);
        acc2 = acc2.add(e2);
        i += 2 * l;
    }
    while i + l <= n {
        let e = V::load(&x[i..]).sub(mv).exp();
        e.store(&mut y[i..]);
        acc = acc.add(e);
        i += l;
    }
    let mut s = acc.add(acc2).hsum();
    if i < n {
        let mut buf = [f32::NEG_INFINITY; 16];
        buf[..n - i].copy_from_slice(&x[i..n]);
        let e = V::load(&buf).sub(mv).exp();
        e.store(&mut buf);
        for (o, &v) in y[i..n].iter_mut().zip(&buf) {
            *o = v;
            s += v;
        }
    }
    let inv = V::splat(1.0 / s);
    let mut i = 0;
    while i + l <= n {
        V::load(&y[i..]).mul(inv).store(&mut y[i..]);
        i += l;
    }
    for v in &mut y[i..n] {
        *v *= 1.0 / s;
    }
}

#[inline(always)]
pub fn normalize_row<V: VF32>(
    x: &[f32],
    mean: f32,
    inv_std: f32,
    scale: &[f32],
    bias: Option<&[f32]>,
    y: &mut [f32],
) {
    let l = V::LANES;
    let n = x.len().min(y.len()).min(scale.len());
    let (mv, iv) = (V::splat(mean), V::splat(inv_std));
    let mut i = 0;
    match bias {
        Some(b) => {
            let n = n.min(b.len());
            while i + l <= n {
                let t = V::load(&x[i..]).sub(mv).mul(iv);
                t.fma(V::load(&scale[i..]), V::load(&b[i..]))
                    .store(&mut y[i..]);
                i += l;
            }
            while i < n {
                y[i] = (x[i] - mean) * inv_std * scale[i] + b[i];
                i += 1;
            }
        }
        None => {
            while i + l <= n {
                let t = V::load(&x[i..]).sub(mv).mul(iv);
                t.mul(V::load(&scale[i..])).store(&mut y[i..]);
                i += l;
            }
            while i < n {
                y[i] = (x[i] - mean) * inv_std * scale[i];
                i += 1;
            }
        }
    }
}

// ------------------------------------------------------------------------------------ SGEMM

/// Blocking of the packed SGEMM (see [`sgemm_blocks`]): `KC` deep blocks of the reduction
/// (long ones: each pass over K costs every tile of C a load, an add and a store), `NC` wide
/// blocks of B (a `KC x NC` block, 768 KiB, stays in a 1 MiB L2), `MC` rows of A per block,
/// bands of `MS` rows of A packed at once. Measured on Zen 4 (1 MiB L2, 32 KiB L1): from
/// KC 256, NC 2048 to these, 256 x 3072 x 768 85 -> 98 GFLOP/s and 512 x 2048 x 1280 88 -> 100
/// (B packed, A strided, 1 thread).
const KC: usize = 768;
const MC: usize = 64;
const NC: usize = 256;
const MS: usize = 512;

/// `C = alpha*A*B + beta*C`: B packed in `KC x NR` panels (NR = 2 vectors), A in `MR x KC`
/// panels with alpha folded in, and an `MR x NR` register-blocked micro-kernel (MR per product:
/// [`gemm_mr_for`]).
#[inline(always)]
#[cfg_attr(not(test), allow(dead_code))]
pub fn sgemm<V: VF32>(g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
    sgemm_ops::<V>(g, Operand::Strided(a), Operand::Strided(b), c)
}

/// The micro-kernel's tile on this vector type: (rows of A's panels, columns of B's panels).
#[inline(always)]
pub fn gemm_tile<V: VF32>() -> (usize, usize) {
    let mr = match V::GEMM_MR {
        12.. => 12,
        8..=11 => 8,
        _ => 4,
    };
    (mr, 2 * V::LANES)
}

/// The height of A's panels for an `m`-row product: the vector type's widest tile, except that
/// on AVX-512 the 8-row tile replaces the 12-row one where 12 would pad much more (rows weighted
/// by each tile's cost: the 12-row tile does about 10% more per cycle), so 16, 32 or 64 rows
/// run as 8-row panels rather than padding to 24, 36 or 72.
#[inline(always)]
pub fn gemm_mr_for<V: VF32>(m: usize) -> usize {
    let top = gemm_tile::<V>().0;
    let cost = |mr: usize, weight: usize| m.div_ceil(mr) * mr * weight;
    if top < 8 {
        return top;
    }
    // (the 4-row tile is never taken where an 8-row one exists: one-row products such as the
    // recurrent steps of LSTM/GRU measured 5% slower on it)
    let mut best = (cost(8, 22), 8);
    if top >= 12 {
        best = best.min((cost(12, 20), 12));
    }
    best.1
}

/// Whether A panels `panel` rows high have a micro-kernel on this vector type.
#[inline(always)]
pub fn gemm_panel_ok<V: VF32>(panel: usize) -> bool {
    panel == 4 || (panel == 8 && V::GEMM_MR >= 8) || (panel == 12 && V::GEMM_MR >= 12)
}

/// [`sgemm`] over operands either of which may come packed ([`Operand::Panels`]: B in the
/// layout of [`gemm_tile`], A in panels of a height [`gemm_panel_ok`] accepts; a packed A
/// needs `alpha = 1`). The caller has checked strided operands with `gemm_fits` and packed
/// ones with `Operand::panels_fit`.
///
/// Each panel height is its own entry below ([`sgemm_ops_12`], ...), dispatched as a function of
/// its own: with all three inlined into one function, the register allocator spilled the 8-row
/// tile's accumulators to the stack on every step of K (2.4x slower).
#[inline(always)]
#[cfg_attr(not(test), allow(dead_code))]
pub fn sgemm_ops<V: VF32>(g: &Gemm, a: Operand<'_>, b: Operand<'_>, c: &mut [f32]) {
    let epi = GemmEpi::NONE;
    match sgemm_panel_height::<V>(g, &a) {
        12 => sgemm_ops_12::<V>(g, a, b, c, epi),
        8 => sgemm_ops_8::<V>(g, a, b, c, epi),
        _ => sgemm_ops_4::<V>(g, a, b, c, epi),
    }
}

/// The A panel height [`sgemm_ops`] runs a product with: a packed A's own, else
/// [`gemm_mr_for`]'s.
#[inline(always)]
pub fn sgemm_panel_height<V: VF32>(g: &Gemm, a: &Operand<'_>) -> usize {
    match a {
        Operand::Panels { panel, .. } => *panel,
        _ => gemm_mr_for::<V>(g.m),
    }
}

/// [`sgemm_ops`] on 12-row A panels (8-row ones where the vector type has no 12-row tile).
#[inline(always)]
pub fn sgemm_ops_12<V: VF32>(
    g: &Gemm,
    a: Operand<'_>,
    b: Operand<'_>,
    c: &mut [f32],
    epi: GemmEpi<'_>,
) {
    if V::GEMM_MR >= 12 {
        sgemm_mr::<V, 12>(g, a, b, c, epi)
    } else {
        sgemm_ops_8::<V>(g, a, b, c, epi)
    }
}

/// [`sgemm_ops`] on 8-row A panels (4-row ones where the vector type has no 8-row tile).
#[inline(always)]
pub fn sgemm_ops_8<V: VF32>(
    g: &Gemm,
    a: Operand<'_>,
    b: Operand<'_>,
    c: &mut [f32],
    epi: GemmEpi<'_>,
) {
    if V::GEMM_MR >= 8 {
        sgemm_mr::<V, 8>(g, a, b, c, epi)
    } else {
        sgemm_ops_4::<V>(g, a, b, c, epi)
    }
}

/// [`sgemm_ops`] on 4-row A panels.
#[inline(always)]
pub fn sgemm_ops_4<V: VF32>(
    g: &Gemm,
    a: Operand<'_>,
    b: Operand<'_>,
    c: &mut [f32],
    epi: GemmEpi<'_>,
) {
    sgemm_mr::<V, 4>(g, a, b, c, epi)
}

#[inline(always)]
fn sgemm_mr<V: VF32, const MR: usize>(
    g: &Gemm,
    a: Operand<'_>,
    b: Operand<'_>,
    c: &mut [f32],
    epi: GemmEpi<'_>,
) {
    let (m, n, k) = (g.m, g.n, g.k);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 || g.alpha == 0.0 {
        scale_c(g, c);
        return epi.apply(m, n, g.ldc, c);
    }
    // with beta 0 the blocked paths write C on their first pass over K (no zero-fill first)
    let overwrite = g.beta == 0.0;
    if !overwrite {
        scale_c(g, c);
    }
    let (Operand::Strided(a), Operand::Strided(b)) = (a, b) else {
        return sgemm_packed::<V, MR>(g, a, b, c, overwrite, epi);
    };
    if m < SMALL_M {
        if overwrite {
            scale_c(g, c);
        }
        if sgemm_few_rows::<V>(g, a, b, c) {
            return epi.apply(m, n, g.ldc, c);
        }
    }
    let nr = 2 * V::LANES;
    if 2 * n <= nr && m >= 2 * nr {
        // Narrow C (a strided 1-D conv, a few output positions): most of each NR-wide tile
        // would be padding, so compute C^T = B^T A^T (n rows, m columns) and add it in.
        let mut t = super::scratch::<f32>(n * m);
        let gt = Gemm {
            m: n,
            n: m,
            k,
            a_rs: g.b_cs,
            a_cs: g.b_rs,
            b_rs: g.a_cs,
            b_cs: g.a_rs,
            ldc: m,
            alpha: g.alpha,
            beta: 0.0,
        };
        t.fill(0.0);
        if !(gt.m < SMALL_M && sgemm_few_rows::<V>(&gt, b, a, &mut t)) {
            let (b, a) = (Operand::Strided(b), Operand::Strided(a));
            sgemm_packed::<V, MR>(&gt, b, a, &mut t, false, GemmEpi::NONE);
        }
        for i in 0..m {
            let row = &mut c[i * g.ldc..i * g.ldc + n];
            for (j, x) in row.iter_mut().enumerate() {
                let v = t[j * m + i];
                *x = if overwrite { v } else { *x + v };
            }
        }
        return epi.apply(m, n, g.ldc, c);
    }
    sgemm_packed::<V, MR>(
        g,
        Operand::Strided(a),
        Operand::Strided(b),
        c,
        overwrite,
        epi,
    )
}

/// Whether [`sgemm_narrow`] takes a product: A packed in panels of a height the vector type
/// has, B strided with contiguous rows, alpha 1, and C of 2 to half a tile's columns (one
/// column, a GEMV, keeps the SGEMM's streaming path).
#[inline(always)]
pub fn sgemm_narrow_fits<V: VF32>(g: &Gemm, a: &Operand<'_>, b: &Operand<'_>) -> bool {
    let nr = 2 * V::LANES;
    matches!((a, b), (Operand::Panels { panel, .. }, Operand::Strided(_))
        if gemm_panel_ok::<V>(*panel) && MR_NARROW.contains(panel))
        && (2..=nr / 2).contains(&g.n)
        && g.alpha == 1.0
        && g.b_cs == 1
        && g.b_rs >= 0
        && g.k > 0
}

/// The panel heights [`sgemm_narrow`] is instantiated for.
const MR_NARROW: [usize; 3] = [4, 8, 12];

/// `C = A B + beta C` by [`sgemm_narrow_panels`] (see [`sgemm_narrow_fits`]; a dispatched
/// function of its own, so that it never shares a function, and its register allocation, with
/// the blocked SGEMM's micro-kernels).
#[inline(always)]
pub fn sgemm_narrow<V: VF32>(g: &Gemm, a: Operand<'_>, b: Operand<'_>, c: &mut [f32]) {
    let (Operand::Panels { data, panel }, Operand::Strided(bs)) = (a, b) else {
        panic!("sgemm_narrow: A packed, B strided");
    };
    let overwrite = g.beta == 0.0;
    if !overwrite {
        scale_c(g, c);
    }
    match panel {
        12 => sgemm_narrow_panels::<V, 12>(g, data, bs, c, overwrite),
        8 => sgemm_narrow_panels::<V, 8>(g, data, bs, c, overwrite),
        _ => sgemm_narrow_panels::<V, 4>(g, data, bs, c, overwrite),
    }
}

/// `C (+)= A B` for a narrow C (a few columns, B's rows contiguous) with A packed in `MR`-row
/// panels: each panel's `MR` values at one step of K are contiguous, so they are the vector
/// operand, loaded once per step and multiplied by each column's broadcast `B[k][j]`; a block
/// of C (the panel's rows by up to 8 columns) stays in registers over the whole of K and is
/// stored transposed at the end. No B packing and no padded columns: the weights stream
/// through once (oww's melspectrogram: 257 x 8 x 512 twice per run; silero's STFT and
/// encoder convolutions). C was already scaled by beta (or is overwritten when `overwrite`).
#[inline(always)]
fn sgemm_narrow_panels<V: VF32, const MR: usize>(
    g: &Gemm,
    ap: &[f32],
    b: &[f32],
    c: &mut [f32],
    overwrite: bool,
) {
    let (m, n, k) = (g.m, g.n, g.k);
    assert!(
        MR.div_ceil(V::LANES) <= NARROW_VMAX && ap.len() >= m.div_ceil(MR) * MR * k,
        "narrow: A's panels"
    );
    assert!(
        g.b_rs >= 0 && g.b_cs == 1,
        "narrow: B's rows are contiguous"
    );
    assert!((k - 1) * g.b_rs as usize + n <= b.len(), "narrow: B");
    let wide = MR.div_ceil(V::LANES) > 1;
    for (p, panel) in ap.chunks_exact(MR * k).take(m.div_ceil(MR)).enumerate() {
        let mut j0 = 0;
        while j0 < n {
            // the widest block of columns that fits (fewer when a panel takes several vectors)
            j0 += match n - j0 {
                8.. if !wide => narrow_block::<V, MR, 8>(g, panel, b, c, p * MR, j0, overwrite),
                4.. => narrow_block::<V, MR, 4>(g, panel, b, c, p * MR, j0, overwrite),
                2.. => narrow_block::<V, MR, 2>(g, panel, b, c, p * MR, j0, overwrite),
                _ => narrow_block::<V, MR, 1>(g, panel, b, c, p * MR, j0, overwrite),
            };
        }
    }
}

/// Vectors of one panel's rows at most (12 rows on 4 lanes).
const NARROW_VMAX: usize = 3;

/// One block of [`sgemm_narrow_panels`]: rows `i0..i0 + MR` (of C; the panel's) by columns
/// `j0..j0 + NB`. Returns `NB`.
#[inline(always)]
fn narrow_block<V: VF32, const MR: usize, const NB: usize>(
    g: &Gemm,
    panel: &[f32],
    b: &[f32],
    c: &mut [f32],
    i0: usize,
    j0: usize,
    overwrite: bool,
) -> usize {
    let k = g.k;
    let l = V::LANES;
    let vp = MR.div_ceil(l);
    let b_rs = g.b_rs as usize;
    let mut last = [0.0f32; NARROW_VMAX * 16];
    // fewer than 8 independent sums cannot cover the FMA latency: then even and odd steps of
    // K go to two sets of sums, added at the end (each set by a constant index: chosen at run
    // time, the sums would live in memory)
    let z = V::splat(0.0);
    let mut acc = [[z; NARROW_VMAX]; NB];
    let mut odd = [[z; NARROW_VMAX]; NB];
    let bk = &b[j0..];
    let mut kk = 0;
    if NB * vp < 8 {
        while kk + 2 <= k {
            narrow_step::<V, MR, NB>(panel, bk, b_rs, kk, &mut acc, &mut last);
            narrow_step::<V, MR, NB>(panel, bk, b_rs, kk + 1, &mut odd, &mut last);
            kk += 2;
        }
    }
    while kk < k {
        narrow_step::<V, MR, NB>(panel, bk, b_rs, kk, &mut acc, &mut last);
        kk += 1;
    }
    let rows = MR.min(g.m - i0);
    let mut out = [0.0f32; NARROW_VMAX * 16];
    for (jj, a) in acc.iter().enumerate() {
        for v in 0..vp {
            a[v].add(odd[jj][v]).store(&mut out[v * l..]);
        }
        for (r, &val) in out[..rows].iter().enumerate() {
            let x = &mut c[(i0 + r) * g.ldc + j0 + jj];
            *x = if overwrite { val } else { *x + val };
        }
    }
    NB
}

/// Step `kk` of K of [`narrow_block`]: the panel's `MR` values times each column's broadcast
/// `B[kk][j0 + jj]` (`bk` is B from column `j0`), into `acc`.
#[inline(always)]
fn narrow_step<V: VF32, const MR: usize, const NB: usize>(
    panel: &[f32],
    bk: &[f32],
    b_rs: usize,
    kk: usize,
    acc: &mut [[V; NARROW_VMAX]; NB],
    last: &mut [f32; NARROW_VMAX * 16],
) {
    let l = V::LANES;
    let vp = MR.div_ceil(l);
    // the last steps of K read their MR values from a copy where whole vectors would pass
    // the end of the panel (MR = 12 on 16 lanes)
    let src: &[f32] = if kk * MR + vp * l <= panel.len() {
        &panel[kk * MR..]
    } else {
        last[..MR].copy_from_slice(&panel[kk * MR..(kk + 1) * MR]);
        &last[..]
    };
    let mut w = [V::splat(0.0); NARROW_VMAX];
    for (v, wv) in w.iter_mut().enumerate().take(vp) {
        *wv = V::load(&src[v * l..]);
    }
    // SAFETY: j0 + NB <= n, so kk * b_rs + jj < (k - 1) * b_rs + n - j0 <= bk.len()
    // (asserted by the caller)
    let br = unsafe { bk.get_unchecked(kk * b_rs..) };
    for (jj, a) in acc.iter_mut().enumerate() {
        let bv = V::splat(unsafe { *br.get_unchecked(jj) });
        for v in 0..vp {
            a[v] = w[v].fma(bv, a[v]);
        }
    }
}

/// The packed, blocked SGEMM accumulating `alpha*A*B` into C (beta already applied), or with
/// `overwrite` storing it there (C's old values are never read).
#[inline(always)]
fn sgemm_packed<V: VF32, const MR: usize>(
    g: &Gemm,
    a: Operand<'_>,
    b: Operand<'_>,
    c: &mut [f32],
    overwrite: bool,
    epi: GemmEpi<'_>,
) {
    let (m, n, k) = (g.m, g.n, g.k);
    let nr = 2 * V::LANES;
    let kc_max = KC.min(k);
    let nc_max = NC.min(n).div_ceil(nr) * nr;
    let ms_max = MS.div_ceil(MR).min(m.div_ceil(MR)) * MR;
    let bn = if matches!(b, Operand::Strided(_)) {
        kc_max * nc_max
    } else {
        0
    };
    let an = if matches!(a, Operand::Strided(_)) {
        kc_max * ms_max
    } else {
        0
    };
    let mut buf = super::scratch::<f32>(bn + an);
    let (bp, ap) = buf.split_at_mut(bn);
    sgemm_blocks::<V, MR>(g, a, b, c, (bp, ap), overwrite, epi)
}

/// The blocked loops of [`sgemm_mr`] over packing buffers `bp` (B panels) and `ap` (A panels),
/// used for the strided operands (a packed one is read in place); with `overwrite` the first
/// block of K stores into C instead of adding.
///
/// Loops, outermost first: bands of up to `MS` rows of A; blocks of `KC` of the reduction
/// (a strided A's band packed once for it); blocks of `NC` columns of B (a strided B's block
/// packed once for them, small enough to stay in a 1 MiB L2); blocks of `MC` rows of the
/// band; then the micro-kernel's tiles, each B panel (in L1) against the block's A panels.
/// Every element of C sums the blocks of K in order, whatever the blocking.
#[inline(always)]
fn sgemm_blocks<V: VF32, const MR: usize>(
    g: &Gemm,
    a: Operand<'_>,
    b: Operand<'_>,
    c: &mut [f32],
    (bp, ap): (&mut [f32], &mut [f32]),
    overwrite: bool,
    epi: GemmEpi<'_>,
) {
    let (m, n, k) = (g.m, g.n, g.k);
    let nr = 2 * V::LANES;
    let band = MS.div_ceil(MR) * MR;
    let mc_max = MC.div_ceil(MR) * MR;
    let mut is = 0;
    while is < m {
        let ms = band.min(m - is);
        let mut pc = 0;
        while pc < k {
            let kc = KC.min(k - pc);
            // A[is.., pc..] as row panels: read in place when packed earlier, else packed
            // here once for every block of columns
            let (asrc, astep): (&[f32], usize) = match a {
                Operand::Panels { data, .. } => (&data[(is / MR * k + pc) * MR..], k * MR),
                Operand::Strided(a) => {
                    pack_a_block::<MR>(g, a, is, ms, pc, kc, ap);
                    (&ap[..ms.div_ceil(MR) * kc * MR], kc * MR)
                }
                // refused by the checks (a row operand is B only)
                Operand::Rows { .. } => return,
            };
            let rows = match b {
                Operand::Rows { offs, .. } => &offs[pc..pc + kc],
                _ => &[],
            };
            let store = overwrite && pc == 0;
            // the bias joins C on the first block of K, the clamp on the last
            let (first, last) = (pc == 0, pc + kc == k);
            let mut jc = 0;
            while jc < n {
                let nc = NC.min(n - jc);
                let npanels = nc.div_ceil(nr);
                // B[pc.., jc..] as column panels of width nr: packed here, read in place from
                // panels packed earlier, or read from its rows (the implicit GEMM)
                let (bsrc, bstep): (&[f32], usize) = match b {
                    Operand::Strided(b) => {
                        pack_b_block(g, b, pc, kc, jc, nc, nr, bp);
                        (&bp[..npanels * kc * nr], kc * nr)
                    }
                    Operand::Panels { data, .. } => (&data[(jc / nr * k + pc) * nr..], k * nr),
                    Operand::Rows { data, .. } => (data, 0),
                };
                if !rows.is_empty() {
                    let reach = npanels * nr + jc;
                    assert!(
                        rows.iter()
                            .all(|&o| o.checked_add(reach).is_some_and(|e| e <= bsrc.len())),
                        "sgemm: B rows run past their data"
                    );
                }
                let mut ic = 0;
                while ic < ms {
                    // whole panels per block (A is addressed by panel)
                    let mc = mc_max.min(ms - ic);
                    let mpanels = mc.div_ceil(MR);
                    let ablock = &asrc[ic / MR * astep..];
                    for pj in 0..npanels {
                        let j0 = jc + pj * nr;
                        let w = nr.min(jc + nc - j0);
                        for pi in 0..mpanels {
                            let i0 = is + ic + pi * MR;
                            let h = MR.min(is + ms - i0);
                            let apanel = &ablock[pi * astep..pi * astep + kc * MR];
                            let c0 = i0 * g.ldc + j0;
                            let e = GemmEpi {
                                bias: epi.bias.filter(|_| first).map(|b| &b[i0..]),
                                clamp: epi.clamp.filter(|_| last),
                            };
                            if rows.is_empty() {
                                let bpanel = &bsrc[pj * bstep..pj * bstep + kc * nr];
                                let brows = bpanel.chunks_exact(nr);
                                micro::<V, MR>(kc, apanel, brows, c, (c0, g.ldc), (h, w), store, e);
                            } else {
                                // SAFETY: every row offset plus this block's columns rounded
                                // up to whole panels lies inside `bsrc` (asserted above), and
                                // j0 + nr <= jc + nc rounded up to nr.
                                let brows = rows
                                    .iter()
                                    .map(|&o| unsafe { bsrc.get_unchecked(o + j0..o + j0 + nr) });
                                micro::<V, MR>(kc, apanel, brows, c, (c0, g.ldc), (h, w), store, e);
                            }
                        }
                    }
                    ic += mc;
                }
                jc += nc;
            }
            pc += kc;
        }
        is += ms;
    }
}

/// Packs `B[pc..pc+kc, jc..jc+nc]` (strided) into column panels of width `nr`, zero-padded.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn pack_b_block(
    g: &Gemm,
    b: &[f32],
    pc: usize,
    kc: usize,
    jc: usize,
    nc: usize,
    nr: usize,
    bp: &mut [f32],
) {
    let bt = |p: usize, j: usize| b[p * g.b_rs as usize + j * g.b_cs as usize];
    for (pi, panel) in bp.chunks_mut(kc * nr).take(nc.div_ceil(nr)).enumerate() {
        let j0 = jc + pi * nr;
        let w = nr.min(jc + nc - j0);
        if g.b_rs == 1 && g.b_cs != 1 {
            // column-major B: read each column's run of kc contiguously
            for jj in 0..w {
                let s = (j0 + jj) * g.b_cs as usize + pc;
                for (p, &v) in b[s..s + kc].iter().enumerate() {
                    panel[p * nr + jj] = v;
                }
            }
            for p in 0..kc {
                panel[p * nr + w..p * nr + nr].fill(0.0);
            }
            continue;
        }
        for p in 0..kc {
            let dst = &mut panel[p * nr..p * nr + nr];
            if g.b_cs == 1 {
                let s = (pc + p) * g.b_rs as usize + j0;
                dst[..w].copy_from_slice(&b[s..s + w]);
            } else {
                for (jj, d) in dst[..w].iter_mut().enumerate() {
                    *d = bt(pc + p, j0 + jj);
                }
            }
            dst[w..].fill(0.0);
        }
    }
}

/// Packs `A[ic..ic+mc, pc..pc+kc]` (strided) into row panels of height `MR`, zero-padded,
/// with alpha folded in.
#[inline(always)]
fn pack_a_block<const MR: usize>(
    g: &Gemm,
    a: &[f32],
    ic: usize,
    mc: usize,
    pc: usize,
    kc: usize,
    ap: &mut [f32],
) {
    let at = |i: usize, p: usize| a[i * g.a_rs as usize + p * g.a_cs as usize];
    for (pi, panel) in ap.chunks_mut(kc * MR).take(mc.div_ceil(MR)).enumerate() {
        let i0 = ic + pi * MR;
        let h = MR.min(ic + mc - i0);
        if g.a_cs == 1 {
            // row-major A: read each row's run of kc contiguously
            let panel = &mut panel[..kc * MR];
            for ii in 0..MR {
                if ii < h {
                    let s = (i0 + ii) * g.a_rs as usize + pc;
                    for (p, &v) in a[s..s + kc].iter().enumerate() {
                        panel[p * MR + ii] = g.alpha * v;
                    }
                } else {
                    for p in 0..kc {
                        panel[p * MR + ii] = 0.0;
                    }
                }
            }
            continue;
        }
        for p in 0..kc {
            let dst = &mut panel[p * MR..p * MR + MR];
            for (ii, d) in dst.iter_mut().enumerate() {
                *d = if ii < h {
                    g.alpha * at(i0 + ii, pc + p)
                } else {
                    0.0
                };
            }
        }
    }
}

/// Below this many rows, packing B costs about as much as the product itself (GEMV-like
/// products: RNN steps, decode steps, batch-1 Gemm), so [`sgemm_few_rows`] runs unpacked.
const SMALL_M: usize = 4;

/// `C += alpha*A*B` without packing, for a few rows of A: B row-major (axpy over blocks of C
/// held in registers) or B column-major with A's rows contiguous (dot products, four columns
/// at a time). Returns `false` for other layouts.
#[inline(always)]
fn sgemm_few_rows<V: VF32>(g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) -> bool {
    let (m, n, k) = (g.m, g.n, g.k);
    let l = V::LANES;
    let (a_rs, a_cs, b_rs, b_cs) = (
        g.a_rs as usize,
        g.a_cs as usize,
        g.b_rs as usize,
        g.b_cs as usize,
    );
    if g.b_cs == 1 {
        // C's rows stay in L1 while B streams through once, four rows of B at a time (one
        // load and store of C per four multiply-adds)
        let nv = n / l * l;
        let mut p = 0;
        while p < k {
            let q = 4.min(k - p);
            let b0 = &b[p * b_rs..p * b_rs + n];
            let b1 = &b[(p + 1).min(k - 1) * b_rs..][..n];
            let b2 = &b[(p + 2).min(k - 1) * b_rs..][..n];
            let b3 = &b[(p + 3).min(k - 1) * b_rs..][..n];
            for i in 0..m {
                let crow = &mut c[i * g.ldc..i * g.ldc + n];
                // rows of B past k get a zero weight
                let w = |d: usize| {
                    if d < q {
                        g.alpha * a[i * a_rs + (p + d) * a_cs]
                    } else {
                        0.0
                    }
                };
                let (a0, a1, a2, a3) = (w(0), w(1), w(2), w(3));
                let (v0, v1, v2, v3) = (V::splat(a0), V::splat(a1), V::splat(a2), V::splat(a3));
                let mut j = 0;
                while j < nv {
                    let x = V::load(&crow[j..]);
                    let x = v0.fma(V::load(&b0[j..]), x);
                    let x = v1.fma(V::load(&b1[j..]), x);
                    let x = v2.fma(V::load(&b2[j..]), x);
                    let x = v3.fma(V::load(&b3[j..]), x);
                    x.store(&mut crow[j..]);
                    j += l;
                }
                for jj in nv..n {
                    crow[jj] += a0 * b0[jj] + a1 * b1[jj] + a2 * b2[jj] + a3 * b3[jj];
                }
            }
            p += q;
        }
        return true;
    }
    if g.b_rs == 1 && g.a_cs == 1 {
        for i in 0..m {
            let arow = &a[i * a_rs..i * a_rs + k];
            let crow = &mut c[i * g.ldc..i * g.ldc + n];
            let mut j = 0;
            while j + 4 <= n {
                let cols: [&[f32]; 4] =
                    core::array::from_fn(|q| &b[(j + q) * b_cs..(j + q) * b_cs + k]);
                let d = dot4::<V>(arow, cols);
                for q in 0..4 {
                    crow[j + q] += g.alpha * d[q];
                }
                j += 4;
            }
            while j < n {
                let col = &b[j * b_cs..j * b_cs + k];
                crow[j] += g.alpha * dot4::<V>(arow, [col, col, col, col])[0];
                j += 1;
            }
        }
        return true;
    }
    false
}

/// `C (+)= alpha*A*B` for a few rows of A (fewer than [`SMALL_M`]) from B's packed panels
/// (weights packed at load): A's rows (alpha folded in) interleaved in a small buffer, then
/// `NP` panels at a time as `NP` long sequential streams through B: one panel from each of
/// `NP` equal runs of consecutive panels where panels are short or narrow, `NP` adjacent
/// panels (each a long stream itself) otherwise; see `few_rows_panels_r`. A GEMV at memory
/// speed, none of a packed A's padding.
/// Taken (by `sgemm_ops`) for a strided A of 1 to 3 rows with B packed; a function of its
/// own, since inlined into the blocked SGEMM it changes that function's register allocation.
#[inline(always)]
pub fn sgemm_few_panels<V: VF32>(g: &Gemm, a: &[f32], bp: &[f32], c: &mut [f32]) {
    let (m, n, k) = (g.m, g.n, g.k);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 || g.alpha == 0.0 {
        return scale_c(g, c);
    }
    let store = g.beta == 0.0;
    if !store {
        scale_c(g, c);
    }
    debug_assert!(m < SMALL_M);
    few_rows_panels::<V>(g, a, bp, c, store)
}

/// Whether [`sgemm_few_panels`] takes a product of `m` rows.
pub const fn few_panels_fit(m: usize) -> bool {
    m < SMALL_M
}

#[inline(always)]
fn few_rows_panels<V: VF32>(g: &Gemm, a: &[f32], bp: &[f32], c: &mut [f32], store: bool) {
    match g.m {
        1 => few_rows_panels_r::<V, 1, 4>(g, a, bp, c, store),
        2 => few_rows_panels_r::<V, 2, 2>(g, a, bp, c, store),
        _ => few_rows_panels_r::<V, 3, 2>(g, a, bp, c, store),
    }
}

#[inline(always)]
fn few_rows_panels_r<V: VF32, const R: usize, const NP: usize>(
    g: &Gemm,
    a: &[f32],
    bp: &[f32],
    c: &mut [f32],
    store: bool,
) {
    let (m, n, k) = (g.m, g.n, g.k);
    debug_assert!(m <= R);
    let nr = 2 * V::LANES;
    // A's rows as [p][r] (rows past m are zero)
    let mut at = super::scratch::<f32>(k * R);
    for p in 0..k {
        for r in 0..R {
            at[p * R + r] = if r < m {
                g.alpha * a[r * g.a_rs as usize + p * g.a_cs as usize]
            } else {
                0.0
            };
        }
    }
    let at = &at[..k * R];
    let npan = n.div_ceil(nr);
    let pan = k * nr;
    // NP streams through B. Panels shorter than 64 KiB, or panel rows shorter than a cache
    // line (4 lanes): stream q runs through the q-th of NP contiguous runs of `span` panels, so
    // every stream is long and sequential whatever K is (NP adjacent short panels were NP
    // streams that each ended after one panel: in wasm at K = 256 half the speed; in wasm the
    // runs were faster at K = 2048 and 4096 too). Otherwise NP adjacent panels, each a long
    // stream already (there the runs, far apart in memory, measured 10-20% slower with
    // AVX-512's 128-byte panel rows). The few panels past NP*span one at a time.
    let span = npan / NP;
    let (step, dq) = if pan * 4 < 64 * 1024 || nr * 4 < 64 {
        (1, span)
    } else {
        (NP, 1)
    };
    for i in 0..span {
        let pans: [&[f32]; NP] = core::array::from_fn(|q| &bp[(i * step + q * dq) * pan..][..pan]);
        let sums = panels_sums::<V, R, NP>(at, pans, k);
        put_sums::<V, R, NP>(g, &sums, i * step * nr, dq * nr, c, store);
    }
    for pj in NP * span..npan {
        let sums = panel_sums_unrolled::<V, R>(at, &bp[pj * pan..], k);
        put_sums::<V, R, 1>(g, &[sums], pj * nr, 0, c, store);
    }
}

/// Sums over K of `R` rows times `NP` panels (`pans`, each `k` rows of one panel; one
/// broadcast of A feeds `2 NP` multiply-adds), as `[panel][row][half]`.
#[inline(always)]
fn panels_sums<V: VF32, const R: usize, const NP: usize>(
    at: &[f32],
    pans: [&[f32]; NP],
    k: usize,
) -> [[[V; 2]; R]; NP] {
    let l = V::LANES;
    let nr = 2 * l;
    let z = V::splat(0.0);
    let mut acc = [[[z; 2]; R]; NP];
    assert!(pans.iter().all(|pq| pq.len() >= k * nr));
    for (p, ap) in at[..k * R].chunks_exact(R).enumerate() {
        let mut av = [z; R];
        for r in 0..R {
            av[r] = V::splat(ap[r]);
        }
        // each panel's two vectors feed its sums as soon as they are loaded: the fewest
        // values live at once (a wasm engine's 16 registers hold them without spilling)
        for q in 0..NP {
            // SAFETY: p < k and every panel holds k rows of nr (asserted above); the checked
            // slice cost wasm 20% of the GEMV (V8 keeps the compare and branch per load)
            let row = unsafe { pans[q].get_unchecked(p * nr..p * nr + nr) };
            let (b0, b1) = (V::load(row), V::load(&row[l..]));
            for r in 0..R {
                acc[q][r][0] = av[r].fma(b0, acc[q][r][0]);
                acc[q][r][1] = av[r].fma(b1, acc[q][r][1]);
            }
        }
    }
    acc
}

/// Sums over K of `R` rows times one panel, K unrolled four times (four independent sets of
/// sums, added at the end), as `[row][half]`.
#[inline(always)]
fn panel_sums_unrolled<V: VF32, const R: usize>(at: &[f32], bp: &[f32], k: usize) -> [[V; 2]; R] {
    let l = V::LANES;
    let nr = 2 * l;
    let pan = &bp[..k * nr];
    let z = V::splat(0.0);
    let mut acc = [[[z; 2]; R]; 4];
    let k4 = k / 4 * 4;
    for (ap, rows) in at[..k4 * R]
        .chunks_exact(4 * R)
        .zip(pan[..k4 * nr].chunks_exact(4 * nr))
    {
        for (u, accu) in acc.iter_mut().enumerate() {
            let b0 = V::load(&rows[u * nr..]);
            let b1 = V::load(&rows[u * nr + l..]);
            for (r, accr) in accu.iter_mut().enumerate() {
                let av = V::splat(ap[u * R + r]);
                accr[0] = av.fma(b0, accr[0]);
                accr[1] = av.fma(b1, accr[1]);
            }
        }
    }
    for p in k4..k {
        let b0 = V::load(&pan[p * nr..]);
        let b1 = V::load(&pan[p * nr + l..]);
        for (r, accr) in acc[0].iter_mut().enumerate() {
            let av = V::splat(at[p * R + r]);
            accr[0] = av.fma(b0, accr[0]);
            accr[1] = av.fma(b1, accr[1]);
        }
    }
    let mut out = acc[0];
    for accu in &acc[1..] {
        for r in 0..R {
            out[r][0] = out[r][0].add(accu[r][0]);
            out[r][1] = out[r][1].add(accu[r][1]);
        }
    }
    out
}

/// Writes (or with `store` false adds) the first `m` rows of `NP` panels' sums into C, panel
/// `q` from column `j0 + q * dj` on.
#[inline(always)]
fn put_sums<V: VF32, const R: usize, const NP: usize>(
    g: &Gemm,
    sums: &[[[V; 2]; R]; NP],
    j0: usize,
    dj: usize,
    c: &mut [f32],
    store: bool,
) {
    let l = V::LANES;
    let nr = 2 * l;
    let mut buf = [0f32; 32];
    for (q, sq) in sums.iter().enumerate() {
        let j = j0 + q * dj;
        let w = nr.min(g.n - j);
        for (r, s) in sq.iter().enumerate().take(g.m) {
            let o = r * g.ldc + j;
            s[0].store(&mut buf[..]);
            s[1].store(&mut buf[l..]);
            for (d, v) in c[o..o + w].iter_mut().zip(&buf) {
                *d = if store { *v } else { *d + v };
            }
        }
    }
}

/// Four dot products of `x` with `ys[q]` (all of `x`'s length), sharing the loads of `x`.
#[inline(always)]
fn dot4<V: VF32>(x: &[f32], ys: [&[f32]; 4]) -> [f32; 4] {
    let l = V::LANES;
    let k = x.len();
    let z = V::splat(0.0);
    let mut acc = [z; 4];
    let mut p = 0;
    while p + l <= k {
        let xv = V::load(&x[p..]);
        for q in 0..4 {
            acc[q] = xv.fma(V::load(&ys[q][p..]), acc[q]);
        }
        p += l;
    }
    let mut out = [0f32; 4];
    for q in 0..4 {
        let mut s = acc[q].hsum();
        for pp in p..k {
            s += x[pp] * ys[q][pp];
        }
        out[q] = s;
    }
    out
}

/// Accumulates an `h x w` tile (h <= MR, w <= 2 lanes) of `A_panel · B_panel` into C at
/// `c0` (rows `ldc` apart), or with `store` writes it there; the B panel's rows
/// (`2 * LANES` values each) come from `brows`.
///
/// On wasm the micro-kernel is a function of its own: inlined into the product's function, V8
/// stored half of the sums to the stack on every step of K (minilm_l6_v2 160 -> 112 ms in
/// Node, 1 thread).
#[cfg_attr(target_arch = "wasm32", inline(never))]
#[cfg_attr(not(target_arch = "wasm32"), inline(always))]
fn micro<'b, V: VF32, const MR: usize>(
    kc: usize,
    ap: &[f32],
    brows: impl Iterator<Item = &'b [f32]>,
    c: &mut [f32],
    (c0, ldc): (usize, usize),
    (h, w): (usize, usize),
    store: bool,
    epi: GemmEpi<'_>,
) {
    let l = V::LANES;
    let nr = 2 * l;
    let z = V::splat(0.0);
    let mut acc = [[z; 2]; MR];
    let ap = &ap[..kc * MR];
    for (av, bv) in ap.chunks_exact(MR).zip(brows) {
        let bv = &bv[..nr];
        let b0 = V::load(bv);
        let b1 = V::load(&bv[l..]);
        for (r, accr) in acc.iter_mut().enumerate() {
            let a = V::splat(av[r]);
            accr[0] = a.fma(b0, accr[0]);
            accr[1] = a.fma(b1, accr[1]);
        }
    }
    // the sums leave the registers through a tile on the stack, by constant indices only:
    // read at a run-time row (`r < h`), the accumulator array itself would live in memory and
    // LLVM then stores it on every step of K (measured: 2x slower, depending on unrelated code)
    let mut tile = [[0f32; 32]; MR];
    for r in 0..MR {
        acc[r][0].store(&mut tile[r][..]);
        acc[r][1].store(&mut tile[r][l..]);
    }
    // C (+)= the tile, then the epilogue: the bias after the sums (as a C filled with the bias
    // and accumulated into gives it), the clamp last
    for (r, t) in tile.iter().enumerate().take(h) {
        let o = c0 + r * ldc;
        let bias = epi.bias.map(|b| b[r]);
        if w == nr {
            let row = &mut c[o..o + nr];
            let (mut t0, mut t1) = (V::load(&t[..]), V::load(&t[l..]));
            if !store {
                t0 = V::load(row).add(t0);
                t1 = V::load(&row[l..]).add(t1);
            }
            if let Some(b) = bias {
                let bv = V::splat(b);
                (t0, t1) = (t0.add(bv), t1.add(bv));
            }
            if let Some(cl) = epi.clamp {
                (t0, t1) = (cl.then(t0), cl.then(t1));
            }
            t0.store(row);
            t1.store(&mut row[l..]);
        } else {
            for (d, s) in c[o..o + w].iter_mut().zip(t) {
                let mut v = if store { *s } else { *d + s };
                if let Some(b) = bias {
                    v += b;
                }
                if let Some(cl) = epi.clamp {
                    v = cl.then1(v);
                }
                *d = v;
            }
        }
    }
}

// ----------------------------------------------------------------------------- int8 element-wise

/// Where a quantized result goes: rounded half to even, plus `zp`, saturated to `lo..=hi`
/// (NaN: `lo`), stored as the low byte (uint8 or int8 bit patterns).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Q8 {
    pub zp: f32,
    pub lo: f32,
    pub hi: f32,
}

#[inline(always)]
fn q8_store<V: VF32>(v: V, q: Q8, d: &mut [u8]) {
    V::splat(q.lo)
        .max(v.round().add(V::splat(q.zp)))
        .min(V::splat(q.hi))
        .store_bytes(d)
}

/// `LANES` bytes as their integer values (int8 when `signed`).
#[inline(always)]
fn q8_load<V: VF32>(b: &[u8], signed: bool) -> V {
    let v = V::bytes(b);
    if signed {
        v.lt_select(V::splat(128.0), v, v.sub(V::splat(256.0)))
    } else {
        v
    }
}

/// Runs `f(src chunks, dst chunk)` over whole vectors, then over the tail through
/// zero-padded copies.
macro_rules! q8_lanes {
    ($l:expr, $n:expr, |$i:ident, $w:ident| $body:block) => {{
        let (l, n) = ($l, $n);
        let mut $i = 0;
        while $i + l <= n {
            let $w = l;
            $body
            $i += l;
        }
        if $i < n {
            let $w = n - $i;
            $body
        }
    }};
}

/// QuantizeLinear: `out = q(x / s)`.
#[inline(always)]
pub fn quantize_q8<V: VF32>(x: &[f32], s: f32, q: Q8, out: &mut [u8]) {
    let n = x.len().min(out.len());
    let sv = V::splat(s);
    q8_lanes!(V::LANES, n, |i, w| {
        if w == V::LANES {
            q8_store(V::load(&x[i..]).div(sv), q, &mut out[i..]);
        } else {
            let mut t = [0f32; 16];
            t[..w].copy_from_slice(&x[i..i + w]);
            let mut o = [0u8; 16];
            q8_store(V::load(&t).div(sv), q, &mut o);
            out[i..i + w].copy_from_slice(&o[..w]);
        }
    });
}

/// DequantizeLinear: `out = (x - z) * s`.
#[inline(always)]
pub fn dequantize_q8<V: VF32>(x: &[u8], signed: bool, z: f32, s: f32, out: &mut [f32]) {
    let n = x.len().min(out.len());
    let (zv, sv) = (V::splat(z), V::splat(s));
    q8_lanes!(V::LANES, n, |i, w| {
        if w == V::LANES {
            q8_load::<V>(&x[i..], signed)
                .sub(zv)
                .mul(sv)
                .store(&mut out[i..]);
        } else {
            let mut t = [0u8; 16];
            t[..w].copy_from_slice(&x[i..i + w]);
            let mut o = [0f32; 16];
            q8_load::<V>(&t, signed).sub(zv).mul(sv).store(&mut o);
            out[i..i + w].copy_from_slice(&o[..w]);
        }
    });
}

/// `out = q(acc * m)` (requantizing f32 sums).
#[inline(always)]
pub fn requantize_q8<V: VF32>(acc: &[f32], m: f32, q: Q8, out: &mut [u8]) {
    let n = acc.len().min(out.len());
    let mv = V::splat(m);
    q8_lanes!(V::LANES, n, |i, w| {
        if w == V::LANES {
            q8_store(V::load(&acc[i..]).mul(mv), q, &mut out[i..]);
        } else {
            let mut t = [0f32; 16];
            t[..w].copy_from_slice(&acc[i..i + w]);
            let mut o = [0u8; 16];
            q8_store(V::load(&t).mul(mv), q, &mut o);
            out[i..i + w].copy_from_slice(&o[..w]);
        }
    });
}

/// What [`qbinary_q8`] computes: com.microsoft QLinearAdd, `ra (a - za) + rb (b - zb)`, or
/// QLinearMul, `(a - za)(b - zb) r` (`rb` unused).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct QBin {
    pub mul: bool,
    pub za: f32,
    pub zb: f32,
    pub ra: f32,
    pub rb: f32,
}

#[inline(always)]
fn qbin<V: VF32>(p: QBin, a: V, b: V) -> V {
    let (a, b) = (a.sub(V::splat(p.za)), b.sub(V::splat(p.zb)));
    if p.mul {
        a.mul(b).mul(V::splat(p.ra))
    } else {
        a.mul(V::splat(p.ra)).add(b.mul(V::splat(p.rb)))
    }
}

/// `out[i] = q(a[i] op b[i % b.len()])` on int8 (`signed`) or uint8 bytes; `b.len()` divides
/// `a.len()` (one per element, or repeating), or with `per_b` each of `b`'s values covers
/// `per_b` consecutive elements of `a` (a per-channel operand), repeating.
#[inline(always)]
pub fn qbinary_q8<V: VF32>(
    p: QBin,
    a: &[u8],
    b: &[u8],
    per_b: usize,
    signed: bool,
    q: Q8,
    out: &mut [u8],
) {
    let n = a.len().min(out.len());
    if per_b > 1 {
        for (ci, (ac, oc)) in a[..n].chunks(per_b).zip(out.chunks_mut(per_b)).enumerate() {
            let bv = V::splat(if signed {
                b[ci % b.len()] as i8 as f32
            } else {
                b[ci % b.len()] as f32
            });
            q8_lanes!(V::LANES, ac.len(), |i, w| {
                if w == V::LANES {
                    q8_store(qbin(p, q8_load::<V>(&ac[i..], signed), bv), q, &mut oc[i..]);
                } else {
                    let mut t = [0u8; 16];
                    t[..w].copy_from_slice(&ac[i..i + w]);
                    let mut o = [0u8; 16];
                    q8_store(qbin(p, q8_load::<V>(&t, signed), bv), q, &mut o);
                    oc[i..i + w].copy_from_slice(&o[..w]);
                }
            });
        }
        return;
    }
    let bl = b.len();
    for (ac, oc) in a[..n].chunks(bl).zip(out.chunks_mut(bl)) {
        q8_lanes!(V::LANES, ac.len(), |i, w| {
            if w == V::LANES {
                let v = qbin(
                    p,
                    q8_load::<V>(&ac[i..], signed),
                    q8_load::<V>(&b[i..], signed),
                );
                q8_store(v, q, &mut oc[i..]);
            } else {
                let (mut ta, mut tb) = ([0u8; 16], [0u8; 16]);
                ta[..w].copy_from_slice(&ac[i..i + w]);
                tb[..w].copy_from_slice(&b[i..i + w]);
                let mut o = [0u8; 16];
                q8_store(
                    qbin(p, q8_load::<V>(&ta, signed), q8_load::<V>(&tb, signed)),
                    q,
                    &mut o,
                );
                oc[i..i + w].copy_from_slice(&o[..w]);
            }
        });
    }
}

/// `(min, max)` of `x` and 0 (DynamicQuantizeLinear's range, which always holds zero); both
/// NaN where `x` holds a NaN.
#[inline(always)]
pub fn range_with_zero<V: VF32>(x: &[f32]) -> (f32, f32) {
    // a fold, not `any`: no early exit, so it compiles to vector compares
    if x.iter().fold(false, |n, v| n | v.is_nan()) {
        return (f32::NAN, f32::NAN);
    }
    let l = V::LANES;
    let (mut lo, mut hi) = (V::splat(0.0), V::splat(0.0));
    let mut i = 0;
    while i + l <= x.len() {
        let v = V::load(&x[i..]);
        lo = lo.min(v);
        hi = hi.max(v);
        i += l;
    }
    let (mut a, mut b) = (-(V::splat(0.0).sub(lo)).hmax(), hi.hmax());
    for &v in &x[i..] {
        a = a.min(v);
        b = b.max(v);
    }
    (a, b)
}
