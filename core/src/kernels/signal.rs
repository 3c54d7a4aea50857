//! Signal processing: DFT, STFT, Hann/Hamming/Blackman windows and MelWeightMatrix.
//!
//! Transforms run in f64: radix-2 FFT for power-of-two lengths, Bluestein's chirp-z algorithm
//! (over a power-of-two FFT) for every other length, so any length costs O(n log n). Lines of
//! a tensor (DFT) and frames (STFT) are spread over the backend's threads.

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;
use core::f64::consts::PI;
use core::sync::atomic::{AtomicU64, Ordering};

use super::{def, opt_tensor_in, out1, tensor_in, Float, LATEST};
use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::Node;
use crate::kernels::types::{FLOATS, INTS};
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::tensor::Tensor;
use crate::value::Value;
use crate::{bail, unsupported};

pub(crate) const KERNELS: &[KernelDef] = &[
    def("DFT", 17, 19, build_dft17).types(FLOATS),
    def("DFT", 20, LATEST, build_dft20).types(FLOATS),
    def("STFT", 17, LATEST, build_stft).types(FLOATS),
    // the windows' and MelWeightMatrix's first input is an integer size; output_datatype is
    // checked when the kernel is built
    def("HannWindow", 17, LATEST, build_hann).types(INTS),
    def("HammingWindow", 17, LATEST, build_hamming).types(INTS),
    def("BlackmanWindow", 17, LATEST, build_blackman).types(INTS),
    def("MelWeightMatrix", 17, LATEST, build_mel).types(INTS),
];

// ----------------------------------------------------------------------------- FFT

enum Plan {
    /// Length 0 or 1: the identity.
    Identity,
    /// Radix-2: `tw[k] = e^{-2πik/n}` for `k < n/2`.
    Pow2 { tw: Vec<(f64, f64)> },
    /// Bluestein: `chirp[k] = e^{-πik²/n}`, and the forward FFT (size `m`) of the conjugate
    /// chirp filter.
    Bluestein {
        inner: Box<Fft>,
        chirp: Vec<(f64, f64)>,
        filt: Vec<(f64, f64)>,
    },
}

/// A complex DFT of one length, planned once and reusable (and shareable across threads).
struct Fft {
    n: usize,
    plan: Plan,
}

#[inline]
fn cmul(a: (f64, f64), b: (f64, f64)) -> (f64, f64) {
    (a.0 * b.0 - a.1 * b.1, a.0 * b.1 + a.1 * b.0)
}

impl Fft {
    fn new(n: usize) -> Fft {
        let plan = if n <= 1 {
            Plan::Identity
        } else if n.is_power_of_two() {
            let tw = (0..n / 2)
                .map(|k| {
                    let a = -2.0 * PI * k as f64 / n as f64;
                    (libm::cos(a), libm::sin(a))
                })
                .collect();
            Plan::Pow2 { tw }
        } else {
            let m = (2 * n - 1).next_power_of_two();
            let inner = Box::new(Fft::new(m));
            let two_n = 2 * n as u128;
            let chirp: Vec<(f64, f64)> = (0..n)
                .map(|k| {
                    // k² mod 2n keeps the angle small and exact
                    let r = ((k as u128 * k as u128) % two_n) as f64;
                    let a = -PI * r / n as f64;
                    (libm::cos(a), libm::sin(a))
                })
                .collect();
            let mut filt = vec![(0.0, 0.0); m];
            filt[0] = (chirp[0].0, -chirp[0].1);
            for k in 1..n {
                let c = (chirp[k].0, -chirp[k].1);
                filt[k] = c;
                filt[m - k] = c;
            }
            inner.forward(&mut filt);
            Plan::Bluestein { inner, chirp, filt }
        };
        Fft { n, plan }
    }

