//! Recurrent layers: LSTM, GRU and simple RNN (every opset), gate matmuls through the backend GEMM.
//!
//! All three share one driver: the input projection `X·W^T` for every time step is one GEMM per
//! direction, biases are folded into it, and each step adds `H·R^T` (a second, small GEMM) before
//! the cell's element-wise update. Computation is in f32; f64/f16/bf16 inputs are converted.

use alloc::borrow::Cow;
use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use super::{def, opt_tensor_in, tensor_in, Float, Prepacked, LATEST, PREPACK_MAX};
use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::Node;
use crate::kernels::types::FLOATS;
use crate::provider::{Gemm, Kernel, KernelCx, KernelDef};
use crate::simd;
use crate::simd::gemm::Operand;
use crate::tensor::Tensor;
use crate::value::Value;
use crate::{bail, unsupported};

pub(crate) const KERNELS: &[KernelDef] = &[
    def("LSTM", 1, LATEST, build_lstm).types(FLOATS),
    def("GRU", 1, LATEST, build_gru).types(FLOATS),
    def("RNN", 1, LATEST, build_rnn).types(FLOATS),
];

// ----------------------------------------------------------------------------- activations

/// An activation function of the recurrent ops, with its alpha/beta resolved.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Act {
    Sigmoid,
    Tanh,
    Relu,
    HardSigmoid(f32, f32),
    LeakyRelu(f32),
    ThresholdedRelu(f32),
    ScaledTanh(f32, f32),
    Affine(f32, f32),
    Elu(f32),
    Softsign,
    Softplus,
}

impl Act {
    /// The SIMD layer's form of this activation, where it has one.
    fn simd(self) -> Option<simd::Act> {
        Some(match self {
            Act::Sigmoid => simd::Act::Sigmoid,
            Act::Tanh => simd::Act::Tanh,
            Act::Relu => simd::Act::Relu,
            Act::HardSigmoid(a, b) => simd::Act::HardSigmoid(a, b),
            Act::LeakyRelu(a) => simd::Act::LeakyRelu(a),
            _ => return None,
        })
    }

    /// Clips (when `clip` is set) and applies the activation to a run of gate values in
    /// place: through the SIMD layer where it has the function, else element by element.
    fn apply_slice(self, x: &mut [f32], clip: Option<f32>) {
        if let Some(c) = clip {
            simd::unary_inplace(simd::Act::Clip(-c, c), x);
        }
        match self.simd() {
            Some(a) => simd::unary_inplace(a, x),
            None => x.iter_mut().for_each(|v| *v = self.apply(*v)),
        }
    }

    #[inline]
    fn apply(self, x: f32) -> f32 {
        use super::fmath::{exp, sigmoid, tanh};
        match self {
            Act::Sigmoid => sigmoid(x),
            Act::Tanh => tanh(x),
            Act::Relu => x.max(0.0),
            Act::HardSigmoid(a, b) => (a * x + b).clamp(0.0, 1.0),
            Act::LeakyRelu(a) => {
                if x >= 0.0 {
                    x
                } else {
                    a * x
                }
            }
            Act::ThresholdedRelu(a) => {
                if x > a {
                    x
                } else {
                    0.0
                }
            }
            Act::ScaledTanh(a, b) => a * tanh(b * x),
            Act::Affine(a, b) => a * x + b,
            Act::Elu(a) => {
                if x >= 0.0 {
                    x
                } else {
                    a * (exp(x) - 1.0)
                }
            }
            Act::Softsign => x / (1.0 + x.abs()),
            Act::Softplus => {
                // log(1 + e^x) without overflow for large x
                if x > 0.0 {
                    x + libm::log1pf(exp(-x))
                } else {
                    libm::log1pf(exp(x))
                }
            }
        }
    }
}

/// Parses the `activations`, `activation_alpha` and `activation_beta` attributes. Alpha and beta
/// values are consumed in order by the activations that take them (as onnxruntime does);
/// missing ones take the defaults of the corresponding ONNX operators.
fn parse_acts(node: &Node, defaults: &[Act], dirs: usize) -> Result<Vec<Act>> {
    let per = defaults.len();
    let Some(names) = node.attr_strings("activations")? else {
        let mut v = Vec::with_capacity(per * dirs);
        for _ in 0..dirs {
            v.extend_from_slice(defaults);
        }
        return Ok(v);
    };
    let names: Vec<String> = if names.len() == per * dirs {
        names
    } else if dirs == 2 && names.len() == per {
        names.iter().chain(names.iter()).cloned().collect()
    } else {
        unsupported!(
            "activations lists {} functions, expected {}",
            names.len(),
            per * dirs
        );
    };
    let alphas = node.attr_floats("activation_alpha")?.unwrap_or_default();
    let betas = node.attr_floats("activation_beta")?.unwrap_or_default();
    let (mut ai, mut bi) = (0usize, 0usize);
    fn take(v: &[f32], i: &mut usize, d: f32) -> f32 {
        let r = v.get(*i).copied().unwrap_or(d);
        *i += 1;
        r
    }
    let mut out = Vec::with_capacity(names.len());
    for n in &names {
        let act = match n.to_ascii_lowercase().as_str() {
            "sigmoid" => Act::Sigmoid,
            "tanh" => Act::Tanh,
            "relu" => Act::Relu,
            "hardsigmoid" => {
                let a = take(&alphas, &mut ai, 0.2);
                let b = take(&betas, &mut bi, 0.5);
                Act::HardSigmoid(a, b)
            }
            "leakyrelu" => Act::LeakyRelu(take(&alphas, &mut ai, 0.01)),
            "thresholdedrelu" => Act::ThresholdedRelu(take(&alphas, &mut ai, 1.0)),
            "scaledtanh" => {
                let a = take(&alphas, &mut ai, 1.0);
                let b = take(&betas, &mut bi, 1.0);
                Act::ScaledTanh(a, b)
            }
            "affine" => {
                let a = take(&alphas, &mut ai, 1.0);
                let b = take(&betas, &mut bi, 0.0);
                Act::Affine(a, b)
            }
            "elu" => Act::Elu(take(&alphas, &mut ai, 1.0)),
            "softsign" => Act::Softsign,
            "softplus" => Act::Softplus,
            other => unsupported!("activation function '{other}' is not supported"),
        };
        out.push(act);
    }
    Ok(out)
}

