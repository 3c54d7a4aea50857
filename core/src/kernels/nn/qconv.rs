//! QLinearConv and ConvInteger on integer kernels.
//!
//! Ungrouped convolutions are one integer product per image ([`simd::qgemm`]): the weights
//! (packed at load when constant) are the signed rows, the input's patches the unsigned
//! packed columns, and zero points, bias and requantization are the product's epilogue.
//! Grouped ones (depthwise) run the float convolution on the centered integers: every
//! product and partial sum is an integer below 2^24 for kernels of up to 258 taps, so the
//! float kernels compute the same sums exactly, then the same requantization follows.

use alloc::borrow::Cow;

use super::*;
use crate::simd::{qcols_pack, qrows_pack_on, Isa, QEpi, QGemm, QGeom, QOut, QVec};

/// The bytes of an int8 or uint8 tensor (int8 as bit patterns), and whether it is int8.
pub(crate) fn q8_bytes(t: &Tensor) -> Result<(Cow<'_, [u8]>, bool)> {
    Ok(match t.dtype() {
        DataType::Uint8 => (t.as_slice::<u8>()?, false),
        DataType::Int8 => match t.as_slice::<i8>()? {
            Cow::Borrowed(v) => (Cow::Borrowed(bytemuck::cast_slice(v)), true),
            Cow::Owned(v) => (Cow::Owned(bytemuck::cast_vec(v)), true),
        },
        dt => return Err(bad_type("quantized convolution", dt)),
    })
}

/// Address and length of an int8/uint8 tensor's elements when they are borrowed storage (a
/// constant), to recognise the tensor a kernel prepared from.
pub(crate) fn q8_key(t: &Tensor) -> Option<(usize, usize)> {
    match q8_bytes(t).ok()?.0 {
        Cow::Borrowed(v) => Some((v.as_ptr() as usize, v.len())),
        Cow::Owned(_) => None,
    }
}

/// A zero point as one value per output channel (or one for all), int8 or uint8 like `t`.
fn zero_points(zp: Option<&Tensor>, dt: DataType, m: usize) -> Result<Vec<i32>> {
    let Some(z) = zp else {
        return Ok(vec![0; m]);
    };
    if z.dtype() != dt {
        bail!("zero point type {} differs from input type {dt}", z.dtype());
    }
    let v = z.to_i64_vec()?;
    match v.len() {
        1 => Ok(vec![v[0] as i32; m]),
        n if n == m => Ok(v.iter().map(|&x| x as i32).collect()),
        _ => unsupported!("zero point of shape {:?} is not supported here", z.shape()),
    }
}

/// Weights ready for the products: the signed rows of the integer product (ungrouped), or
/// the centered values as f32 (grouped).
enum QWeights {
    Rows {
        /// `m` rows of `ka` bytes (int8; uint8 weights moved by -128), packed by
        /// [`qrows_pack_on`] for the product's ISA.
        rows: Vec<u8>,
        /// Each row's sum.
        sums: Vec<i32>,
        /// Each row's zero point, moved like the weights.
        zp: Vec<i32>,
        k: usize,
        ka: usize,
    },
    Centered(Vec<f32>),
}

impl QWeights {
    fn new(w: &Tensor, wzp: Option<&Tensor>, group: usize, isa: Isa) -> Result<QWeights> {
        let m = w.shape()[0];
        let k = w.len().checked_div(m).unwrap_or(0);
        let (wb, signed) = q8_bytes(w)?;
        let zp = zero_points(wzp, w.dtype(), m)?;
        if group == 1 {
            let flip = if signed { 0 } else { 0x80 };
            let g = simd::qgeom(isa, k, 1);
            let mut rows = vec![0u8; m * g.ka()];
            let mut sums = vec![0i32; m];
            qrows_pack_on(isa, &g, &wb, m, k, flip, &mut rows, &mut sums);
            let zp = zp
                .iter()
                .map(|&z| if signed { z } else { z - 128 })
                .collect();
            Ok(QWeights::Rows {
                rows,
                sums,
                zp,
                k,
                ka: g.ka(),
            })
        } else {
            let per = k;
            Ok(QWeights::Centered(
                wb.iter()
                    .enumerate()
                    .map(|(i, &b)| {
                        let v = if signed { b as i8 as i32 } else { b as i32 };
                        (v - zp[i / per.max(1)]) as f32
                    })
                    .collect(),
            ))
        }
    }

