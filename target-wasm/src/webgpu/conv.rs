//! Convolutions, pooling, Resize and Pad.
//!
//! - Conv: an implicit GEMM (the MatMul kernel's 64x64 tiling, with the im2col matrix read
//!   straight from X through a small per-K offset table) when a group has 16 or more output
//!   channels; otherwise a direct kernel, one invocation per output element over its taps
//!   and the group's input channels (depthwise and other thin convolutions).
//! - Conv runs lazily as a [`Producer`]: an element-wise chain that reads its output (an
//!   activation, a residual add) becomes the kernel's epilogue, one dispatch in all.
//! - ConvTranspose: a direct gather kernel, one invocation per output element over the taps
//!   that land on it.
//! - MaxPool / AveragePool: one invocation per output element; the global pools one
//!   workgroup per plane (`pool.rs`).
//! - Resize and Pad: per-axis tables (source index and weight per output position, built on
//!   the host exactly as the CPU kernels build theirs) and one gather kernel (`resize.rs`).
//!
//! Convolutions and pools handle 1 to 3 spatial dimensions (padded with unit leading axes to
//! 3); a node whose attributes say more stays on the CPU.

mod pool;
mod resize;

use nxrt_core::ir::Node;
use nxrt_core::kernels::opt_tensor_in;
use nxrt_core::{Error, Result};

use std::sync::Arc;

use nxrt_core::Tensor;

use super::ew::{epilogue, EpiParts, Epilogue};
use super::{dev_buf, dev_in, out1, shader_1d, Exec, Gpu, OpDef, Producer, Store};

pub(crate) const OPS: &[OpDef] = &[
    OpDef {
        op: "Conv",
        since: 1,
        type_input: 0,
        half: true,
        host: &[],
        build: build_conv,
    },
    OpDef {
        op: "ConvTranspose",
        since: 1,
        type_input: 0,
        half: true,
        host: &[],
        build: build_conv_transpose,
    },
    OpDef {
        op: "MaxPool",
        since: 1,
        type_input: 0,
        half: true,
        host: &[],
        build: pool::build_max_pool,
    },
    OpDef {
        op: "AveragePool",
        since: 1,
        type_input: 0,
        half: true,
        host: &[],
        build: pool::build_average_pool,
    },
    OpDef {
        op: "GlobalAveragePool",
        since: 1,
        type_input: 0,
        half: true,
        host: &[],
        build: pool::build_global_average_pool,
    },
    OpDef {
        op: "GlobalMaxPool",
        since: 1,
        type_input: 0,
        half: true,
        host: &[],
        build: pool::build_global_max_pool,
    },
    OpDef {
        op: "Resize",
        since: 11,
        type_input: 0,
        half: true,
        host: &[1, 2, 3],
        build: resize::build_resize,
    },
    OpDef {
        op: "Pad",
        since: 1,
        type_input: 0,
        half: true,
        host: &[1, 2, 3],
        build: resize::build_pad,
    },
];

/// Spatial dimensions the convolution and pooling kernels handle.
const ND: usize = 3;
const WG: u32 = 128;
/// A group with at least this many output channels runs as a tiled implicit GEMM.
const GEMM_MIN_CHANNELS: usize = 16;
/// Tile edge of the implicit GEMM (outputs; its K step is 16).
const TILE: usize = 64;

pub(super) fn fail(msg: impl std::fmt::Display) -> Error {
    Error::Other(format!("webgpu: {msg}"))
}

/// `v` as a kernel parameter word.
pub(super) fn word(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| fail(format!("{what} {v} does not fit 32 bits")))
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum AutoPad {
    NotSet,
    SameUpper,
    SameLower,
    Valid,
}

/// Spatial attributes of convolutions and pools, checked at load.
#[derive(Clone, Debug)]
pub(super) struct Spatial {
    pub auto_pad: AutoPad,
    pub kernel: Option<Vec<usize>>,
    pub strides: Option<Vec<usize>>,
    pub dilations: Option<Vec<usize>>,
    pub pads: Option<Vec<usize>>,
}

