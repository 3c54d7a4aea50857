//! Kernels of the blocked channel layout (NCHWc, 16 channels per block; see `simd::nchwc`
//! and the rewrite that introduces them, `crate::nchwc`), in the private domain `nxrt`:
//!
//! - `ReorderOutput` (`channels` = C): [N, ceil(C/16), H, W, 16] back to [N, C, H, W].
//! - `Conv`: a 2-D convolution, group 1 (input plain or blocked) or depthwise (input blocked),
//!   into the blocked layout, with FusedConv's residual input Z (blocked) and activation. Its
//!   weights come blocked ([ceil(M/16), C/group, kh, kw, 16]) and its bias padded to the blocks.
//!   Every lane of every block is written: padding channels hold `act(0)` (their weights and
//!   bias are zero) and are never read by a kernel that mixes channels.
//! - `GlobalAveragePool`: [N, Cb, H, W, 16] into [N, Cb, 1, 1, 16].

use super::*;
use crate::simd::{NcGeom, NCHWC};

/// The private domain of the layout kernels.
pub(crate) const DOMAIN: &str = "nxrt";

/// Rows of output (or positions of a pointwise convolution's one flattened row) per unit of
/// parallel work and per epilogue pass: small enough that the epilogue finds them in cache.
const SEG: usize = 256;

fn blocks(c: usize) -> usize {
    c.div_ceil(NCHWC)
}

fn shape5(x: &Tensor, what: &str) -> Result<[usize; 5]> {
    match *x.shape() {
        [n, cb, h, w, l] if l == NCHWC => Ok([n, cb, h, w, l]),
        ref s => bail!("{what}: expected a blocked tensor [N, C/16, H, W, 16], got {s:?}"),
    }
}

fn channels_attr(node: &Node) -> Result<usize> {
    let c = node.get_i("channels", 0)?;
    if c <= 0 {
        bail!("a blocked-layout node needs a positive `channels`, has {c}");
    }
    Ok(c as usize)
}

// ----------------------------------------------------------------------------- reorders

struct ReorderOutput {
    channels: usize,
}

impl Kernel for ReorderOutput {
    fn compute(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        let x = tensor_in(inputs, 0)?;
        let [n, cb, h, w, _] = shape5(x, "ReorderOutput")?;
        let c = self.channels;
        if blocks(c) != cb {
            bail!("ReorderOutput: {c} channels do not fill {cb} blocks");
        }
        let xv = x.as_slice::<f32>()?;
        let plane = h * w;
        let mut y = cx.output::<f32>(0, &[n, c, h, w])?;
        // one task per image and block: the block's channels are contiguous planes of y
        let yp = SyncPtr(y.as_mut_ptr());
        let ylen = y.len();
        cx.cpu.parallel_for_work(n * cb, 2 * ylen, &|t| {
            let (ni, bi) = (t / cb, t % cb);
            let cn = NCHWC.min(c - bi * NCHWC);
            let o = (ni * c + bi * NCHWC) * plane;
            debug_assert!(o + cn * plane <= ylen);
            // SAFETY: task (ni, bi) alone writes channels bi*16..bi*16 + cn of image ni, a
            // range inside `y`, which is borrowed until `parallel_for_work` returns
            let dst = unsafe { core::slice::from_raw_parts_mut(yp.get().add(o), cn * plane) };
            let src = &xv[t * plane * NCHWC..(t + 1) * plane * NCHWC];
            simd::transpose_matrix(src, NCHWC, plane, cn, dst, plane);
        });
        out1(y.into_tensor())
    }
}

fn build_reorder_output(node: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(ReorderOutput {
        channels: channels_attr(node)?,
    }))
}

// ----------------------------------------------------------------------------- pooling

struct BlockedGlobalAveragePool;

impl Kernel for BlockedGlobalAveragePool {
    fn compute(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        let x = tensor_in(inputs, 0)?;
        let [n, cb, h, w, _] = shape5(x, "GlobalAveragePool")?;
        let xv = x.as_slice::<f32>()?;
        let plane = h * w;
        let mut y = cx.output::<f32>(0, &[n, cb, 1, 1, NCHWC])?;
        let inv = 1.0 / plane as f32;
        for (dst, src) in y
            .chunks_exact_mut(NCHWC)
            .zip(xv.chunks_exact(plane * NCHWC))
        {
            let mut s = [0f32; NCHWC];
            for p in src.chunks_exact(NCHWC) {
                for (a, &v) in s.iter_mut().zip(p) {
                    *a += v;
                }
            }
            for (d, a) in dst.iter_mut().zip(s) {
                *d = a * inv;
            }
        }
        out1(y.into_tensor())
    }
}