    /// In-place forward transform `X[k] = Σ x[j] e^{-2πijk/n}` of `a` (length `n`).
    fn forward(&self, a: &mut [(f64, f64)]) {
        debug_assert_eq!(a.len(), self.n);
        match &self.plan {
            Plan::Identity => {}
            Plan::Pow2 { tw } => radix2(a, tw),
            Plan::Bluestein { inner, chirp, filt } => {
                let m = inner.n;
                let mut buf = vec![(0.0, 0.0); m];
                for k in 0..self.n {
                    buf[k] = cmul(a[k], chirp[k]);
                }
                inner.forward(&mut buf);
                for (b, f) in buf.iter_mut().zip(filt) {
                    *b = cmul(*b, *f);
                }
                // inverse FFT through conjugation; the 1/m scale is applied below
                for b in buf.iter_mut() {
                    b.1 = -b.1;
                }
                inner.forward(&mut buf);
                let s = 1.0 / m as f64;
                for k in 0..self.n {
                    let v = (buf[k].0 * s, -buf[k].1 * s);
                    a[k] = cmul(v, chirp[k]);
                }
            }
        }
    }

    /// In-place unscaled inverse transform `x[j] = Σ X[k] e^{+2πijk/n}`.
    fn backward(&self, a: &mut [(f64, f64)]) {
        for v in a.iter_mut() {
            v.1 = -v.1;
        }
        self.forward(a);
        for v in a.iter_mut() {
            v.1 = -v.1;
        }
    }
}

fn radix2(a: &mut [(f64, f64)], tw: &[(f64, f64)]) {
    let n = a.len();
    let bits = n.trailing_zeros();
    for i in 0..n {
        let j = i.reverse_bits() >> (usize::BITS - bits);
        if j > i {
            a.swap(i, j);
        }
    }
    let mut len = 2;
    while len <= n {
        let half = len / 2;
        let step = n / len;
        for start in (0..n).step_by(len) {
            for j in 0..half {
                let w = tw[j * step];
                let u = a[start + j];
                let v = cmul(a[start + j + half], w);
                a[start + j] = (u.0 + v.0, u.1 + v.1);
                a[start + j + half] = (u.0 - v.0, u.1 - v.1);
            }
        }
        len <<= 1;
    }
}

// ----------------------------------------------------------------------------- helpers

/// A float tensor's elements as f64.
fn f64_of(t: &Tensor, op: &str) -> Result<Vec<f64>> {
    crate::dispatch_float!(t.dtype(), T => {
        Ok(t.as_slice::<T>()?.iter().map(|v| v.to_f64()).collect())
    }, else Err(super::bad_type(op, t.dtype())))
}

/// A float tensor of element type `dt` from f64 values.
fn float_tensor(dt: DataType, shape: &[usize], v: &[f64], op: &str) -> Result<Tensor> {
    crate::dispatch_float!(dt, T => {
        Tensor::from_vec(shape, v.iter().map(|&x| T::from_f64(x)).collect::<Vec<T>>())
    }, else Err(super::bad_type(op, dt)))
}

/// A tensor of any numeric element type from f64 values (integers truncate, as numpy's
/// `astype` does).
fn numeric_tensor(dt: DataType, shape: &[usize], v: &[f64], op: &str) -> Result<Tensor> {
    macro_rules! ints {
        ($t:ty) => {
            Tensor::from_vec(shape, v.iter().map(|&x| x as $t).collect::<Vec<$t>>())
        };
    }
    match dt {
        DataType::Int8 => ints!(i8),
        DataType::Int16 => ints!(i16),
        DataType::Int32 => ints!(i32),
        DataType::Int64 => ints!(i64),
        DataType::Uint8 => ints!(u8),
        DataType::Uint16 => ints!(u16),
        DataType::Uint32 => ints!(u32),
        DataType::Uint64 => ints!(u64),
        _ => float_tensor(dt, shape, v, op),
    }
}

/// A scalar (or one-element) integer input.
fn scalar_int(t: &Tensor, what: &str) -> Result<i64> {
    if t.len() != 1 {
        bail!("{what} must be a scalar, has shape {:?}", t.shape());
    }
    match t.dtype() {
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::Uint8
        | DataType::Uint16
        | DataType::Uint32
        | DataType::Uint64 => Ok(t.to_i64_vec()?[0]),
        dt => bail!("{what} must be an integer, is {dt}"),
    }
}

/// A scalar float input.
fn scalar_float(t: &Tensor, what: &str) -> Result<f64> {
    if t.len() != 1 {
        bail!("{what} must be a scalar, has shape {:?}", t.shape());
    }
    Ok(f64_of(t, what)?[0])
}

/// Output elements written from parallel tasks (f64 bits in atomics keeps it safe Rust).
struct Shared(Vec<AtomicU64>);