/// Parses and checks the spatial attributes: an error keeps the node on the CPU (unknown
/// auto_pad, negative pads, non-positive kernel/strides/dilations, more than 3 spatial axes or
/// attribute lengths that disagree).
pub(super) fn parse_spatial(node: &Node) -> Result<Spatial> {
    let auto_pad = match node.get_s("auto_pad", "NOTSET")?.as_str() {
        "NOTSET" | "" => AutoPad::NotSet,
        "SAME_UPPER" => AutoPad::SameUpper,
        "SAME_LOWER" => AutoPad::SameLower,
        "VALID" => AutoPad::Valid,
        a => return Err(fail(format!("auto_pad '{a}'"))),
    };
    let ints = |name: &str, min: i64| -> Result<Option<Vec<usize>>> {
        match node.attr_ints(name)? {
            None => Ok(None),
            Some(v) if v.iter().any(|&x| x < min) => Err(fail(format!(
                "{} attribute {name} {v:?} (the kernels take values >= {min})",
                node.op_type
            ))),
            Some(v) => Ok(Some(v.into_iter().map(|x| x as usize).collect())),
        }
    };
    let sp = Spatial {
        auto_pad,
        kernel: ints("kernel_shape", 1)?,
        strides: ints("strides", 1)?,
        dilations: ints("dilations", 1)?,
        pads: ints("pads", 0)?,
    };
    let mut nd = None;
    let lens = [
        sp.kernel.as_ref().map(|v| v.len()),
        sp.strides.as_ref().map(|v| v.len()),
        sp.dilations.as_ref().map(|v| v.len()),
        sp.pads.as_ref().map(|v| {
            if v.len() % 2 == 0 {
                v.len() / 2
            } else {
                usize::MAX
            }
        }),
    ];
    for n in lens.into_iter().flatten() {
        if n == 0 || n > ND {
            return Err(fail(format!(
                "{} over {} spatial dimensions (the WebGPU kernels take 1 to {ND})",
                node.op_type,
                if n == usize::MAX {
                    "an odd number of pads for".to_string()
                } else {
                    n.to_string()
                }
            )));
        }
        if nd.is_some_and(|m| m != n) {
            return Err(fail(format!(
                "{}: attribute lengths disagree on the spatial rank",
                node.op_type
            )));
        }
        nd = Some(n);
    }
    Ok(sp)
}

impl Spatial {
    fn per_dim(
        v: &Option<Vec<usize>>,
        nd: usize,
        name: &str,
        default: usize,
    ) -> Result<Vec<usize>> {
        match v {
            None => Ok(vec![default; nd]),
            Some(v) if v.len() == nd => Ok(v.clone()),
            Some(v) => Err(fail(format!(
                "attribute {name} has {} values for {nd} spatial dimensions",
                v.len()
            ))),
        }
    }
    fn pads(&self, nd: usize) -> Result<(Vec<usize>, Vec<usize>)> {
        match &self.pads {
            None => Ok((vec![0; nd], vec![0; nd])),
            Some(p) if p.len() == 2 * nd => Ok((p[..nd].to_vec(), p[nd..].to_vec())),
            Some(p) => Err(fail(format!(
                "attribute pads has {} values for {nd} spatial dimensions",
                p.len()
            ))),
        }
    }
}

/// Window geometry over 3 spatial axes (unit leading axes for 1-D and 2-D): input and output
/// extents, kernel, strides, dilations, begin and end pads. For ConvTranspose `inp` is X's and
/// `out` Y's extent, with output position `i*s + k*d - pb` for input position `i`.
#[derive(Clone, Debug)]
pub(super) struct Geom {
    pub inp: [usize; ND],
    pub out: [usize; ND],
    pub k: [usize; ND],
    pub s: [usize; ND],
    pub d: [usize; ND],
    pub pb: [usize; ND],
    pub pe: [usize; ND],
}

impl Geom {
    /// Fills the last `nd` axes from per-axis vectors (the leading ones stay unit).
    fn new(inp: &[usize]) -> Result<Geom> {
        let nd = inp.len();
        if nd == 0 || nd > ND {
            return Err(fail(format!(
                "{nd} spatial dimensions (the WebGPU kernels take 1 to {ND})"
            )));
        }
        let mut g = Geom {
            inp: [1; ND],
            out: [1; ND],
            k: [1; ND],
            s: [1; ND],
            d: [1; ND],
            pb: [0; ND],
            pe: [0; ND],
        };
        g.inp[ND - nd..].copy_from_slice(inp);
        Ok(g)
    }

    fn set(a: &mut [usize; ND], v: &[usize]) {
        a[ND - v.len()..].copy_from_slice(v);
    }

    /// The output's spatial extents (the last `nd`).
    pub fn out_dims(&self, nd: usize) -> &[usize] {
        &self.out[ND - nd..]
    }

    /// Parameter words: in, out, k, s, d, pb, pe (3 each; 21 words).
    pub fn words(&self) -> Result<Vec<u32>> {
        let mut v = Vec::with_capacity(21);
        for a in [
            &self.inp, &self.out, &self.k, &self.s, &self.d, &self.pb, &self.pe,
        ] {
            for &x in a {
                let w = word(x, "a spatial extent")?;
                if w > i32::MAX as u32 {
                    return Err(fail(format!("spatial extent {x} is too large")));
                }
                v.push(w);
            }
        }
        Ok(v)
    }
}

/// Where the geometry words start in every kernel's params here.
const GEO: usize = 8;