// ----------------------------------------------------------------------------- configuration

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cell {
    Lstm,
    Gru,
    Rnn,
}

impl Cell {
    fn gates(self) -> usize {
        match self {
            Cell::Lstm => 4,
            Cell::Gru => 3,
            Cell::Rnn => 1,
        }
    }
    fn name(self) -> &'static str {
        match self {
            Cell::Lstm => "LSTM",
            Cell::Gru => "GRU",
            Cell::Rnn => "RNN",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Direction {
    Forward,
    Reverse,
    Bidirectional,
}

/// Parsed attributes of one recurrent node.
#[derive(Clone, Debug)]
struct Cfg {
    cell: Cell,
    dir: Direction,
    hidden: Option<usize>,
    layout: i64,
    clip: Option<f32>,
    acts: Vec<Act>,
    input_forget: bool,
    linear_before_reset: bool,
    n_out: usize,
}

impl Cfg {
    fn dirs(&self) -> usize {
        if self.dir == Direction::Bidirectional {
            2
        } else {
            1
        }
    }
}

fn parse_cfg(node: &Node, cell: Cell) -> Result<Cfg> {
    let dir = match node.get_s("direction", "forward")?.as_str() {
        "forward" => Direction::Forward,
        "reverse" => Direction::Reverse,
        "bidirectional" => Direction::Bidirectional,
        other => unsupported!("direction '{other}' is not supported"),
    };
    let dirs = if dir == Direction::Bidirectional {
        2
    } else {
        1
    };
    let hidden = match node.attr_i("hidden_size")? {
        None => None,
        Some(h) if h > 0 => Some(h as usize),
        Some(h) => bail!("hidden_size must be positive, is {h}"),
    };
    let layout = node.get_i("layout", 0)?;
    if layout != 0 && (layout != 1 || node.opset < 14) {
        unsupported!("layout {layout} is not supported at opset {}", node.opset);
    }
    let clip = match node.attr_f("clip")? {
        None => None,
        Some(c) if c > 0.0 => Some(c),
        Some(c) => unsupported!("clip must be positive, is {c}"),
    };
    let defaults: &[Act] = match cell {
        Cell::Lstm => &[Act::Sigmoid, Act::Tanh, Act::Tanh],
        Cell::Gru => &[Act::Sigmoid, Act::Tanh],
        Cell::Rnn => &[Act::Tanh],
    };
    let acts = parse_acts(node, defaults, dirs)?;
    let input_forget = match node.get_i("input_forget", 0)? {
        0 => false,
        1 if cell == Cell::Lstm => true,
        v => unsupported!("input_forget={v} is not supported"),
    };
    let linear_before_reset = match node.get_i("linear_before_reset", 0)? {
        0 => false,
        1 if cell == Cell::Gru => true,
        v => unsupported!("linear_before_reset={v} is not supported"),
    };
    // opset 1 had `output_sequence`; the node's declared outputs decide what is produced
    Ok(Cfg {
        cell,
        dir,
        hidden,
        layout,
        clip,
        acts,
        input_forget,
        linear_before_reset,
        n_out: node.outputs.len(),
    })
}

fn build_lstm(node: &Node) -> Result<Box<dyn Kernel>> {
    build(node, Cell::Lstm)
}
fn build_gru(node: &Node) -> Result<Box<dyn Kernel>> {
    build(node, Cell::Gru)
}
fn build_rnn(node: &Node) -> Result<Box<dyn Kernel>> {
    build(node, Cell::Rnn)
}

fn build(node: &Node, cell: Cell) -> Result<Box<dyn Kernel>> {
    let cfg = parse_cfg(node, cell)?;
    Ok(Box::new(RnnKernel {
        cfg,
        w: None,
        r: None,
    }))
}

/// A recurrent node, with W and R packed at load into the SGEMM's B panels when they are
/// constant f32 (the step's `H·R^T` then streams packed weights instead of taking dot
/// products down R's rows, and the input projection skips packing W on every run).
struct RnnKernel {
    cfg: Cfg,
    w: Option<PackedWeights>,
    r: Option<PackedWeights>,
}

/// W or R (`[dirs, rows, k]`) packed per direction and per block of rows (`parts`: the GRU
/// without `linear_before_reset` multiplies by z/r's rows and h's rows separately), as the
/// SGEMM's B panels of width `panel` (B = the block's transpose).
struct PackedWeights {
    src: Prepacked,
    panel: usize,
    /// Start of each (direction, part) in `src.data`, direction-major.
    offs: Vec<usize>,
}

impl PackedWeights {
    fn new(t: &Tensor, parts: &[(usize, usize)]) -> Option<PackedWeights> {
        let panel = simd::gemm_tile().1;
        let mut offs = Vec::new();
        let src = Prepacked::new(t, |v, s| {
            let [nd, rows, k] = *s else { return None };
            let len = nd * rows * k;
            if len == 0 || len > PREPACK_MAX || parts.iter().any(|&(r0, nr)| r0 + nr > rows) {
                return None;
            }
            let mut data = Vec::new();
            for d in 0..nd {
                for &(r0, nr) in parts {
                    offs.push(data.len());
                    let blk = &v[(d * rows + r0) * k..(d * rows + r0 + nr) * k];
                    data.extend(simd::gemm::pack_b(k, nr, blk, 1, k as isize, panel));
                }
            }
            Some(data)
        })?;
        Some(PackedWeights { src, panel, offs })
    }

    /// Panels of (direction `d`, part `p`) when `t` is the tensor packed and this machine's
    /// SGEMM still takes panels of that width.
    fn get(&self, t: &Tensor, d: usize, p: usize, nparts: usize) -> Option<&[f32]> {
        if simd::gemm_tile().1 != self.panel {
            return None;
        }
        let data = self.src.for_tensor(t)?;
        Some(&data[*self.offs.get(d * nparts + p)?..])
    }
}

/// The row blocks R is multiplied by separately.
fn r_parts(cfg: &Cfg, hidden: usize) -> Vec<(usize, usize)> {
    let gh = cfg.cell.gates() * hidden;
    if cfg.cell == Cell::Gru && !cfg.linear_before_reset {
        vec![(0, 2 * hidden), (2 * hidden, hidden)]
    } else {
        vec![(0, gh)]
    }
}

impl Kernel for RnnKernel {
    fn compute(&self, cx: &KernelCx<'_>, inputs: &[Option<&Value>]) -> Result<Vec<Value>> {
        let packed = Packed {
            w: weights_in(inputs, 1, &self.w),
            r: weights_in(inputs, 2, &self.r),
        };
        run(&self.cfg, cx, inputs, &packed)
    }

    fn prepare(&mut self, consts: &[Option<&Tensor>]) -> usize {
        let g = self.cfg.cell.gates();
        if let Some(Some(w)) = consts.get(1) {
            if w.rank() == 3 {
                self.w = PackedWeights::new(w, &[(0, w.shape()[1])]);
            }
        }
        if let Some(Some(r)) = consts.get(2) {
            if r.rank() == 3 && r.shape()[1] == g * r.shape()[2] {
                self.r = PackedWeights::new(r, &r_parts(&self.cfg, r.shape()[2]));
            }
        }
        self.w.as_ref().map_or(0, |p| p.src.bytes()) + self.r.as_ref().map_or(0, |p| p.src.bytes())
    }
}

/// Input `i` with the packed copy of it the kernel holds, if both exist.
fn weights_in<'a>(
    inputs: &[Option<&'a Value>],
    i: usize,
    pk: &'a Option<PackedWeights>,
) -> Option<(&'a Tensor, &'a PackedWeights)> {
    match (inputs.get(i), pk) {
        (Some(Some(Value::Tensor(t))), Some(pk)) => Some((t, pk)),
        _ => None,
    }
}

/// The packed weights a run may use (each checked against the tensor it is given).
struct Packed<'a> {
    w: Option<(&'a Tensor, &'a PackedWeights)>,
    r: Option<(&'a Tensor, &'a PackedWeights)>,
}

// ----------------------------------------------------------------------------- driver

/// Reads a float tensor as f32 after checking its shape.
fn f32_of<'t>(t: &'t Tensor, shape: &[usize], what: &str) -> Result<Cow<'t, [f32]>> {
    if t.shape() != shape {
        bail!("{what} has shape {:?}, expected {:?}", t.shape(), shape);
    }
    as_f32(t)
}

