//! Reduction kernels: ReduceSum/Mean/Max/Min/Prod/SumSquare/L1/L2/LogSum/LogSumExp, ArgMax/ArgMin, CumSum and TopK.

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;
use core::cmp::Ordering;

use half::{bf16, f16};

use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::Node;
use crate::kernels::{bad_type, def, ints_of, norm_axis, opt_tensor_in, out1, tensor_in, LATEST};
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::tensor::{Elem, Tensor};
use crate::value::Value;
use crate::{bail, unsupported};

pub(crate) const KERNELS: &[KernelDef] = &[
    def("ReduceSum", 1, LATEST, build_sum),
    def("ReduceMean", 1, LATEST, build_mean),
    def("ReduceMax", 1, LATEST, build_max),
    def("ReduceMin", 1, LATEST, build_min),
    def("ReduceProd", 1, LATEST, build_prod),
    def("ReduceSumSquare", 1, LATEST, build_sum_square),
    def("ReduceL1", 1, LATEST, build_l1),
    def("ReduceL2", 1, LATEST, build_l2),
    def("ReduceLogSum", 1, LATEST, build_log_sum),
    def("ReduceLogSumExp", 1, LATEST, build_log_sum_exp),
    def("ArgMax", 1, LATEST, build_argmax),
    def("ArgMin", 1, LATEST, build_argmin),
    def("CumSum", 11, LATEST, build_cumsum),
    def("TopK", 1, LATEST, build_topk),
];

// ----------------------------------------------------------------------------- element traits

/// Accumulator scalar: f32 (f32/f16/bf16), f64, or i128 with wrapping arithmetic (integers
/// and bool).
pub(crate) trait Acc: Copy + PartialOrd + Send + Sync + 'static {
    const ZERO: Self;
    const ONE: Self;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn abs(self) -> Self;
    fn is_nan(self) -> bool;
    fn is_finite(self) -> bool;
    fn to_f64(self) -> f64;
    fn from_f64(v: f64) -> Self;
    fn from_usize(n: usize) -> Self;
    fn div(self, o: Self) -> Self;
    fn sqrt(self) -> Self;
    fn ln(self) -> Self;
    fn exp(self) -> Self;
    fn sub(self, o: Self) -> Self;
    /// Total order with NaN above everything.
    fn total_cmp(self, o: Self) -> Ordering;
}

macro_rules! acc_float {
    ($t:ty, $sqrt:path, $ln:path, $exp:path) => {
        impl Acc for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            #[inline(always)]
            fn add(self, o: Self) -> Self {
                self + o
            }
            #[inline(always)]
            fn mul(self, o: Self) -> Self {
                self * o
            }
            #[inline(always)]
            fn abs(self) -> Self {
                if self < 0.0 {
                    -self
                } else {
                    self
                }
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                self != self
            }
            #[inline(always)]
            fn is_finite(self) -> bool {
                self - self == 0.0
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn from_usize(n: usize) -> Self {
                n as $t
            }
            #[inline(always)]
            fn div(self, o: Self) -> Self {
                self / o
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                $sqrt(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                $ln(self)
            }
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
            }
            #[inline(always)]
            fn sub(self, o: Self) -> Self {
                self - o
            }
            #[inline(always)]
            fn total_cmp(self, o: Self) -> Ordering {
                match (Acc::is_nan(self), Acc::is_nan(o)) {
                    (true, true) => Ordering::Equal,
                    (true, false) => Ordering::Greater,
                    (false, true) => Ordering::Less,
                    _ => self.partial_cmp(&o).unwrap_or(Ordering::Equal),
                }
            }
        }
    };
}
acc_float!(f32, libm::sqrtf, libm::logf, libm::expf);
acc_float!(f64, libm::sqrt, libm::log, libm::exp);