    fn bytes(&self) -> usize {
        match self {
            QWeights::Rows { rows, sums, zp, .. } => rows.len() + 4 * (sums.len() + zp.len()),
            QWeights::Centered(v) => 4 * v.len(),
        }
    }
}

/// Weights prepared at load: the keys of the weight and of its zero point, the instruction
/// set they were packed for, and the result.
type Prepared = ((usize, usize), Option<(usize, usize)>, Isa, QWeights);

/// QLinearConv (`qlinear`) or ConvInteger.
pub(super) struct QConv {
    sp: Spatial,
    group: usize,
    qlinear: bool,
    /// Weights prepared at load: the keys of the weight and its zero point, the vector
    /// lanes they were packed for, and the result.
    packed: Option<Prepared>,
}

pub(super) fn build_qconv(node: &Node, qlinear: bool) -> Result<Box<dyn Kernel>> {
    let (sp, group) = conv_attrs(node)?;
    Ok(Box::new(QConv {
        sp,
        group,
        qlinear,
        packed: None,
    }))
}

impl QConv {
    /// Input positions of the weight, its zero point.
    fn w_inputs(&self) -> (usize, usize) {
        if self.qlinear {
            (3, 5)
        } else {
            (1, 3)
        }
    }
}

impl Kernel for QConv {
    fn prepare(&mut self, consts: &[Option<&Tensor>]) -> usize {
        let (wi, zi) = self.w_inputs();
        let c = |i: usize| consts.get(i).copied().flatten();
        let Some(w) = c(wi) else { return 0 };
        if w.rank() < 3 || !matches!(w.dtype(), DataType::Int8 | DataType::Uint8) {
            return 0;
        }
        let isa = simd::q4_isa().0;
        let Ok(qw) = QWeights::new(w, c(zi), self.group, isa) else {
            return 0;
        };
        let Some(wk) = q8_key(w) else { return 0 };
        let zk = match c(zi) {
            Some(z) => match q8_key(z) {
                Some(k) => Some(k),
                None => return 0,
            },
            None => None,
        };
        let bytes = qw.bytes();
        self.packed = Some((wk, zk, isa, qw));
        bytes
    }

