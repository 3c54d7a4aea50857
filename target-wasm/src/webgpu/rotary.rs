//! RotaryEmbedding on the device: ONNX opset 23 (X, cos_cache, sin_cache, position_ids) and
//! com.microsoft (X, position_ids, cos_cache, sin_cache). The layout and each token's cache row
//! are core's checked [`RotaryPlan`] (the CPU kernels' own checks), computed on the host from
//! the position ids and passed with the kernel parameters; one invocation per element of X
//! writes it rotated (the first `2 * half` of each head) or copied. float32.

use nxrt_core::ir::Node;
use nxrt_core::kernels::attention::RotaryPlan;
use nxrt_core::kernels::contrib_enc::ms_rotary_plan;
use nxrt_core::kernels::{opt_tensor_in, tensor_in};
use nxrt_core::{DataType, Error, Result, Tensor};

use super::gqa::ROT_FN;
use super::reduce::word;
use super::{dev_buf, module_header, out1, shader_1d, Exec, Gpu, OpDef, Store};

pub(crate) const OPS: &[OpDef] = &[OpDef {
    op: "RotaryEmbedding",
    since: 23,
    type_input: 0,
    half: false,
    // position_ids
    host: &[3],
    build: build_onnx,
}];

pub(crate) const MS_OPS: &[OpDef] = &[OpDef {
    op: "RotaryEmbedding",
    since: 1,
    type_input: 0,
    half: false,
    // position_ids
    host: &[1],
    build: build_ms,
}];

/// Parameter words before the per-token cache rows.
const HDR: usize = 10;

/// Params: [width, count, sb, ss, sh, head size, half, interleaved, seq, 4-D] then the cache
/// row of each (batch, token).
const BODY: &str = "
  if (i >= p[1]) { return; }
  let b = i / p[2];
  let r = i % p[2];
  var n = 0u;
  if (p[9] != 0u) { n = (r % p[4]) / p[3]; } else { n = r / p[3]; }
  let e = i % p[5];
  let pos = p[HDR + b * p[8] + n];
  y[i] = st(rot(i - e, e, pos, p[6], p[7] != 0u));
";

fn interleaved(node: &Node) -> Result<bool> {
    match node.get_i("interleaved", 0)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(Error::Other(format!(
            "RotaryEmbedding: interleaved must be 0 or 1, is {v}"
        ))),
    }
}

fn dims(node: &Node) -> Result<(usize, usize)> {
    let rot_dim = node.get_i("rotary_embedding_dim", 0)?;
    let num_heads = node.get_i("num_heads", 0)?;
    if rot_dim < 0 || num_heads < 0 {
        return Err(Error::Other(format!(
            "RotaryEmbedding: rotary_embedding_dim {rot_dim} and num_heads {num_heads} must be nonnegative"
        )));
    }
    Ok((rot_dim as usize, num_heads as usize))
}

fn build_onnx(node: &Node) -> Result<Exec> {
    let inter = interleaved(node)?;
    let (rot_dim, num_heads) = dims(node)?;
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, cos, sin) = (
            tensor_in(inputs, 0)?,
            tensor_in(inputs, 1)?,
            tensor_in(inputs, 2)?,
        );
        let plan = RotaryPlan::new(x, cos, sin, opt_tensor_in(inputs, 3)?, rot_dim, num_heads)?;
        run(gpu, x, cos, sin, &plan, inter)
    }))
}

fn build_ms(node: &Node) -> Result<Exec> {
    let inter = interleaved(node)?;
    let (rot_dim, num_heads) = dims(node)?;
    if node.get_i("is_packed_batching", 0)? != 0 {
        return Err(Error::Other(
            "the WebGPU RotaryEmbedding kernel does not take is_packed_batching".into(),
        ));
    }
    if rot_dim > 0 && num_heads == 0 {
        return Err(Error::Other(
            "RotaryEmbedding: rotary_embedding_dim needs the num_heads attribute".into(),
        ));
    }
    Ok(Box::new(move |gpu: &Gpu, inputs| {
        let (x, cos, sin) = (
            tensor_in(inputs, 0)?,
            tensor_in(inputs, 2)?,
            tensor_in(inputs, 3)?,
        );
        let plan = ms_rotary_plan(x, tensor_in(inputs, 1)?, cos, sin, rot_dim, num_heads)?;
        run(gpu, x, cos, sin, &plan, inter)
    }))
}

fn run(
    gpu: &Gpu,
    x: &Tensor,
    cos: &Tensor,
    sin: &Tensor,
    plan: &RotaryPlan,
    inter: bool,
) -> Result<Vec<nxrt_core::Value>> {
    for t in [x, cos, sin] {
        if t.dtype() != DataType::Float {
            return Err(Error::Other(format!(
                "the WebGPU RotaryEmbedding kernel takes float32, not {}",
                t.dtype()
            )));
        }
    }
    let (y, yb) = gpu.alloc(DataType::Float, x.shape())?;
    if y.is_empty() {
        return out1(y);
    }
    let four = x.rank() == 4;
    let hs = if four { plan.ss } else { plan.sh };
    let mut params = vec![0u32; HDR];
    params[1] = word(x.len(), "elements")?;
    params[2] = word(plan.sb, "a batch stride")?;
    params[3] = word(plan.ss, "a token stride")?;
    params[4] = word(plan.sh, "a head stride")?;
    params[5] = word(hs, "the head size")?;
    params[6] = word(plan.half, "the rotary width")?;
    params[7] = u32::from(inter);
    params[8] = word(plan.seq, "tokens")?;
    params[9] = u32::from(four);
    for &r in &plan.rows {
        params.push(word(r, "a cache row")?);
    }
    let pipe = gpu.pipeline("rotary", || {
        let bufs = [
            ("x", "read", "f32"),
            ("cs", "read", "f32"),
            ("sn_", "read", "f32"),
            ("y", "read_write", "T"),
        ];
        let body = BODY.replace("HDR", &format!("{HDR}u"));
        let header = module_header(&[Store::F32], Store::F32);
        format!("{header}{}", shader_1d(&bufs, 256, ROT_FN, &body))
    })?;
    let bufs = [
        dev_buf(x)?.raw(),
        dev_buf(cos)?.raw(),
        dev_buf(sin)?.raw(),
        yb.raw(),
    ];
    gpu.dispatch(&pipe, &mut params, &bufs, x.len() as u64, 256)?;
    out1(y)
}
