//! com.microsoft MatMulNBits on the device: `Y = A · dequant(B)ᵀ (+ bias)`, B's N columns of K
//! weights in blocks of 2-, 4- or 8-bit codes (the layout and semantics are core's CPU kernel's,
//! `core/src/kernels/nbits.rs`, and docs/genai.md), so an int4 decoder's matrix products stay on
//! the GPU.
//!
//! B, the packed zero points (uint8) live on the device as bytes, four to a 32-bit word. Each
//! workgroup computes 16 columns for up to 4 rows of A: 16 lanes per column, each lane taking
//! every 16th block, its codes unpacked from whole words, and the lanes' sums added in
//! workgroup memory. At `accuracy_level` 4 (4 or 8 bits, integer zero points) a first dispatch
//! quantizes each block of A's rows to int8 as ONNX Runtime's CPU kernel does (`amax / 127`,
//! round to nearest even), and the products are integer sums (exact in f32) times
//! `scale_a * scale_b` per block. `g_idx` stays on the CPU.

use nxrt_core::ir::Node;
use nxrt_core::kernels::{opt_tensor_in, tensor_in};
use nxrt_core::{DataType, Error, Result};

use super::reduce::word;
use super::{dev_buf, module_header, shader_1d, Exec, Gpu, OpDef, Store};

pub(crate) const MS_OPS: &[OpDef] = &[OpDef {
    op: "MatMulNBits",
    since: 1,
    type_input: 0,
    half: false,
    host: &[],
    build,
}];

/// Rows of A one workgroup computes (they share each block's unpacked codes).
const ROWS: usize = 4;

#[derive(Clone, Copy, Debug)]
struct Cfg {
    k: usize,
    n: usize,
    bits: usize,
    bs: usize,
    accuracy: i64,
}

fn build(node: &Node) -> Result<Exec> {
    let k = node.get_i("K", 0)?;
    let n = node.get_i("N", 0)?;
    let bits = node.get_i("bits", 4)?;
    let bs = node.get_i("block_size", 0)?;
    if k <= 0 || n <= 0 {
        return Err(Error::Other(format!(
            "MatMulNBits: K {k} and N {n} must be positive"
        )));
    }
    if !matches!(bits, 2 | 4 | 8) {
        return Err(Error::Other(format!(
            "the WebGPU MatMulNBits kernel takes 2, 4 or 8 bits, not {bits}"
        )));
    }
    if !(16..=4096).contains(&bs) || (bs & (bs - 1)) != 0 {
        return Err(Error::Other(format!(
            "the WebGPU MatMulNBits kernel takes block sizes 16 to 4096 (powers of two), not {bs}"
        )));
    }
    if node.inputs.get(4).is_some_and(Option::is_some) {
        return Err(Error::Other(
            "the WebGPU MatMulNBits kernel does not take g_idx".into(),
        ));
    }
    let cfg = Cfg {
        k: k as usize,
        n: n as usize,
        bits: bits as usize,
        bs: bs as usize,
        accuracy: node.get_i("accuracy_level", 0)?,
    };
    Ok(Box::new(move |gpu: &Gpu, inputs| run(gpu, &cfg, inputs)))
}

/// A's blocks as int8 values (kept in f32) and one scale per (row, block). Params: [width,
/// count (rows x blocks), K, blocks, block size].
const QUANT_BODY: &str = "
  if (i >= p[1]) { return; }
  let kk = p[2]; let blocks = p[3]; let bs = p[4];
  let m = i / blocks;
  let blk = i % blocks;
  let k0 = blk * bs;
  let k1 = min(k0 + bs, kk);
  var amax = 0.0;
  for (var k = k0; k < k1; k++) { amax = max(amax, abs(a[m * kk + k])); }
  let inv = select(0.0, 127.0 / amax, amax != 0.0);
  for (var k = k0; k < k1; k++) { qa[m * kk + k] = round(a[m * kk + k] * inv); }
  sa[i] = amax / 127.0;
";

/// Params: [M, N, K, blocks, block size, bits, zp mode (0 default, 1 packed, 2 float),
/// quantized A, bias, words per block, zero-point bytes per column].
const MAIN: &str = "
var<workgroup> red: array<f32, 1024>;