    fn compute(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        let (wi, zi) = self.w_inputs();
        let x = tensor_in(inputs, 0)?;
        let w = tensor_in(inputs, wi)?;
        let wzp = opt_tensor_in(inputs, zi)?;
        let xzp = opt_tensor_in(inputs, 2)?; // x_zero_point in both ops
        let bias = if self.qlinear {
            opt_tensor_in(inputs, 8)?
        } else {
            None
        };
        let cs = conv_shape(&self.sp, self.group, x.shape(), w.shape(), bias)?;
        let q_isa = simd::q4_isa().0;
        let owned;
        let qw = match &self.packed {
            Some((wk, zk, i, qw))
                if *i == q_isa && q8_key(w) == Some(*wk) && wzp.map(q8_key) == zk.map(Some) =>
            {
                qw
            }
            _ => {
                owned = QWeights::new(w, wzp, self.group, q_isa)?;
                &owned
            }
        };
        let (xb, x_signed) = q8_bytes(x)?;
        // one value (zero_points refuses any other length for one channel)
        let xz = zero_points(xzp, x.dtype(), 1)?[0];
        let bias_v: Option<Vec<i32>> = match bias {
            Some(b) if b.dtype() == DataType::Int32 => Some(b.as_slice::<i32>()?.into_owned()),
            Some(b) => return Err(bad_type("QLinearConv bias", b.dtype())),
            None => None,
        };
        let out_plane: usize = cs.g.out.iter().product();
        let (n, m) = (cs.n, cs.m);
        let mut shape = vec![n, m];
        shape.extend_from_slice(&cs.g.out);
        // requantization: multiplier per output channel, output zero point and range
        let rq = if self.qlinear {
            let x_scale = tensor_in(inputs, 1)?.to_f32_vec()?;
            let w_scale = tensor_in(inputs, 4)?.to_f32_vec()?;
            let y_scale = tensor_in(inputs, 6)?.to_f32_vec()?;
            let y_zp = opt_tensor_in(inputs, 7)?;
            if x_scale.len() != 1 || y_scale.len() != 1 {
                unsupported!("QLinearConv: x_scale and y_scale must be scalars");
            }
            if w_scale.len() != 1 && w_scale.len() != m {
                bail!(
                    "QLinearConv: w_scale has {} values for {m} output channels",
                    w_scale.len()
                );
            }
            let out_dt = y_zp.map_or(x.dtype(), |z| z.dtype());
            let zp = match y_zp {
                Some(z) if z.len() == 1 => z.to_i64_vec()?[0] as f32,
                Some(_) => unsupported!("QLinearConv: y_zero_point must be a scalar"),
                None => 0.0,
            };
            let (lo, hi) = match out_dt {
                DataType::Uint8 => (0.0, 255.0),
                DataType::Int8 => (-128.0, 127.0),
                dt => return Err(bad_type("QLinearConv", dt)),
            };
            let mult: Vec<f32> = (0..m)
                .map(|i| x_scale[0] * w_scale[if w_scale.len() == 1 { 0 } else { i }] / y_scale[0])
                .collect();
            Some((mult, zp, lo, hi, out_dt))
        } else {
            None
        };
        // the output in the planned arena where there is one (every element is written)
        let mut q8out = match &rq {
            Some((.., out_dt)) => Some(crate::kernels::qlinear::Q8Buf::new(cx, *out_dt, &shape)?),
            None => None,
        };
        let mut i32out = match &rq {
            Some(_) => None,
            None => Some(cx.output::<i32>(0, &shape)?),
        };
        let y8: &mut [u8] = match q8out.as_mut() {
            Some(b) => b.bytes(),
            None => &mut [],
        };
        let y32: &mut [i32] = match i32out.as_mut() {
            Some(b) => &mut b[..],
            None => &mut [],
        };
        match qw {
            QWeights::Rows {
                rows,
                sums,
                zp: wz,
                k,
                ka,
            } => {
                let g = cs.g.simplified();
                let k = *k;
                debug_assert_eq!(k, cs.c * g.k.iter().product::<usize>());
                let (flip, xzs) = if x_signed {
                    (0x80u8, xz + 128)
                } else {
                    (0, xz)
                };
                let qg = simd::qgeom(q_isa, k, out_plane);
                debug_assert_eq!(qg.ka(), *ka);
                let direct = g.k.iter().all(|&v| v == 1)
                    && g.s.iter().all(|&v| v == 1)
                    && g.pb.iter().all(|&v| v == 0);
                let in_plane: usize = g.inp.iter().product();
                // patches go straight into the packed layout
                let patches = !direct;
                let mut packed = simd::scratch::<u8>(qg.packed_len());
                let cross = wz.iter().any(|&z| z != 0);
                let mut colsum = vec![0i32; if cross { qg.np() } else { 0 }];
                // -zx * rowsum(w) + K * zw * zx + bias; and -zw * colsum(x) when zw != 0
                let row_add: Vec<i32> = (0..m)
                    .map(|i| {
                        -xzs * sums[i]
                            + k as i32 * wz[i] * xzs
                            + bias_v.as_ref().map_or(0, |b| b[i])
                    })
                    .collect();
                let nwz: Vec<i32> = wz.iter().map(|z| -z).collect();
                for img in 0..n {
                    let xi = &xb[img * cs.c * in_plane..(img + 1) * cs.c * in_plane];
                    let sums = cross.then_some(&mut colsum[..]);
                    if patches {
                        patches_pack_par(cx.cpu, &g, xi, &qg, (flip, xz as u8), &mut packed, sums);
                    } else {
                        qcols_pack_par(cx.cpu, &qg, xi, out_plane, flip, &mut packed, sums);
                    }
                    let p = QGemm {
                        m,
                        g: qg,
                        a: rows,
                        b: &packed,
                    };
                    let mut e = QEpi {
                        row_add: Some(&row_add),
                        cross: cross.then_some((&colsum[..], &nwz[..])),
                        ..Default::default()
                    };
                    // multiply-adds per output (the unit of the pool's wake-up threshold)
                    let work = k.max(1);
                    let range = img * m * out_plane..(img + 1) * m * out_plane;
                    let chunk = even_rows(cx.cpu, m) * out_plane;
                    match &rq {
                        Some((mult, zp, lo, hi, _)) => {
                            e.scale = Some(QVec::Row(mult));
                            par_chunks_mut(
                                cx.cpu,
                                &mut y8[range.clone()],
                                chunk,
                                work,
                                &|ci, c| {
                                    let r0 = ci * chunk / out_plane;
                                    let r1 = r0 + c.len() / out_plane;
                                    let out = QOut::Q8 {
                                        y: c,
                                        zp: *zp,
                                        lo: *lo,
                                        hi: *hi,
                                    };
                                    simd::qgemm_rows_on(q_isa, &p, &e, r0, r1, out, out_plane);
                                },
                            );
                        }
                        None => {
                            par_chunks_mut(cx.cpu, &mut y32[range], chunk, work, &|ci, c| {
                                let r0 = ci * chunk / out_plane;
                                let r1 = r0 + c.len() / out_plane;
                                simd::qgemm_rows_on(q_isa, &p, &e, r0, r1, QOut::I32(c), out_plane);
                            });
                        }
                    }
                }
            }
            QWeights::Centered(wf) => {
                // centered input, float sums and requantization each split between the
                // threads, in pooled scratch buffers (every element written)
                let mut xf = simd::scratch::<f32>(xb.len());
                let chunk = crate::kernels::par::even_chunk(cx.cpu, xb.len(), 1 << 14, 16);
                par_chunks_mut(cx.cpu, &mut xf, chunk, 2, &|i, c| {
                    let o = i * chunk;
                    simd::dequantize_q8(&xb[o..o + c.len()], x_signed, xz as f32, 1.0, c);
                });
                let bf: Option<Vec<f32>> = bias_v
                    .as_ref()
                    .map(|b| b.iter().map(|&v| v as f32).collect());
                let mut acc = simd::scratch::<f32>(n * m * out_plane);
                conv_compute_into(
                    cx,
                    &xf,
                    wf,
                    None,
                    bf.as_deref(),
                    &cs,
                    &mut acc,
                    ConvEpilogue::NONE,
                );
                let plane = out_plane.max(1);
                match &rq {
                    Some((mult, zp, lo, hi, _)) => {
                        let q = simd::Q8 {
                            zp: *zp,
                            lo: *lo,
                            hi: *hi,
                        };
                        // whole channel planes per task
                        let per = (1usize << 14).div_ceil(plane).max(1) * plane;
                        par_chunks_mut(cx.cpu, y8, per, 2, &|ti, yc| {
                            let p0 = ti * per / plane;
                            for (j, yp) in yc.chunks_mut(plane).enumerate() {
                                let at = (p0 + j) * plane;
                                simd::requantize_q8(
                                    &acc[at..at + yp.len()],
                                    mult[(p0 + j) % m],
                                    q,
                                    yp,
                                );
                            }
                        });
                    }
                    None => {
                        for (yv, &a) in y32.iter_mut().zip(acc.iter()) {
                            *yv = a as i32;
                        }
                    }
                }
            }
        }
        let t = match (q8out, i32out) {
            (Some(b), _) => b.into_tensor(),
            (None, Some(b)) => b.into_tensor(),
            (None, None) => unreachable!("one output buffer"),
        };
        out1(t)
    }
}

