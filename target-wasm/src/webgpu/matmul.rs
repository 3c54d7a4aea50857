//! MatMul (numpy batch broadcasting, 1-D operands) and Gemm (transposes, alpha, beta, a
//! broadcast C): one tiled kernel. A workgroup of 16x16 invocations computes a 64x64 block of
//! the output, each invocation a 4x4 register tile, over K in steps of 16 staged through
//! workgroup memory. Operands are read through strides, so transposes cost nothing; per-batch
//! offsets come from a small table, so broadcast batch dimensions cost nothing either.
//!
//! With at most [`GEMV_ROWS`] rows (a decode step, a classifier head, a squeeze-excite block)
//! a matrix-vector kernel runs instead: a 64x64 tile would leave all but a row of its work
//! idle. Each workgroup takes 16 columns and splits K over 16 lanes.
//!
//! Both run lazily as a [`Producer`]: an element-wise chain that reads the product (bias,
//! activation, residual) becomes the kernel's epilogue, so `MatMul -> Add -> Relu` is one
//! dispatch.

use nxrt_core::ir::Node;
use nxrt_core::kernels::{broadcast_shapes, opt_tensor_in};
use nxrt_core::{Error, Result};

use std::sync::Arc;

use nxrt_core::Tensor;

use super::ew::{epilogue, Epilogue};
use super::{dev_buf, dev_in, out1, Exec, Gpu, OpDef, Producer};

pub(crate) const OPS: &[OpDef] = &[
    OpDef {
        op: "MatMul",
        since: 9,
        type_input: 0,
        half: true,
        host: &[],
        build: build_matmul,
    },
    OpDef {
        op: "Gemm",
        since: 11,
        type_input: 0,
        half: true,
        host: &[],
        build: build_gemm,
    },
];

/// Tile edge (outputs) and K step.
const TILE: u32 = 64;

/// Rows up to which the matrix-vector kernel runs.
const GEMV_ROWS: usize = 4;

/// Parameter words before the epilogue's.
const PARAMS: usize = 13;

/// Params: [0, M, N, K, sam, sak, sbk, sbn, scm, scn, has_c, alpha, beta]; offsets table:
/// per batch (a offset, b offset, c offset). `EPI` is the epilogue (bindings from 6).
const SHADER: &str = "
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> offs: array<u32>;
@group(0) @binding(2) var<storage, read> a: array<T>;
@group(0) @binding(3) var<storage, read> b: array<T>;
@group(0) @binding(4) var<storage, read> c: array<T>;
@group(0) @binding(5) var<storage, read_write> y: array<T>;

EPI
var<workgroup> ta: array<array<f32, 16>, 64>;
var<workgroup> tb: array<array<f32, 64>, 16>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let M = p[1]; let N = p[2]; let K = p[3];
  let sam = p[4]; let sak = p[5]; let sbk = p[6]; let sbn = p[7];
  let row0 = wid.y * 64u;
  let col0 = wid.x * 64u;
  let bi = wid.z;
  let ao = offs[bi * 3u];
  let bo = offs[bi * 3u + 1u];
  let t = lid.y * 16u + lid.x;
  var acc: array<array<f32, 4>, 4>;
  for (var k0 = 0u; k0 < K; k0 += 16u) {
    for (var l = 0u; l < 4u; l++) {
      let e = t + l * 256u;
      let ar = e / 16u; let ac = e % 16u;
      let gr = row0 + ar; let gk = k0 + ac;
      var va = 0.0;
      if (gr < M && gk < K) { va = f32(a[ao + gr * sam + gk * sak]); }
      ta[ar][ac] = va;
      let br = e / 64u; let bc = e % 64u;
      let gk2 = k0 + br; let gc = col0 + bc;
      var vb = 0.0;
      if (gk2 < K && gc < N) { vb = f32(b[bo + gk2 * sbk + gc * sbn]); }
      tb[br][bc] = vb;
    }
    workgroupBarrier();
    for (var kk = 0u; kk < 16u; kk++) {
      var av: array<f32, 4>;
      var bv: array<f32, 4>;
      for (var q = 0u; q < 4u; q++) {
        av[q] = ta[lid.y * 4u + q][kk];
        bv[q] = tb[kk][lid.x * 4u + q];
      }
      for (var q = 0u; q < 4u; q++) {
        for (var s = 0u; s < 4u; s++) {
          acc[q][s] = fma(av[q], bv[s], acc[q][s]);
        }
      }
    }
    workgroupBarrier();
  }
  let alpha = bitcast<f32>(p[11]);
  let beta = bitcast<f32>(p[12]);
  let co = offs[bi * 3u + 2u];
  let yo = bi * M * N;
  for (var q = 0u; q < 4u; q++) {
    let r = row0 + lid.y * 4u + q;
    if (r >= M) { continue; }
    for (var s = 0u; s < 4u; s++) {
      let col = col0 + lid.x * 4u + s;
      if (col >= N) { continue; }
      var v = alpha * acc[q][s];
      if (p[10] != 0u) { v += beta * f32(c[co + r * p[8] + col * p[9]]); }
      let o = yo + r * N + col;
      y[o] = st(epi(v, o));
    }
  }
}
";