impl Shared {
    fn new(n: usize) -> Shared {
        Shared((0..n).map(|_| AtomicU64::new(0)).collect())
    }
    #[inline]
    fn set(&self, i: usize, v: f64) {
        self.0[i].store(v.to_bits(), Ordering::Relaxed);
    }
    fn into_vec(self) -> Vec<f64> {
        self.0
            .into_iter()
            .map(|a| f64::from_bits(a.into_inner()))
            .collect()
    }
}

/// Runs `f(i)` for `i in 0..n` in a few parallel chunks.
fn par_range(cx: &KernelCx<'_>, n: usize, f: &(dyn Fn(usize) + Sync)) {
    let tasks = n.min(cx.cpu.threads().max(1) * 4);
    if tasks <= 1 {
        (0..n).for_each(f);
        return;
    }
    let per = n.div_ceil(tasks);
    cx.cpu.parallel_for(tasks, &|t| {
        for i in t * per..((t + 1) * per).min(n) {
            f(i)
        }
    });
}

// ----------------------------------------------------------------------------- DFT

#[derive(Clone, Copy)]
struct DftAttrs {
    axis: Option<i64>,
    inverse: bool,
    onesided: bool,
}

fn dft_attrs(node: &Node) -> Result<(bool, bool)> {
    let inverse = match node.get_i("inverse", 0)? {
        0 => false,
        1 => true,
        v => unsupported!("inverse={v} is not supported"),
    };
    let onesided = match node.get_i("onesided", 0)? {
        0 => false,
        1 => true,
        v => unsupported!("onesided={v} is not supported"),
    };
    Ok((inverse, onesided))
}

fn build_dft17(node: &Node) -> Result<Box<dyn Kernel>> {
    let (inverse, onesided) = dft_attrs(node)?;
    let a = DftAttrs {
        axis: Some(node.get_i("axis", 1)?),
        inverse,
        onesided,
    };
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| run_dft(cx, inputs, a),
    ))
}

fn build_dft20(node: &Node) -> Result<Box<dyn Kernel>> {
    let (inverse, onesided) = dft_attrs(node)?;
    let a = DftAttrs {
        axis: None,
        inverse,
        onesided,
    };
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| run_dft(cx, inputs, a),
    ))
}

fn run_dft(cx: &KernelCx<'_>, inputs: &[Option<&Value>], a: DftAttrs) -> Result<Vec<Value>> {
    let x = tensor_in(inputs, 0)?;
    let shape = x.shape().to_vec();
    let r = shape.len();
    if r < 2 || !(shape[r - 1] == 1 || shape[r - 1] == 2) {
        bail!("DFT input must have rank >= 2 and a last dimension of 1 or 2, has shape {shape:?}");
    }
    let axis = match a.axis {
        Some(ax) => ax,
        None => match opt_tensor_in(inputs, 2)? {
            Some(t) => scalar_int(t, "axis")?,
            None => -2,
        },
    };
    let axis = if axis < 0 { axis + r as i64 } else { axis };
    if axis < 0 || axis >= r as i64 - 1 {
        bail!("DFT axis is out of range for input shape {shape:?}");
    }
    let axis = axis as usize;
    let n_in = shape[axis];
    let len = match opt_tensor_in(inputs, 1)? {
        Some(t) => scalar_int(t, "dft_length")?,
        None if a.inverse && a.onesided => 2 * (n_in as i64 - 1),
        None => n_in as i64,
    };
    if len <= 0 {
        bail!("DFT length must be positive, is {len}");
    }
    let len = len as usize;
    let comps = shape[r - 1];
    let xs = f64_of(x, "DFT")?;
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..r - 1].iter().product();
    // inverse onesided is irfft: the first len/2+1 bins make a Hermitian spectrum, real output
    let irfft = a.inverse && a.onesided;
    let (out_len, out_comps, use_in) = if irfft {
        (len, 1, (len / 2 + 1).min(n_in))
    } else if a.onesided {
        (len / 2 + 1, 2, len.min(n_in))
    } else {
        (len, 2, len.min(n_in))
    };
    let mut out_shape = shape.clone();
    out_shape[axis] = out_len;
    out_shape[r - 1] = out_comps;
    let fft = Fft::new(len);
    let out = Shared::new(outer * out_len * inner * out_comps);
    let scale = if a.inverse { 1.0 / len as f64 } else { 1.0 };
    par_range(cx, outer * inner, &|line| {
        let (o, i) = (line / inner, line % inner);
        let mut buf = vec![(0.0, 0.0); len];
        for k in 0..use_in {
            let p = ((o * n_in + k) * inner + i) * comps;
            buf[k] = (xs[p], if comps == 2 { xs[p + 1] } else { 0.0 });
        }
        if irfft {
            // mirror the conjugate half; the real part of the inverse drops the imaginary
            // parts of the DC and Nyquist bins, as a c2r transform does
            for k in len / 2 + 1..len {
                let m = buf[len - k];
                buf[k] = (m.0, -m.1);
            }
        }
        if a.inverse {
            fft.backward(&mut buf);
        } else {
            fft.forward(&mut buf);
        }
        for k in 0..out_len {
            let q = ((o * out_len + k) * inner + i) * out_comps;
            out.set(q, buf[k].0 * scale);
            if out_comps == 2 {
                out.set(q + 1, buf[k].1 * scale);
            }
        }
    });
    out1(float_tensor(x.dtype(), &out_shape, &out.into_vec(), "DFT")?)
}