impl Acc for i128 {
    const ZERO: Self = 0;
    const ONE: Self = 1;
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        self.wrapping_add(o)
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        self.wrapping_mul(o)
    }
    #[inline(always)]
    fn abs(self) -> Self {
        self.wrapping_abs()
    }
    #[inline(always)]
    fn is_nan(self) -> bool {
        false
    }
    #[inline(always)]
    fn is_finite(self) -> bool {
        true
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn from_f64(v: f64) -> Self {
        v as i128
    }
    #[inline(always)]
    fn from_usize(n: usize) -> Self {
        n as i128
    }
    #[inline(always)]
    fn div(self, o: Self) -> Self {
        if o == 0 {
            0
        } else {
            self.wrapping_div(o)
        }
    }
    fn sqrt(self) -> Self {
        libm::sqrt(self as f64) as i128
    }
    fn ln(self) -> Self {
        libm::log(self as f64) as i128
    }
    fn exp(self) -> Self {
        libm::exp(self as f64) as i128
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        self.wrapping_sub(o)
    }
    #[inline(always)]
    fn total_cmp(self, o: Self) -> Ordering {
        self.cmp(&o)
    }
}

/// An element type the reductions handle, with its accumulator and its extreme values.
pub(crate) trait RElem: Elem + Copy {
    type A: Acc;
    fn to_a(self) -> Self::A;
    fn from_a(a: Self::A) -> Self;
    /// Identity of max (lowest value, -inf for floats).
    fn lowest() -> Self::A;
    /// Identity of min (highest value, +inf for floats).
    fn highest() -> Self::A;
}