/// The matrix-vector kernel (M <= 4): a workgroup computes 16 columns of every row, its 16
/// lanes each summing every 16th K, then adding up through workgroup memory. `KX` (0 or 1):
/// whether lanes run along `lid.x` (B read along K, a transposed B) or columns do. Same
/// params, table and bindings as the tiled kernel.
const GEMV: &str = "
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> offs: array<u32>;
@group(0) @binding(2) var<storage, read> a: array<T>;
@group(0) @binding(3) var<storage, read> b: array<T>;
@group(0) @binding(4) var<storage, read> c: array<T>;
@group(0) @binding(5) var<storage, read_write> y: array<T>;
EPI
var<workgroup> part: array<f32, 1024>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
  let M = p[1]; let N = p[2]; let K = p[3];
  let sam = p[4]; let sak = p[5]; let sbk = p[6]; let sbn = p[7];
  let kx = KXu != 0u;
  let cl = select(lid.x, lid.y, kx);
  let lane = select(lid.y, lid.x, kx);
  let col = wid.x * 16u + cl;
  let bi = wid.z;
  let ao = offs[bi * 3u];
  let bo = offs[bi * 3u + 1u];
  var acc: array<f32, 4>;
  if (col < N) {
    for (var k = lane; k < K; k += 16u) {
      let bv = f32(b[bo + k * sbk + col * sbn]);
      for (var q = 0u; q < 4u; q++) {
        if (q < M) { acc[q] = fma(f32(a[ao + q * sam + k * sak]), bv, acc[q]); }
      }
    }
  }
  for (var q = 0u; q < 4u; q++) {
    part[(q * 16u + lane) * 16u + cl] = acc[q];
  }
  workgroupBarrier();
  if (lane != 0u || col >= N) { return; }
  let alpha = bitcast<f32>(p[11]);
  let beta = bitcast<f32>(p[12]);
  let co = offs[bi * 3u + 2u];
  let yo = bi * M * N;
  for (var q = 0u; q < M; q++) {
    var s = 0.0;
    for (var l = 0u; l < 16u; l++) { s += part[(q * 16u + l) * 16u + cl]; }
    var v = alpha * s;
    if (p[10] != 0u) { v += beta * f32(c[co + q * p[8] + col * p[9]]); }
    let o = yo + q * N + col;
    y[o] = st(epi(v, o));
  }
}
";

/// One MatMul/Gemm call, run lazily ([`Producer`]).
struct Mm {
    m: usize,
    n: usize,
    k: usize,
    /// strides of A over (m, k) and B over (k, n)
    sa: (usize, usize),
    sb: (usize, usize),
    /// per batch: (a, b, c) element offsets
    offs: Vec<u32>,
    a: Tensor,
    b: Tensor,
    /// C and its strides over (m, n)
    c: Option<(Tensor, usize, usize)>,
    alpha: f32,
    beta: f32,
}

