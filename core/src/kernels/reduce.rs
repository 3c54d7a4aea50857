//! Reduction kernels: ReduceSum/Mean/Max/Min/Prod/SumSquare/L1/L2/LogSum/LogSumExp, ArgMax/ArgMin, CumSum and TopK.

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;
use core::cmp::Ordering;

use half::{bf16, f16};

use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::Node;
use crate::kernels::shape::copy_strided;
use crate::kernels::types::{NUMERIC, NUMERIC_BOOL};
use crate::kernels::{bad_type, def, ints_of, norm_axis, opt_tensor_in, out1, tensor_in, LATEST};
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::tensor::{contiguous_strides, Elem, Tensor};
use crate::value::Value;
use crate::{bail, unsupported};

pub(crate) const KERNELS: &[KernelDef] = &[
    def("ReduceSum", 1, LATEST, build_sum).types(NUMERIC),
    def("ReduceMean", 1, LATEST, build_mean).types(NUMERIC),
    def("ReduceMax", 1, LATEST, build_max).types(NUMERIC_BOOL),
    def("ReduceMin", 1, LATEST, build_min).types(NUMERIC_BOOL),
    def("ReduceProd", 1, LATEST, build_prod).types(NUMERIC),
    def("ReduceSumSquare", 1, LATEST, build_sum_square).types(NUMERIC),
    def("ReduceL1", 1, LATEST, build_l1).types(NUMERIC),
    def("ReduceL2", 1, LATEST, build_l2).types(NUMERIC),
    def("ReduceLogSum", 1, LATEST, build_log_sum).types(NUMERIC),
    def("ReduceLogSumExp", 1, LATEST, build_log_sum_exp).types(NUMERIC),
    def("ArgMax", 1, LATEST, build_argmax).types(NUMERIC),
    def("ArgMin", 1, LATEST, build_argmin).types(NUMERIC),
    def("CumSum", 11, LATEST, build_cumsum).types(NUMERIC),
    def("CumProd", 26, LATEST, build_cumprod).types(NUMERIC),
    def("TopK", 1, LATEST, build_topk).types(NUMERIC),
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
        let p = permuted(x, &perm)?;
        let outer = prod(&p.shape()[..kept]);
        let rr = prod(&p.shape()[kept..]);
        (p, outer, rr, 1)
    };
    let dt = x.dtype();
    if dt == DataType::Bool && !matches!(op, Op::Max | Op::Min) {
        return Err(bad_type(op.name(), dt));
    }
    // f32 sums and means over contiguous rows: the SIMD layer's vector sum
    if dt == DataType::Float && inner == 1 && rr > 0 && matches!(op, Op::Sum | Op::Mean) {
        let s = xt.as_slice::<f32>()?;
        let v: Vec<f32> = s
            .chunks_exact(rr)
            .take(outer)
            .map(|row| {
                let t = crate::simd::sum(row);
                if op == Op::Mean {
                    t / rr as f32
                } else {
                    t
                }
            })
            .collect();
        return Tensor::from_vec(&out_shape, v);
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

/// A contiguous copy of `x` with its axes permuted.
fn permuted(x: &Tensor, perm: &[usize]) -> Result<Tensor> {
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape()[p]).collect();
    let cs = contiguous_strides(x.shape());
    let strides: Vec<isize> = perm.iter().map(|&p| cs[p]).collect();
    let dt = x.dtype();
    dispatch_red!(dt, T => {
        let v = copy_strided(&x.as_slice::<T>()?, &shape, &strides, 0)?;
        Tensor::from_vec(&shape, v)
    }, else Err(bad_type("Reduce", dt)))
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
    if inner == 1 {
        for (o, row) in x.chunks_exact(d).take(outer).enumerate() {
            let (mut b, mut bi) = (row[0].to_a(), 0);
            for (k, &v) in row.iter().enumerate().skip(1) {
                let v = v.to_a();
                if better(v, b) {
                    b = v;
                    bi = k;
                }
            }
            out[o] = bi as i64;
        }
        return out;
    }
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
    build_cumulative(node, "CumSum", false)
}