// ----------------------------------------------------------------------------- STFT

fn build_stft(node: &Node) -> Result<Box<dyn Kernel>> {
    let onesided = match node.get_i("onesided", 1)? {
        0 => false,
        1 => true,
        v => unsupported!("onesided={v} is not supported"),
    };
    Ok(Box::new(
        move |cx: &KernelCx<'_>, inputs: &[Option<&Value>]| run_stft(cx, inputs, onesided),
    ))
}

fn run_stft(cx: &KernelCx<'_>, inputs: &[Option<&Value>], onesided: bool) -> Result<Vec<Value>> {
    let x = tensor_in(inputs, 0)?;
    let shape = x.shape();
    // [batch, length] (real, as onnxruntime and exporters use it) or [batch, length, 1|2]
    let (batch, sig_len, comps) = match *shape {
        [b, l] => (b, l, 1),
        [b, l, c] if c == 1 || c == 2 => (b, l, c),
        _ => bail!("STFT signal must have shape [batch, length, 1|2], has {shape:?}"),
    };
    let step = scalar_int(tensor_in(inputs, 1)?, "frame_step")?;
    if step <= 0 {
        bail!("STFT frame_step must be positive, is {step}");
    }
    let step = step as usize;
    let window = match opt_tensor_in(inputs, 2)? {
        Some(w) => {
            if w.rank() != 1 {
                bail!("STFT window must be 1-D, has shape {:?}", w.shape());
            }
            Some(f64_of(w, "STFT")?)
        }
        None => None,
    };
    let frame_len = match opt_tensor_in(inputs, 3)? {
        Some(t) => {
            let fl = scalar_int(t, "frame_length")?;
            if fl <= 0 {
                bail!("STFT frame_length must be positive, is {fl}");
            }
            fl as usize
        }
        None => window.as_ref().map_or(sig_len, |w| w.len()),
    };
    if let Some(w) = &window {
        if w.len() != frame_len {
            bail!(
                "STFT window has {} elements but frame_length is {frame_len}",
                w.len()
            );
        }
    }
    if frame_len == 0 || frame_len > sig_len {
        bail!("STFT frame_length {frame_len} does not fit a signal of length {sig_len}");
    }
    let frames = 1 + (sig_len - frame_len) / step;
    let bins = if onesided {
        frame_len / 2 + 1
    } else {
        frame_len
    };
    let xs = f64_of(x, "STFT")?;
    let fft = Fft::new(frame_len);
    let out = Shared::new(batch * frames * bins * 2);
    par_range(cx, batch * frames, &|task| {
        let (b, f) = (task / frames, task % frames);
        let mut buf = vec![(0.0, 0.0); frame_len];
        let base = (b * sig_len + f * step) * comps;
        for (k, v) in buf.iter_mut().enumerate() {
            let p = base + k * comps;
            let w = window.as_ref().map_or(1.0, |w| w[k]);
            *v = (xs[p] * w, if comps == 2 { xs[p + 1] * w } else { 0.0 });
        }
        fft.forward(&mut buf);
        let q = task * bins * 2;
        for k in 0..bins {
            out.set(q + 2 * k, buf[k].0);
            out.set(q + 2 * k + 1, buf[k].1);
        }
    });
    out1(float_tensor(
        x.dtype(),
        &[batch, frames, bins, 2],
        &out.into_vec(),
        "STFT",
    )?)
}