fn byte_at(idx: u32) -> u32 { return (zp[idx / 4u] >> (8u * (idx % 4u))) & 255u; }

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
  let mm = p[0]; let nn = p[1]; let kk = p[2]; let blocks = p[3]; let bs = p[4];
  let bits = p[5]; let zmode = p[6]; let quant = p[7] != 0u; let wpb = p[9];
  let col = t / 16u;
  let lane = t % 16u;
  let n = wid.x * 16u + col;
  let m0 = wid.y * 4u;
  let rows = min(4u, mm - m0);
  let per = 32u / bits;
  let mask = (1u << bits) - 1u;
  var acc = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
  if (n < nn) {
    for (var blk = lane; blk < blocks; blk += 16u) {
      let sb = scales[n * blocks + blk];
      var zpv = f32(1u << (bits - 1u));
      if (zmode == 1u) {
        let bit = blk * bits;
        zpv = f32((byte_at(n * p[10] + bit / 8u) >> (bit % 8u)) & mask);
      }
ZPF
      let wbase = (n * blocks + blk) * wpb;
      let k0 = blk * bs;
      var s = array<f32, 4>(0.0, 0.0, 0.0, 0.0);
      for (var w = 0u; w < wpb; w++) {
        let word = b[wbase + w];
        let kw = k0 + w * per;
        for (var j = 0u; j < per; j++) {
          let k = kw + j;
          if (k < kk) {
            let c = f32((word >> (j * bits)) & mask) - zpv;
            for (var r = 0u; r < rows; r++) { s[r] += AV * c; }
          }
        }
      }
      for (var r = 0u; r < rows; r++) { acc[r] += s[r] * SCALE; }
    }
  }
  for (var r = 0u; r < 4u; r++) { red[r * 256u + t] = acc[r]; }
  workgroupBarrier();
  for (var h = 8u; h > 0u; h = h >> 1u) {
    if (lane < h) {
      for (var r = 0u; r < 4u; r++) { red[r * 256u + t] += red[r * 256u + t + h]; }
    }
    workgroupBarrier();
  }
  if (lane == 0u && n < nn) {
    for (var r = 0u; r < rows; r++) {
      var v = red[r * 256u + t];
BIAS
      y[(m0 + r) * nn + n] = st(v);
    }
  }
}
";