/// WGSL reading the geometry words into named values (`id ih iw`, `od oh ow`, `kd kh kw`,
/// `sd sh sw` and so on; pads as i32).
fn geo_prelude() -> String {
    let names = [
        ["id", "ih", "iw"],
        ["od", "oh", "ow"],
        ["kd", "kh", "kw"],
        ["sd", "sh", "sw"],
        ["dd", "dh", "dw"],
        ["pd", "ph", "pw"],
        ["qd", "qh", "qw"],
    ];
    let mut s = String::new();
    for (g, row) in names.iter().enumerate() {
        for (j, n) in row.iter().enumerate() {
            let at = GEO + g * 3 + j;
            if g >= 5 {
                s.push_str(&format!("  let {n} = i32(p[{at}u]);\n"));
            } else {
                s.push_str(&format!("  let {n} = p[{at}u];\n"));
            }
        }
    }
    s
}

/// Output extents and begin pads of a convolution (the ONNX Conv rules, as the CPU kernel).
fn conv_geom(sp: &Spatial, inp: &[usize], k: &[usize]) -> Result<Geom> {
    let nd = inp.len();
    let mut g = Geom::new(inp)?;
    let s = Spatial::per_dim(&sp.strides, nd, "strides", 1)?;
    let d = Spatial::per_dim(&sp.dilations, nd, "dilations", 1)?;
    let (pb, pe) = sp.pads(nd)?;
    let mut out = vec![0; nd];
    let mut pbv = vec![0; nd];
    for j in 0..nd {
        let keff = (k[j] - 1) * d[j] + 1;
        match sp.auto_pad {
            AutoPad::NotSet | AutoPad::Valid => {
                let (b, e) = if sp.auto_pad == AutoPad::Valid {
                    (0, 0)
                } else {
                    (pb[j], pe[j])
                };
                let padded = inp[j] + b + e;
                if padded < keff {
                    return Err(fail(format!(
                        "kernel extent {keff} exceeds the padded input extent {padded} (axis {})",
                        j + 2
                    )));
                }
                out[j] = (padded - keff) / s[j] + 1;
                pbv[j] = b;
            }
            AutoPad::SameUpper | AutoPad::SameLower => {
                out[j] = inp[j].div_ceil(s[j]);
                let total = ((out[j].max(1) - 1) * s[j] + keff).saturating_sub(inp[j]);
                pbv[j] = if sp.auto_pad == AutoPad::SameUpper {
                    total / 2
                } else {
                    total - total / 2
                };
            }
        }
    }
    Geom::set(&mut g.out, &out);
    Geom::set(&mut g.k, k);
    Geom::set(&mut g.s, &s);
    Geom::set(&mut g.d, &d);
    Geom::set(&mut g.pb, &pbv);
    Ok(g)
}

/// Output extents and begin/end pads of a pooling window (the ONNX pool rules, ceil_mode).
pub(super) fn pool_geom(sp: &Spatial, inp: &[usize], ceil: bool) -> Result<Geom> {
    let nd = inp.len();
    let mut g = Geom::new(inp)?;
    let k = sp
        .kernel
        .as_ref()
        .ok_or_else(|| fail("pooling needs kernel_shape"))?;
    if k.len() != nd {
        return Err(fail(format!(
            "kernel_shape has {} values for {nd} spatial dimensions",
            k.len()
        )));
    }
    let s = Spatial::per_dim(&sp.strides, nd, "strides", 1)?;
    let d = Spatial::per_dim(&sp.dilations, nd, "dilations", 1)?;
    let (pb, pe) = sp.pads(nd)?;
    let mut out = vec![0; nd];
    let mut pbv = vec![0; nd];
    let mut pev = vec![0; nd];
    for j in 0..nd {
        let keff = (k[j] - 1) * d[j] + 1;
        match sp.auto_pad {
            AutoPad::NotSet | AutoPad::Valid => {
                let (b, e) = if sp.auto_pad == AutoPad::Valid {
                    (0, 0)
                } else {
                    (pb[j], pe[j])
                };
                let padded = inp[j] + b + e;
                if padded < keff {
                    return Err(fail(format!(
                        "kernel extent {keff} exceeds the padded input extent {padded} (axis {})",
                        j + 2
                    )));
                }
                let span = padded - keff;
                out[j] = if ceil {
                    let mut o = span.div_ceil(s[j]) + 1;
                    // the last window must start inside the input or its begin padding
                    if (o - 1) * s[j] >= inp[j] + b {
                        o -= 1;
                    }
                    o
                } else {
                    span / s[j] + 1
                };
                pbv[j] = b;
                pev[j] = e;
            }
            AutoPad::SameUpper | AutoPad::SameLower => {
                out[j] = inp[j].div_ceil(s[j]);
                let total = ((out[j].max(1) - 1) * s[j] + keff).saturating_sub(inp[j]);
                let b = if sp.auto_pad == AutoPad::SameUpper {
                    total / 2
                } else {
                    total - total / 2
                };
                pbv[j] = b;
                pev[j] = total - b;
            }
        }
    }
    Geom::set(&mut g.out, &out);
    Geom::set(&mut g.k, k);
    Geom::set(&mut g.s, &s);
    Geom::set(&mut g.d, &d);
    Geom::set(&mut g.pb, &pbv);
    Geom::set(&mut g.pe, &pev);
    Ok(g)
}