/// [`qcols_pack`] with the column groups split between the backend's threads: a range of
/// whole groups is a contiguous range of the packed bytes (and of the column sums), so each
/// task packs its own columns as a narrower product's operand, and the result is the same
/// bytes as one call.
pub(crate) fn qcols_pack_par(
    cpu: &dyn CpuBackend,
    g: &QGeom,
    src: &[u8],
    ld: usize,
    flip: u8,
    out: &mut [u8],
    sums: Option<&mut [i32]>,
) {
    pack_groups_par(cpu, g, out, sums, &|(g0, g1), o, s| {
        let c0 = g0 * g.lanes;
        let sub = QGeom {
            n: (g1 * g.lanes).min(g.n) - c0,
            ..*g
        };
        qcols_pack(&sub, &src[c0..], ld, flip, o, s);
    });
}

/// A packer of column groups `g0..g1` of `g`'s operand: it writes their packed bytes from
/// the start of its slice, and their column sums from the start of the other (when given).
type GroupPacker<'a> = dyn Fn((usize, usize), &mut [u8], Option<&mut [i32]>) + Sync + 'a;

/// Runs `pack` over `g`'s column groups, split between the backend's threads (a few tasks
/// per thread, as whole groups).
fn pack_groups_par(
    cpu: &dyn CpuBackend,
    g: &QGeom,
    out: &mut [u8],
    sums: Option<&mut [i32]>,
    pack: &GroupPacker<'_>,
) {
    let (groups, gbytes) = (g.groups(), g.kq() * g.lanes * 4);
    assert!(out.len() >= g.packed_len() && sums.as_ref().is_none_or(|s| s.len() >= g.n));
    let t = cpu.threads().max(1);
    if t == 1 || groups < 2 || g.k == 0 {
        return pack((0, groups), out, sums);
    }
    let per = groups.div_ceil(2 * t).max(1);
    let tasks = groups.div_ceil(per);
    let (out_p, sums_p) = (
        SyncPtr(out.as_mut_ptr()),
        sums.map(|s| SyncPtr(s.as_mut_ptr())),
    );
    cpu.parallel_for_work(tasks, g.k * g.n, &|ti| {
        let (g0, g1) = (ti * per, ((ti + 1) * per).min(groups));
        let c0 = g0 * g.lanes;
        // SAFETY: tasks cover disjoint group ranges, [g0, g1) groups of packed bytes and
        // columns [c0, min(g1 * lanes, n)) of the sums, inside `out` and `sums` (asserted
        // above), which stay borrowed until parallel_for_work returns.
        let o = unsafe {
            core::slice::from_raw_parts_mut(out_p.get().add(g0 * gbytes), (g1 - g0) * gbytes)
        };
        let s = sums_p.as_ref().map(|p| unsafe {
            core::slice::from_raw_parts_mut(p.get().add(c0), (g1 * g.lanes).min(g.n) - c0)
        });
        pack((g0, g1), o, s);
    });
}

