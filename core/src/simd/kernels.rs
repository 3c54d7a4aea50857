//! The generic bodies behind `simd`'s dispatched functions. Each is `#[inline(always)]` so it
//! is compiled inside the ISA-specific wrapper that instantiates it.

use super::VF32;
use crate::provider::Gemm;
use alloc::vec;

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
    assert!(!b.is_empty() && a.len() % b.len() == 0 && out.len() == a.len());
    if b.len() == 1 {
        return scalar_chunk::<V>(op, a, b[0], false, out);
    }
    for (o, x) in out.chunks_mut(b.len()).zip(a.chunks(b.len())) {
        zip_chunk::<V>(op, x, b, o);
    }
}

#[inline(always)]
pub fn binary_repeat_lhs<V: VF32>(op: BinOp, a: &[f32], b: &[f32], out: &mut [f32]) {
    assert!(!a.is_empty() && b.len() % a.len() == 0 && out.len() == b.len());
    if a.len() == 1 {
        return scalar_chunk::<V>(op, b, a[0], true, out);
    }
    for (o, y) in out.chunks_mut(a.len()).zip(b.chunks(a.len())) {
        zip_chunk::<V>(op, a, y, o);
    }
}

#[inline(always)]
fn map<V: VF32>(x: &[f32], out: &mut [f32], f: impl Fn(V) -> V) {
    let l = V::LANES;
    let n = x.len().min(out.len());
    let mut i = 0;
    while i + l <= n {
        f(V::load(&x[i..])).store(&mut out[i..]);
        i += l;
    }
    // the tail goes through the vector code too (padded), so every element gets the same math
    if i < n {
        let mut buf = [0f32; 16];
        buf[..n - i].copy_from_slice(&x[i..n]);
        f(V::load(&buf)).store(&mut buf);
        out[i..n].copy_from_slice(&buf[..n - i]);
    }
}

#[inline(always)]
pub fn relu<V: VF32>(x: &[f32], out: &mut [f32]) {
    // max(x, 0) with x first keeps NaN
    map::<V>(x, out, |v| v.max(V::splat(0.0)));
}

#[inline(always)]
pub fn sigmoid<V: VF32>(x: &[f32], out: &mut [f32]) {
    let one = V::splat(1.0);
    map::<V>(x, out, |v| one.div(one.add(V::splat(0.0).sub(v).exp())));
}