fn build_cumprod(node: &Node) -> Result<Box<dyn Kernel>> {
    build_cumulative(node, "CumProd", true)
}

/// CumSum (`product` false) and CumProd (`product` true).
fn build_cumulative(node: &Node, op: &'static str, product: bool) -> Result<Box<dyn Kernel>> {
    let exclusive = node.get_i("exclusive", 0)? != 0;
    let reverse = node.get_i("reverse", 0)? != 0;
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let ax = tensor_in(inputs, 1)?.to_i64_vec()?;
        if ax.len() != 1 {
            bail!("{op} axis must be a scalar");
        }
        if x.rank() == 0 {
            bail!("{op} input must have rank >= 1");
        }
        let a = norm_axis(ax[0], x.rank())?;
        let (outer, d, inner) = split_at_axis(x.shape(), a);
        let dt = x.dtype();
        if dt == DataType::Bool {
            return Err(bad_type(op, dt));
        }
        let shape = Cum {
            outer,
            d,
            inner,
            exclusive,
            reverse,
            product,
        };
        out1(dispatch_red!(dt, T => {
            let v = cumulative_t::<T>(&x.as_slice::<T>()?, shape);
            Tensor::from_vec(x.shape(), v)?
        }, else return Err(bad_type(op, dt))))
    })
}

/// How a cumulative sum or product runs over an `outer x d x inner` tensor.
#[derive(Clone, Copy)]
struct Cum {
    outer: usize,
    d: usize,
    inner: usize,
    exclusive: bool,
    reverse: bool,
    product: bool,
}

fn cumulative_t<T: RElem>(x: &[T], c: Cum) -> Vec<T> {
    let Cum {
        outer,
        d,
        inner,
        exclusive,
        reverse,
        product,
    } = c;
    let id = if product {
        <T::A as Acc>::ONE
    } else {
        <T::A as Acc>::ZERO
    };
    let step = |a: T::A, v: T::A| if product { a.mul(v) } else { a.add(v) };
    let mut out = x.to_vec();
    let mut acc = vec![id; inner];
    for o in 0..outer {
        acc.fill(id);
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
                    *a = step(*a, v.to_a());
                } else {
                    *a = step(*a, v.to_a());
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
            if k <= 16 && k < d {
                // keep the best k sorted; most candidates lose to the current k-th at once
                let beats = |v: T::A, w: T::A| {
                    let c = v.total_cmp(w);
                    if largest {
                        c == Ordering::Greater
                    } else {
                        c == Ordering::Less
                    }
                };
                for (j, &v) in lane.iter().enumerate() {
                    if order.len() == k {
                        if !beats(v, lane[order[k - 1]]) {
                            continue;
                        }
                        order.pop();
                    }
                    let pos = order
                        .iter()
                        .position(|&q| beats(v, lane[q]))
                        .unwrap_or(order.len());
                    order.insert(pos, j);
                }
            } else {
                order.extend(0..d);
                if k < d {
                    order.select_nth_unstable_by(k - 1, cmp);
                    order.truncate(k);
                }
                order.sort_unstable_by(cmp);
            }
            for (j, &p) in order.iter().enumerate() {
                let t = (o * k + j) * inner + i;
                vals[t] = x[(o * d + p) * inner + i];
                idxs[t] = p as i64;
            }
        }
    }
    (vals, idxs)
}

#[cfg(test)]
#[allow(clippy::excessive_precision)] // expected values pasted from numpy
mod tests {
    //! Expected values come from numpy / the ONNX reference implementation (pasted), or from
    //! closed-form sums.
    use super::*;
    use crate::ir::AttrValue;
    use crate::provider::ReferenceCpu;
    use alloc::string::{String, ToString};