/// The patch matrix of one image `x` (what [`im2col`] gives for geometry `geo`) packed
/// straight into the quad layout of `g`, each byte `xor flip` and padding `pad` (the bytes
/// im2col then [`qcols_pack`] give), with its column sums when `sums` is given; the column
/// groups split between the backend's threads. The matrix is never written out whole: 1-D
/// and 2-D geometries read each column group's bytes from the input ([`Patches`], through a
/// padded copy of the image where the convolution pads, so that no read needs a bounds
/// test), others take a quad of patch rows at a time through a buffer that stays in the L1
/// cache.
pub(super) fn patches_pack_par(
    cpu: &dyn CpuBackend,
    geo: &Geom,
    x: &[u8],
    g: &QGeom,
    flip_pad: (u8, u8),
    out: &mut [u8],
    sums: Option<&mut [i32]>,
) {
    let kk: usize = geo.k.iter().product();
    let c = g.k / kk.max(1);
    let direct = Patches::new(geo, c);
    let mut padded = None;
    if let Some(p) = &direct {
        if p.pads {
            let mut buf = simd::scratch::<u8>(c * p.ih * p.iw);
            p.pad_image(geo, x, flip_pad.1, &mut buf);
            padded = Some(buf);
        }
    }
    let src: &[u8] = padded.as_deref().unwrap_or(x);
    pack_groups_par(cpu, g, out, sums, &|r, o, s| {
        macro_rules! lanes {
            ($L:literal) => {
                match &direct {
                    Some(p) => p.pack::<$L>(src, g, flip_pad.0, r, o, s),
                    None => patches_pack::<$L>(geo, x, g, flip_pad, r, o, s),
                }
            };
        }
        match g.lanes {
            4 => lanes!(4),
            8 => lanes!(8),
            16 => lanes!(16),
            l => unreachable!("{l} lanes"),
        }
    });
}