fn group_attr(node: &Node) -> Result<usize> {
    let group = node.get_i("group", 1)?;
    if group <= 0 {
        return Err(fail(format!("group {group}")));
    }
    Ok(group as usize)
}

// ----------------------------------------------------------------------------- Conv

/// Params: [row, total, N, C, M, cg, mg, has_bias, geometry (21)].
fn direct_conv_shader(epi: &str) -> String {
    shader_1d(
        &[
            ("x", "read", "T"),
            ("w", "read", "T"),
            ("bias", "read", "T"),
            ("y", "read_write", "T"),
        ],
        WG,
        epi,
        &format!(
            "  if (i >= p[1]) {{ return; }}
  let C = p[3]; let M = p[4]; let cg = p[5]; let mg = p[6];
{}
  let ox = i % ow; var r = i / ow;
  let oy = r % oh; r = r / oh;
  let oz = r % od; r = r / od;
  let m = r % M; let n = r / M;
  let g = m / mg;
  let in_plane = id * ih * iw;
  let kk = kd * kh * kw;
  var acc = 0.0;
  if (p[7] != 0u) {{ acc = f32(bias[m]); }}
  let xb = (n * C + g * cg) * in_plane;
  let wb = m * cg * kk;
  let z0 = i32(oz * sd) - pd;
  let y0 = i32(oy * sh) - ph;
  let x0 = i32(ox * sw) - pw;
  for (var a = 0u; a < kd; a++) {{
    let z = z0 + i32(a * dd);
    if (z < 0 || z >= i32(id)) {{ continue; }}
    for (var b = 0u; b < kh; b++) {{
      let yy = y0 + i32(b * dh);
      if (yy < 0 || yy >= i32(ih)) {{ continue; }}
      for (var c = 0u; c < kw; c++) {{
        let xx = x0 + i32(c * dw);
        if (xx < 0 || xx >= i32(iw)) {{ continue; }}
        let xo = xb + (u32(z) * ih + u32(yy)) * iw + u32(xx);
        let wo = wb + (a * kh + b) * kw + c;
        for (var ci = 0u; ci < cg; ci++) {{
          acc = fma(f32(x[xo + ci * in_plane]), f32(w[wo + ci * kk]), acc);
        }}
      }}
    }}
  }}
  y[i] = st(epi(acc, i));",
            geo_prelude()
        ),
    )
}

/// Params: [row (unused), cols, K, C, M, cg, mg, has_bias, geometry (21), first column].
/// Per K index, `ktab` holds (X offset from the column's base, z, y, x tap displacement).
fn gemm_conv_shader(epi: &str) -> String {
    format!(
        "
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> ktab: array<i32>;
@group(0) @binding(2) var<storage, read> x: array<T>;
@group(0) @binding(3) var<storage, read> w: array<T>;
@group(0) @binding(4) var<storage, read> bias: array<T>;
@group(0) @binding(5) var<storage, read_write> y: array<T>;
{epi}
var<workgroup> ta: array<array<f32, 16>, 64>;
var<workgroup> tb: array<array<f32, 64>, 16>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {{
  let cols = p[1]; let K = p[2]; let C = p[3]; let M = p[4]; let cg = p[5]; let mg = p[6];
{}
  let g = wid.z;
  let row0 = wid.y * 64u;
  let col0 = p[{first}u] + wid.x * 64u;
  let t = lid.y * 16u + lid.x;
  let P = od * oh * ow;
  let in_plane = id * ih * iw;
  // the one column of B this invocation loads, decoded once
  let bc = t % 64u;
  let col = col0 + bc;
  let live = col < cols;
  let n = col / P; let pos = col % P;
  let ox = pos % ow; let oy = (pos / ow) % oh; let oz = pos / (ow * oh);
  let z0 = i32(oz * sd) - pd;
  let y0 = i32(oy * sh) - ph;
  let x0 = i32(ox * sw) - pw;
  let cbase = i32((n * C + g * cg) * in_plane) + (z0 * i32(ih) + y0) * i32(iw) + x0;
  let wrow = g * mg;
  var acc: array<array<f32, 4>, 4>;
  for (var k0 = 0u; k0 < K; k0 += 16u) {{
    for (var l = 0u; l < 4u; l++) {{
      let e = t + l * 256u;
      let ar = e / 16u; let ac = e % 16u;
      let gr = row0 + ar; let gk = k0 + ac;
      var va = 0.0;
      if (gr < mg && gk < K) {{ va = f32(w[(wrow + gr) * K + gk]); }}
      ta[ar][ac] = va;
      let br = e / 64u;
      let gk2 = k0 + br;
      var vb = 0.0;
      if (live && gk2 < K) {{
        let kt = gk2 * 4u;
        let z = z0 + ktab[kt + 1u];
        let yy = y0 + ktab[kt + 2u];
        let xx = x0 + ktab[kt + 3u];
        if (z >= 0 && z < i32(id) && yy >= 0 && yy < i32(ih) && xx >= 0 && xx < i32(iw)) {{
          vb = f32(x[u32(cbase + ktab[kt])]);
        }}
      }}
      tb[br][bc] = vb;
    }}
    workgroupBarrier();
    for (var kk = 0u; kk < 16u; kk++) {{
      var av: array<f32, 4>;
      var bv: array<f32, 4>;
      for (var q = 0u; q < 4u; q++) {{
        av[q] = ta[lid.y * 4u + q][kk];
        bv[q] = tb[kk][lid.x * 4u + q];
      }}
      for (var q = 0u; q < 4u; q++) {{
        for (var s = 0u; s < 4u; s++) {{
          acc[q][s] = fma(av[q], bv[s], acc[q][s]);
        }}
      }}
    }}
    workgroupBarrier();
  }}
  for (var q = 0u; q < 4u; q++) {{
    let r = row0 + lid.y * 4u + q;
    if (r >= mg) {{ continue; }}
    let m = wrow + r;
    var b = 0.0;
    if (p[7] != 0u) {{ b = f32(bias[m]); }}
    for (var s = 0u; s < 4u; s++) {{
      let c = col0 + lid.x * 4u + s;
      if (c >= cols) {{ continue; }}
      let o = ((c / P) * M + m) * P + c % P;
      y[o] = st(epi(acc[q][s] + b, o));
    }}
  }}
}}
",
        geo_prelude(),
        first = GEO + 21,
    )
}