fn run(
    gpu: &Gpu,
    cfg: &Cfg,
    inputs: &[Option<&nxrt_core::Value>],
) -> Result<Vec<nxrt_core::Value>> {
    let Cfg { k, n, bits, bs, .. } = *cfg;
    let a = tensor_in(inputs, 0)?;
    let b = tensor_in(inputs, 1)?;
    let scales = tensor_in(inputs, 2)?;
    let zp = opt_tensor_in(inputs, 3)?;
    if opt_tensor_in(inputs, 4)?.is_some() {
        return Err(Error::Other(
            "the WebGPU MatMulNBits kernel does not take g_idx".into(),
        ));
    }
    let bias = opt_tensor_in(inputs, 5)?;
    if a.dtype() != DataType::Float || a.rank() == 0 || a.shape()[a.rank() - 1] != k {
        return Err(Error::Shape(format!(
            "MatMulNBits: A {} {:?} must be float and end in K = {k}",
            a.dtype(),
            a.shape()
        )));
    }
    let blocks = k.div_ceil(bs);
    let blob = bs * bits / 8;
    if b.dtype() != DataType::Uint8 || b.len() != n * blocks * blob {
        return Err(Error::Shape(format!(
            "MatMulNBits: B must be {n} x {blocks} x {blob} uint8 (is {} {:?})",
            b.dtype(),
            b.shape()
        )));
    }
    if scales.dtype() != DataType::Float || scales.len() != n * blocks {
        return Err(Error::Shape(format!(
            "MatMulNBits: scales must be {n} x {blocks} floats (is {} {:?})",
            scales.dtype(),
            scales.shape()
        )));
    }
    let zp_bytes = (blocks * bits).div_ceil(8);
    let zmode = match zp {
        None => 0u32,
        Some(z) if z.dtype() == DataType::Uint8 && z.len() == n * zp_bytes => 1,
        Some(z) if z.dtype() == DataType::Float && z.len() == n * blocks => 2,
        Some(z) => {
            return Err(Error::Shape(format!(
                "MatMulNBits: zero_points {} {:?}: expected {n} x {zp_bytes} uint8 or {n} x {blocks} floats",
                z.dtype(),
                z.shape()
            )))
        }
    };
    if let Some(bb) = bias {
        if bb.dtype() != DataType::Float || bb.len() != n {
            return Err(Error::Shape(format!(
                "MatMulNBits: bias must be {n} floats (is {:?})",
                bb.shape()
            )));
        }
    }
    // the int8 activations of accuracy level 4, as the CPU kernel decides
    let quant = cfg.accuracy == 4 && zmode != 2 && bits != 2;
    let m = a.len() / k;
    let mut shape = a.shape().to_vec();
    *shape.last_mut().expect("rank >= 1") = n;
    let (y, yb) = gpu.alloc(DataType::Float, &shape)?;
    if m == 0 {
        return Ok(vec![nxrt_core::Value::Tensor(y)]);
    }
    let header = module_header(&[Store::F32], Store::F32);
    let ab = dev_buf(a)?;
    let quantized = if quant {
        let qa = gpu.buffer((m * k) as u64 * 4, "MatMulNBits int8 activations")?;
        let sa = gpu.buffer((m * blocks) as u64 * 4, "MatMulNBits activation scales")?;
        let pipe = gpu.pipeline("nbits_quant", || {
            let bufs = [
                ("a", "read", "f32"),
                ("qa", "read_write", "f32"),
                ("sa", "read_write", "f32"),
            ];
            shader_1d(&bufs, 64, "", QUANT_BODY)
        })?;
        let count = m * blocks;
        let mut params = [
            0,
            word(count, "A blocks")?,
            word(k, "K")?,
            word(blocks, "blocks")?,
            word(bs, "the block size")?,
        ];
        gpu.dispatch(
            &pipe,
            &mut params,
            &[ab.raw(), qa.raw(), sa.raw()],
            count as u64,
            64,
        )?;
        Some((qa, sa))
    } else {
        None
    };
    let has_bias = bias.is_some();
    let key = format!("nbits:{quant}:{zmode}:{has_bias}");
    let pipe = gpu.pipeline(&key, || {
        let mut bufs = vec![("a", "read", "f32")];
        if quant {
            bufs.push(("sa", "read", "f32"));
        }
        bufs.push(("b", "read", "u32"));
        bufs.push(("scales", "read", "f32"));
        // the zero points: packed bytes or floats (a dummy binding when absent)
        bufs.push(("zp", "read", "u32"));
        if zmode == 2 {
            bufs.push(("zpf", "read", "f32"));
        }
        if has_bias {
            bufs.push(("bias", "read", "f32"));
        }
        bufs.push(("y", "read_write", "T"));
        let mut s = String::from("@group(0) @binding(0) var<storage, read> p: array<u32>;\n");
        for (i, (name, access, ty)) in bufs.iter().enumerate() {
            s.push_str(&format!(
                "@group(0) @binding({}) var<storage, {access}> {name}: array<{ty}>;\n",
                i + 1
            ));
        }
        let body = MAIN
            .replace("AV", "a[(m0 + r) * kk + k]")
            .replace(
                "SCALE",
                if quant {
                    "(sa[(m0 + r) * blocks + blk] * sb)"
                } else {
                    "sb"
                },
            )
            .replace(
                "ZPF\n",
                if zmode == 2 {
                    "      if (zmode == 2u) { zpv = zpf[n * blocks + blk]; }\n"
                } else {
                    ""
                },
            )
            .replace(
                "BIAS\n",
                if has_bias {
                    "      v += bias[n];\n"
                } else {
                    ""
                },
            );
        format!("{header}{s}{body}")
    })?;
    let params = [
        word(m, "rows of A")?,
        word(n, "N")?,
        word(k, "K")?,
        word(blocks, "blocks")?,
        word(bs, "the block size")?,
        word(bits, "bits")?,
        zmode,
        u32::from(quant),
        u32::from(has_bias),
        word(blob.div_ceil(4), "words per block")?,
        word(zp_bytes, "zero-point bytes")?,
    ];
    let mut bufs = vec![match &quantized {
        Some((qa, _)) => qa.raw(),
        None => ab.raw(),
    }];
    if let Some((_, sa)) = &quantized {
        bufs.push(sa.raw());
    }
    bufs.push(dev_buf(b)?.raw());
    bufs.push(dev_buf(scales)?.raw());
    let zb = match zp {
        Some(z) if zmode == 1 => dev_buf(z)?.raw(),
        // never read: any buffer fills the binding
        _ => dev_buf(scales)?.raw(),
    };
    bufs.push(zb);
    if let (Some(z), 2) = (zp, zmode) {
        bufs.push(dev_buf(z)?.raw());
    }
    if let Some(bb) = bias {
        bufs.push(dev_buf(bb)?.raw());
    }
    bufs.push(yb.raw());
    let grid = [
        word(n.div_ceil(16), "column groups")?,
        word(m.div_ceil(ROWS), "row groups")?,
        1,
    ];
    gpu.dispatch_grid(&pipe, &params, &bufs, grid)?;
    Ok(vec![nxrt_core::Value::Tensor(y)])
}
