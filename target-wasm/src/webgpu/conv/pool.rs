//! MaxPool and AveragePool (one invocation per output element over its window), and the
//! global pools (one workgroup per plane, a tree reduction in workgroup memory).

use nxrt_core::ir::Node;
use nxrt_core::Result;

use super::super::{dev_in, out1, shader_1d, Exec, Gpu};
use super::{fail, geo_prelude, parse_spatial, pool_geom, word, Spatial, GEO, WG};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Max,
    Avg { include_pad: bool },
}

/// Params: [row, total, planes, 0, include_pad, -inf bits, 0, 0, geometry (21)].
fn pool_shader(max: bool) -> String {
    let (init, fold, fin) = if max {
        (
            "bitcast<f32>(p[5])",
            "if (v > acc) { acc = v; }",
            "y[i] = st(acc);",
        )
    } else {
        (
            "0.0",
            "acc += v; cnt += 1u;",
            "var div = cnt;
  if (p[4] != 0u) { div = pz * py * px; }
  if (div == 0u) { y[i] = st(0.0); } else { y[i] = st(acc / f32(div)); }",
        )
    };
    shader_1d(
        &[("x", "read", "T"), ("y", "read_write", "T")],
        WG,
        "",
        &format!(
            "  if (i >= p[1]) {{ return; }}
{geo}
  let ox = i % ow; var r = i / ow;
  let oy = r % oh; r = r / oh;
  let oz = r % od; let plane = r / od;
  let xb = plane * id * ih * iw;
  let z0 = i32(oz * sd) - pd;
  let y0 = i32(oy * sh) - ph;
  let x0 = i32(ox * sw) - pw;
  // taps inside the input and its explicit padding, per axis (count_include_pad)
  var pz = 0u; var py = 0u; var px = 0u;
  for (var a = 0u; a < kd; a++) {{ let z = z0 + i32(a * dd); if (z >= -pd && z < i32(id) + qd) {{ pz += 1u; }} }}
  for (var a = 0u; a < kh; a++) {{ let z = y0 + i32(a * dh); if (z >= -ph && z < i32(ih) + qh) {{ py += 1u; }} }}
  for (var a = 0u; a < kw; a++) {{ let z = x0 + i32(a * dw); if (z >= -pw && z < i32(iw) + qw) {{ px += 1u; }} }}
  var acc = {init};
  var cnt = 0u;
  for (var a = 0u; a < kd; a++) {{
    let z = z0 + i32(a * dd);
    if (z < 0 || z >= i32(id)) {{ continue; }}
    for (var b = 0u; b < kh; b++) {{
      let yy = y0 + i32(b * dh);
      if (yy < 0 || yy >= i32(ih)) {{ continue; }}
      let row = xb + (u32(z) * ih + u32(yy)) * iw;
      for (var c = 0u; c < kw; c++) {{
        let xx = x0 + i32(c * dw);
        if (xx < 0 || xx >= i32(iw)) {{ continue; }}
        let v = f32(x[row + u32(xx)]);
        {fold}
      }}
    }}
  }}
  {fin}",
            geo = geo_prelude()
        ),
    )
}

struct PoolAttrs {
    sp: Spatial,
    ceil: bool,
    kind: Kind,
}

fn pool_attrs(node: &Node, kind: Kind) -> Result<PoolAttrs> {
    let sp = parse_spatial(node)?;
    if sp.kernel.is_none() {
        return Err(fail(format!("{} without kernel_shape", node.op_type)));
    }
    if node.outputs.get(1).is_some_and(|o| o.is_some()) {
        return Err(fail(format!(
            "{}'s Indices output stays on the CPU",
            node.op_type
        )));
    }
    let storage_order = node.get_i("storage_order", 0)?;
    if !(0..=1).contains(&storage_order) {
        return Err(fail(format!("storage_order {storage_order}")));
    }
    Ok(PoolAttrs {
        sp,
        ceil: node.get_i("ceil_mode", 0)? != 0,
        kind,
    })
}