/// Shapes of one convolution call.
struct ConvShape {
    n: usize,
    c: usize,
    m: usize,
    group: usize,
    nd: usize,
    g: Geom,
}

fn conv_shape(
    sp: &Spatial,
    group: usize,
    xs: &[usize],
    ws: &[usize],
    bias: Option<usize>,
) -> Result<ConvShape> {
    if xs.len() < 3 || ws.len() != xs.len() {
        return Err(fail(format!(
            "Conv needs X of rank >= 3 and W of the same rank (got {xs:?} and {ws:?})"
        )));
    }
    let (n, c, m) = (xs[0], xs[1], ws[0]);
    if c % group != 0 || m % group != 0 || ws[1] * group != c {
        return Err(fail(format!(
            "Conv: X {xs:?}, W {ws:?} and group {group} do not fit"
        )));
    }
    let k = &ws[2..];
    if let Some(ks) = &sp.kernel {
        if ks.as_slice() != k {
            return Err(fail(format!(
                "Conv: kernel_shape {ks:?} differs from W's spatial shape {k:?}"
            )));
        }
    }
    if bias.is_some_and(|b| b != m) {
        return Err(fail(format!(
            "Conv: bias has {} values for {m} output channels",
            bias.unwrap_or(0)
        )));
    }
    if k.contains(&0) {
        return Err(fail(format!("Conv: empty kernel {k:?}")));
    }
    let g = conv_geom(sp, &xs[2..], k)?;
    Ok(ConvShape {
        n,
        c,
        m,
        group,
        nd: xs.len() - 2,
        g,
    })
}

fn build_conv(node: &Node) -> Result<Exec> {
    let sp = parse_spatial(node)?;
    let group = group_attr(node)?;
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, _) = dev_in(inputs, 0)?;
        let (w, _) = dev_in(inputs, 1)?;
        let b = opt_tensor_in(inputs, 2)?;
        if let Some(b) = b {
            dev_buf(b)?;
        }
        if w.dtype() != x.dtype() || b.is_some_and(|b| b.dtype() != x.dtype()) {
            return Err(fail("Conv of mixed element types"));
        }
        let cs = conv_shape(&sp, group, x.shape(), w.shape(), b.map(|b| b.len()))?;
        let mut shape = vec![cs.n, cs.m];
        shape.extend_from_slice(cs.g.out_dims(cs.nd));
        let n: usize = shape.iter().product();
        let (cg, mg) = (cs.c / group, cs.m / group);
        let mut params = vec![
            0,
            word(n, "an output size")?,
            word(cs.n, "a batch")?,
            word(cs.c, "a channel count")?,
            word(cs.m, "a channel count")?,
            word(cg, "a channel count")?,
            word(mg, "a channel count")?,
            u32::from(b.is_some()),
        ];
        params.extend(cs.g.words()?);
        let job = ConvJob {
            x: x.clone(),
            w: w.clone(),
            b: b.cloned(),
            cs,
            params,
            n,
        };
        out1(gpu.alloc_produced(x.dtype(), &shape, Arc::new(job))?)
    }))
}