/// Column groups `g0..g1` of [`patches_pack_par`], from `out[0]` and `sums[0]`, for any
/// geometry: a quad of patch rows at a time through the buffer.
fn patches_pack<const L: usize>(
    geo: &Geom,
    x: &[u8],
    g: &QGeom,
    (flip, pad): (u8, u8),
    (g0, g1): (usize, usize),
    out: &mut [u8],
    mut sums: Option<&mut [i32]>,
) {
    let (k, kq) = (g.k, g.kq());
    let p0 = g0 * L;
    let (ncols, np) = ((g1 * L).min(g.n) - p0, (g1 - g0) * L);
    assert!(g.lanes == L && out.len() >= (g1 - g0) * kq * L * 4);
    let tile = PatchTile::new(geo, p0, ncols);
    // four patch rows of the task's columns; columns past the last and rows past K hold
    // `flip` (zero once flipped)
    let mut buf = vec![flip; 4 * np];
    if let Some(s) = sums.as_deref_mut() {
        s[..ncols].fill(0);
    }
    let f = u32::from_le_bytes([flip; 4]);
    for q in 0..kq {
        for (t, row) in buf.chunks_exact_mut(np).enumerate() {
            let r = 4 * q + t;
            if r < k {
                im2col_row(x, geo, &tile, r, &mut row[..ncols], pad);
            } else {
                row.fill(flip);
            }
        }
        let (b0, rest) = buf.split_at(np);
        let (b1, rest) = rest.split_at(np);
        let (b2, b3) = rest.split_at(np);
        for gl in 0..g1 - g0 {
            let c0 = gl * L;
            let rows: [&[u8; L]; 4] =
                [b0, b1, b2, b3].map(|b| b[c0..c0 + L].try_into().expect("L bytes"));
            // four rows of L bytes into L words of four bytes, flipped (vectorises: widen,
            // shift, or, xor)
            let mut wv = [0u32; L];
            for (c, v) in wv.iter_mut().enumerate() {
                *v = u32::from_le_bytes([rows[0][c], rows[1][c], rows[2][c], rows[3][c]]) ^ f;
            }
            let dst = &mut out[(gl * kq + q) * L * 4..][..L * 4];
            for (d, v) in dst.chunks_exact_mut(4).zip(&wv) {
                d.copy_from_slice(&v.to_le_bytes());
            }
            if let Some(s) = sums.as_deref_mut() {
                let w = L.min(ncols.saturating_sub(c0));
                for (cs, v) in s[c0..c0 + w].iter_mut().zip(&wv) {
                    *cs += v.to_le_bytes().iter().map(|&b| b as i32).sum::<i32>();
                }
            }
        }
    }
}