impl Producer for Mm {
    fn bindings(&self) -> usize {
        6
    }

    fn run(&self, gpu: &Gpu, y: &wgpu::Buffer, epi: Option<&Epilogue>) -> Result<()> {
        let mm = self;
        let batch = mm.offs.len() / 3;
        if mm.m == 0 || mm.n == 0 || batch == 0 {
            return Ok(());
        }
        let (a, b) = (dev_buf(&mm.a)?.raw(), dev_buf(&mm.b)?.raw());
        let u = |v: usize| -> Result<u32> {
            u32::try_from(v).map_err(|_| Error::Other(format!("MatMul dimension {v} is too large")))
        };
        let (c_buf, scm, scn, has_c) = match &mm.c {
            Some((ct, sm, sn)) => (Some(dev_buf(ct)?.raw()), *sm, *sn, 1),
            None => (None, 0, 0, 0),
        };
        let e = epilogue(gpu, epi, 6, PARAMS)?;
        let st = gpu.store(mm.a.dtype())?;
        let gemv = mm.m <= GEMV_ROWS;
        let kx = u32::from(mm.sb.0 == 1 && mm.sb.1 != 1);
        let key = if gemv {
            format!("matmul:{}:gemv{kx}:{}", st.key(), e.key)
        } else {
            format!("matmul:{}:{}", st.key(), e.key)
        };
        let pipe = gpu.pipeline(&key, || {
            let body = if gemv {
                GEMV.replace("EPI", &e.wgsl).replace("KX", &kx.to_string())
            } else {
                SHADER.replace("EPI", &e.wgsl)
            };
            format!("{}{body}", st.header())
        })?;
        let offs_words: &[u8] = bytemuck::cast_slice(&mm.offs);
        let offs = gpu.table(offs_words, "a MatMul batch table")?;
        let mut params = vec![
            0,
            u(mm.m)?,
            u(mm.n)?,
            u(mm.k)?,
            u(mm.sa.0)?,
            u(mm.sa.1)?,
            u(mm.sb.0)?,
            u(mm.sb.1)?,
            u(scm)?,
            u(scn)?,
            has_c,
            mm.alpha.to_bits(),
            mm.beta.to_bits(),
        ];
        params.extend(&e.params);
        // with no C, A stands in for the binding (never read; it must not alias the
        // read-write output)
        let c_bind = c_buf.unwrap_or(a);
        let tile = if gemv { 16 } else { TILE as usize };
        let rows = if gemv {
            1
        } else {
            mm.m.div_ceil(TILE as usize)
        };
        let grid = [u(mm.n.div_ceil(tile))?, u(rows)?, u(batch)?];
        let mut bufs = vec![offs.raw(), a, b, c_bind, y];
        bufs.extend(e.bufs);
        gpu.dispatch_grid(&pipe, &params, &bufs, grid)
    }
}