/// One Conv call, run lazily ([`Producer`]).
struct ConvJob {
    x: Tensor,
    w: Tensor,
    b: Option<Tensor>,
    cs: ConvShape,
    /// [row, outputs, N, C, M, cg, mg, has_bias, geometry]
    params: Vec<u32>,
    /// output elements
    n: usize,
}

impl ConvJob {
    fn gemm(&self) -> bool {
        let (cg, mg) = (self.cs.c / self.cs.group, self.cs.m / self.cs.group);
        mg >= GEMM_MIN_CHANNELS && cg > 0
    }
}

impl Producer for ConvJob {
    fn bindings(&self) -> usize {
        if self.gemm() {
            6
        } else {
            5
        }
    }

    fn run(&self, gpu: &Gpu, y: &wgpu::Buffer, epi: Option<&Epilogue>) -> Result<()> {
        let xb = dev_buf(&self.x)?.raw();
        let wb = dev_buf(&self.w)?.raw();
        // the weights stand in for an absent bias (never read)
        let bias = match &self.b {
            Some(b) => dev_buf(b)?.raw(),
            None => wb,
        };
        let mut params = self.params.clone();
        if self.gemm() {
            let st = gpu.store(self.x.dtype())?;
            return conv_gemm(gpu, &self.cs, params, [xb, wb, bias, y], st, epi);
        }
        let e = epilogue(gpu, epi, 5, params.len())?;
        params.extend(&e.params);
        let st = gpu.store(self.x.dtype())?;
        let pipe = gpu.pipeline(&format!("conv:direct:{}:{}", st.key(), e.key), || {
            format!("{}{}", st.header(), direct_conv_shader(&e.wgsl))
        })?;
        let mut bufs = vec![xb, wb, bias, y];
        bufs.extend(&e.bufs);
        gpu.dispatch(&pipe, &mut params, &bufs, self.n as u64, WG)
    }
}

/// The implicit-GEMM convolution: per group, Y[mg, N*P] = W[mg, K] x im2col(X)[K, N*P].
fn conv_gemm(
    gpu: &Gpu,
    cs: &ConvShape,
    mut params: Vec<u32>,
    [x, w, bias, y]: [&wgpu::Buffer; 4],
    st: Store,
    epi: Option<&Epilogue>,
) -> Result<()> {
    let g = &cs.g;
    let (cg, mg) = (cs.c / cs.group, cs.m / cs.group);
    let kk: usize = g.k.iter().product();
    let kdim = cg * kk;
    let plane: usize = g.out.iter().product();
    let cols = cs.n * plane;
    let in_plane: usize = g.inp.iter().product();
    // per K index: X offset from the column base, and the tap's displacement per axis
    let mut ktab: Vec<i32> = Vec::with_capacity(kdim * 4);
    let i32w = |v: usize| -> Result<i32> {
        i32::try_from(v).map_err(|_| fail(format!("a Conv offset {v} does not fit 31 bits")))
    };
    for c in 0..cg {
        for a in 0..g.k[0] {
            for b in 0..g.k[1] {
                for e in 0..g.k[2] {
                    let (dz, dy, dx) = (a * g.d[0], b * g.d[1], e * g.d[2]);
                    ktab.extend([
                        i32w(c * in_plane + (dz * g.inp[1] + dy) * g.inp[2] + dx)?,
                        i32w(dz)?,
                        i32w(dy)?,
                        i32w(dx)?,
                    ]);
                }
            }
        }
    }
    params[1] = word(cols, "a Conv column count")?;
    params[2] = word(kdim, "a Conv reduction")?;
    params.push(0);
    let first = params.len() - 1;
    let EpiParts {
        wgsl,
        key,
        params: eparams,
        bufs: ebufs,
    } = epilogue(gpu, epi, 6, params.len())?;
    params.extend(eparams);
    let kbytes: &[u8] = bytemuck::cast_slice(&ktab);
    let kbuf = gpu.table(kbytes, "a Conv offset table")?;
    let pipe = gpu.pipeline(&format!("conv:gemm:{}:{key}", st.key()), || {
        format!("{}{}", st.header(), gemm_conv_shader(&wgsl))
    })?;
    let max = gpu.limits.max_compute_workgroups_per_dimension as usize;
    let tiles = cols.div_ceil(TILE);
    let rows = word(mg.div_ceil(TILE), "a Conv tile count")?;
    let groups = word(cs.group, "a Conv group count")?;
    let mut t0 = 0;
    while t0 < tiles {
        let nt = (tiles - t0).min(max);
        params[first] = word(t0 * TILE, "a Conv column")?;
        let mut bufs = vec![kbuf.raw(), x, w, bias, y];
        bufs.extend(&ebufs);
        gpu.dispatch_grid(&pipe, &params, &bufs, [nt as u32, rows, groups])?;
        t0 += nt;
    }
    Ok(())
}