impl RElem for f32 {
    type A = f32;
    #[inline(always)]
    fn to_a(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_a(a: f32) -> Self {
        a
    }
    fn lowest() -> f32 {
        f32::NEG_INFINITY
    }
    fn highest() -> f32 {
        f32::INFINITY
    }
}

impl RElem for f64 {
    type A = f64;
    #[inline(always)]
    fn to_a(self) -> f64 {
        self
    }
    #[inline(always)]
    fn from_a(a: f64) -> Self {
        a
    }
    fn lowest() -> f64 {
        f64::NEG_INFINITY
    }
    fn highest() -> f64 {
        f64::INFINITY
    }
}

macro_rules! relem_half {
    ($($t:ty),*) => {$(
        impl RElem for $t {
            type A = f32;
            #[inline(always)]
            fn to_a(self) -> f32 {
                self.to_f32()
            }
            #[inline(always)]
            fn from_a(a: f32) -> Self {
                <$t>::from_f32(a)
            }
            fn lowest() -> f32 {
                f32::NEG_INFINITY
            }
            fn highest() -> f32 {
                f32::INFINITY
            }
        }
    )*};
}
relem_half!(f16, bf16);

macro_rules! relem_int {
    ($($t:ty),*) => {$(
        impl RElem for $t {
            type A = i128;
            #[inline(always)]
            fn to_a(self) -> i128 {
                self as i128
            }
            #[inline(always)]
            fn from_a(a: i128) -> Self {
                a as $t
            }
            fn lowest() -> i128 {
                <$t>::MIN as i128
            }
            fn highest() -> i128 {
                <$t>::MAX as i128
            }
        }
    )*};
}
relem_int!(i8, i16, i32, i64, u8, u16, u32, u64);

impl RElem for bool {
    type A = i128;
    fn to_a(self) -> i128 {
        self as i128
    }
    fn from_a(a: i128) -> Self {
        a != 0
    }
    fn lowest() -> i128 {
        0
    }
    fn highest() -> i128 {
        1
    }
}

/// Calls `$body` with `$T` bound to an [`RElem`] type (numeric, f16, bf16, bool).
macro_rules! dispatch_red {
    ($dt:expr, $T:ident => $body:expr, else $other:expr) => {{
        let __dt: DataType = $dt;
        match __dt {
            DataType::Float => {
                type $T = f32;
                $body
            }
            DataType::Double => {
                type $T = f64;
                $body
            }
            DataType::Float16 => {
                type $T = f16;
                $body
            }
            DataType::Bfloat16 => {
                type $T = bf16;
                $body
            }
            DataType::Int8 => {
                type $T = i8;
                $body
            }
            DataType::Int16 => {
                type $T = i16;
                $body
            }
            DataType::Int32 => {
                type $T = i32;
                $body
            }
            DataType::Int64 => {
                type $T = i64;
                $body
            }
            DataType::Uint8 => {
                type $T = u8;
                $body
            }
            DataType::Uint16 => {
                type $T = u16;
                $body
            }
            DataType::Uint32 => {
                type $T = u32;
                $body
            }
            DataType::Uint64 => {
                type $T = u64;
                $body
            }
            DataType::Bool => {
                type $T = bool;
                $body
            }
            _ => $other,
        }
    }};
}

// ----------------------------------------------------------------------------- helpers

/// Boxes a closure as a kernel (fixes the closure's signature).
fn kernel<F>(f: F) -> Result<Box<dyn Kernel>>
where
    F: Fn(&KernelCx<'_>, &[Option<&Value>]) -> Result<Vec<Value>> + Send + Sync + 'static,
{
    Ok(Box::new(f))
}

fn prod(d: &[usize]) -> usize {
    d.iter().product()
}

/// `[outer, d, inner]` around axis `a`.
fn split_at_axis(shape: &[usize], a: usize) -> (usize, usize, usize) {
    (prod(&shape[..a]), shape[a], prod(&shape[a + 1..]))
}

/// The shape after reducing axis `a` (kept as 1 or dropped).
fn reduced_shape(shape: &[usize], a: usize, keepdims: bool) -> Vec<usize> {
    let mut s = shape.to_vec();
    if keepdims {
        s[a] = 1;
    } else {
        s.remove(a);
    }
    s
}

#[inline(always)]
fn max_nan<A: Acc>(a: A, b: A) -> A {
    if b > a || b.is_nan() {
        b
    } else {
        a
    }
}

#[inline(always)]
fn min_nan<A: Acc>(a: A, b: A) -> A {
    if b < a || b.is_nan() {
        b
    } else {
        a
    }
}

/// Folds `x` viewed as `[outer, r, inner]` over its middle axis: each output is
/// `merge(init, map(x_0), map(x_1), ...)`. Rows (`inner == 1`) run in 8 independent lanes so
/// the loop vectorises; inner blocks accumulate a whole contiguous row at a time.
#[inline(always)]
fn fold<T: RElem, M, G>(
    x: &[T],
    outer: usize,
    r: usize,
    inner: usize,
    init: T::A,
    map: M,
    merge: G,
) -> Vec<T::A>
where
    M: Fn(T::A) -> T::A,
    G: Fn(T::A, T::A) -> T::A,
{
    if r == 0 {
        return vec![init; outer * inner];
    }
    let mut out = Vec::with_capacity(outer * inner);
    if inner == 1 {
        for row in x.chunks_exact(r).take(outer) {
            let mut lanes = [init; 8];
            let mut it = row.chunks_exact(8);
            for c in &mut it {
                for l in 0..8 {
                    lanes[l] = merge(lanes[l], map(c[l].to_a()));
                }
            }
            let mut a = init;
            for &v in it.remainder() {
                a = merge(a, map(v.to_a()));
            }
            for l in lanes {
                a = merge(a, l);
            }
            out.push(a);
        }
    } else {
        let mut acc = vec![init; inner];
        for o in 0..outer {
            acc.fill(init);
            for k in 0..r {
                let row = &x[(o * r + k) * inner..(o * r + k + 1) * inner];
                for (a, &v) in acc.iter_mut().zip(row) {
                    *a = merge(*a, map(v.to_a()));
                }
            }
            out.extend_from_slice(&acc);
        }
    }
    out
}

// ----------------------------------------------------------------------------- Reduce*

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    SumSquare,
    L1,
    L2,
    LogSum,
    LogSumExp,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Sum => "ReduceSum",
            Op::Mean => "ReduceMean",
            Op::Max => "ReduceMax",
            Op::Min => "ReduceMin",
            Op::Prod => "ReduceProd",
            Op::SumSquare => "ReduceSumSquare",
            Op::L1 => "ReduceL1",
            Op::L2 => "ReduceL2",
            Op::LogSum => "ReduceLogSum",
            Op::LogSumExp => "ReduceLogSumExp",
        }
    }
}