#[inline(always)]
pub fn exp<V: VF32>(x: &[f32], out: &mut [f32]) {
    map::<V>(x, out, |v| v.exp());
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
    if x.iter().any(|v| v.is_nan()) {
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
    let mut acc = V::splat(0.0);
    let mut i = 0;
    while i + l <= n {
        let e = V::load(&x[i..]).sub(mv).exp();
        e.store(&mut y[i..]);
        acc = acc.add(e);
        i += l;
    }
    let mut s = acc.hsum();
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

const MR: usize = 4;
const KC: usize = 256;
const MC: usize = 64;
const NC: usize = 2048;

/// `C = alpha*A*B + beta*C`: B packed in `KC x NR` panels (NR = 2 vectors), A in `MR x KC`
/// panels with alpha folded in, and an `MR x NR` register-blocked micro-kernel.
#[inline(always)]
pub fn sgemm<V: VF32>(g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
    let (m, n, k) = (g.m, g.n, g.k);
    if m == 0 || n == 0 {
        return;
    }
    crate::provider::scale_c(g, c);
    if k == 0 || g.alpha == 0.0 {
        return;
    }
    if m < SMALL_M && sgemm_few_rows::<V>(g, a, b, c) {
        return;
    }
    let nr = 2 * V::LANES;
    let kc_max = KC.min(k);
    let nc_max = NC.min(n).div_ceil(nr) * nr;
    let mc_max = MC.min(m).div_ceil(MR) * MR;
    let mut bp = vec![0f32; kc_max * nc_max];
    let mut ap = vec![0f32; kc_max * mc_max];
    let at = |i: usize, p: usize| a[i * g.a_rs as usize + p * g.a_cs as usize];
    let bt = |p: usize, j: usize| b[p * g.b_rs as usize + j * g.b_cs as usize];

    let mut jc = 0;
    while jc < n {
        let nc = NC.min(n - jc);
        let mut pc = 0;
        while pc < k {
            let kc = KC.min(k - pc);
            // pack B[pc.., jc..] into column panels of width nr, zero-padded
            for (pi, panel) in bp.chunks_mut(kc * nr).take(nc.div_ceil(nr)).enumerate() {
                let j0 = jc + pi * nr;
                let w = nr.min(jc + nc - j0);
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
            let mut ic = 0;
            while ic < m {
                let mc = MC.min(m - ic);
                // pack A[ic.., pc..] into row panels of height MR (alpha folded in)
                for (pi, panel) in ap.chunks_mut(kc * MR).take(mc.div_ceil(MR)).enumerate() {
                    let i0 = ic + pi * MR;
                    let h = MR.min(ic + mc - i0);
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
                for (pj, bpanel) in bp.chunks(kc * nr).take(nc.div_ceil(nr)).enumerate() {
                    let j0 = jc + pj * nr;
                    let w = nr.min(jc + nc - j0);
                    for (pi, apanel) in ap.chunks(kc * MR).take(mc.div_ceil(MR)).enumerate() {
                        let i0 = ic + pi * MR;
                        let h = MR.min(ic + mc - i0);
                        micro::<V>(kc, apanel, bpanel, c, i0 * g.ldc + j0, g.ldc, h, w);
                    }
                }
                ic += mc;
            }
            pc += kc;
        }
        jc += nc;
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
        for i in 0..m {
            let crow = &mut c[i * g.ldc..i * g.ldc + n];
            let arow = |p: usize| g.alpha * a[i * a_rs + p * a_cs];
            let mut j = 0;
            while j + 4 * l <= n {
                let mut acc = [
                    V::load(&crow[j..]),
                    V::load(&crow[j + l..]),
                    V::load(&crow[j + 2 * l..]),
                    V::load(&crow[j + 3 * l..]),
                ];
                for p in 0..k {
                    let av = V::splat(arow(p));
                    let brow = &b[p * b_rs + j..p * b_rs + j + 4 * l];
                    for (q, x) in acc.iter_mut().enumerate() {
                        *x = av.fma(V::load(&brow[q * l..]), *x);
                    }
                }
                for (q, x) in acc.iter().enumerate() {
                    x.store(&mut crow[j + q * l..]);
                }
                j += 4 * l;
            }
            while j + l <= n {
                let mut x = V::load(&crow[j..]);
                for p in 0..k {
                    x = V::splat(arow(p)).fma(V::load(&b[p * b_rs + j..]), x);
                }
                x.store(&mut crow[j..]);
                j += l;
            }
            for (jj, cv) in crow.iter_mut().enumerate().skip(j) {
                let mut s = 0.0;
                for p in 0..k {
                    s += arow(p) * b[p * b_rs + jj];
                }
                *cv += s;
            }
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

/// Accumulates an `h x w` tile (h <= MR, w <= 2 lanes) of `A_panel · B_panel` into C.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn micro<V: VF32>(
    kc: usize,
    ap: &[f32],
    bp: &[f32],
    c: &mut [f32],
    c0: usize,
    ldc: usize,
    h: usize,
    w: usize,
) {
    let l = V::LANES;
    let nr = 2 * l;
    let z = V::splat(0.0);
    let mut acc = [[z; 2]; MR];
    let ap = &ap[..kc * MR];
    let bp = &bp[..kc * nr];
    for (av, bv) in ap.chunks_exact(MR).zip(bp.chunks_exact(nr)) {
        let b0 = V::load(bv);
        let b1 = V::load(&bv[l..]);
        for (r, accr) in acc.iter_mut().enumerate() {
            let a = V::splat(av[r]);
            accr[0] = a.fma(b0, accr[0]);
            accr[1] = a.fma(b1, accr[1]);
        }
    }
    if w == nr {
        for (r, accr) in acc.iter().enumerate().take(h) {
            let o = c0 + r * ldc;
            let row = &mut c[o..o + nr];
            V::load(row).add(accr[0]).store(row);
            V::load(&row[l..]).add(accr[1]).store(&mut row[l..]);
        }
    } else {
        let mut buf = [0f32; 32];
        for (r, accr) in acc.iter().enumerate().take(h) {
            accr[0].store(&mut buf[..]);
            accr[1].store(&mut buf[l..]);
            let o = c0 + r * ldc;
            for (d, s) in c[o..o + w].iter_mut().zip(&buf) {
                *d += s;
            }
        }
    }
}