// ----------------------------------------------------------------------------- ConvTranspose

/// Params: [row, total, N, C, M, cg, mg, has_bias, geometry (21)]; W is [C, mg, k..].
fn conv_transpose_shader() -> String {
    shader_1d(
        &[
            ("x", "read", "T"),
            ("w", "read", "T"),
            ("bias", "read", "T"),
            ("y", "read_write", "T"),
        ],
        WG,
        "",
        &format!(
            "  if (i >= p[1]) {{ return; }}
  let C = p[3]; let M = p[4]; let cg = p[5]; let mg = p[6];
{}
  let ox = i % ow; var r = i / ow;
  let oy = r % oh; r = r / oh;
  let oz = r % od; r = r / od;
  let m = r % M; let n = r / M;
  let g = m / mg; let ml = m % mg;
  let in_plane = id * ih * iw;
  let kk = kd * kh * kw;
  var acc = 0.0;
  if (p[7] != 0u) {{ acc = f32(bias[m]); }}
  let xb = (n * C + g * cg) * in_plane;
  let wb = (g * cg * mg + ml) * kk;
  let wstep = mg * kk;
  let z0 = i32(oz) + pd;
  let y0 = i32(oy) + ph;
  let x0 = i32(ox) + pw;
  for (var a = 0u; a < kd; a++) {{
    let tz = z0 - i32(a * dd);
    if (tz < 0 || tz % i32(sd) != 0) {{ continue; }}
    let z = u32(tz) / sd;
    if (z >= id) {{ continue; }}
    for (var b = 0u; b < kh; b++) {{
      let ty = y0 - i32(b * dh);
      if (ty < 0 || ty % i32(sh) != 0) {{ continue; }}
      let yy = u32(ty) / sh;
      if (yy >= ih) {{ continue; }}
      for (var c = 0u; c < kw; c++) {{
        let tx = x0 - i32(c * dw);
        if (tx < 0 || tx % i32(sw) != 0) {{ continue; }}
        let xx = u32(tx) / sw;
        if (xx >= iw) {{ continue; }}
        let xo = xb + (z * ih + yy) * iw + xx;
        let wo = wb + (a * kh + b) * kw + c;
        for (var ci = 0u; ci < cg; ci++) {{
          acc = fma(f32(x[xo + ci * in_plane]), f32(w[wo + ci * wstep]), acc);
        }}
      }}
    }}
  }}
  y[i] = st(acc);",
            geo_prelude()
        ),
    )
}

struct ConvTAttrs {
    sp: Spatial,
    group: usize,
    output_padding: Option<Vec<usize>>,
    output_shape: Option<Vec<usize>>,
}