    fn run_n(
        op: &str,
        opset: i64,
        attrs: Vec<(&str, AttrValue)>,
        inputs: Vec<Option<Tensor>>,
    ) -> Result<Vec<Tensor>> {
        let n = Node {
            name: "n".to_string(),
            op_type: op.to_string(),
            domain: String::new(),
            opset,
            inputs: Vec::new(),
            outputs: vec![Some(0), Some(1)],
            attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            implicit_inputs: Vec::new(),
        };
        let def = KERNELS
            .iter()
            .find(|d| d.op == op && opset >= d.since && opset <= d.until)
            .expect("kernel registered");
        let k = (def.build)(&n)?;
        let vals: Vec<Option<Value>> = inputs.into_iter().map(|t| t.map(Value::Tensor)).collect();
        let refs: Vec<Option<&Value>> = vals.iter().map(|v| v.as_ref()).collect();
        let out = k.compute(&KernelCx::new(&ReferenceCpu), &refs)?;
        out.into_iter().map(|v| v.into_tensor()).collect()
    }

    fn run(
        op: &str,
        opset: i64,
        attrs: Vec<(&str, AttrValue)>,
        inputs: Vec<Option<Tensor>>,
    ) -> Result<Tensor> {
        Ok(run_n(op, opset, attrs, inputs)?.remove(0))
    }