/// Where the patch rows of a 1-D or 2-D convolution read (as 2-D, a unit H for 1-D), in an
/// image whose planes are `ih x iw` and hold every tap of every output position: the input
/// itself where the convolution does not pad, else a copy with the padding written in
/// ([`Patches::pad_image`]). Row `r` at output position `(oy, ox)` is
/// `x[rows[r] + oy sh iw + ox sw]`.
struct Patches {
    ih: usize,
    iw: usize,
    ow: usize,
    sh: usize,
    sw: usize,
    /// Whether the image is a padded copy (else the input, `ih x iw` its planes).
    pads: bool,
    /// The padding before the input along H and W (in the copy).
    ph: usize,
    pw: usize,
    /// Each patch row's offset: its channel's plane, plus its tap's `dy iw + dx` (in a
    /// pooled buffer: nothing allocated per call).
    rows: simd::Scratch<usize>,
}

impl Patches {
    /// `None` for other than 1 or 2 spatial axes.
    fn new(g: &Geom, c: usize) -> Option<Patches> {
        let nd = g.nd();
        if !(1..=2).contains(&nd) {
            return None;
        }
        let two = |v: &[usize]| if nd == 2 { (v[0], v[1]) } else { (1, v[0]) };
        let ((ih, iw), (oh, ow), (kh, kw)) = (two(&g.inp), two(&g.out), two(&g.k));
        let ((sh, sw), (dh, dw)) = (two(&g.s), two(&g.d));
        let (ph, pw) = if nd == 2 {
            (g.pb[0], g.pb[1])
        } else {
            (0, g.pb[0])
        };
        // the extent the taps of every output position cover, from the first (padding
        // included); negative leading pads (a crop) and extents past the input's end take the
        // copy too
        let span =
            |o: usize, s: usize, k: usize, d: usize| (o.max(1) - 1) * s + (k.max(1) - 1) * d + 1;
        let (eh, ew) = (span(oh, sh, kh, dh), span(ow, sw, kw, dw));
        if ph < 0 || pw < 0 {
            return None;
        }
        let pads = ph != 0 || pw != 0 || eh > ih || ew > iw;
        let (ih, iw) = if pads { (eh, ew) } else { (ih, iw) };
        let mut rows = simd::scratch::<usize>(c * kh * kw);
        let taps = (0..c).flat_map(|ci| {
            (0..kh).flat_map(move |ky| (0..kw).map(move |kx| ci * ih * iw + ky * dh * iw + kx * dw))
        });
        for (r, off) in rows.iter_mut().zip(taps) {
            *r = off;
        }
        Some(Patches {
            ih,
            iw,
            ow,
            sh,
            sw,
            pads,
            ph: ph as usize,
            pw: pw as usize,
            rows,
        })
    }

    /// The padded copy of the image `x` (its planes `g`'s input extent) into `out`
    /// (`c` planes of `ih x iw`): `pad` outside the input.
    fn pad_image(&self, g: &Geom, x: &[u8], pad: u8, out: &mut [u8]) {
        let (ih0, iw0) = if g.nd() == 2 {
            (g.inp[0], g.inp[1])
        } else {
            (1, g.inp[0])
        };
        let plane = self.ih * self.iw;
        for (ci, dst) in out.chunks_exact_mut(plane).enumerate() {
            let srcp = &x[ci * ih0 * iw0..(ci + 1) * ih0 * iw0];
            for (y, row) in dst.chunks_exact_mut(self.iw).enumerate() {
                let iy = y as isize - self.ph as isize;
                if !(0..ih0 as isize).contains(&iy) {
                    row.fill(pad);
                    continue;
                }
                let src = &srcp[iy as usize * iw0..(iy as usize + 1) * iw0];
                // columns pw.. hold the input's, as far as the copy reaches
                let p0 = self.pw.min(self.iw);
                let n = iw0.min(self.iw - p0);
                row[..p0].fill(pad);
                row[p0..p0 + n].copy_from_slice(&src[..n]);
                row[p0 + n..].fill(pad);
            }
        }
    }