// ----------------------------------------------------------------------------- windows

#[derive(Clone, Copy)]
enum Window {
    Hann,
    Hamming,
    Blackman,
}

/// Parses `output_datatype`: any numeric element type.
fn output_dtype(node: &Node) -> Result<DataType> {
    let code = node.get_i("output_datatype", 1)?;
    let dt = i32::try_from(code)
        .ok()
        .and_then(DataType::from_code)
        .filter(|d| {
            matches!(
                d,
                DataType::Float
                    | DataType::Double
                    | DataType::Float16
                    | DataType::Bfloat16
                    | DataType::Int8
                    | DataType::Int16
                    | DataType::Int32
                    | DataType::Int64
                    | DataType::Uint8
                    | DataType::Uint16
                    | DataType::Uint32
                    | DataType::Uint64
            )
        });
    match dt {
        Some(d) => Ok(d),
        None => unsupported!("output_datatype {code} is not supported"),
    }
}

fn build_window(node: &Node, kind: Window) -> Result<Box<dyn Kernel>> {
    let dt = output_dtype(node)?;
    let periodic = match node.get_i("periodic", 1)? {
        0 => false,
        1 => true,
        v => unsupported!("periodic={v} is not supported"),
    };
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| {
            let size = scalar_int(tensor_in(inputs, 0)?, "size")?;
            if size < 0 {
                bail!("window size must not be negative, is {size}");
            }
            let size = size as usize;
            // the symmetric window of length 1 divides by zero, as the ONNX definition does
            let denom = if periodic { size } else { size.wrapping_sub(1) } as f64;
            let v: Vec<f64> = (0..size)
                .map(|n| {
                    let a = 2.0 * PI * n as f64 / denom;
                    match kind {
                        Window::Hann => 0.5 - 0.5 * libm::cos(a),
                        Window::Hamming => 25.0 / 46.0 - (21.0 / 46.0) * libm::cos(a),
                        Window::Blackman => 0.42 - 0.5 * libm::cos(a) + 0.08 * libm::cos(2.0 * a),
                    }
                })
                .collect();
            out1(numeric_tensor(dt, &[size], &v, "window")?)
        },
    ))
}

fn build_hann(node: &Node) -> Result<Box<dyn Kernel>> {
    build_window(node, Window::Hann)
}
fn build_hamming(node: &Node) -> Result<Box<dyn Kernel>> {
    build_window(node, Window::Hamming)
}
fn build_blackman(node: &Node) -> Result<Box<dyn Kernel>> {
    build_window(node, Window::Blackman)
}

// ----------------------------------------------------------------------------- MelWeightMatrix

fn build_mel(node: &Node) -> Result<Box<dyn Kernel>> {
    let dt = output_dtype(node)?;
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| {
            let num_mel = scalar_int(tensor_in(inputs, 0)?, "num_mel_bins")?;
            let dft_len = scalar_int(tensor_in(inputs, 1)?, "dft_length")?;
            let rate = scalar_int(tensor_in(inputs, 2)?, "sample_rate")?;
            let lo = scalar_float(tensor_in(inputs, 3)?, "lower_edge_hertz")?;
            let hi = scalar_float(tensor_in(inputs, 4)?, "upper_edge_hertz")?;
            if num_mel <= 0 || dft_len <= 0 || rate <= 0 {
                bail!("MelWeightMatrix needs positive num_mel_bins, dft_length and sample_rate");
            }
            let v = mel_matrix(num_mel as usize, dft_len as usize, rate as f64, lo, hi)?;
            let bins = dft_len as usize / 2 + 1;
            out1(numeric_tensor(
                dt,
                &[bins, num_mel as usize],
                &v,
                "MelWeightMatrix",
            )?)
        },
    ))
}