fn build_global_average_pool(_: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(BlockedGlobalAveragePool))
}

// ----------------------------------------------------------------------------- Conv

struct BlockedConv {
    sp: Spatial,
    group: usize,
    channels: usize,
    act: Option<simd::Act>,
    /// The output is plain NCHW (`plain_output` = 1): each row segment is computed blocked
    /// in scratch and written out per channel, with no blocked tensor in between.
    plain: bool,
}

impl BlockedConv {
    /// The convolution's geometry: (N, C, its shape as plain NCHW convolution, blocked-ness).
    fn geometry(&self, x: &Tensor, w: &Tensor) -> Result<(ConvShape, NcGeom)> {
        let ws = w.shape();
        let [mb, wc, kh, kw, l] = match *ws {
            [a, b, c, d, e] => [a, b, c, d, e],
            ref s => bail!("blocked Conv: weights of shape {s:?}, expected 5-D"),
        };
        let m = self.channels;
        if l != NCHWC || blocks(m) != mb {
            bail!("blocked Conv: weights {ws:?} do not hold {m} output channels");
        }
        let depthwise = self.group > 1;
        // (shape, channels per block, block, position and channel strides: see NcGeom)
        let (xs, xbs, x_blk, x_pos, x_lane) = match *x.shape() {
            [n, c, h, w] if !depthwise => ([n, c, h, w], c.max(1), c * h * w, 1, h * w),
            [n, cb, h, w, l] if l == NCHWC => {
                let c = if depthwise { m } else { wc };
                if blocks(c) != cb {
                    bail!(
                        "blocked Conv: input {:?} does not hold {c} channels",
                        x.shape()
                    );
                }
                ([n, c, h, w], NCHWC, h * w * NCHWC, NCHWC, 1)
            }
            ref s => bail!("blocked Conv: input of shape {s:?}"),
        };
        if depthwise && (self.group != m || wc != 1) {
            bail!("blocked Conv: group {} with weights {ws:?}", self.group);
        }
        let cs = conv_shape(&self.sp, self.group, &xs, &[m, wc, kh, kw], None)?;
        let g = &cs.g;
        let pad = |p: isize| -> Result<usize> {
            usize::try_from(p).map_err(|_| crate::error::Error::Other("negative pad".into()))
        };
        let geo = NcGeom {
            cin: wc,
            xbs,
            x_blk,
            x_pos,
            x_lane,
            ih: g.inp[0],
            iw: g.inp[1],
            oh: g.out[0],
            ow: g.out[1],
            kh,
            kw,
            sh: g.s[0],
            sw: g.s[1],
            dh: g.d[0],
            dw: g.d[1],
            ph: pad(g.pb[0])?,
            pw: pad(g.pb[1])?,
            clamp: None,
        };
        Ok((cs, geo))
    }
}