/// Shapes of a transposed convolution (the ONNX rules, as the CPU kernel: an explicit
/// output_shape or SAME auto_pad sets the total padding, split begin/end by auto_pad).
fn conv_transpose_shape(
    a: &ConvTAttrs,
    xs: &[usize],
    ws: &[usize],
    bias: Option<usize>,
) -> Result<ConvShape> {
    if xs.len() < 3 || ws.len() != xs.len() {
        return Err(fail(format!(
            "ConvTranspose needs X of rank >= 3 and W of the same rank (got {xs:?} and {ws:?})"
        )));
    }
    let nd = xs.len() - 2;
    let (n, c) = (xs[0], xs[1]);
    let group = a.group;
    if ws[0] != c || c % group != 0 {
        return Err(fail(format!(
            "ConvTranspose: X {xs:?}, W {ws:?} and group {group} do not fit"
        )));
    }
    let m = ws[1] * group;
    let k = ws[2..].to_vec();
    if let Some(ks) = &a.sp.kernel {
        if ks != &k {
            return Err(fail(format!(
                "ConvTranspose: kernel_shape {ks:?} differs from W's spatial shape {k:?}"
            )));
        }
    }
    if k.contains(&0) {
        return Err(fail(format!("ConvTranspose: empty kernel {k:?}")));
    }
    if bias.is_some_and(|b| b != m) {
        return Err(fail(format!(
            "ConvTranspose: bias has {} values for {m} output channels",
            bias.unwrap_or(0)
        )));
    }
    let inp = &xs[2..];
    let mut g = Geom::new(inp)?;
    let s = Spatial::per_dim(&a.sp.strides, nd, "strides", 1)?;
    let d = Spatial::per_dim(&a.sp.dilations, nd, "dilations", 1)?;
    let op = Spatial::per_dim(&a.output_padding, nd, "output_padding", 0)?;
    let explicit_out = match &a.output_shape {
        Some(os) if os.len() == nd => Some(os.clone()),
        Some(os) if os.len() == nd + 2 => Some(os[2..].to_vec()),
        Some(os) => {
            return Err(fail(format!(
                "ConvTranspose: output_shape {os:?} does not fit {nd} spatial dims"
            )))
        }
        None => None,
    };
    let (pads_b, pads_e) = a.sp.pads(nd)?;
    let mut out = vec![0usize; nd];
    let mut pb = vec![0usize; nd];
    for j in 0..nd {
        let keff = ((k[j] - 1) * d[j] + 1) as i64;
        let natural = (s[j] * inp[j].saturating_sub(1)) as i64 + op[j] as i64 + keff;
        let target = match (&explicit_out, a.sp.auto_pad) {
            (Some(o), _) => Some(o[j] as i64),
            (None, AutoPad::SameUpper | AutoPad::SameLower) => Some((inp[j] * s[j]) as i64),
            _ => None,
        };
        match target {
            Some(t) => {
                // up to stride-1 beyond the natural extent pads the end; more is unreachable
                if natural - t <= -(s[j] as i64) {
                    return Err(fail(format!(
                        "ConvTranspose: output extent {t} is unreachable from input extent {} on axis {}",
                        inp[j],
                        j + 2
                    )));
                }
                let total = (natural - t).max(0);
                let begin = if a.sp.auto_pad == AutoPad::SameUpper {
                    total / 2
                } else {
                    total - total / 2
                };
                out[j] = t as usize;
                pb[j] = begin as usize;
            }
            None => {
                let (b, e) = if a.sp.auto_pad == AutoPad::Valid {
                    (0, 0)
                } else {
                    (pads_b[j] as i64, pads_e[j] as i64)
                };
                let o = natural - b - e;
                if o < 0 {
                    return Err(fail(format!(
                        "ConvTranspose: negative output extent on axis {}",
                        j + 2
                    )));
                }
                out[j] = o as usize;
                pb[j] = b as usize;
            }
        }
    }
    Geom::set(&mut g.out, &out);
    Geom::set(&mut g.k, &k);
    Geom::set(&mut g.s, &s);
    Geom::set(&mut g.d, &d);
    Geom::set(&mut g.pb, &pb);
    Ok(ConvShape {
        n,
        c,
        m,
        group,
        nd,
        g,
    })
}

fn build_conv_transpose(node: &Node) -> Result<Exec> {
    let sp = parse_spatial(node)?;
    let group = group_attr(node)?;
    let nd_of = |name: &str| -> Result<Option<Vec<usize>>> {
        match node.attr_ints(name)? {
            Some(v) if v.iter().any(|&x| x < 0) => Err(fail(format!("ConvTranspose {name} {v:?}"))),
            Some(v) => Ok(Some(v.into_iter().map(|x| x as usize).collect())),
            None => Ok(None),
        }
    };
    let output_padding = nd_of("output_padding")?;
    let output_shape = nd_of("output_shape")?;
    if output_padding.as_ref().is_some_and(|v| v.len() > ND) {
        return Err(fail(format!(
            "ConvTranspose over more than {ND} spatial dimensions"
        )));
    }
    let a = ConvTAttrs {
        sp,
        group,
        output_padding,
        output_shape,
    };
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, xb) = dev_in(inputs, 0)?;
        let (w, wb) = dev_in(inputs, 1)?;
        let b = opt_tensor_in(inputs, 2)?;
        if w.dtype() != x.dtype() || b.is_some_and(|b| b.dtype() != x.dtype()) {
            return Err(fail("ConvTranspose of mixed element types"));
        }
        let st = gpu.store(x.dtype())?;
        let cs = conv_transpose_shape(&a, x.shape(), w.shape(), b.map(|b| b.len()))?;
        let mut shape = vec![cs.n, cs.m];
        shape.extend_from_slice(cs.g.out_dims(cs.nd));
        let (y, yb) = gpu.alloc(x.dtype(), &shape)?;
        if y.is_empty() {
            return out1(y);
        }
        let bias = match b {
            Some(b) => Some(dev_buf(b)?.raw()),
            None => None,
        };
        let mut params = vec![
            0,
            word(y.len(), "an output size")?,
            word(cs.n, "a batch")?,
            word(cs.c, "a channel count")?,
            word(cs.m, "a channel count")?,
            word(cs.c / cs.group, "a channel count")?,
            word(cs.m / cs.group, "a channel count")?,
            u32::from(bias.is_some()),
        ];
        params.extend(cs.g.words()?);
        let bias = bias.unwrap_or(wb.raw());
        let pipe = gpu.pipeline(&format!("convtranspose:{}", st.key()), || {
            format!("{}{}", st.header(), conv_transpose_shader())
        })?;
        gpu.dispatch(
            &pipe,
            &mut params,
            &[xb.raw(), wb.raw(), bias, yb.raw()],
            y.len() as u64,
            WG,
        )?;
        out1(y)
    }))
}