/// Triangular filters between mel-spaced points (HTK mel scale), as the ONNX definition
/// computes them: `num_mel + 2` points, each snapped down to a spectrogram bin.
fn mel_matrix(num_mel: usize, dft_len: usize, rate: f64, lo: f64, hi: f64) -> Result<Vec<f64>> {
    let bins = dft_len / 2 + 1;
    let to_mel = |f: f64| 2595.0 * libm::log10(1.0 + f / 700.0);
    let (lo_mel, hi_mel) = (to_mel(lo), to_mel(hi));
    let points = num_mel + 2;
    let step = (hi_mel - lo_mel) / points as f64;
    let mut idx = Vec::with_capacity(points);
    for i in 0..points {
        let mel = i as f64 * step + lo_mel;
        let hz = 700.0 * (libm::pow(10.0, mel / 2595.0) - 1.0);
        let b = libm::floor((dft_len as f64 + 1.0) * hz / rate);
        if !(0.0..bins as f64).contains(&b) {
            bail!(
                "MelWeightMatrix: edge frequency {hz} Hz falls outside the {bins} spectrogram bins"
            );
        }
        idx.push(b as usize);
    }
    let mut out = vec![0f64; bins * num_mel];
    for i in 0..num_mel {
        let (l, c, h) = (idx[i], idx[i + 1], idx[i + 2]);
        if c == l {
            out[c * num_mel + i] = 1.0;
        } else {
            for j in l..=c {
                out[j * num_mel + i] = (j - l) as f64 / (c - l) as f64;
            }
        }
        if h > c {
            for j in c..h {
                out[j * num_mel + i] = (h - j) as f64 / (h - c) as f64;
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::AttrValue;
    use crate::provider::ReferenceCpu;

    /// `sin(i * 0.7 + seed) * scale` in f64, rounded to f32 (same in the Python generator).
    fn det(n: usize, seed: f64, scale: f64) -> Vec<f32> {
        (0..n)
            .map(|i| (libm::sin(i as f64 * 0.7 + seed) * scale) as f32)
            .collect()
    }

    /// A node with one output.
    fn node(op: &str, opset: i64, attrs: Vec<(&str, AttrValue)>) -> Node {
        crate::kernels::test_util::node(op, opset, attrs, 1)
    }

    fn t<T: crate::tensor::Elem>(shape: &[usize], v: Vec<T>) -> Option<Value> {
        Some(Value::Tensor(Tensor::from_vec(shape, v).unwrap()))
    }

    fn run(n: &Node, inputs: &[Option<Value>]) -> Tensor {
        let def = KERNELS
            .iter()
            .find(|d| d.op == n.op_type && n.opset >= d.since && n.opset <= d.until)
            .unwrap();
        let k = (def.build)(n).unwrap();
        let cx = KernelCx::new(&ReferenceCpu);
        let refs: Vec<Option<&Value>> = inputs.iter().map(|v| v.as_ref()).collect();
        let mut o = k.compute(&cx, &refs).unwrap();
        o.remove(0).into_tensor().unwrap()
    }

    fn close(got: &[f32], want: &[f32], tol: f32) {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= tol * (1.0 + w.abs()),
                "element {i}: got {g}, want {w}"
            );
        }
    }

    // Expected values: numpy.fft (f64) and the ONNX reference MelWeightMatrix.
    const DFT12_FWD: [f32; 24] = [
        1.3124516,
        0.87947404,
        0.8282261,
        1.3438951,
        0.08970141,
        2.5964105,
        2.3813505,
        -3.032636,
        0.9107734,
        -0.00382741,
        0.5131888,
        0.52541405,
        0.1625749,
        0.8365028,
        -0.31146652,
        1.1429789,
        -1.2979237,
        1.6502138,
        -7.6716113,
        4.495791,
        4.573359,
        -0.76129544,
        2.0556185,
        0.42472982,
    ];
    const DFT12_INV: [f32; 24] = [
        0.10937096,
        0.073289506,
        0.17130154,
        0.03539415,
        0.38111326,
        -0.063441284,
        -0.63930094,
        0.37464926,
        -0.1081603,
        0.13751782,
        -0.025955541,
        0.095248245,
        0.0135479085,
        0.06970856,
        0.04276573,
        0.043784507,
        0.07589778,
        -0.00031895083,
        0.19844587,
        -0.25271964,
        0.007475117,
        0.21636754,
        0.06901884,
        0.111991264,
    ];
    const RFFT16_20: [f32; 22] = [
        -0.12291281,
        0.0,
        0.5474933,
        -0.65496165,
        8.308289,
        0.4549203,
        -2.25945,
        -2.6585138,
        0.11523754,
        -1.7881252,
        0.7924818,
        -0.75469106,
        0.55049884,
        -0.030279664,
        0.091516115,
        0.009565168,
        0.057662714,
        -0.32006833,
        0.4345463,
        -0.38498384,
        0.6705092,
        0.0,
    ];
    const IRFFT7_12: [f32; 12] = [
        0.014329747,
        -0.1492332,
        0.34697548,
        0.7501873,
        -0.17092375,
        0.100266166,
        -0.010166244,
        0.05464383,
        0.13541704,
        0.19402811,
        -0.27489677,
        -0.08133026,
    ];
    const STFT_SEL: [f32; 28] = [
        -0.00054634665,
        0.0,
        -0.0005481564,
        -9.643007e-06,
        -0.00055296795,
        -1.884946e-05,
        0.1557893,
        0.03964891,
        0.00013507943,
        3.75574e-05,
        9.730491e-06,
        -6.611753e-08,
        9.520205e-06,
        0.0,
        -0.0003730142,
        0.0,
        -0.00037397287,
        2.876695e-05,
        -0.00037726865,
        5.703203e-05,
        0.106309965,
        -0.12062275,
        9.2184e-05,
        -0.0001149456,
        6.642436e-06,
        -2.6624875e-07,
        6.565243e-06,
        0.0,
    ];
    const HANN8P: [f32; 8] = [
        0.0, 0.14644662, 0.5, 0.8535534, 1.0, 0.8535534, 0.5, 0.14644662,
    ];
    const HAMMING5S: [f32; 5] = [0.08695652, 0.54347825, 1.0, 0.54347825, 0.08695652];
    const BLACKMAN6P: [f32; 6] = [-1.3877788e-17, 0.13, 0.63, 1.0, 0.63, 0.13];
    const MEL_NZ_IDX: [usize; 35] = [
        0, 9, 17, 18, 26, 34, 35, 43, 51, 52, 60, 68, 69, 76, 77, 85, 93, 94, 101, 102, 110, 118,
        119, 126, 127, 134, 135, 142, 143, 151, 159, 167, 175, 183, 191,
    ];
    const MEL_NZ_VAL: [f32; 35] = [
        1.0, 1.0, 0.5, 0.5, 1.0, 0.5, 0.5, 1.0, 0.5, 0.5, 1.0, 0.6666667, 0.33333334, 0.33333334,
        0.6666667, 1.0, 0.6666667, 0.33333334, 0.33333334, 0.6666667, 1.0, 0.8, 0.2, 0.6, 0.4, 0.4,
        0.6, 0.2, 0.8, 1.0, 0.8333333, 0.6666667, 0.5, 0.33333334, 0.16666667,
    ];

    #[test]
    fn fft_matches_naive_dft_for_many_lengths() {
        for n in [1usize, 2, 3, 5, 8, 12, 17, 64, 100, 400, 512] {
            let x: Vec<(f64, f64)> = (0..n)
                .map(|i| (libm::sin(i as f64 * 1.3), libm::cos(i as f64 * 0.4 + 0.2)))
                .collect();
            let mut y = x.clone();
            Fft::new(n).forward(&mut y);
            for k in 0..n {
                let mut acc = (0.0, 0.0);
                for (j, v) in x.iter().enumerate() {
                    let a = -2.0 * PI * ((j * k) % n) as f64 / n as f64;
                    acc.0 += v.0 * libm::cos(a) - v.1 * libm::sin(a);
                    acc.1 += v.0 * libm::sin(a) + v.1 * libm::cos(a);
                }
                assert!((acc.0 - y[k].0).abs() < 1e-9 * n as f64, "n={n} k={k}");
                assert!((acc.1 - y[k].1).abs() < 1e-9 * n as f64, "n={n} k={k}");
            }
        }
    }

    #[test]
    fn dft_complex_bluestein_forward_and_inverse() {
        let x = t(&[1, 12, 2], det(24, 0.3, 1.0));
        let n = node("DFT", 17, vec![]);
        close(
            &run(&n, core::slice::from_ref(&x)).to_f32_vec().unwrap(),
            &DFT12_FWD,
            1e-5,
        );
        // opset 20: axis as an input (here explicit -2), inverse
        let n = node("DFT", 20, vec![("inverse", AttrValue::Int(1))]);
        let o = run(&n, &[x, None, t(&[], vec![-2i64])]);
        assert_eq!(o.shape(), &[1, 12, 2]);
        close(&o.to_f32_vec().unwrap(), &DFT12_INV, 1e-5);
    }

    #[test]
    fn dft_real_onesided_padded() {
        let n = node("DFT", 17, vec![("onesided", AttrValue::Int(1))]);
        let o = run(
            &n,
            &[t(&[1, 16, 1], det(16, 1.1, 1.0)), t(&[], vec![20i64])],
        );
        assert_eq!(o.shape(), &[1, 11, 2]);
        close(&o.to_f32_vec().unwrap(), &RFFT16_20, 1e-5);
    }

    #[test]
    fn dft_irfft() {
        let n = node(
            "DFT",
            20,
            vec![
                ("inverse", AttrValue::Int(1)),
                ("onesided", AttrValue::Int(1)),
            ],
        );
        let o = run(&n, &[t(&[1, 7, 2], det(14, 2.0, 1.0)), t(&[], vec![12i64])]);
        assert_eq!(o.shape(), &[1, 12, 1]);
        close(&o.to_f32_vec().unwrap(), &IRFFT7_12, 1e-5);
    }

    #[test]
    fn stft_400_sample_frames_match_rfft() {
        let s: Vec<f32> = det(560, 0.05, 1.0).iter().map(|v| v * 0.8f32).collect();
        let w = run(&node("HannWindow", 17, vec![]), &[t(&[], vec![400i64])]);
        let n = node("STFT", 17, vec![]);
        // rank-2 signal, as the ASR exporters feed it
        let o = run(
            &n,
            &[
                t(&[1, 560], s),
                t(&[], vec![160i64]),
                Some(Value::Tensor(w)),
            ],
        );
        assert_eq!(o.shape(), &[1, 2, 201, 2]);
        let v = o.to_f32_vec().unwrap();
        let mut sel = Vec::new();
        for f in 0..2 {
            for b in [0usize, 1, 2, 50, 100, 199, 200] {
                sel.push(v[(f * 201 + b) * 2]);
                sel.push(v[(f * 201 + b) * 2 + 1]);
            }
        }
        close(&sel, &STFT_SEL, 1e-5);
    }

    #[test]
    fn windows() {
        let o = run(&node("HannWindow", 17, vec![]), &[t(&[], vec![8i32])]);
        close(&o.to_f32_vec().unwrap(), &HANN8P, 1e-6);
        let n = node("HammingWindow", 17, vec![("periodic", AttrValue::Int(0))]);
        close(
            &run(&n, &[t(&[], vec![5i64])]).to_f32_vec().unwrap(),
            &HAMMING5S,
            1e-6,
        );
        let n = node(
            "BlackmanWindow",
            17,
            vec![("output_datatype", AttrValue::Int(11))],
        );
        let o = run(&n, &[t(&[], vec![6i64])]);
        assert_eq!(o.dtype(), DataType::Double);
        close(&o.to_f32_vec().unwrap(), &BLACKMAN6P, 1e-6);
        let n = node(
            "HannWindow",
            17,
            vec![("output_datatype", AttrValue::Int(8))],
        );
        assert!(matches!(
            build_hann(&n),
            Err(crate::Error::Unsupported { .. })
        ));
    }

    #[test]
    fn mel_weight_matrix_matches_reference() {
        let n = node("MelWeightMatrix", 17, vec![]);
        let o = run(
            &n,
            &[
                t(&[], vec![8i64]),
                t(&[], vec![64i64]),
                t(&[], vec![16000i64]),
                t(&[], vec![20f32]),
                t(&[], vec![8000f32]),
            ],
        );
        assert_eq!(o.shape(), &[33, 8]);
        let v = o.to_f32_vec().unwrap();
        let mut want = vec![0f32; 33 * 8];
        for (i, x) in MEL_NZ_IDX.iter().zip(MEL_NZ_VAL) {
            want[*i] = x;
        }
        close(&v, &want, 1e-6);
    }
}