fn build_matmul(_node: &Node) -> Result<Exec> {
    Ok(Box::new(|gpu: &Gpu, inputs| {
        let (a, _) = dev_in(inputs, 0)?;
        let (b, _) = dev_in(inputs, 1)?;
        if a.dtype() != b.dtype() {
            return Err(Error::Other("MatMul of two element types".into()));
        }
        let (mut ash, mut bsh) = (a.shape().to_vec(), b.shape().to_vec());
        if ash.is_empty() || bsh.is_empty() {
            return Err(Error::Other("MatMul of a scalar".into()));
        }
        let a1 = ash.len() == 1;
        let b1 = bsh.len() == 1;
        if a1 {
            ash.insert(0, 1);
        }
        if b1 {
            bsh.push(1);
        }
        let (m, k) = (ash[ash.len() - 2], ash[ash.len() - 1]);
        let (k2, n) = (bsh[bsh.len() - 2], bsh[bsh.len() - 1]);
        if k != k2 {
            return Err(Error::Shape(format!(
                "MatMul {:?} x {:?}: inner dimensions differ",
                a.shape(),
                b.shape()
            )));
        }
        let abat = &ash[..ash.len() - 2];
        let bbat = &bsh[..bsh.len() - 2];
        let bat = broadcast_shapes(abat, bbat)?;
        let sa = super::ew::bcast_strides(abat, &bat);
        let sb = super::ew::bcast_strides(bbat, &bat);
        let nb: usize = bat.iter().product();
        let mut offs = Vec::with_capacity(nb * 3);
        for bi in 0..nb {
            let (mut rem, mut oa, mut ob) = (bi, 0usize, 0usize);
            for d in (0..bat.len()).rev() {
                let c = rem % bat[d];
                rem /= bat[d];
                oa += c * sa[d] as usize;
                ob += c * sb[d] as usize;
            }
            offs.extend([(oa * m * k) as u32, (ob * k * n) as u32, 0]);
        }
        let mut out = bat.clone();
        if !a1 {
            out.push(m);
        }
        if !b1 {
            out.push(n);
        }
        let mm = Mm {
            m,
            n,
            k,
            sa: (k, 1),
            sb: (n, 1),
            offs,
            a: a.clone(),
            b: b.clone(),
            c: None,
            alpha: 1.0,
            beta: 0.0,
        };
        out1(gpu.alloc_produced(a.dtype(), &out, Arc::new(mm))?)
    }))
}

fn build_gemm(node: &Node) -> Result<Exec> {
    let ta = node.get_i("transA", 0)? != 0;
    let tb = node.get_i("transB", 0)? != 0;
    let alpha = node.get_f("alpha", 1.0)?;
    let beta = node.get_f("beta", 1.0)?;
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (a, _) = dev_in(inputs, 0)?;
        let (b, _) = dev_in(inputs, 1)?;
        if a.dtype() != b.dtype() {
            return Err(Error::Other("MatMul of two element types".into()));
        }
        if a.rank() != 2 || b.rank() != 2 {
            return Err(Error::Shape("Gemm takes 2-D A and B".into()));
        }
        let (m, k) = if ta {
            (a.shape()[1], a.shape()[0])
        } else {
            (a.shape()[0], a.shape()[1])
        };
        let (k2, n) = if tb {
            (b.shape()[1], b.shape()[0])
        } else {
            (b.shape()[0], b.shape()[1])
        };
        if k != k2 {
            return Err(Error::Shape(format!(
                "Gemm {:?} x {:?}: inner dimensions differ",
                a.shape(),
                b.shape()
            )));
        }
        let c = match opt_tensor_in(inputs, 2)? {
            Some(c) if beta != 0.0 => {
                let cs = c.shape();
                if cs.len() > 2 {
                    return Err(Error::Shape(format!("Gemm C of shape {cs:?}")));
                }
                let full = [1usize, 1];
                let cs2: Vec<usize> = full[..2 - cs.len()].iter().chain(cs).copied().collect();
                if (cs2[0] != 1 && cs2[0] != m) || (cs2[1] != 1 && cs2[1] != n) {
                    return Err(Error::Shape(format!(
                        "Gemm C of shape {cs:?} does not broadcast to [{m}, {n}]"
                    )));
                }
                let scm = if cs2[0] == 1 { 0 } else { cs2[1] };
                let scn = usize::from(cs2[1] != 1);
                dev_buf(c)?;
                if c.dtype() != a.dtype() {
                    return Err(Error::Other("Gemm of two element types".into()));
                }
                Some((c.clone(), scm, scn))
            }
            _ => None,
        };
        let sa = if ta { (1, m) } else { (k, 1) };
        let sb = if tb { (1, k) } else { (n, 1) };
        let mm = Mm {
            m,
            n,
            k,
            sa,
            sb,
            offs: vec![0, 0, 0],
            a: a.clone(),
            b: b.clone(),
            c,
            alpha,
            beta,
        };
        out1(gpu.alloc_produced(a.dtype(), &[m, n], Arc::new(mm))?)
    }))
}