    fn f(shape: &[usize], v: &[f32]) -> Option<Tensor> {
        Some(Tensor::from_vec(shape, v.to_vec()).unwrap())
    }
    fn i(shape: &[usize], v: &[i64]) -> Option<Tensor> {
        Some(Tensor::from_vec(shape, v.to_vec()).unwrap())
    }
    fn fv(t: &Tensor) -> Vec<f32> {
        t.as_slice::<f32>().unwrap().into_owned()
    }
    fn iv(t: &Tensor) -> Vec<i64> {
        t.as_slice::<i64>().unwrap().into_owned()
    }
    fn close(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            let ok = g == w || (g - w).abs() <= 1e-5 * w.abs().max(1.0);
            assert!(ok, "{got:?} vs {want:?}");
        }
    }
    fn keep(k: i64) -> Vec<(&'static str, AttrValue)> {
        vec![("keepdims", AttrValue::Int(k))]
    }

    const A: [f32; 12] = [
        1.5, -2.0, 3.0, 0.25, 4.0, 5.5, -6.0, 7.0, 0.5, 0.0, -1.0, 2.0,
    ];

    #[test]
    fn reductions_match_numpy_on_both_layouts() {
        // numpy over axis=1 (rows) and axis=0 (inner blocks) of A.reshape(3, 4)
        let cases: [(&str, [f32; 3], [f32; 4]); 9] = [
            ("ReduceSum", [2.75, 10.5, 1.5], [6.0, 3.5, -4.0, 9.25]),
            (
                "ReduceMean",
                [0.6875, 2.625, 0.375],
                [2.0, 1.1666666, -1.3333334, 3.0833333],
            ),
            ("ReduceMax", [3.0, 7.0, 2.0], [4.0, 5.5, 3.0, 7.0]),
            ("ReduceMin", [-2.0, -6.0, -1.0], [0.5, -2.0, -6.0, 0.25]),
            ("ReduceProd", [-2.25, -924.0, -0.0], [3.0, -0.0, 18.0, 3.5]),
            (
                "ReduceSumSquare",
                [15.3125, 131.25, 5.25],
                [18.5, 34.25, 46.0, 53.0625],
            ),
            ("ReduceL1", [6.75, 22.5, 3.5], [6.0, 7.5, 10.0, 9.25]),
            (
                "ReduceL2",
                [3.9131191, 11.456439, 2.2912879],
                [4.3011627, 5.8523498, 6.7823300, 7.2844009],
            ),
            (
                "ReduceLogSumExp",
                [3.2575805, 7.2413130, 2.3423495],
                [4.1064138, 5.5046291, 3.0182712, 7.0078778],
            ),
        ];
        for (op, rows, cols) in cases {
            let y = run(op, 18, keep(0), vec![f(&[3, 4], &A), i(&[1], &[1])]).unwrap();
            assert_eq!(y.shape(), &[3], "{op}");
            close(&fv(&y), &rows);
            let y = run(op, 18, keep(1), vec![f(&[3, 4], &A), i(&[1], &[-2])]).unwrap();
            assert_eq!(y.shape(), &[1, 4], "{op}");
            close(&fv(&y), &cols);
        }
        // numpy: np.log(np.sum(np.abs(A) + 1, axis=1))
        let b: Vec<f32> = A.iter().map(|v| v.abs() + 1.0).collect();
        let y = run(
            "ReduceLogSum",
            18,
            keep(0),
            vec![f(&[3, 4], &b), i(&[1], &[1])],
        )
        .unwrap();
        close(&fv(&y), &[2.3749058, 3.2771447, 2.0149031]);
    }

    #[test]
    fn axes_attribute_versions_and_layouts() {
        let x: Vec<f32> = (0..24).map(|v| v as f32).collect();
        // numpy: np.arange(24).reshape(2,3,4).sum(axis=(0,2)) -> non-adjacent axes
        let y = run(
            "ReduceSum",
            13,
            keep(0),
            vec![f(&[2, 3, 4], &x), i(&[2], &[0, 2])],
        )
        .unwrap();
        assert_eq!(fv(&y), [60., 92., 124.]);
        let y = run(
            "ReduceSum",
            11,
            vec![("axes", AttrValue::Ints(vec![-1]))],
            vec![f(&[2, 3, 4], &x)],
        )
        .unwrap();
        assert_eq!(y.shape(), &[2, 3, 1]);
        assert_eq!(fv(&y), [6., 22., 38., 54., 70., 86.]);
        let y = run(
            "ReduceMean",
            13,
            vec![("axes", AttrValue::Ints(vec![0, 2]))],
            vec![f(&[2, 3, 4], &x)],
        )
        .unwrap();
        assert_eq!(y.shape(), &[1, 3, 1]);
        assert_eq!(fv(&y), [7.5, 11.5, 15.5]);
        // no axes: everything
        let y = run("ReduceMax", 18, keep(0), vec![f(&[2, 3, 4], &x)]).unwrap();
        assert_eq!((y.rank(), fv(&y)), (0, vec![23.]));
        // noop_with_empty_axes: reduce over nothing (numpy axis=())
        let noop = vec![("noop_with_empty_axes", AttrValue::Int(1))];
        let y = run(
            "ReduceSumSquare",
            18,
            noop.clone(),
            vec![f(&[3], &[1., -2., 3.])],
        )
        .unwrap();
        assert_eq!(fv(&y), [1., 4., 9.]);
        let y = run(
            "ReduceSum",
            13,
            noop,
            vec![f(&[3], &[1., -2., 3.]), i(&[0], &[])],
        )
        .unwrap();
        assert_eq!(fv(&y), [1., -2., 3.]);
        assert!(run(
            "ReduceSum",
            13,
            vec![],
            vec![f(&[3], &[1., 2., 3.]), i(&[1], &[1])]
        )
        .is_err());
    }

    #[test]
    fn empty_sets_give_identities() {
        let e = || Some(Tensor::zeros(DataType::Float, &[2, 0]).unwrap());
        let ax = || i(&[1], &[1]);
        let get = |op: &str| fv(&run(op, 18, keep(0), vec![e(), ax()]).unwrap());
        assert_eq!(get("ReduceSum"), [0., 0.]);
        assert_eq!(get("ReduceProd"), [1., 1.]);
        assert_eq!(get("ReduceMax"), [f32::NEG_INFINITY; 2]);
        assert_eq!(get("ReduceMin"), [f32::INFINITY; 2]);
        assert_eq!(get("ReduceL2"), [0., 0.]);
        assert_eq!(get("ReduceLogSum"), [f32::NEG_INFINITY; 2]);
        assert_eq!(get("ReduceLogSumExp"), [f32::NEG_INFINITY; 2]);
        assert!(get("ReduceMean").iter().all(|v| v.is_nan()));
        let ei = Some(Tensor::zeros(DataType::Int32, &[2, 0]).unwrap());
        let y = run("ReduceMax", 18, keep(0), vec![ei, ax()]).unwrap();
        assert_eq!(&*y.as_slice::<i32>().unwrap(), [i32::MIN; 2]);
    }

    #[test]
    fn log_sum_exp_infinities_and_long_rows() {
        let inf = f32::INFINITY;
        let x = f(&[3, 2], &[-inf, -inf, inf, 1.0, -inf, 0.0]);
        let y = run("ReduceLogSumExp", 18, keep(0), vec![x, i(&[1], &[1])]).unwrap();
        assert_eq!(fv(&y), [-inf, inf, 0.0]);
        // sum over i < 1000 of (i % 7) = 142 * 21 + (0+1+2+3+4+5) = 2997, per row
        let v: Vec<f32> = (0..3000).map(|k| ((k % 1000) % 7) as f32).collect();
        let y = run(
            "ReduceSum",
            13,
            keep(0),
            vec![f(&[3, 1000], &v), i(&[1], &[1])],
        )
        .unwrap();
        assert_eq!(fv(&y), [2997.; 3]);
    }

    #[test]
    fn integer_and_bool_reductions() {
        let x = Some(Tensor::from_vec(&[2, 3], vec![1i32, 2, 4, -7, 5, 3]).unwrap());
        let y = run("ReduceMean", 18, keep(0), vec![x.clone(), i(&[1], &[1])]).unwrap();
        assert_eq!(&*y.as_slice::<i32>().unwrap(), [2, 0]);
        let y = run("ReduceProd", 18, keep(0), vec![x.clone(), i(&[1], &[0])]).unwrap();
        assert_eq!(&*y.as_slice::<i32>().unwrap(), [-7, 10, 12]);
        let y = run("ReduceMin", 18, keep(0), vec![x, i(&[1], &[1])]).unwrap();
        assert_eq!(&*y.as_slice::<i32>().unwrap(), [1, -7]);
        let u = Some(Tensor::from_vec(&[2], vec![u64::MAX, 3]).unwrap());
        let y = run("ReduceMax", 18, keep(0), vec![u]).unwrap();
        assert_eq!(&*y.as_slice::<u64>().unwrap(), [u64::MAX]);
        let b = Some(Tensor::from_vec(&[2, 2], vec![true, false, false, false]).unwrap());
        let y = run("ReduceMax", 20, keep(0), vec![b.clone(), i(&[1], &[1])]).unwrap();
        assert_eq!(&*y.as_slice::<bool>().unwrap(), [true, false]);
        let y = run("ReduceMin", 20, keep(0), vec![b.clone(), i(&[1], &[0])]).unwrap();
        assert_eq!(&*y.as_slice::<bool>().unwrap(), [false, false]);
        assert!(run("ReduceSum", 13, keep(0), vec![b]).is_err());
    }

    #[test]
    fn argmax_argmin_ties_and_nan() {
        let nan = f32::NAN;
        let x = || f(&[2, 4], &[2., 5., 5., 1., nan, 3., nan, 0.]);
        let at = |axis: i64, last: i64| {
            vec![
                ("axis", AttrValue::Int(axis)),
                ("keepdims", AttrValue::Int(0)),
                ("select_last_index", AttrValue::Int(last)),
            ]
        };
        // numpy argmax/argmin (NaN wins, first occurrence); select_last on the flipped array
        assert_eq!(iv(&run("ArgMax", 13, at(1, 0), vec![x()]).unwrap()), [1, 0]);
        assert_eq!(iv(&run("ArgMax", 13, at(1, 1), vec![x()]).unwrap()), [2, 2]);
        assert_eq!(
            iv(&run("ArgMin", 13, at(-1, 0), vec![x()]).unwrap()),
            [3, 0]
        );
        let y = f(&[3, 2], &[1., 4., 3., 4., 3., 0.]);
        assert_eq!(
            iv(&run("ArgMax", 13, at(0, 0), vec![y.clone()]).unwrap()),
            [1, 0]
        );
        assert_eq!(
            iv(&run("ArgMax", 13, at(0, 1), vec![y.clone()]).unwrap()),
            [2, 1]
        );
        let k = run("ArgMin", 11, vec![], vec![y]).unwrap();
        assert_eq!((k.shape(), iv(&k)), (&[1usize, 2][..], vec![0, 2]));
    }

    #[test]
    fn cumsum_variants() {
        let x = Some(Tensor::from_vec(&[2, 3], vec![1f64, 2., 3., 4., 5., 6.]).unwrap());
        let at = vec![
            ("exclusive", AttrValue::Int(1)),
            ("reverse", AttrValue::Int(1)),
        ];
        let y = run("CumSum", 14, at, vec![x.clone(), i(&[], &[1])]).unwrap();
        assert_eq!(&*y.as_slice::<f64>().unwrap(), [5., 3., 0., 11., 6., 0.]);
        let ax = Some(Tensor::from_vec(&[], vec![0i32]).unwrap());
        let y = run("CumSum", 14, vec![], vec![x.clone(), ax]).unwrap();
        assert_eq!(&*y.as_slice::<f64>().unwrap(), [1., 2., 3., 5., 7., 9.]);
        assert!(run("CumSum", 14, vec![], vec![x, i(&[], &[2])]).is_err());
    }

    #[test]
    fn cumprod_variants() {
        // the spec's own example [1, 2, 3] in all four modes
        let x = Some(Tensor::from_vec(&[3], vec![1i32, 2, 3]).unwrap());
        let ax = || Some(Tensor::from_vec(&[], vec![0i64]).unwrap());
        let mode = |e: i64, r: i64| {
            vec![
                ("exclusive", AttrValue::Int(e)),
                ("reverse", AttrValue::Int(r)),
            ]
        };
        for (e, r, want) in [
            (0, 0, [1, 2, 6]),
            (1, 0, [1, 1, 2]),
            (0, 1, [6, 6, 3]),
            (1, 1, [6, 3, 1]),
        ] {
            let y = run("CumProd", 26, mode(e, r), vec![x.clone(), ax()]).unwrap();
            assert_eq!(&*y.as_slice::<i32>().unwrap(), want);
        }
        // along the last axis of a 2-D float tensor
        let x = Some(Tensor::from_vec(&[2, 2], vec![2f32, 3., 0.5, 4.]).unwrap());
        let y = run("CumProd", 26, vec![], vec![x, i(&[], &[-1])]).unwrap();
        assert_eq!(&*y.as_slice::<f32>().unwrap(), [2., 6., 0.5, 2.]);
    }

    #[test]
    fn topk_order_and_ties() {
        let x = || f(&[2, 4], &[3., 1., 3., 2., 0., 5., 5., -1.]);
        let ys = run_n("TopK", 11, vec![], vec![x(), i(&[1], &[2])]).unwrap();
        assert_eq!(fv(&ys[0]), [3., 3., 5., 5.]);
        assert_eq!(iv(&ys[1]), [0, 2, 1, 2]);
        let ys = run_n(
            "TopK",
            11,
            vec![("largest", AttrValue::Int(0))],
            vec![x(), i(&[1], &[3])],
        )
        .unwrap();
        assert_eq!(fv(&ys[0]), [1., 2., 3., -1., 0., 5.]);
        assert_eq!(iv(&ys[1]), [1, 3, 0, 3, 0, 1]);
        let ys = run_n(
            "TopK",
            1,
            vec![("k", AttrValue::Int(1)), ("axis", AttrValue::Int(0))],
            vec![x()],
        )
        .unwrap();
        assert_eq!(ys[0].shape(), &[1, 4]);
        assert_eq!(fv(&ys[0]), [3., 5., 5., 2.]);
        assert_eq!(iv(&ys[1]), [0, 1, 1, 0]);
        assert!(run_n("TopK", 11, vec![], vec![x(), i(&[1], &[5])]).is_err());
    }
}