impl Kernel for BlockedConv {
    fn compute(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        let x = tensor_in(inputs, 0)?;
        let w = tensor_in(inputs, 1)?;
        let b = tensor_in(inputs, 2)?;
        let z = opt_tensor_in(inputs, 3)?;
        let (cs, mut geo) = self.geometry(x, w)?;
        let m = self.channels;
        let mb = blocks(m);
        let (n, oh, ow) = (cs.n, geo.oh, geo.ow);
        let shape = [n, mb, oh, ow, NCHWC];
        let out_blk = oh * ow * NCHWC;
        if b.len() != mb * NCHWC {
            bail!("blocked Conv: {} biases for {mb} blocks", b.len());
        }
        if let Some(z) = z {
            if z.shape() != shape.as_slice() {
                bail!("blocked Conv: Z {:?}, the output {shape:?}", z.shape());
            }
        }
        let (xv, wv, bv) = (
            x.as_slice::<f32>()?,
            w.as_slice::<f32>()?,
            b.as_slice::<f32>()?,
        );
        let zv = match z {
            Some(z) => Some(z.as_slice::<f32>()?),
            None => None,
        };
        let zv = zv.as_deref();
        let plain_shape = [n, m, oh, ow];
        let mut y = if self.plain {
            cx.output_raw::<f32>(0, &plain_shape)?
        } else {
            cx.output_raw::<f32>(0, &shape)?
        };
        if y.is_empty() {
            // SAFETY: no elements
            return out1(unsafe { y.assume_written() }?.into_tensor());
        }
        if !self.plain {
            // the blocked output is written through slices of it: initialised memory
            y.zero_fresh();
        }
        let depthwise = self.group > 1;
        // a pointwise convolution is one row of all the plane's positions
        let pointwise = geo.kh == 1
            && geo.kw == 1
            && geo.sh == 1
            && geo.sw == 1
            && geo.ph == 0
            && geo.pw == 0
            && geo.oh == geo.ih
            && geo.ow == geo.iw;
        if pointwise {
            geo.iw *= geo.ih;
            geo.ow *= geo.oh;
            geo.ih = 1;
            geo.oh = 1;
        }
        let x_img = if geo.xbs != NCHWC {
            cs.c * geo.ih * geo.iw
        } else {
            blocks(cs.c) * geo.ih * geo.iw * NCHWC
        };
        // units: whole output rows, or segments of the pointwise row
        let seg = if pointwise { SEG } else { geo.ow };
        let per_row = geo.ow.div_ceil(seg);
        let units = geo.oh * per_row;
        // output blocks in pairs (two at once share every input read), depthwise one at once
        let sets = if depthwise { mb } else { mb.div_ceil(2) };
        let macs = geo.cin.max(1) * geo.kh * geo.kw;
        let threads = cx.cpu.threads().max(1);
        let chunks = if threads > 1 {
            (4 * threads).div_ceil(n * sets).clamp(1, units)
        } else {
            1
        };
        let per = units.div_ceil(chunks);
        let chunks = units.div_ceil(per);
        let work = n * mb * out_blk * if depthwise { geo.kh * geo.kw } else { macs };
        // Relu and Clip in the kernels' registers, unless a residual is added first
        geo.clamp = self.act.and_then(simd::Clamp::of).filter(|_| zv.is_none());
        let act = self.act.filter(|_| geo.clamp.is_none());
        let plain = self.plain;
        let plane = oh * ow;
        let yp = SyncPtr(y.as_mut_ptr());
        let ylen = y.len();
        cx.cpu.parallel_for_work(n * sets * chunks, work, &|t| {
            let (img, rest) = (t / (sets * chunks), t % (sets * chunks));
            let (set, chunk) = (rest / chunks, rest % chunks);
            let (u0, u1) = (chunk * per, ((chunk + 1) * per).min(units));
            let xi = &xv[img * x_img..(img + 1) * x_img];
            let (b0, nb) = if depthwise {
                (set, 1)
            } else {
                (2 * set, 2.min(mb - 2 * set))
            };
            // the task's span of each of its blocks: positions p0..p1 (row-major)
            let pos = |u: usize| (u / per_row) * geo.ow + (u % per_row) * seg;
            let p0 = pos(u0);
            let p1 = if u1 == units {
                geo.oh * geo.ow
            } else {
                pos(u1)
            };
            // blocked output: the blocks' spans of y; plain output: one unit's scratch per
            // block (from the scratch pool: every element is written before it is read)
            let mut scratch = crate::simd::scratch::<f32>(if plain { 2 * seg * NCHWC } else { 0 });
            let span = |k: usize| {
                let o = (img * mb + b0 + k) * out_blk + p0 * NCHWC;
                debug_assert!(o + (p1 - p0) * NCHWC <= ylen);
                // SAFETY: block b0 + k of image img, positions p0..p1, is written by this task
                // alone (tasks split images, block sets and position ranges), lies inside
                // `y`, and `y` is borrowed until `parallel_for_work` returns
                unsafe { core::slice::from_raw_parts_mut(yp.get().add(o), (p1 - p0) * NCHWC) }
            };
            let (d0, d1): (&mut [f32], &mut [f32]) = if plain {
                scratch.split_at_mut(seg * NCHWC)
            } else {
                let d0 = span(0);
                let d1: &mut [f32] = if nb == 2 { span(1) } else { &mut [] };
                (d0, d1)
            };
            for u in u0..u1 {
                let (row, s) = (u / per_row, u % per_row);
                let (ow0, ow1) = (s * seg, ((s + 1) * seg).min(geo.ow));
                let at = if plain {
                    0
                } else {
                    (row * geo.ow + ow0 - p0) * NCHWC
                };
                let len = (ow1 - ow0) * NCHWC;
                if depthwise {
                    let plane = geo.ih * geo.iw * NCHWC;
                    let xb = &xi[b0 * plane..(b0 + 1) * plane];
                    let taps = geo.kh * geo.kw * NCHWC;
                    let wb = &wv[b0 * taps..(b0 + 1) * taps];
                    let bb = &bv[b0 * NCHWC..(b0 + 1) * NCHWC];
                    simd::nchwc_dw_seg(&geo, xb, wb, bb, row, ow0, ow1, &mut d0[at..at + len]);
                } else {
                    let wl = macs * NCHWC;
                    let w0 = &wv[b0 * wl..(b0 + 1) * wl];
                    let w1 = if nb == 2 {
                        &wv[(b0 + 1) * wl..(b0 + 2) * wl]
                    } else {
                        &[][..]
                    };
                    let bs0 = &bv[b0 * NCHWC..(b0 + 1) * NCHWC];
                    let bs1 = if nb == 2 {
                        &bv[(b0 + 1) * NCHWC..(b0 + 2) * NCHWC]
                    } else {
                        &[][..]
                    };
                    let y1: &mut [f32] = if nb == 2 {
                        &mut d1[at..at + len]
                    } else {
                        &mut []
                    };
                    simd::nchwc_conv_seg(
                        &geo,
                        xi,
                        (w0, w1),
                        (bs0, bs1),
                        row,
                        ow0,
                        ow1,
                        (&mut d0[at..at + len], y1),
                    );
                }
                // the epilogue on the segment while it is in cache
                for k in 0..nb {
                    let d = if k == 0 { &mut *d0 } else { &mut *d1 };
                    let seg_out = &mut d[at..at + len];
                    if let Some(zv) = zv {
                        let zo = (img * mb + b0 + k) * out_blk + (row * geo.ow + ow0) * NCHWC;
                        for (o, &v) in seg_out.iter_mut().zip(&zv[zo..zo + len]) {
                            *o += v;
                        }
                    }
                    if let Some(a) = act {
                        simd::unary_inplace(a, seg_out);
                    }
                    if plain {
                        // [position][16] straight into the block's real channels' rows of y
                        let npos = ow1 - ow0;
                        let c0 = (b0 + k) * NCHWC;
                        let cn = NCHWC.min(m - c0);
                        let p = row * geo.ow + ow0;
                        let mut rows: [&mut [f32]; NCHWC] = Default::default();
                        for (c, r) in rows.iter_mut().take(cn).enumerate() {
                            let o = (img * m + c0 + c) * plane + p;
                            debug_assert!(o + npos <= ylen);
                            // SAFETY: channel c0 + c of image img at positions p..p + npos is
                            // written by this task alone (its block and unit), inside `y`,
                            // which is borrowed until `parallel_for_work` returns
                            *r = unsafe { core::slice::from_raw_parts_mut(yp.get().add(o), npos) };
                        }
                        simd::transpose_to_rows(seg_out, NCHWC, npos, cn, &mut rows);
                    }
                }
            }
        });
        // SAFETY: the tasks cover every image, block and position: blocked output writes all
        // 16 lanes of each, plain output every real channel's row
        out1(unsafe { y.assume_written() }?.into_tensor())
    }
}

fn build_conv(node: &Node) -> Result<Box<dyn Kernel>> {
    let (sp, group) = conv_attrs(node)?;
    Ok(Box::new(BlockedConv {
        sp,
        group,
        channels: channels_attr(node)?,
        act: fused_activation(node)?,
        plain: node.get_i("plain_output", 0)? != 0,
    }))
}

pub(crate) const KERNELS: &[KernelDef] = &[
    def_in(DOMAIN, "ReorderOutput", 1, 1, build_reorder_output).types(&[DataType::Float]),
    def_in(DOMAIN, "Conv", 1, 1, build_conv).types(&[DataType::Float]),
    def_in(DOMAIN, "GlobalAveragePool", 1, 1, build_global_average_pool).types(&[DataType::Float]),
];