fn build_sum(n: &Node) -> Result<Box<dyn Kernel>> {
    build_reduce(n, Op::Sum)
}
fn build_mean(n: &Node) -> Result<Box<dyn Kernel>> {
    build_reduce(n, Op::Mean)
}
fn build_max(n: &Node) -> Result<Box<dyn Kernel>> {
    build_reduce(n, Op::Max)
}
fn build_min(n: &Node) -> Result<Box<dyn Kernel>> {
    build_reduce(n, Op::Min)
}
fn build_prod(n: &Node) -> Result<Box<dyn Kernel>> {
    build_reduce(n, Op::Prod)
}
fn build_sum_square(n: &Node) -> Result<Box<dyn Kernel>> {
    build_reduce(n, Op::SumSquare)
}
fn build_l1(n: &Node) -> Result<Box<dyn Kernel>> {
    build_reduce(n, Op::L1)
}
fn build_l2(n: &Node) -> Result<Box<dyn Kernel>> {
    build_reduce(n, Op::L2)
}
fn build_log_sum(n: &Node) -> Result<Box<dyn Kernel>> {
    build_reduce(n, Op::LogSum)
}
fn build_log_sum_exp(n: &Node) -> Result<Box<dyn Kernel>> {
    build_reduce(n, Op::LogSumExp)
}

fn build_reduce(node: &Node, op: Op) -> Result<Box<dyn Kernel>> {
    let keepdims = node.get_i("keepdims", 1)? != 0;
    let noop = node.get_i("noop_with_empty_axes", 0)? != 0;
    // axes moved from an attribute to an input: ReduceSum at 13, the others at 18
    let from_input = node.opset >= if op == Op::Sum { 13 } else { 18 };
    let attr_axes = if from_input {
        None
    } else {
        node.attr_ints("axes")?
    };
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let axes = if from_input {
            opt_tensor_in(inputs, 1)?.map(ints_of).transpose()?
        } else {
            attr_axes.clone()
        };
        out1(reduce(x, op, axes.as_deref(), keepdims, noop)?)
    })
}

/// Reduces `x` over `axes` (none or empty: all axes, or none at all with `noop`).
fn reduce(x: &Tensor, op: Op, axes: Option<&[i64]>, keepdims: bool, noop: bool) -> Result<Tensor> {
    let shape = x.shape();
    let r = shape.len();
    let mut red = vec![false; r];
    match axes {
        Some(a) if !a.is_empty() => {
            for &ax in a {
                if r == 0 {
                    bail!("{}: axis {ax} is out of range for a scalar", op.name());
                }
                red[norm_axis(ax, r)?] = true;
            }
        }
        _ => {
            if !noop {
                red.fill(true);
            }
        }
    }
    let out_shape: Vec<usize> = if keepdims {
        shape
            .iter()
            .zip(&red)
            .map(|(&d, &rd)| if rd { 1 } else { d })
            .collect()
    } else {
        shape
            .iter()
            .zip(&red)
            .filter(|(_, &rd)| !rd)
            .map(|(&d, _)| d)
            .collect()
    };
    // [outer, r, inner] over the contiguous input when the reduced (non-unit) axes are one
    // block; otherwise move them to the end first
    let nu: Vec<usize> = (0..r).filter(|&i| shape[i] != 1).collect();
    let first = nu.iter().position(|&i| red[i]);
    let last = nu.iter().rposition(|&i| red[i]);
    let block = match (first, last) {
        (Some(f), Some(l)) => nu[f..=l].iter().all(|&i| red[i]),
        _ => true,
    };
    let (xt, outer, rr, inner) = if block {
        let (f, l) = match (first, last) {
            (Some(f), Some(l)) => (f, l + 1),
            _ => (nu.len(), nu.len()),
        };
        let dims = |s: &[usize]| s.iter().map(|&i| shape[i]).product::<usize>();
        (x.clone(), dims(&nu[..f]), dims(&nu[f..l]), dims(&nu[l..]))
    } else {
        let mut perm: Vec<usize> = (0..r).filter(|&i| !red[i]).collect();
        let kept = perm.len();
        perm.extend((0..r).filter(|&i| red[i]));
        let p = x.permute(&perm)?.contiguous()?;
        let outer = prod(&p.shape()[..kept]);
        let rr = prod(&p.shape()[kept..]);
        (p, outer, rr, 1)
    };
    let dt = x.dtype();
    if dt == DataType::Bool && !matches!(op, Op::Max | Op::Min) {
        return Err(bad_type(op.name(), dt));
    }
    dispatch_red!(dt, T => {
        let s = xt.as_slice::<T>()?;
        let v: Vec<T> = if op == Op::LogSumExp && !dt.is_float() {
            let f: Vec<f64> = s.iter().map(|v| v.to_a().to_f64()).collect();
            log_sum_exp(&f, outer, rr, inner)
                .into_iter()
                .map(|v| T::from_a(<<T as RElem>::A as Acc>::from_f64(v)))
                .collect()
        } else {
            reduce_t::<T>(&s, outer, rr, inner, op)?
        };
        Tensor::from_vec(&out_shape, v)
    }, else Err(bad_type(op.name(), dt)))
}