/// The tensor's values as f32: borrowed for a contiguous f32 tensor (weights are not copied
/// on every run), converted otherwise.
fn as_f32(t: &Tensor) -> Result<Cow<'_, [f32]>> {
    if t.dtype() == DataType::Float {
        t.as_slice::<f32>()
    } else {
        Ok(Cow::Owned(t.to_f32_vec()?))
    }
}

/// Swaps the first two axes of a rank-3 tensor (layout 1 <-> layout 0) as f32.
fn swap01(t: &Tensor) -> Result<Tensor> {
    t.permute(&[1, 0, 2])
}

fn to_dtype(dt: DataType, shape: &[usize], v: Vec<f32>) -> Result<Tensor> {
    crate::dispatch_float!(dt, T => {
        if dt == DataType::Float {
            Tensor::from_vec(shape, v)
        } else {
            Tensor::from_vec(shape, v.into_iter().map(<T as Float>::from_f32).collect::<Vec<T>>())
        }
    }, else Err(super::bad_type("RNN", dt)))
}

/// Everything one direction's recurrence reads.
struct DirIn<'a> {
    x: &'a [f32],
    w: &'a [f32],
    r: &'a [f32],
    b: Option<&'a [f32]>,
    p: Option<&'a [f32]>,
    /// W and R (each of its parts, see [`r_parts`]) packed at load, when they were.
    wp: Option<&'a [f32]>,
    rp: [Option<&'a [f32]>; 2],
    acts: &'a [Act],
    reverse: bool,
}

/// Sizes shared by every direction.
struct Dims<'a> {
    seq: usize,
    batch: usize,
    input: usize,
    hidden: usize,
    lens: &'a [usize],
}