fn build_pool(node: &Node, kind: Kind) -> Result<Exec> {
    let a = pool_attrs(node, kind)?;
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, xb) = dev_in(inputs, 0)?;
        let xs = x.shape();
        if xs.len() < 3 {
            return Err(fail(format!(
                "pooling needs an input of rank >= 3, got {xs:?}"
            )));
        }
        let nd = xs.len() - 2;
        let g = pool_geom(&a.sp, &xs[2..], a.ceil)?;
        let mut shape = vec![xs[0], xs[1]];
        shape.extend_from_slice(g.out_dims(nd));
        let st = gpu.store(x.dtype())?;
        let (y, yb) = gpu.alloc(x.dtype(), &shape)?;
        let (max, include_pad) = match a.kind {
            Kind::Max => (true, false),
            Kind::Avg { include_pad } => (false, include_pad),
        };
        let mut params = vec![
            0,
            word(y.len(), "an output size")?,
            word(xs[0] * xs[1], "a plane count")?,
            0,
            u32::from(include_pad),
            f32::NEG_INFINITY.to_bits(),
            0,
            0,
        ];
        debug_assert_eq!(params.len(), GEO);
        params.extend(g.words()?);
        let kind = if max { "max" } else { "avg" };
        let pipe = gpu.pipeline(&format!("pool:{kind}:{}", st.key()), || {
            format!("{}{}", st.header(), pool_shader(max))
        })?;
        gpu.dispatch(
            &pipe,
            &mut params,
            &[xb.raw(), yb.raw()],
            y.len() as u64,
            WG,
        )?;
        out1(y)
    }))
}

pub(super) fn build_max_pool(node: &Node) -> Result<Exec> {
    build_pool(node, Kind::Max)
}

pub(super) fn build_average_pool(node: &Node) -> Result<Exec> {
    let include_pad = node.get_i("count_include_pad", 0)? != 0;
    build_pool(node, Kind::Avg { include_pad })
}

/// Workgroup width of the global pools (one workgroup per plane).
const GWG: u32 = 256;

/// Params: [row, planes, plane length, -inf bits].
fn global_shader(max: bool) -> String {
    let (init, op, fin) = if max {
        (
            "bitcast<f32>(p[3])",
            "max(a, b)",
            "select(red[0], 0.0, len == 0u)",
        )
    } else {
        ("0.0", "a + b", "red[0] / f32(max(len, 1u))")
    };
    format!(
        "
@group(0) @binding(0) var<storage, read> p: array<u32>;
@group(0) @binding(1) var<storage, read> x: array<T>;
@group(0) @binding(2) var<storage, read_write> y: array<T>;

var<workgroup> red: array<f32, {GWG}>;

fn op(a: f32, b: f32) -> f32 {{ return {op}; }}

@compute @workgroup_size({GWG})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {{
  let plane = wid.x + wid.y * (p[0] / {GWG}u);
  let planes = p[1];
  let len = p[2];
  var acc = {init};
  if (plane < planes) {{
    let base = plane * len;
    for (var j = li; j < len; j += {GWG}u) {{
      acc = op(acc, f32(x[base + j]));
    }}
  }}
  red[li] = acc;
  workgroupBarrier();
  for (var s = {half}u; s > 0u; s = s / 2u) {{
    if (li < s) {{ red[li] = op(red[li], red[li + s]); }}
    workgroupBarrier();
  }}
  if (li == 0u && plane < planes) {{
    y[plane] = st({fin});
  }}
}}
",
        half = GWG / 2
    )
}

fn build_global(max: bool) -> Result<Exec> {
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, xb) = dev_in(inputs, 0)?;
        let xs = x.shape();
        if xs.len() < 2 {
            return Err(fail(format!(
                "global pooling needs an input of rank >= 2, got {xs:?}"
            )));
        }
        let planes = xs[0] * xs[1];
        let len: usize = xs[2..].iter().product();
        let mut shape = xs.to_vec();
        shape[2..].iter_mut().for_each(|d| *d = 1);
        let st = gpu.store(x.dtype())?;
        let (y, yb) = gpu.alloc(x.dtype(), &shape)?;
        let mut params = vec![
            0,
            word(planes, "a plane count")?,
            word(len, "a plane size")?,
            f32::NEG_INFINITY.to_bits(),
        ];
        let kind = if max { "max" } else { "avg" };
        let pipe = gpu.pipeline(&format!("gpool:{kind}:{}", st.key()), || {
            format!("{}{}", st.header(), global_shader(max))
        })?;
        gpu.dispatch(
            &pipe,
            &mut params,
            &[xb.raw(), yb.raw()],
            planes as u64 * GWG as u64,
            GWG,
        )?;
        out1(y)
    }))
}

pub(super) fn build_global_average_pool(_node: &Node) -> Result<Exec> {
    build_global(false)
}

pub(super) fn build_global_max_pool(_node: &Node) -> Result<Exec> {
    build_global(true)
}