fn reduce_t<T: RElem>(x: &[T], outer: usize, r: usize, inner: usize, op: Op) -> Result<Vec<T>> {
    let add = |a: T::A, b: T::A| a.add(b);
    let id = |v: T::A| v;
    let zero = <T::A as Acc>::ZERO;
    let acc: Vec<T::A> = match op {
        Op::Sum | Op::Mean | Op::LogSum => fold(x, outer, r, inner, zero, id, add),
        Op::SumSquare | Op::L2 => fold(x, outer, r, inner, zero, |v: T::A| v.mul(v), add),
        Op::L1 => fold(x, outer, r, inner, zero, |v: T::A| v.abs(), add),
        Op::Prod => fold(x, outer, r, inner, <T::A as Acc>::ONE, id, |a: T::A, b| {
            a.mul(b)
        }),
        Op::Max => fold(x, outer, r, inner, T::lowest(), id, max_nan),
        Op::Min => fold(x, outer, r, inner, T::highest(), id, min_nan),
        Op::LogSumExp => return Ok(log_sum_exp(x, outer, r, inner)),
    };
    let integer = !T::DT.is_float();
    if r == 0 && integer && matches!(op, Op::Mean | Op::LogSum) {
        bail!("{} of an empty set is undefined for {}", op.name(), T::DT);
    }
    Ok(match op {
        Op::Mean => {
            let n = <T::A as Acc>::from_usize(r);
            acc.into_iter().map(|a| T::from_a(a.div(n))).collect()
        }
        Op::L2 => acc.into_iter().map(|a| T::from_a(a.sqrt())).collect(),
        Op::LogSum => acc.into_iter().map(|a| T::from_a(a.ln())).collect(),
        _ => acc.into_iter().map(T::from_a).collect(),
    })
}

/// `max + ln(sum(exp(x - max)))` over the middle axis of `[outer, r, inner]` (infinite or NaN
/// maxima pass through; the empty set gives -inf).
fn log_sum_exp<T: RElem>(x: &[T], outer: usize, r: usize, inner: usize) -> Vec<T> {
    let m = fold(x, outer, r, inner, T::lowest(), |v| v, max_nan);
    let zero = <T::A as Acc>::ZERO;
    let mut s = vec![zero; outer * inner];
    for o in 0..outer {
        for k in 0..r {
            let row = &x[(o * r + k) * inner..(o * r + k + 1) * inner];
            let mo = &m[o * inner..(o + 1) * inner];
            let so = &mut s[o * inner..(o + 1) * inner];
            for ((a, &v), &mx) in so.iter_mut().zip(row).zip(mo) {
                if mx.is_finite() {
                    *a = a.add(v.to_a().sub(mx).exp());
                }
            }
        }
    }
    m.into_iter()
        .zip(s)
        .map(|(mx, sum)| {
            if mx.is_finite() {
                T::from_a(mx.add(sum.ln()))
            } else {
                T::from_a(mx)
            }
        })
        .collect()
}

// ----------------------------------------------------------------------------- ArgMax/ArgMin