    /// Column groups `g0..g1` of [`patches_pack_par`], from `out[0]` and `sums[0]`, reading
    /// the image `x` this geometry describes (K's padding rows and the columns past N hold
    /// `flip`, zero once flipped).
    fn pack<const L: usize>(
        &self,
        x: &[u8],
        g: &QGeom,
        flip: u8,
        (g0, g1): (usize, usize),
        out: &mut [u8],
        mut sums: Option<&mut [i32]>,
    ) {
        let (k, n, kq) = (g.k, g.n, g.kq());
        let rows: &[usize] = &self.rows;
        assert!(g.lanes == L && rows.len() == k && out.len() >= (g1 - g0) * kq * L * 4);
        let (iw, sw) = (self.iw, self.sw);
        // the last byte any patch row reads, for the one bounds check per group
        let last_row = rows.last().copied().unwrap_or(0);
        let f = u32::from_le_bytes([flip; 4]);
        for gi in g0..g1 {
            let j0 = gi * L;
            let w = L.min(n - j0);
            let (mut oy, mut ox) = (j0 / self.ow, j0 % self.ow);
            // each column's offset in the image before its row's
            let mut at = [0usize; L];
            for a in at.iter_mut().take(w) {
                *a = oy * self.sh * iw + ox * sw;
                ox += 1;
                if ox == self.ow {
                    (ox, oy) = (0, oy + 1);
                }
            }
            // the whole group on one output row: each patch row's bytes are L input bytes
            // `sw` apart
            let run = w == L && at[L - 1] == at[0] + (L - 1) * sw;
            assert!(
                w == 0 || at[w - 1] + last_row < x.len(),
                "patches read past the image"
            );
            let dst = &mut out[(gi - g0) * kq * L * 4..][..kq * L * 4];
            let mut colsum = [0i32; L];
            for (q, dq) in dst.chunks_exact_mut(L * 4).enumerate() {
                let mut tmp = [[flip; L]; 4];
                let full = 4 * q + 4 <= k;
                let b: [&[u8; L]; 4] = if run && full && sw == 1 {
                    core::array::from_fn(|t| {
                        let a = at[0] + rows[4 * q + t];
                        x[a..a + L].try_into().expect("L bytes")
                    })
                } else {
                    for (t, bt) in tmp.iter_mut().enumerate() {
                        let Some(&off) = rows.get(4 * q + t) else {
                            break;
                        };
                        for (v, &a) in bt.iter_mut().zip(&at[..w]) {
                            *v = x[a + off];
                        }
                    }
                    [&tmp[0], &tmp[1], &tmp[2], &tmp[3]]
                };
                // four rows of L bytes into L words of four bytes, flipped (vectorises: widen,
                // shift, or, xor)
                let mut wv = [0u32; L];
                for (c, v) in wv.iter_mut().enumerate() {
                    *v = u32::from_le_bytes([b[0][c], b[1][c], b[2][c], b[3][c]]) ^ f;
                }
                for (d, v) in dq.chunks_exact_mut(4).zip(&wv) {
                    d.copy_from_slice(&v.to_le_bytes());
                }
                if sums.is_some() {
                    for (cs, v) in colsum.iter_mut().zip(&wv) {
                        *cs += v.to_le_bytes().iter().map(|&b| b as i32).sum::<i32>();
                    }
                }
            }
            if let Some(s) = sums.as_deref_mut() {
                s[j0 - g0 * L..j0 - g0 * L + w].copy_from_slice(&colsum[..w]);
            }
        }
    }
}

/// Rows per task for splitting `m` output rows between the backend's threads (whole tiles of
/// four rows where there are enough).
fn even_rows(cpu: &dyn CpuBackend, m: usize) -> usize {
    let t = cpu.threads().max(1);
    let per = m.div_ceil(t);
    if m >= 4 * t {
        per.div_ceil(4) * 4
    } else {
        per.max(1)
    }
}