fn run(
    cfg: &Cfg,
    cx: &KernelCx<'_>,
    inputs: &[Option<&Value>],
    packed: &Packed<'_>,
) -> Result<Vec<Value>> {
    let op = cfg.cell.name();
    let x_t = tensor_in(inputs, 0)?;
    let dt = x_t.dtype();
    if !matches!(
        dt,
        DataType::Float | DataType::Double | DataType::Float16 | DataType::Bfloat16
    ) {
        return Err(super::bad_type(op, dt));
    }
    if x_t.rank() != 3 {
        bail!("{op}: X must have rank 3, has shape {:?}", x_t.shape());
    }
    let x_t = if cfg.layout == 1 {
        swap01(x_t)?
    } else {
        x_t.clone()
    };
    let (seq, batch, input) = (x_t.shape()[0], x_t.shape()[1], x_t.shape()[2]);
    let w_t = tensor_in(inputs, 1)?;
    let r_t = tensor_in(inputs, 2)?;
    let nd = cfg.dirs();
    let g = cfg.cell.gates();
    if r_t.rank() != 3 {
        bail!("{op}: R must have rank 3, has shape {:?}", r_t.shape());
    }
    let hidden = r_t.shape()[2];
    if let Some(h) = cfg.hidden {
        if h != hidden {
            bail!("{op}: hidden_size is {h} but R has shape {:?}", r_t.shape());
        }
    }
    let gh = g * hidden;
    let x = as_f32(&x_t)?;
    let w = f32_of(w_t, &[nd, gh, input], "W")?;
    let r = f32_of(r_t, &[nd, gh, hidden], "R")?;
    let b = match opt_tensor_in(inputs, 3)? {
        Some(t) => Some(f32_of(t, &[nd, 2 * gh], "B")?),
        None => None,
    };
    let lens: Vec<usize> = match opt_tensor_in(inputs, 4)? {
        Some(t) => {
            if t.shape() != [batch] {
                bail!(
                    "{op}: sequence_lens has shape {:?}, expected [{batch}]",
                    t.shape()
                );
            }
            let v = t.to_i64_vec()?;
            let mut out = Vec::with_capacity(batch);
            for l in v {
                if l < 0 || l as usize > seq {
                    bail!("{op}: sequence length {l} is outside [0, {seq}]");
                }
                out.push(l as usize);
            }
            out
        }
        None => vec![seq; batch],
    };
    let state_in = |i: usize, what: &str| -> Result<Option<Vec<f32>>> {
        match opt_tensor_in(inputs, i)? {
            Some(t) => {
                let t = if cfg.layout == 1 && t.rank() == 3 {
                    swap01(t)?
                } else {
                    t.clone()
                };
                Ok(Some(f32_of(&t, &[nd, batch, hidden], what)?.into_owned()))
            }
            None => Ok(None),
        }
    };
    let h0 = state_in(5, "initial_h")?;
    let (c0, p) = if cfg.cell == Cell::Lstm {
        let c0 = state_in(6, "initial_c")?;
        let p = match opt_tensor_in(inputs, 7)? {
            Some(t) => Some(f32_of(t, &[nd, 3 * hidden], "P")?),
            None => None,
        };
        (c0, p)
    } else {
        (None, None)
    };

    let dims = Dims {
        seq,
        batch,
        input,
        hidden,
        lens: &lens,
    };
    let bh = batch * hidden;
    let mut y = vec![0f32; seq * nd * bh];
    let mut yh = vec![0f32; nd * bh];
    let mut yc = vec![0f32; nd * bh];
    let per_dir_acts = cfg.acts.len() / nd;
    for d in 0..nd {
        let din = DirIn {
            x: &x,
            w: &w[d * gh * input..(d + 1) * gh * input],
            r: &r[d * gh * hidden..(d + 1) * gh * hidden],
            b: b.as_ref().map(|b| &b[d * 2 * gh..(d + 1) * 2 * gh]),
            p: p.as_ref().map(|p| &p[d * 3 * hidden..(d + 1) * 3 * hidden]),
            wp: packed.w.and_then(|(t, pk)| pk.get(t, d, 0, 1)),
            rp: core::array::from_fn(|i| {
                let np = r_parts(cfg, hidden).len();
                packed
                    .r
                    .and_then(|(t, pk)| (i < np).then(|| pk.get(t, d, i, np)).flatten())
            }),
            acts: &cfg.acts[d * per_dir_acts..(d + 1) * per_dir_acts],
            reverse: cfg.dir == Direction::Reverse || d == 1,
        };
        let h = &mut yh[d * bh..(d + 1) * bh];
        if let Some(h0) = &h0 {
            h.copy_from_slice(&h0[d * bh..(d + 1) * bh]);
        }
        let c = &mut yc[d * bh..(d + 1) * bh];
        if let Some(c0) = &c0 {
            c.copy_from_slice(&c0[d * bh..(d + 1) * bh]);
        }
        // Y rows for this direction: y[t][d] is a batch×hidden block
        let mut emit = |t: usize, b: usize, hv: &[f32]| {
            let o = ((t * nd + d) * batch + b) * hidden;
            y[o..o + hidden].copy_from_slice(hv);
        };
        run_direction(cfg, cx, &dims, &din, h, c, &mut emit);
    }

    let mut outs = Vec::with_capacity(cfg.n_out);
    if cfg.n_out > 0 {
        let t = if cfg.layout == 1 {
            // [S, nd, B, H] -> [B, S, nd, H]
            let mut v = vec![0f32; y.len()];
            for t in 0..seq {
                for d in 0..nd {
                    for b in 0..batch {
                        let src = ((t * nd + d) * batch + b) * hidden;
                        let dst = ((b * seq + t) * nd + d) * hidden;
                        v[dst..dst + hidden].copy_from_slice(&y[src..src + hidden]);
                    }
                }
            }
            to_dtype(dt, &[batch, seq, nd, hidden], v)?
        } else {
            to_dtype(dt, &[seq, nd, batch, hidden], y)?
        };
        outs.push(Value::Tensor(t));
    }
    let state_out = |v: Vec<f32>| -> Result<Value> {
        let t = if cfg.layout == 1 {
            let mut o = vec![0f32; v.len()];
            for d in 0..nd {
                for b in 0..batch {
                    let src = (d * batch + b) * hidden;
                    let dst = (b * nd + d) * hidden;
                    o[dst..dst + hidden].copy_from_slice(&v[src..src + hidden]);
                }
            }
            to_dtype(dt, &[batch, nd, hidden], o)?
        } else {
            to_dtype(dt, &[nd, batch, hidden], v)?
        };
        Ok(Value::Tensor(t))
    };
    if cfg.n_out > 1 {
        outs.push(state_out(yh)?);
    }
    if cfg.n_out > 2 {
        if cfg.cell != Cell::Lstm {
            bail!("{op} has at most 2 outputs, node declares {}", cfg.n_out);
        }
        outs.push(state_out(yc)?);
    }
    Ok(outs)
}

/// `c[m×n] = a[m×k] · w^T` where `w` is n×k row-major (ldc = n), through the backend GEMM;
/// `wp`: w^T already in the SGEMM's B panels.
#[allow(clippy::too_many_arguments)]
fn gemm_wt(
    cx: &KernelCx<'_>,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    w: &[f32],
    wp: Option<&[f32]>,
    c: &mut [f32],
) {
    let g = Gemm {
        m,
        n,
        k,
        a_rs: k as isize,
        a_cs: 1,
        b_rs: 1,
        b_cs: k as isize,
        ldc: n,
        alpha: 1.0,
        beta: 0.0,
    };
    if let Some(bp) = wp {
        let panel = simd::gemm_tile().1;
        let b = Operand::Panels { data: bp, panel };
        return cx.cpu.sgemm_ops(&g, Operand::Strided(a), b, c);
    }
    cx.cpu.sgemm(&g, a, w, c);
}