fn build_argmax(n: &Node) -> Result<Box<dyn Kernel>> {
    build_arg(n, true)
}
fn build_argmin(n: &Node) -> Result<Box<dyn Kernel>> {
    build_arg(n, false)
}

fn build_arg(node: &Node, max: bool) -> Result<Box<dyn Kernel>> {
    let axis = node.get_i("axis", 0)?;
    let keepdims = node.get_i("keepdims", 1)? != 0;
    let last = node.get_i("select_last_index", 0)? != 0;
    let name = if max { "ArgMax" } else { "ArgMin" };
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        if x.rank() == 0 {
            bail!("{name} input must have rank >= 1");
        }
        let a = norm_axis(axis, x.rank())?;
        let (outer, d, inner) = split_at_axis(x.shape(), a);
        if d == 0 {
            bail!("{name} over an empty axis");
        }
        let dt = x.dtype();
        if dt == DataType::Bool {
            return Err(bad_type(name, dt));
        }
        let idx = dispatch_red!(dt, T => arg_t::<T>(&x.as_slice::<T>()?, outer, d, inner, max, last),
            else return Err(bad_type(name, dt)));
        out1(Tensor::from_vec(
            &reduced_shape(x.shape(), a, keepdims),
            idx,
        )?)
    })
}

/// Index of the max (min) along the middle axis of `[outer, d, inner]`; NaN wins, ties go to
/// the first (or, with `last`, the last) occurrence.
fn arg_t<T: RElem>(
    x: &[T],
    outer: usize,
    d: usize,
    inner: usize,
    max: bool,
    last: bool,
) -> Vec<i64> {
    let better = |v: T::A, b: T::A| -> bool {
        if b.is_nan() {
            return last && v.is_nan();
        }
        if v.is_nan() {
            return true;
        }
        match (max, last) {
            (true, false) => v > b,
            (true, true) => v >= b,
            (false, false) => v < b,
            (false, true) => v <= b,
        }
    };
    let mut out = vec![0i64; outer * inner];
    let mut best: Vec<T::A> = Vec::with_capacity(inner);
    for o in 0..outer {
        let base = o * d * inner;
        best.clear();
        best.extend(x[base..base + inner].iter().map(|v| v.to_a()));
        let oi = &mut out[o * inner..(o + 1) * inner];
        for k in 1..d {
            let row = &x[base + k * inner..base + (k + 1) * inner];
            for ((b, i), &v) in best.iter_mut().zip(oi.iter_mut()).zip(row) {
                let v = v.to_a();
                if better(v, *b) {
                    *b = v;
                    *i = k as i64;
                }
            }
        }
    }
    out
}

// ----------------------------------------------------------------------------- CumSum

fn build_cumsum(node: &Node) -> Result<Box<dyn Kernel>> {
    let exclusive = node.get_i("exclusive", 0)? != 0;
    let reverse = node.get_i("reverse", 0)? != 0;
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let ax = tensor_in(inputs, 1)?.to_i64_vec()?;
        if ax.len() != 1 {
            bail!("CumSum axis must be a scalar");
        }
        if x.rank() == 0 {
            bail!("CumSum input must have rank >= 1");
        }
        let a = norm_axis(ax[0], x.rank())?;
        let (outer, d, inner) = split_at_axis(x.shape(), a);
        let dt = x.dtype();
        if dt == DataType::Bool {
            return Err(bad_type("CumSum", dt));
        }
        out1(dispatch_red!(dt, T => {
            let v = cumsum_t::<T>(&x.as_slice::<T>()?, outer, d, inner, exclusive, reverse);
            Tensor::from_vec(x.shape(), v)?
        }, else return Err(bad_type("CumSum", dt))))
    })
}

fn cumsum_t<T: RElem>(
    x: &[T],
    outer: usize,
    d: usize,
    inner: usize,
    exclusive: bool,
    reverse: bool,
) -> Vec<T> {
    let mut out = x.to_vec();
    let mut acc = vec![<T::A as Acc>::ZERO; inner];
    for o in 0..outer {
        acc.fill(<T::A as Acc>::ZERO);
        for k in 0..d {
            let k = if reverse { d - 1 - k } else { k };
            let b = (o * d + k) * inner;
            for ((a, y), &v) in acc
                .iter_mut()
                .zip(&mut out[b..b + inner])
                .zip(&x[b..b + inner])
            {
                if exclusive {
                    *y = T::from_a(*a);
                    *a = a.add(v.to_a());
                } else {
                    *a = a.add(v.to_a());
                    *y = T::from_a(*a);
                }
            }
        }
    }
    out
}

// ----------------------------------------------------------------------------- TopK

fn build_topk(node: &Node) -> Result<Box<dyn Kernel>> {
    let k_attr = if node.opset < 10 {
        match node.attr_i("k")? {
            Some(k) => Some(k),
            None => bail!("TopK needs a 'k' attribute before opset 10"),
        }
    } else {
        None
    };
    let axis = node.get_i("axis", -1)?;
    let largest = node.get_i("largest", 1)? != 0;
    // `sorted = 0` leaves the order unspecified: sorted output is conformant
    let sorted = node.get_i("sorted", 1)?;
    if sorted != 0 && sorted != 1 {
        unsupported!("TopK sorted={sorted} is not supported");
    }
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let k = match k_attr {
            Some(k) => k,
            None => {
                let k = tensor_in(inputs, 1)?.to_i64_vec()?;
                if k.len() != 1 {
                    bail!("TopK k must have one element");
                }
                k[0]
            }
        };
        if x.rank() == 0 {
            bail!("TopK input must have rank >= 1");
        }
        let a = norm_axis(axis, x.rank())?;
        let (outer, d, inner) = split_at_axis(x.shape(), a);
        if k < 0 || k as usize > d {
            bail!("TopK k={k} is out of range for a dimension of {d}");
        }
        let k = k as usize;
        let mut oshape = x.shape().to_vec();
        oshape[a] = k;
        let dt = x.dtype();
        if dt == DataType::Bool {
            return Err(bad_type("TopK", dt));
        }
        let (vals, idx) = dispatch_red!(dt, T => {
            let (v, i) = topk_t::<T>(&x.as_slice::<T>()?, outer, d, inner, k, largest);
            (Tensor::from_vec(&oshape, v)?, i)
        }, else return Err(bad_type("TopK", dt)));
        Ok(vec![
            Value::Tensor(vals),
            Value::Tensor(Tensor::from_vec(&oshape, idx)?),
        ])
    })
}

/// The `k` largest (smallest) along the middle axis of `[outer, d, inner]`, sorted, ties by
/// lower index; NaN counts as the largest value.
fn topk_t<T: RElem>(
    x: &[T],
    outer: usize,
    d: usize,
    inner: usize,
    k: usize,
    largest: bool,
) -> (Vec<T>, Vec<i64>) {
    let n = outer * k * inner;
    let mut vals: Vec<T> = Vec::with_capacity(n);
    let mut idxs: Vec<i64> = Vec::with_capacity(n);
    if n == 0 {
        return (vals, idxs);
    }
    vals.resize(n, x[0]);
    idxs.resize(n, 0);
    let mut lane: Vec<T::A> = vec![<T::A as Acc>::ZERO; d];
    let mut order: Vec<usize> = Vec::with_capacity(d);
    for o in 0..outer {
        for i in 0..inner {
            for (j, l) in lane.iter_mut().enumerate() {
                *l = x[(o * d + j) * inner + i].to_a();
            }
            let cmp = |&p: &usize, &q: &usize| -> Ordering {
                let c = lane[p].total_cmp(lane[q]);
                let c = if largest { c.reverse() } else { c };
                c.then(p.cmp(&q))
            };
            order.clear();
            order.extend(0..d);
            if k < d {
                order.select_nth_unstable_by(k - 1, cmp);
                order.truncate(k);
            }
            order.sort_unstable_by(cmp);
            for (j, &p) in order.iter().enumerate() {
                let t = (o * k + j) * inner + i;
                vals[t] = x[(o * d + p) * inner + i];
                idxs[t] = p as i64;
            }
        }
    }
    (vals, idxs)
}