#[inline]
fn clipped(x: f32, clip: Option<f32>) -> f32 {
    match clip {
        Some(c) => x.clamp(-c, c),
        None => x,
    }
}

/// Runs one direction of the recurrence. `h`/`c` hold the initial state on entry and the final
/// state (of each batch entry's last valid step) on exit; `emit(t, b, h)` records Y.
fn run_direction(
    cfg: &Cfg,
    cx: &KernelCx<'_>,
    dm: &Dims<'_>,
    din: &DirIn<'_>,
    h: &mut [f32],
    c: &mut [f32],
    emit: &mut dyn FnMut(usize, usize, &[f32]),
) {
    let (seq, batch, hs) = (dm.seq, dm.batch, dm.hidden);
    let g = cfg.cell.gates();
    let gh = g * hs;
    let lbr = cfg.linear_before_reset;
    let max_len = dm.lens.iter().copied().max().unwrap_or(0);
    if max_len == 0 || batch == 0 || hs == 0 {
        return;
    }
    // input projection of every (t, b) row, biases folded in
    let mut xw = vec![0f32; seq * batch * gh];
    gemm_wt(cx, seq * batch, gh, dm.input, din.x, din.w, din.wp, &mut xw);
    // recurrent bias that stays outside the fold (GRU with linear_before_reset: Rbh)
    let mut rbh: Option<&[f32]> = None;
    if let Some(b) = din.b {
        let (wb, rb) = b.split_at(gh);
        let mut fold: Vec<f32> = wb.iter().zip(rb).map(|(a, b)| a + b).collect();
        if cfg.cell == Cell::Gru && lbr {
            fold[2 * hs..].copy_from_slice(&wb[2 * hs..]);
            rbh = Some(&rb[2 * hs..]);
        }
        for row in xw.chunks_exact_mut(gh) {
            for (v, f) in row.iter_mut().zip(&fold) {
                *v += f;
            }
        }
    }
    // time index of step `s` for batch entry `b`, or None once its sequence has ended
    let time_of = |s: usize, b: usize| -> Option<usize> {
        let l = dm.lens[b];
        if s >= l {
            None
        } else if din.reverse {
            Some(l - 1 - s)
        } else {
            Some(s)
        }
    };
    let clip = cfg.clip;
    let acts = din.acts;
    let mut hr = vec![0f32; batch * gh];
    match cfg.cell {
        Cell::Rnn => {
            let f = acts[0];
            for s in 0..max_len {
                gemm_wt(cx, batch, hs, hs, h, din.r, din.rp[0], &mut hr);
                for b in 0..batch {
                    let Some(t) = time_of(s, b) else { continue };
                    let xr = &xw[(t * batch + b) * hs..][..hs];
                    let hb = &mut h[b * hs..(b + 1) * hs];
                    for j in 0..hs {
                        hb[j] = f.apply(clipped(xr[j] + hr[b * hs + j], clip));
                    }
                    emit(t, b, hb);
                }
            }
        }
        Cell::Lstm => {
            let (fa, ga, ha) = (acts[0], acts[1], acts[2]);
            let zeros = vec![0f32; 3 * hs];
            let p = din.p.unwrap_or(&zeros);
            let (pi, po, pf) = (&p[..hs], &p[hs..2 * hs], &p[2 * hs..]);
            // without peepholes or coupled gates the gates are whole runs: i, o, f through
            // f, c through g, each one vector pass
            let vector = din.p.is_none() && !cfg.input_forget;
            let mut gate = vec![0f32; gh];
            let mut tc = vec![0f32; hs];
            for s in 0..max_len {
                gemm_wt(cx, batch, gh, hs, h, din.r, din.rp[0], &mut hr);
                for b in 0..batch {
                    let Some(t) = time_of(s, b) else { continue };
                    let xr = &xw[(t * batch + b) * gh..][..gh];
                    let rr = &hr[b * gh..(b + 1) * gh];
                    let hb = &mut h[b * hs..(b + 1) * hs];
                    let cb = &mut c[b * hs..(b + 1) * hs];
                    if vector {
                        simd::binary_repeat(simd::BinOp::Add, xr, rr, &mut gate);
                        fa.apply_slice(&mut gate[..3 * hs], clip);
                        ga.apply_slice(&mut gate[3 * hs..], clip);
                        let (gi, rest) = gate.split_at(hs);
                        let (go, rest) = rest.split_at(hs);
                        let (gf, gc) = rest.split_at(hs);
                        for j in 0..hs {
                            let cn = gf[j] * cb[j] + gi[j] * gc[j];
                            cb[j] = cn;
                            tc[j] = cn;
                        }
                        ha.apply_slice(&mut tc, None);
                        for j in 0..hs {
                            hb[j] = go[j] * tc[j];
                        }
                        emit(t, b, hb);
                        continue;
                    }
                    for j in 0..hs {
                        let cp = cb[j];
                        let gi = fa.apply(clipped(xr[j] + rr[j] + pi[j] * cp, clip));
                        let gf = if cfg.input_forget {
                            1.0 - gi
                        } else {
                            fa.apply(clipped(xr[2 * hs + j] + rr[2 * hs + j] + pf[j] * cp, clip))
                        };
                        let gc = ga.apply(clipped(xr[3 * hs + j] + rr[3 * hs + j], clip));
                        let cn = gf * cp + gi * gc;
                        let go = fa.apply(clipped(xr[hs + j] + rr[hs + j] + po[j] * cn, clip));
                        cb[j] = cn;
                        hb[j] = go * ha.apply(cn);
                    }
                    emit(t, b, hb);
                }
            }
        }
        Cell::Gru => {
            let (fa, ga) = (acts[0], acts[1]);
            let mut gate = vec![0f32; gh];
            if lbr {
                for s in 0..max_len {
                    gemm_wt(cx, batch, gh, hs, h, din.r, din.rp[0], &mut hr);
                    for b in 0..batch {
                        let Some(t) = time_of(s, b) else { continue };
                        let xr = &xw[(t * batch + b) * gh..][..gh];
                        let rr = &hr[b * gh..(b + 1) * gh];
                        let hb = &mut h[b * hs..(b + 1) * hs];
                        // z and r in one vector pass, then n
                        simd::binary_repeat(
                            simd::BinOp::Add,
                            &xr[..2 * hs],
                            &rr[..2 * hs],
                            &mut gate[..2 * hs],
                        );
                        fa.apply_slice(&mut gate[..2 * hs], clip);
                        let (zr, nb) = gate.split_at_mut(2 * hs);
                        for j in 0..hs {
                            let rh = rr[2 * hs + j] + rbh.map_or(0.0, |v| v[j]);
                            nb[j] = xr[2 * hs + j] + zr[hs + j] * rh;
                        }
                        ga.apply_slice(nb, clip);
                        for j in 0..hs {
                            let z = zr[j];
                            hb[j] = (1.0 - z) * nb[j] + z * hb[j];
                        }
                        emit(t, b, hb);
                    }
                }
            } else {
                // z and r from H·[Rz;Rr]^T, then (r ⊙ H)·Rh^T
                let mut zr = vec![0f32; batch * 2 * hs];
                let mut rh = vec![0f32; batch * hs];
                let mut hn = vec![0f32; batch * hs];
                let r_zr = &din.r[..2 * hs * hs];
                let r_h = &din.r[2 * hs * hs..];
                for s in 0..max_len {
                    gemm_wt(cx, batch, 2 * hs, hs, h, r_zr, din.rp[0], &mut zr);
                    for b in 0..batch {
                        let Some(t) = time_of(s, b) else { continue };
                        let xr = &xw[(t * batch + b) * gh..][..gh];
                        let zb = &mut zr[b * 2 * hs..(b + 1) * 2 * hs];
                        for j in 0..2 * hs {
                            zb[j] += xr[j];
                        }
                        fa.apply_slice(zb, clip);
                        for j in 0..hs {
                            rh[b * hs + j] = zb[hs + j] * h[b * hs + j];
                        }
                    }
                    gemm_wt(cx, batch, hs, hs, &rh, r_h, din.rp[1], &mut hn);
                    for b in 0..batch {
                        let Some(t) = time_of(s, b) else { continue };
                        let xr = &xw[(t * batch + b) * gh..][..gh];
                        let hb = &mut h[b * hs..(b + 1) * hs];
                        let nb = &mut gate[..hs];
                        for j in 0..hs {
                            nb[j] = xr[2 * hs + j] + hn[b * hs + j];
                        }
                        ga.apply_slice(nb, clip);
                        for j in 0..hs {
                            let z = zr[b * 2 * hs + j];
                            hb[j] = (1.0 - z) * nb[j] + z * hb[j];
                        }
                        emit(t, b, hb);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::AttrValue;
    use crate::provider::ReferenceCpu;

    /// Deterministic test data, reproduced in the Python script that produced the expectations:
    /// `sin(i * 0.7 + seed) * scale` computed in f64.
    fn det(n: usize, seed: f64, scale: f64) -> Vec<f32> {
        (0..n)
            .map(|i| (libm::sin(i as f64 * 0.7 + seed) * scale) as f32)
            .collect()
    }

    fn t(shape: &[usize], v: Vec<f32>) -> Option<Value> {
        Some(Value::Tensor(Tensor::from_vec(shape, v).unwrap()))
    }

    use crate::kernels::test_util::node;

    fn s(v: &str) -> AttrValue {
        AttrValue::String(v.as_bytes().to_vec())
    }

    fn strs(v: &[&str]) -> AttrValue {
        AttrValue::Strings(v.iter().map(|s| s.as_bytes().to_vec()).collect())
    }

    fn run_node(n: &Node, inputs: &[Option<Value>]) -> Vec<Vec<f32>> {
        let k = (KERNELS.iter().find(|d| d.op == n.op_type).unwrap().build)(n).unwrap();
        let cx = KernelCx::new(&ReferenceCpu);
        let refs: Vec<Option<&Value>> = inputs.iter().map(|v| v.as_ref()).collect();
        k.compute(&cx, &refs)
            .unwrap()
            .into_iter()
            .map(|v| v.into_tensor().unwrap().to_f32_vec().unwrap())
            .collect()
    }

    /// Runs `n` with W and R (inputs 1 and 2) prepared at load, returning the outputs and the
    /// bytes `prepare` reported.
    fn run_prepared(
        n: &Node,
        prep: &[Option<Value>],
        inputs: &[Option<Value>],
    ) -> (Vec<Vec<f32>>, usize) {
        let mut k = (KERNELS.iter().find(|d| d.op == n.op_type).unwrap().build)(n).unwrap();
        let consts: Vec<Option<&Tensor>> = prep
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Some(Value::Tensor(t)) if i == 1 || i == 2 => Some(t),
                _ => None,
            })
            .collect();
        let bytes = k.prepare(&consts);
        let cx = KernelCx::new(&ReferenceCpu);
        let refs: Vec<Option<&Value>> = inputs.iter().map(|v| v.as_ref()).collect();
        let outs = k
            .compute(&cx, &refs)
            .unwrap()
            .into_iter()
            .map(|v| v.into_tensor().unwrap().to_f32_vec().unwrap())
            .collect();
        (outs, bytes)
    }

    #[test]
    fn weights_packed_at_load_give_what_unpacked_weights_give() {
        // every cell (GRU both ways round the reset), both directions, one row per step (the
        // few-row product over packed R) and five (the blocked SGEMM), a hidden size that is
        // not a whole panel; then a prepared kernel given other weights must use those
        type Case = (&'static str, Vec<(&'static str, AttrValue)>, usize, usize);
        let cases: [Case; 4] = [
            ("LSTM", vec![], 4, 1),
            ("GRU", vec![("direction", s("bidirectional"))], 3, 2),
            (
                "GRU",
                vec![("linear_before_reset", AttrValue::Int(1))],
                3,
                1,
            ),
            ("RNN", vec![("direction", s("reverse"))], 1, 1),
        ];
        let (seq, input, hidden) = (4, 7, 20);
        for (op, attrs, gates, nd) in cases {
            let mut attrs = attrs;
            attrs.push(("hidden_size", AttrValue::Int(hidden as i64)));
            let n = node(op, 14, attrs, 2);
            let gh = gates * hidden;
            for batch in [1usize, 5] {
                let ins = vec![
                    t(&[seq, batch, input], det(seq * batch * input, 0.1, 1.0)),
                    t(&[nd, gh, input], det(nd * gh * input, 0.2, 0.3)),
                    t(&[nd, gh, hidden], det(nd * gh * hidden, 0.3, 0.3)),
                    t(&[nd, 2 * gh], det(nd * 2 * gh, 0.4, 0.5)),
                ];
                let want = run_node(&n, &ins);
                let (got, bytes) = run_prepared(&n, &ins, &ins);
                assert!(bytes > 0, "{op}: nothing packed");
                for (g, w) in got.iter().zip(&want) {
                    close(g, w);
                }
                // other W and R than those prepared
                let mut other = ins.clone();
                other[1] = t(&[nd, gh, input], det(nd * gh * input, 0.6, 0.3));
                other[2] = t(&[nd, gh, hidden], det(nd * gh * hidden, 0.7, 0.3));
                let want = run_node(&n, &other);
                let (got, _) = run_prepared(&n, &ins, &other);
                for (g, w) in got.iter().zip(&want) {
                    close(g, w);
                }
            }
        }
    }

    fn close(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!((g - w).abs() <= 1e-5, "element {i}: got {g}, want {w}");
        }
    }

    fn seq_lens(v: &[i32]) -> Option<Value> {
        Some(Value::Tensor(
            Tensor::from_vec(&[v.len()], v.to_vec()).unwrap(),
        ))
    }

    // Expected values: onnxruntime 1.32 CPU on the same deterministic inputs.
    const LSTM1_Y: [f32; 12] = [
        0.09640363,
        -0.35551074,
        -0.04160616,
        -0.24322495,
        -0.18087478,
        -0.31446528,
        -0.0438349,
        -0.40598503,
        -0.26696917,
        -0.27804518,
        0.0,
        0.0,
    ];
    const LSTM1_YH: [f32; 4] = [-0.26696917, -0.27804518, -0.0438349, -0.40598503];
    const LSTM1_YC: [f32; 4] = [-0.46885407, -0.41471982, -0.07478111, -0.53086287];
    const LSTM2_Y: [f32; 24] = [
        0.065213956,
        0.07928274,
        0.078917235,
        0.025216227,
        -0.029416554,
        0.036499597,
        -0.06926329,
        -0.04844775,
        0.03664775,
        0.010262605,
        0.034714047,
        -0.014280184,
        0.058385525,
        -0.1608655,
        -0.04706124,
        0.04332784,
        0.00039001033,
        -0.019453365,
        0.01046821,
        -0.024276387,
        -0.0978113,
        -0.15209882,
        0.018135624,
        -0.14993061,
    ];
    const LSTM2_YH: [f32; 8] = [
        0.00039001033,
        -0.019453365,
        0.01046821,
        -0.024276387,
        -0.029416554,
        0.036499597,
        -0.06926329,
        -0.04844775,
    ];
    const LSTM2_YC: [f32; 8] = [
        0.0006846972,
        -0.035334636,
        0.018708874,
        -0.056299828,
        -0.083048366,
        0.06753349,
        -0.15620342,
        -0.11599879,
    ];
    const GRU1_Y: [f32; 24] = [
        0.15201868,
        0.08966617,
        0.5047275,
        0.08298846,
        -0.45985672,
        -0.28677502,
        -0.46336135,
        -0.35468304,
        0.0911566,
        0.42358655,
        0.3067198,
        -0.13847612,
        -0.40916017,
        0.041837707,
        -0.65130216,
        -0.29073417,
        0.0,
        0.0,
        0.09129264,
        0.3136562,
        0.0,
        0.0,
        -0.6493932,
        0.004933387,
    ];
    const GRU1_YH: [f32; 8] = [
        0.0911566,
        0.42358655,
        0.09129264,
        0.3136562,
        -0.45985672,
        -0.28677502,
        -0.46336135,
        -0.35468304,
    ];
    const GRU2_Y: [f32; 12] = [
        0.43454093, 0.5169069, 0.94953763, 0.77879757, 0.0, 0.0, 0.7163867, 0.79919153, 0.0, 0.0,
        0.66838753, 0.89002264,
    ];
    const GRU2_YH: [f32; 4] = [0.43454093, 0.5169069, 0.94953763, 0.77879757];
    const RNN1_Y: [f32; 24] = [
        1.7025379,
        0.84467196,
        0.8128416,
        1.5020564,
        -0.3822204,
        0.14589249,
        -0.30542856,
        -0.09204965,
        0.54677564,
        1.6109157,
        0.0,
        0.0,
        0.3690326,
        -0.5400236,
        0.0,
        0.0,
        1.3781389,
        1.9946606,
        0.0,
        0.0,
        -0.2943604,
        -0.20425329,
        0.0,
        0.0,
    ];
    const RNN1_YH: [f32; 8] = [
        1.3781389,
        1.9946606,
        0.8128416,
        1.5020564,
        -0.3822204,
        0.14589249,
        -0.30542856,
        -0.09204965,
    ];

    const S: usize = 3;
    const B: usize = 2;
    const I: usize = 3;
    const H: usize = 2;

    #[test]
    fn lstm_forward_all_inputs() {
        let n = node("LSTM", 14, vec![("hidden_size", AttrValue::Int(2))], 3);
        let ins = [
            t(&[S, B, I], det(S * B * I, 0.1, 1.0)),
            t(&[1, 4 * H, I], det(4 * H * I, 0.2, 0.5)),
            t(&[1, 4 * H, H], det(4 * H * H, 0.3, 0.5)),
            t(&[1, 8 * H], det(8 * H, 0.4, 0.5)),
            seq_lens(&[3, 2]),
            t(&[1, B, H], det(B * H, 0.5, 0.5)),
            t(&[1, B, H], det(B * H, 0.6, 0.5)),
            t(&[1, 3 * H], det(3 * H, 0.7, 0.5)),
        ];
        let o = run_node(&n, &ins);
        close(&o[0], &LSTM1_Y);
        close(&o[1], &LSTM1_YH);
        close(&o[2], &LSTM1_YC);
    }

    #[test]
    fn lstm_bidirectional_clip_input_forget_activations() {
        let n = node(
            "LSTM",
            14,
            vec![
                ("hidden_size", AttrValue::Int(2)),
                ("direction", s("bidirectional")),
                ("clip", AttrValue::Float(0.4)),
                ("input_forget", AttrValue::Int(1)),
                (
                    "activations",
                    strs(&[
                        "HardSigmoid",
                        "LeakyRelu",
                        "Softsign",
                        "Sigmoid",
                        "ScaledTanh",
                        "Elu",
                    ]),
                ),
                (
                    "activation_alpha",
                    AttrValue::Floats(vec![0.3, 0.2, 1.5, 0.8]),
                ),
                ("activation_beta", AttrValue::Floats(vec![0.45, 0.7])),
            ],
            3,
        );
        let ins = [
            t(&[S, B, I], det(S * B * I, 0.1, 1.0)),
            t(&[2, 4 * H, I], det(2 * 4 * H * I, 0.2, 0.5)),
            t(&[2, 4 * H, H], det(2 * 4 * H * H, 0.3, 0.5)),
            t(&[2, 8 * H], det(2 * 8 * H, 0.4, 0.5)),
            None,
            t(&[2, B, H], det(2 * B * H, 0.5, 0.5)),
            t(&[2, B, H], det(2 * B * H, 0.6, 0.5)),
            t(&[2, 3 * H], det(2 * 3 * H, 0.7, 0.5)),
        ];
        let o = run_node(&n, &ins);
        close(&o[0], &LSTM2_Y);
        close(&o[1], &LSTM2_YH);
        close(&o[2], &LSTM2_YC);
    }

    #[test]
    fn gru_bidirectional_linear_before_reset() {
        let n = node(
            "GRU",
            14,
            vec![
                ("hidden_size", AttrValue::Int(2)),
                ("direction", s("bidirectional")),
                ("linear_before_reset", AttrValue::Int(1)),
            ],
            2,
        );
        let ins = [
            t(&[S, B, I], det(S * B * I, 0.1, 1.0)),
            t(&[2, 3 * H, I], det(2 * 3 * H * I, 0.2, 0.5)),
            t(&[2, 3 * H, H], det(2 * 3 * H * H, 0.3, 0.5)),
            t(&[2, 6 * H], det(2 * 6 * H, 0.4, 0.5)),
            seq_lens(&[2, 3]),
            t(&[2, B, H], det(2 * B * H, 0.5, 0.5)),
        ];
        let o = run_node(&n, &ins);
        close(&o[0], &GRU1_Y);
        close(&o[1], &GRU1_YH);
    }

    #[test]
    fn gru_reverse_reset_before_linear() {
        let n = node(
            "GRU",
            7,
            vec![
                ("hidden_size", AttrValue::Int(2)),
                ("direction", s("reverse")),
                ("activations", strs(&["Sigmoid", "Softplus"])),
            ],
            2,
        );
        let ins = [
            t(&[S, B, I], det(S * B * I, 0.1, 1.0)),
            t(&[1, 3 * H, I], det(3 * H * I, 0.2, 0.5)),
            t(&[1, 3 * H, H], det(3 * H * H, 0.3, 0.5)),
            t(&[1, 6 * H], det(6 * H, 0.4, 0.5)),
            seq_lens(&[1, 3]),
            t(&[1, B, H], det(B * H, 0.5, 0.5)),
        ];
        let o = run_node(&n, &ins);
        close(&o[0], &GRU2_Y);
        close(&o[1], &GRU2_YH);
    }

    /// Transposes a row-major array of shape `dims` by `perm`.
    fn transpose(v: &[f32], dims: &[usize], perm: &[usize]) -> Vec<f32> {
        let t = Tensor::from_vec(dims, v.to_vec()).unwrap();
        t.permute(perm).unwrap().to_f32_vec().unwrap()
    }

    #[test]
    fn rnn_bidirectional_layout1() {
        let n = node(
            "RNN",
            14,
            vec![
                ("hidden_size", AttrValue::Int(2)),
                ("direction", s("bidirectional")),
                ("layout", AttrValue::Int(1)),
                ("activations", strs(&["Relu", "Affine"])),
                ("activation_alpha", AttrValue::Floats(vec![0.5])),
                ("activation_beta", AttrValue::Floats(vec![0.1])),
            ],
            2,
        );
        let x = transpose(&det(S * B * I, 0.1, 1.0), &[S, B, I], &[1, 0, 2]);
        let h0 = transpose(&det(2 * B * H, 0.5, 0.5), &[2, B, H], &[1, 0, 2]);
        let ins = [
            t(&[B, S, I], x),
            t(&[2, H, I], det(2 * H * I, 0.2, 0.5)),
            t(&[2, H, H], det(2 * H * H, 0.3, 0.5)),
            t(&[2, 2 * H], det(2 * 2 * H, 0.4, 0.5)),
            seq_lens(&[3, 1]),
            t(&[B, 2, H], h0),
        ];
        let o = run_node(&n, &ins);
        close(&o[0], &transpose(&RNN1_Y, &[S, 2, B, H], &[2, 0, 1, 3]));
        close(&o[1], &transpose(&RNN1_YH, &[2, B, H], &[1, 0, 2]));
    }

    #[test]
    fn bad_attributes_are_unsupported() {
        let n = node(
            "LSTM",
            14,
            vec![("activations", strs(&["Gelu", "Tanh", "Tanh"]))],
            1,
        );
        assert!(matches!(
            build_lstm(&n),
            Err(crate::Error::Unsupported { .. })
        ));
        let n = node("GRU", 13, vec![("layout", AttrValue::Int(1))], 1);
        assert!(matches!(
            build_gru(&n),
            Err(crate::Error::Unsupported { .. })
        ));
        let n = node("RNN", 14, vec![("direction", s("sideways"))], 1);
        assert!(matches!(
            build_rnn(&n),
            Err(crate::Error::Unsupported { .. })
        ));
    }
}
