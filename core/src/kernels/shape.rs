//! Shape and data-movement kernels: views (Reshape, Squeeze, ...), copies (Transpose, Slice, Gather, Scatter, Pad, ...) and generators (Constant, Range, EyeLike, ...).

use alloc::borrow::Cow;
use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::cmp::Ordering;

use half::{bf16, f16};

use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::ir::Node;
use crate::kernels::types::{ALL, FLOATS, INTS, NUMERIC, NUMERIC_BOOL, PLAIN, UNPACKED};
use crate::kernels::{
    bad_type, broadcast_shapes, def, dims_of, ints_of, norm_axis, opt_tensor_in, out1, tensor_in,
    LATEST,
};
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::tensor::{contiguous_strides, numel, Data, Elem, Tensor};
use crate::value::Value;
use crate::{bail, unsupported};

pub(crate) const KERNELS: &[KernelDef] = &[
    def("Identity", 1, LATEST, build_identity).types(ALL),
    def("Reshape", 1, LATEST, build_reshape).types(ALL),
    def("Flatten", 1, LATEST, build_flatten).types(ALL),
    def("Squeeze", 1, LATEST, build_squeeze).types(ALL),
    def("Unsqueeze", 1, LATEST, build_unsqueeze).types(ALL),
    def("Shape", 1, LATEST, build_shape).types(ALL),
    def("Size", 1, LATEST, build_size).types(ALL),
    def("Transpose", 1, LATEST, build_transpose).types(UNPACKED),
    def("Concat", 1, LATEST, build_concat).types(UNPACKED),
    def("Split", 1, LATEST, build_split).types(UNPACKED),
    def("Slice", 1, LATEST, build_slice).types(UNPACKED),
    def("Gather", 1, LATEST, build_gather).types(UNPACKED),
    def("GatherElements", 11, LATEST, build_gather_elements).types(UNPACKED),
    def("GatherND", 11, LATEST, build_gather_nd).types(UNPACKED),
    // a reduction other than none needs numeric data; the kernel checks that
    def("ScatterElements", 11, LATEST, build_scatter_elements).types(UNPACKED),
    def("Scatter", 9, LATEST, build_scatter_elements).types(UNPACKED),
    def("ScatterND", 11, LATEST, build_scatter_nd).types(UNPACKED),
    def("Expand", 8, LATEST, build_expand).types(UNPACKED),
    def("Tile", 1, LATEST, build_tile).types(UNPACKED),
    // before opset 11 the pad value is a float attribute, cast to the data's numeric type
    def("Pad", 1, 10, build_pad).types(NUMERIC_BOOL),
    def("Pad", 11, LATEST, build_pad).types(UNPACKED),
    // input 0 is the shape; the output takes the value attribute's type, which may be any
    def("ConstantOfShape", 9, LATEST, build_constant_of_shape).types(INTS),
    def("Range", 11, LATEST, build_range).types(NUMERIC),
    // no inputs (types::UNDECLARED)
    def("Constant", 1, LATEST, build_constant),
    def("NonZero", 9, LATEST, build_nonzero).types(PLAIN),
    // the values (input 2) decide the output; indices and depth are read as integers
    def("OneHot", 9, LATEST, build_onehot).types_at(2, UNPACKED),
    def("Trilu", 14, LATEST, build_trilu).types(UNPACKED),
    // a dtype attribute, when given, is checked when the kernel is built
    def("EyeLike", 9, LATEST, build_eyelike).types(NUMERIC_BOOL),
    def("DepthToSpace", 1, LATEST, build_depth_to_space).types(UNPACKED),
    def("SpaceToDepth", 1, LATEST, build_space_to_depth).types(UNPACKED),
    def("ReverseSequence", 10, LATEST, build_reverse_sequence).types(UNPACKED),
    def("Compress", 9, LATEST, build_compress).types(UNPACKED),
    def("Unique", 11, LATEST, build_unique).types(PLAIN),
    // ONNX's types; only training mode computes, but inference mode is meant for them too
    def("Dropout", 1, LATEST, build_dropout).types(FLOATS),
];

// ----------------------------------------------------------------------------- element traits

/// An element data-movement kernels copy around: every typed element, plus fixed-width byte
/// blocks standing in for raw types (float8, complex).
pub(crate) trait Item: Clone + Send + Sync + 'static {
    /// The tensor's elements in row-major order.
    fn load(t: &Tensor) -> Result<Cow<'_, [Self]>>;
    /// A contiguous tensor of element type `dt` over `v`.
    fn store(dt: DataType, shape: &[usize], v: Vec<Self>) -> Result<Tensor>;
    /// The zero / empty / false element.
    fn zero() -> Self;
}

macro_rules! item_elem {
    ($($t:ty),*) => {$(
        impl Item for $t {
            #[inline]
            fn load(t: &Tensor) -> Result<Cow<'_, [Self]>> {
                t.as_slice::<$t>()
            }
            #[inline]
            fn store(_dt: DataType, shape: &[usize], v: Vec<Self>) -> Result<Tensor> {
                Tensor::from_vec(shape, v)
            }
            #[inline]
            fn zero() -> Self {
                <$t>::default()
            }
        }
    )*};
}
item_elem!(f32, f64, f16, bf16, i8, i16, i32, i64, u8, u16, u32, u64, bool, String);

macro_rules! item_bytes {
    ($($w:literal),*) => {$(
        impl Item for [u8; $w] {
            fn load(t: &Tensor) -> Result<Cow<'_, [Self]>> {
                let b = t.raw_bytes()?;
                if !t.is_contiguous() || b.len() != t.len() * $w {
                    bail!("strided views of {} tensors are not supported", t.dtype());
                }
                Ok(Cow::Owned(
                    b.chunks_exact($w)
                        .map(|c| {
                            let mut a = [0u8; $w];
                            a.copy_from_slice(c);
                            a
                        })
                        .collect(),
                ))
            }
            fn store(dt: DataType, shape: &[usize], v: Vec<Self>) -> Result<Tensor> {
                Tensor::from_data(dt, shape.to_vec(), Data::Raw(v.concat()))
            }
            fn zero() -> Self {
                [0u8; $w]
            }
        }
    )*};
}
item_bytes!(1, 8, 16);

/// Calls `$body` with `$T` bound to an [`Item`] type for `$dt`: the typed elements, and byte
/// blocks for raw types of 8, 64 and 128 bits (float8, complex). Packed sub-byte types go to
/// `$other`.
macro_rules! dispatch_item {
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
            DataType::String => {
                type $T = String;
                $body
            }
            d if d.bits() == 8 => {
                type $T = [u8; 1];
                $body
            }
            d if d.bits() == 64 => {
                type $T = [u8; 8];
                $body
            }
            d if d.bits() == 128 => {
                type $T = [u8; 16];
                $body
            }
            _ => $other,
        }
    }};
}

/// Numeric elements (and bool, as 0/1 with `add` = or, `mul` = and, like numpy).
pub(crate) trait Num: Item + Copy + PartialOrd {
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn from_i64(v: i64) -> Self;
    fn add(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
}

macro_rules! num_int {
    ($($t:ty),*) => {$(
        impl Num for $t {
            #[inline]
            fn from_f64(v: f64) -> Self { v as $t }
            #[inline]
            fn to_f64(self) -> f64 { self as f64 }
            #[inline]
            fn from_i64(v: i64) -> Self { v as $t }
            #[inline]
            fn add(self, o: Self) -> Self { self.wrapping_add(o) }
            #[inline]
            fn mul(self, o: Self) -> Self { self.wrapping_mul(o) }
        }
    )*};
}
num_int!(i8, i16, i32, i64, u8, u16, u32, u64);

macro_rules! num_float {
    ($($t:ty),*) => {$(
        impl Num for $t {
            #[inline]
            fn from_f64(v: f64) -> Self { v as $t }
            #[inline]
            fn to_f64(self) -> f64 { self as f64 }
            #[inline]
            fn from_i64(v: i64) -> Self { v as $t }
            #[inline]
            fn add(self, o: Self) -> Self { self + o }
            #[inline]
            fn mul(self, o: Self) -> Self { self * o }
        }
    )*};
}
num_float!(f32, f64);

macro_rules! num_half {
    ($($t:ty),*) => {$(
        impl Num for $t {
            #[inline]
            fn from_f64(v: f64) -> Self { <$t>::from_f64(v) }
            #[inline]
            fn to_f64(self) -> f64 { <$t>::to_f64(self) }
            #[inline]
            fn from_i64(v: i64) -> Self { <$t>::from_f64(v as f64) }
            #[inline]
            fn add(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() + o.to_f32()) }
            #[inline]
            fn mul(self, o: Self) -> Self { <$t>::from_f32(self.to_f32() * o.to_f32()) }
        }
    )*};
}
num_half!(f16, bf16);

impl Num for bool {
    fn from_f64(v: f64) -> Self {
        v != 0.0
    }
    fn to_f64(self) -> f64 {
        self as u8 as f64
    }
    fn from_i64(v: i64) -> Self {
        v != 0
    }
    fn add(self, o: Self) -> Self {
        self | o
    }
    fn mul(self, o: Self) -> Self {
        self & o
    }
}

/// Calls `$body` with `$T` bound to a [`Num`] type (numeric, f16, bf16, bool).
macro_rules! dispatch_num {
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

/// Typed elements with a truth value (non-zero, non-empty) and a total order (NaN last).
pub(crate) trait Plain: Item {
    fn truthy(&self) -> bool;
    fn total_cmp(&self, o: &Self) -> Ordering;
}

fn float_cmp(a: f64, b: f64) -> Ordering {
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        _ => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

macro_rules! plain_ord {
    ($($t:ty),*) => {$(
        impl Plain for $t {
            #[inline]
            fn truthy(&self) -> bool { *self != <$t>::default() }
            #[inline]
            fn total_cmp(&self, o: &Self) -> Ordering { self.cmp(o) }
        }
    )*};
}
plain_ord!(i8, i16, i32, i64, u8, u16, u32, u64, bool);

macro_rules! plain_float {
    ($($t:ty),*) => {$(
        impl Plain for $t {
            #[inline]
            fn truthy(&self) -> bool { Num::to_f64(*self) != 0.0 }
            #[inline]
            fn total_cmp(&self, o: &Self) -> Ordering { float_cmp(Num::to_f64(*self), Num::to_f64(*o)) }
        }
    )*};
}
plain_float!(f32, f64, f16, bf16);

impl Plain for String {
    fn truthy(&self) -> bool {
        !self.is_empty()
    }
    fn total_cmp(&self, o: &Self) -> Ordering {
        self.cmp(o)
    }
}

/// Calls `$body` with `$T` bound to a [`Plain`] type (every typed element, strings included).
macro_rules! dispatch_plain {
    ($dt:expr, $T:ident => $body:expr, else $other:expr) => {{
        let __dt: DataType = $dt;
        match __dt {
            DataType::String => { type $T = String; $body }
            d => dispatch_num!(d, $T => $body, else $other),
        }
    }};
}

// ----------------------------------------------------------------------------- generic helpers

/// Boxes a closure as a kernel (fixes the closure's signature).
fn kernel<F>(f: F) -> Result<Box<dyn Kernel>>
where
    F: Fn(&KernelCx<'_>, &[Option<&Value>]) -> Result<Vec<Value>> + Send + Sync + 'static,
{
    Ok(Box::new(f))
}

/// Clones an element (generic, so the dispatch macros' `Copy` types need no special case).
#[inline(always)]
fn cl<T: Clone>(v: &T) -> T {
    v.clone()
}

fn prod(d: &[usize]) -> usize {
    d.iter().product()
}

/// Resolves an axis that may also point one past the last dimension (`[-r-1, r]`).
fn norm_axis_incl(axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r + 1 } else { axis };
    if a < 0 || a > r {
        bail!("axis {axis} is out of range for rank {rank}");
    }
    Ok(a as usize)
}

/// A possibly negative index into a dimension of size `d`; out of range is an error.
#[inline]
fn wrap_index(i: i64, d: usize) -> Result<usize> {
    let di = d as i64;
    let j = if i < 0 { i + di } else { i };
    if j < 0 || j >= di {
        bail!("index {i} is out of range for a dimension of size {d}");
    }
    Ok(j as usize)
}

/// Reads an index tensor (int32/int64) as i64s.
fn index_values(t: &Tensor) -> Result<Vec<i64>> {
    match t.dtype() {
        DataType::Int64 | DataType::Int32 => t.to_i64_vec(),
        dt => bail!("indices must be int32 or int64, got {dt}"),
    }
}

/// Reads a one-element tensor as an i64.
fn scalar_i64(t: &Tensor, what: &str) -> Result<i64> {
    let v = t.to_i64_vec()?;
    if v.len() != 1 {
        bail!("{what} must have exactly one element, has {}", v.len());
    }
    Ok(v[0])
}

fn unsupported_type(op: &str, dt: DataType) -> Result<Tensor> {
    Err(bad_type(op, dt))
}

/// The axes of a strided view as (extent, stride) pairs: unit axes dropped, and an axis merged
/// into the one before it when the two are contiguous.
fn coalesce(shape: &[usize], strides: &[isize]) -> Vec<(usize, isize)> {
    let mut dims: Vec<(usize, isize)> = Vec::with_capacity(shape.len());
    for (&d, &s) in shape.iter().zip(strides) {
        if d == 1 {
            continue;
        }
        if let Some(last) = dims.last_mut() {
            if last.1 == s * d as isize {
                last.0 *= d;
                last.1 = s;
                continue;
            }
        }
        dims.push((d, s));
    }
    dims
}

/// Whether [`copy_strided`] takes its tiled transpose path for these (coalesced) axes: the
/// index of the outer axis that reads with unit stride.
fn tiled_axis(dims: &[(usize, isize)]) -> Option<usize> {
    let &(ld, ls) = dims.last()?;
    if ls == 1 || ls == 0 || ld < 8 {
        return None;
    }
    dims[..dims.len() - 1]
        .iter()
        .position(|&(d, s)| s == 1 && d >= 8)
}

/// Calls `run(base, stride)` for each innermost run (of `dims.last().0` elements) of the
/// view, in row-major order; `dims` is not empty.
#[inline(always)]
fn for_each_run(dims: &[(usize, isize)], offset: isize, mut run: impl FnMut(usize, isize)) {
    let ls = dims[dims.len() - 1].1;
    let outer = &dims[..dims.len() - 1];
    let mut idx = vec![0usize; outer.len()];
    let mut base = offset;
    loop {
        run(base as usize, ls);
        let mut ax = outer.len();
        loop {
            if ax == 0 {
                return;
            }
            ax -= 1;
            idx[ax] += 1;
            base += outer[ax].1;
            if idx[ax] < outer[ax].0 {
                break;
            }
            base -= outer[ax].1 * outer[ax].0 as isize;
            idx[ax] = 0;
        }
    }
}

/// Row-major copy of the strided view (`shape`, `strides`, `offset`, in elements) of `src`.
/// Merges contiguous dimensions, copies unit-stride runs with `extend_from_slice`, and tiles
/// transposes so that both sides stay in cache.
pub(crate) fn copy_strided<T: Clone>(
    src: &[T],
    shape: &[usize],
    strides: &[isize],
    offset: isize,
) -> Result<Vec<T>> {
    let n = prod(shape);
    if n == 0 {
        return Ok(Vec::new());
    }
    let dims = coalesce(shape, strides);
    if !core::mem::needs_drop::<T>() && !dims.is_empty() {
        if let Some(a) = tiled_axis(&dims) {
            return copy_tiled(src, &dims, a, offset, n);
        }
    }
    let mut out = crate::governor::try_with_capacity(n)?;
    if dims.is_empty() {
        out.push(src[offset as usize].clone());
        return Ok(out);
    }
    let ld = dims[dims.len() - 1].0;
    for_each_run(&dims, offset, |b, ls| {
        if ls == 1 {
            out.extend_from_slice(&src[b..b + ld]);
        } else if ls == 0 {
            out.extend(core::iter::repeat_n(&src[b], ld).cloned());
        } else {
            let mut p = b as isize;
            for _ in 0..ld {
                out.push(src[p as usize].clone());
                p += ls;
            }
        }
    });
    Ok(out)
}

/// [`copy_strided`] into `out` (the view's length), except for views that take the tiled
/// transpose path: `false` for those, and `out` is untouched.
fn copy_strided_into<T: Copy>(
    src: &[T],
    shape: &[usize],
    strides: &[isize],
    offset: isize,
    out: &mut [T],
) -> bool {
    let dims = coalesce(shape, strides);
    if out.is_empty() {
        return true;
    }
    if dims.is_empty() {
        out[0] = src[offset as usize];
        return true;
    }
    if tiled_axis(&dims).is_some() {
        return false;
    }
    let ld = dims[dims.len() - 1].0;
    let mut pos = 0;
    for_each_run(&dims, offset, |b, ls| {
        let dst = &mut out[pos..pos + ld];
        if ls == 1 {
            dst.copy_from_slice(&src[b..b + ld]);
        } else if ls == 0 {
            dst.fill(src[b]);
        } else {
            let mut p = b as isize;
            for d in dst.iter_mut() {
                *d = src[p as usize];
                p += ls;
            }
        }
        pos += ld;
    });
    true
}

/// The view copied into output 0's planned arena region (or a heap buffer outside planned
/// runs), so that a data-movement kernel's result never costs a fresh allocation per run;
/// `None` where the copy takes the tiled transpose path.
fn view_into<T: Elem + Copy>(
    cx: &KernelCx<'_>,
    x: &Tensor,
    shape: &[usize],
    strides: &[isize],
    offset: isize,
) -> Result<Option<Tensor>> {
    let src = x.as_slice::<T>()?;
    if tiled_axis(&coalesce(shape, strides)).is_some() {
        return Ok(None);
    }
    let mut o = cx.output::<T>(0, shape)?;
    let done = copy_strided_into(&src, shape, strides, offset, &mut o);
    debug_assert!(done);
    Ok(Some(o.into_tensor()))
}

/// The tiled path of [`copy_strided`]: `dims[a]` has source stride 1, the last dim does not.
fn copy_tiled<T: Clone>(
    src: &[T],
    dims: &[(usize, isize)],
    a: usize,
    offset: isize,
    n: usize,
) -> Result<Vec<T>> {
    const B: usize = 16;
    let r = dims.len();
    let mut ostr = vec![0usize; r];
    let mut acc = 1usize;
    for i in (0..r).rev() {
        ostr[i] = acc;
        acc *= dims[i].0;
    }
    let mut out: Vec<T> = crate::governor::try_with_capacity(n)?;
    out.resize(n, src[offset as usize].clone());
    let (da, oa) = (dims[a].0, ostr[a]);
    let (ld, ls) = dims[r - 1];
    // the other outer dims: (size, source stride, output stride)
    let others: Vec<(usize, isize, usize)> = (0..r - 1)
        .filter(|&i| i != a)
        .map(|i| (dims[i].0, dims[i].1, ostr[i]))
        .collect();
    let mut idx = vec![0usize; others.len()];
    let (mut sb, mut ob) = (offset, 0usize);
    loop {
        let mut i0 = 0;
        while i0 < da {
            let i1 = (i0 + B).min(da);
            let mut j0 = 0;
            while j0 < ld {
                let j1 = (j0 + B).min(ld);
                for i in i0..i1 {
                    let orow = ob + i * oa;
                    let srow = sb + i as isize;
                    for j in j0..j1 {
                        out[orow + j] = src[(srow + j as isize * ls) as usize].clone();
                    }
                }
                j0 = j1;
            }
            i0 = i1;
        }
        let mut ax = others.len();
        loop {
            if ax == 0 {
                return Ok(out);
            }
            ax -= 1;
            let (d, s, o) = others[ax];
            idx[ax] += 1;
            sb += s;
            ob += o;
            if idx[ax] < d {
                break;
            }
            sb -= s * d as isize;
            ob -= o * d;
            idx[ax] = 0;
        }
    }
}

/// Copies the view of `x` given by `shape`/`strides`/`offset` over its row-major elements.
fn view_copy(
    cx: Option<&KernelCx<'_>>,
    op: &str,
    x: &Tensor,
    shape: &[usize],
    strides: &[isize],
    offset: isize,
) -> Result<Tensor> {
    if prod(shape) == 0 {
        return Tensor::zeros(x.dtype(), shape);
    }
    let dt = x.dtype();
    if let Some(cx) = cx {
        let t = match dt {
            DataType::Float => view_into::<f32>(cx, x, shape, strides, offset)?,
            DataType::Int64 => view_into::<i64>(cx, x, shape, strides, offset)?,
            DataType::Int32 => view_into::<i32>(cx, x, shape, strides, offset)?,
            DataType::Double => view_into::<f64>(cx, x, shape, strides, offset)?,
            _ => None,
        };
        if let Some(t) = t {
            return Ok(t);
        }
    }
    // the copy's memory is leased first: a view can be far larger than its source (Expand
    // and Tile to sizes read from data)
    let bytes = dt
        .storage_bytes(numel(shape)?)
        .ok_or_else(|| Error::Shape(alloc::format!("{op}: the bytes of {shape:?} overflow")))?;
    let lease = match cx {
        Some(cx) => cx.lease_output(bytes)?,
        None => Some(alloc::sync::Arc::new(crate::governor::Lease::take(
            None,
            crate::governor::Tier::Host,
            crate::governor::Holder::Outputs,
            bytes,
            &|| crate::governor::KERNEL.into(),
        )?)),
    };
    let mut t = dispatch_item!(dt, T => {
        let src = T::load(x)?;
        T::store(dt, shape, copy_strided(&src, shape, strides, offset)?)
    }, else unsupported_type(op, dt))?;
    t.set_lease(lease);
    Ok(t)
}

/// Row-major copy of `x` with its axes permuted (`out[i] = in[perm[i]]`).
fn permute_copy(cx: Option<&KernelCx<'_>>, op: &str, x: &Tensor, perm: &[usize]) -> Result<Tensor> {
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape()[p]).collect();
    // a permutation that keeps the order of the non-unit dims is only a reshape
    let order: Vec<usize> = perm
        .iter()
        .copied()
        .filter(|&p| x.shape()[p] != 1)
        .collect();
    if order.windows(2).all(|w| w[0] < w[1]) {
        return x.reshape(&shape);
    }
    let cs = contiguous_strides(x.shape());
    let strides: Vec<isize> = perm.iter().map(|&p| cs[p]).collect();
    view_copy(cx, op, x, &shape, &strides, 0)
}

/// Strides that broadcast a contiguous `from` shape to `to` (zero on broadcast dims).
fn broadcast_strides(from: &[usize], to: &[usize]) -> Result<Vec<isize>> {
    if from.len() > to.len() {
        bail!("cannot broadcast {from:?} to {to:?}");
    }
    let cs = contiguous_strides(from);
    let pad = to.len() - from.len();
    let mut s = vec![0isize; to.len()];
    for i in 0..from.len() {
        if from[i] == to[pad + i] {
            s[pad + i] = cs[i];
        } else if from[i] != 1 {
            bail!("cannot broadcast {from:?} to {to:?}");
        }
    }
    Ok(s)
}

/// For every position of `shape` in row-major order, the offset `sum(i_k * strides[k])` over
/// all dims but `skip`.
fn offsets_except(shape: &[usize], strides: &[usize], skip: usize) -> Vec<usize> {
    let n = prod(shape);
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let r = shape.len();
    let mut idx = vec![0usize; r];
    let mut base = 0usize;
    for _ in 0..n {
        out.push(base);
        let mut ax = r;
        while ax > 0 {
            ax -= 1;
            idx[ax] += 1;
            if ax != skip {
                base += strides[ax];
            }
            if idx[ax] < shape[ax] {
                break;
            }
            if ax != skip {
                base -= strides[ax] * shape[ax];
            }
            idx[ax] = 0;
        }
    }
    out
}

// ----------------------------------------------------------------------------- views

fn build_identity(_node: &Node) -> Result<Box<dyn Kernel>> {
    kernel(|_cx, inputs| match inputs.first().copied().flatten() {
        Some(v) => Ok(vec![v.clone()]),
        None => bail!("Identity needs an input"),
    })
}

/// Resolves an ONNX reshape target (0 copies a dim unless `allowzero`, -1 is inferred).
pub fn reshape_dims(input: &[usize], spec: &[i64], allowzero: bool) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(spec.len());
    let mut infer = None;
    for (i, &d) in spec.iter().enumerate() {
        match d {
            -1 => {
                if infer.is_some() {
                    bail!("reshape target {spec:?} has more than one -1");
                }
                infer = Some(i);
                out.push(1);
            }
            0 if !allowzero => match input.get(i) {
                Some(&v) => out.push(v),
                None => {
                    bail!("reshape target {spec:?} copies dim {i} of {input:?}, which is absent")
                }
            },
            d if d < 0 => bail!("reshape target {spec:?} has a negative dim"),
            d => out.push(d as usize),
        }
    }
    let total = numel(input)?;
    if let Some(i) = infer {
        let known = numel(&out)?;
        if known == 0 || total % known != 0 {
            bail!("cannot reshape {input:?} to {spec:?}");
        }
        out[i] = total / known;
    }
    if numel(&out)? != total {
        bail!("cannot reshape {input:?} ({total} elements) to {spec:?}");
    }
    Ok(out)
}

fn build_reshape(node: &Node) -> Result<Box<dyn Kernel>> {
    if node.opset < 5 {
        let Some(spec) = node.attr_ints("shape")? else {
            bail!("Reshape-1 needs a 'shape' attribute");
        };
        return kernel(move |_cx, inputs| {
            let x = tensor_in(inputs, 0)?;
            out1(x.reshape(&reshape_dims(x.shape(), &spec, false)?)?)
        });
    }
    let allowzero = node.get_i("allowzero", 0)? != 0;
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let spec = ints_of(tensor_in(inputs, 1)?)?;
        out1(x.reshape(&reshape_dims(x.shape(), &spec, allowzero)?)?)
    })
}

fn build_flatten(node: &Node) -> Result<Box<dyn Kernel>> {
    let axis = node.get_i("axis", 1)?;
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let r = x.rank();
        let a = if axis < 0 { axis + r as i64 } else { axis };
        if a < 0 || a > r as i64 {
            bail!("Flatten axis {axis} is out of range for rank {r}");
        }
        let a = a as usize;
        out1(x.reshape(&[prod(&x.shape()[..a]), prod(&x.shape()[a..])])?)
    })
}

fn squeeze_shape(shape: &[usize], axes: Option<&[i64]>) -> Result<Vec<usize>> {
    match axes {
        None => Ok(shape.iter().copied().filter(|&d| d != 1).collect()),
        Some(axes) => {
            let mut drop = vec![false; shape.len()];
            for &a in axes {
                let i = norm_axis(a, shape.len())?;
                if i >= shape.len() || shape[i] != 1 {
                    bail!("cannot squeeze axis {a} of shape {shape:?}");
                }
                drop[i] = true;
            }
            Ok(shape
                .iter()
                .zip(&drop)
                .filter(|(_, &d)| !d)
                .map(|(&s, _)| s)
                .collect())
        }
    }
}

fn build_squeeze(node: &Node) -> Result<Box<dyn Kernel>> {
    let from_input = node.opset >= 13;
    let attr = if from_input {
        None
    } else {
        node.attr_ints("axes")?
    };
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let axes = if from_input {
            opt_tensor_in(inputs, 1)?.map(ints_of).transpose()?
        } else {
            attr.clone()
        };
        out1(x.reshape(&squeeze_shape(x.shape(), axes.as_deref())?)?)
    })
}

fn unsqueeze_shape(shape: &[usize], axes: &[i64]) -> Result<Vec<usize>> {
    let r = shape.len() + axes.len();
    let mut ins = vec![false; r];
    for &a in axes {
        let i = norm_axis(a, r)?;
        if ins[i] {
            bail!("Unsqueeze axes {axes:?} repeat an axis");
        }
        ins[i] = true;
    }
    let mut src = shape.iter();
    Ok(ins
        .iter()
        .map(|&new| if new { 1 } else { *src.next().unwrap_or(&1) })
        .collect())
}

fn build_unsqueeze(node: &Node) -> Result<Box<dyn Kernel>> {
    let from_input = node.opset >= 13;
    let attr = if from_input {
        None
    } else {
        match node.attr_ints("axes")? {
            Some(a) => Some(a),
            None => bail!("Unsqueeze needs an 'axes' attribute before opset 13"),
        }
    };
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let axes = match &attr {
            Some(a) => a.clone(),
            None => ints_of(tensor_in(inputs, 1)?)?,
        };
        out1(x.reshape(&unsqueeze_shape(x.shape(), &axes)?)?)
    })
}

fn build_shape(node: &Node) -> Result<Box<dyn Kernel>> {
    let start = node.get_i("start", 0)?;
    let end = node.attr_i("end")?;
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let r = x.rank() as i64;
        let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
        let s = clamp(start);
        let e = clamp(end.unwrap_or(r));
        let dims: Vec<i64> = if s < e {
            x.shape()[s..e].iter().map(|&d| d as i64).collect()
        } else {
            Vec::new()
        };
        out1(Tensor::from_vec(&[dims.len()], dims)?)
    })
}

fn build_size(_node: &Node) -> Result<Box<dyn Kernel>> {
    kernel(|_cx, inputs| out1(Tensor::scalar(tensor_in(inputs, 0)?.len() as i64)))
}

// ----------------------------------------------------------------------------- copies

fn build_transpose(node: &Node) -> Result<Box<dyn Kernel>> {
    let perm = node.attr_ints("perm")?;
    kernel(move |cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let r = x.rank();
        let p: Vec<usize> = match &perm {
            Some(p) => {
                if p.len() != r {
                    bail!("Transpose perm {p:?} does not match rank {r}");
                }
                let mut seen = vec![false; r];
                for &a in p {
                    if a < 0 || a as usize >= r || seen[a as usize] {
                        bail!("Transpose perm {p:?} is not a permutation");
                    }
                    seen[a as usize] = true;
                }
                p.iter().map(|&a| a as usize).collect()
            }
            None => (0..r).rev().collect(),
        };
        out1(permute_copy(Some(cx), "Transpose", x, &p)?)
    })
}

fn build_concat(node: &Node) -> Result<Box<dyn Kernel>> {
    let axis = match node.attr_i("axis")? {
        Some(a) => a,
        None if node.opset < 4 => 1,
        None => bail!("Concat needs an 'axis' attribute"),
    };
    kernel(move |cx, inputs| {
        let xs: Vec<&Tensor> = (0..inputs.len())
            .map(|i| tensor_in(inputs, i))
            .collect::<Result<_>>()?;
        out1(concat(Some(cx), &xs, axis)?)
    })
}

/// Concatenates tensors along `axis` (all of one element type, same dims elsewhere).
pub(crate) fn concat(cx: Option<&KernelCx<'_>>, xs: &[&Tensor], axis: i64) -> Result<Tensor> {
    let Some(first) = xs.first() else {
        bail!("Concat needs at least one input");
    };
    let r = first.rank();
    if r == 0 {
        bail!("Concat inputs must have rank >= 1");
    }
    let a = norm_axis(axis, r)?;
    let dt = first.dtype();
    let mut shape = first.shape().to_vec();
    shape[a] = 0;
    for x in xs {
        if x.dtype() != dt || x.rank() != r {
            bail!("Concat inputs differ in element type or rank");
        }
        for i in 0..r {
            if i != a && x.shape()[i] != shape[i] {
                bail!(
                    "Concat inputs {:?} and {:?} differ outside axis {a}",
                    first.shape(),
                    x.shape()
                );
            }
        }
        shape[a] += x.shape()[a];
    }
    if xs.len() == 1 {
        return Ok((*first).clone());
    }
    if numel(&shape)? == 0 {
        return Tensor::zeros(dt, &shape);
    }
    if let Some(cx) = cx {
        match dt {
            DataType::Float => return concat_into::<f32>(cx, xs, &shape, a),
            DataType::Int64 => return concat_into::<i64>(cx, xs, &shape, a),
            DataType::Int32 => return concat_into::<i32>(cx, xs, &shape, a),
            DataType::Double => return concat_into::<f64>(cx, xs, &shape, a),
            _ => {}
        }
    }
    dispatch_item!(dt, T => {
        let srcs: Vec<Cow<'_, [T]>> = xs.iter().map(|x| T::load(x)).collect::<Result<_>>()?;
        let outer = prod(&shape[..a]);
        let inner = prod(&shape[a + 1..]);
        let mut out = Vec::with_capacity(numel(&shape)?);
        for o in 0..outer {
            for (s, x) in srcs.iter().zip(xs) {
                let blk = x.shape()[a] * inner;
                out.extend_from_slice(&s[o * blk..(o + 1) * blk]);
            }
        }
        T::store(dt, &shape, out)
    }, else unsupported_type("Concat", dt))
}

/// [`concat`] of plain element types into output 0's planned arena region (or a heap buffer
/// outside planned runs).
fn concat_into<T: Elem + Copy>(
    cx: &KernelCx<'_>,
    xs: &[&Tensor],
    shape: &[usize],
    a: usize,
) -> Result<Tensor> {
    let srcs: Vec<Cow<'_, [T]>> = xs
        .iter()
        .map(|x| x.as_slice::<T>())
        .collect::<Result<_>>()?;
    let outer = prod(&shape[..a]);
    let inner = prod(&shape[a + 1..]);
    let mut out = cx.output::<T>(0, shape)?;
    let mut pos = 0;
    for o in 0..outer {
        for (s, x) in srcs.iter().zip(xs) {
            let blk = x.shape()[a] * inner;
            out[pos..pos + blk].copy_from_slice(&s[o * blk..(o + 1) * blk]);
            pos += blk;
        }
    }
    Ok(out.into_tensor())
}

fn build_split(node: &Node) -> Result<Box<dyn Kernel>> {
    let axis = node.get_i("axis", 0)?;
    let n_out = node.outputs.len();
    let opset = node.opset;
    let attr_split = if opset < 13 {
        node.attr_ints("split")?
    } else {
        None
    };
    let num_outputs = if opset >= 18 {
        node.attr_i("num_outputs")?
    } else {
        None
    };
    if let Some(n) = num_outputs {
        if n < 1 || n as usize != n_out {
            bail!("Split num_outputs={n} does not match the node's {n_out} outputs");
        }
    }
    // opset 1 took the split as an optional second input; opset 13 made it an input for good
    let split_input = !(2..13).contains(&opset);
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let a = norm_axis(axis, x.rank())?;
        if x.rank() == 0 {
            bail!("Split input must have rank >= 1");
        }
        let d = x.shape()[a];
        let given = match (split_input, opt_tensor_in(inputs, 1)?) {
            (true, Some(t)) => Some(ints_of(t)?),
            _ => attr_split.clone(),
        };
        let sizes: Vec<usize> = match given {
            Some(s) => {
                let s = dims_of(&s)?;
                if s.len() != n_out || s.iter().sum::<usize>() != d {
                    bail!("Split sizes {s:?} do not cut a dim of {d} into {n_out} outputs");
                }
                s
            }
            None if num_outputs.is_some() => {
                let c = d.div_ceil(n_out);
                if c * (n_out - 1) > d {
                    bail!("cannot split a dim of {d} into {n_out} outputs");
                }
                let mut s = vec![c; n_out];
                s[n_out - 1] = d - c * (n_out - 1);
                s
            }
            None => {
                if n_out == 0 || d % n_out != 0 {
                    bail!("cannot split a dim of {d} evenly into {n_out} outputs");
                }
                vec![d / n_out; n_out]
            }
        };
        split(x, a, &sizes)
    })
}

/// `x` cut along axis `a` into pieces of `sizes` (which sum to its dim), as contiguous copies.
pub(crate) fn split(x: &Tensor, a: usize, sizes: &[usize]) -> Result<Vec<Value>> {
    let dt = x.dtype();
    let shape = x.shape();
    let (outer, d, inner) = (prod(&shape[..a]), shape[a], prod(&shape[a + 1..]));
    let mut res = Vec::with_capacity(sizes.len());
    if x.is_empty() {
        for &s in sizes {
            let mut sh = shape.to_vec();
            sh[a] = s;
            res.push(Value::Tensor(Tensor::zeros(dt, &sh)?));
        }
        return Ok(res);
    }
    dispatch_item!(dt, T => {
        let src = T::load(x)?;
        let mut off = 0;
        for &s in sizes {
            let mut v = Vec::with_capacity(outer * s * inner);
            for o in 0..outer {
                let b = (o * d + off) * inner;
                v.extend_from_slice(&src[b..b + s * inner]);
            }
            let mut sh = shape.to_vec();
            sh[a] = s;
            res.push(Value::Tensor(T::store(dt, &sh, v)?));
            off += s;
        }
        Ok(res)
    }, else Err(bad_type("Split", dt)))
}

/// Output shape, strides and offset (over the contiguous input) of an ONNX Slice.
fn slice_plan(
    shape: &[usize],
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> Result<(Vec<usize>, Vec<isize>, isize)> {
    let r = shape.len();
    let n = starts.len();
    if ends.len() != n || axes.is_some_and(|a| a.len() != n) || steps.is_some_and(|s| s.len() != n)
    {
        bail!("Slice starts, ends, axes and steps differ in length");
    }
    let cs = contiguous_strides(shape);
    let mut out = shape.to_vec();
    let mut strides = cs.clone();
    let mut offset = 0isize;
    let mut seen = vec![false; r];
    for i in 0..n {
        let a = match axes {
            Some(ax) => norm_axis(ax[i], r)?,
            None => i,
        };
        if a >= r || seen[a] {
            bail!("Slice axes are out of range or repeated");
        }
        seen[a] = true;
        let step = steps.map_or(1, |s| s[i]) as i128;
        if step == 0 {
            bail!("Slice step cannot be 0");
        }
        let d = shape[a] as i128;
        let mut s = starts[i] as i128;
        let mut e = ends[i] as i128;
        if s < 0 {
            s += d;
        }
        if e < 0 {
            e += d;
        }
        let (s, len) = if d == 0 {
            (0, 0)
        } else if step > 0 {
            let s = s.clamp(0, d);
            let e = e.clamp(0, d);
            (s, if e > s { (e - s + step - 1) / step } else { 0 })
        } else {
            let s = s.clamp(0, d - 1);
            let e = e.clamp(-1, d - 1);
            (s, if s > e { (s - e - step - 1) / -step } else { 0 })
        };
        out[a] = len as usize;
        if len > 0 {
            offset += s as isize * cs[a];
        }
        strides[a] = cs[a] * step as isize;
    }
    Ok((out, strides, offset))
}

fn build_slice(node: &Node) -> Result<Box<dyn Kernel>> {
    if node.opset < 10 {
        let (Some(starts), Some(ends)) = (node.attr_ints("starts")?, node.attr_ints("ends")?)
        else {
            bail!("Slice-1 needs 'starts' and 'ends' attributes");
        };
        let axes = node.attr_ints("axes")?;
        return kernel(move |cx, inputs| {
            let x = tensor_in(inputs, 0)?;
            out1(slice(Some(cx), x, &starts, &ends, axes.as_deref(), None)?)
        });
    }
    kernel(|cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let starts = ints_of(tensor_in(inputs, 1)?)?;
        let ends = ints_of(tensor_in(inputs, 2)?)?;
        let axes = opt_tensor_in(inputs, 3)?.map(ints_of).transpose()?;
        let steps = opt_tensor_in(inputs, 4)?.map(ints_of).transpose()?;
        out1(slice(
            Some(cx),
            x,
            &starts,
            &ends,
            axes.as_deref(),
            steps.as_deref(),
        )?)
    })
}

fn slice(
    cx: Option<&KernelCx<'_>>,
    x: &Tensor,
    starts: &[i64],
    ends: &[i64],
    axes: Option<&[i64]>,
    steps: Option<&[i64]>,
) -> Result<Tensor> {
    let (shape, strides, offset) = slice_plan(x.shape(), starts, ends, axes, steps)?;
    if shape == x.shape() && strides == contiguous_strides(x.shape()) {
        return Ok(x.clone());
    }
    view_copy(cx, "Slice", x, &shape, &strides, offset)
}

fn build_gather(node: &Node) -> Result<Box<dyn Kernel>> {
    let axis = node.get_i("axis", 0)?;
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let ind = tensor_in(inputs, 1)?;
        if x.rank() == 0 {
            bail!("Gather data must have rank >= 1");
        }
        let a = norm_axis(axis, x.rank())?;
        let d = x.shape()[a];
        let idx: Vec<usize> = index_values(ind)?
            .into_iter()
            .map(|i| wrap_index(i, d))
            .collect::<Result<_>>()?;
        out1(gather(x, a, &idx, ind.shape())?)
    })
}

/// Takes the slices `idx` (already in range) of `x` along axis `a`; `ishape` is the shape the
/// indices contribute to the output.
fn gather(x: &Tensor, a: usize, idx: &[usize], ishape: &[usize]) -> Result<Tensor> {
    let shape = x.shape();
    let (outer, d, inner) = (prod(&shape[..a]), shape[a], prod(&shape[a + 1..]));
    let mut oshape = shape[..a].to_vec();
    oshape.extend_from_slice(ishape);
    oshape.extend_from_slice(&shape[a + 1..]);
    let dt = x.dtype();
    if numel(&oshape)? == 0 {
        return Tensor::zeros(dt, &oshape);
    }
    dispatch_item!(dt, T => {
        let src = T::load(x)?;
        let mut out = Vec::with_capacity(outer * idx.len() * inner);
        for o in 0..outer {
            let row = &src[o * d * inner..(o + 1) * d * inner];
            if inner == 1 {
                out.extend(idx.iter().map(|&i| cl(&row[i])));
            } else {
                for &i in idx {
                    out.extend_from_slice(&row[i * inner..(i + 1) * inner]);
                }
            }
        }
        T::store(dt, &oshape, out)
    }, else unsupported_type("Gather", dt))
}

/// Checks GatherElements/ScatterElements shapes and returns, for every index position, the
/// data offset of its target element.
fn element_targets(data: &[usize], ishape: &[usize], ind: &[i64], a: usize) -> Result<Vec<usize>> {
    if ishape.len() != data.len() {
        bail!("indices {ishape:?} and data {data:?} differ in rank");
    }
    for (i, (&n, &d)) in ishape.iter().zip(data).enumerate() {
        if i != a && n > d {
            bail!("indices {ishape:?} exceed data {data:?} on axis {i}");
        }
    }
    let ds: Vec<usize> = contiguous_strides(data)
        .iter()
        .map(|&s| s as usize)
        .collect();
    let mut offs = offsets_except(ishape, &ds, a);
    for (o, &i) in offs.iter_mut().zip(ind) {
        *o += wrap_index(i, data[a])? * ds[a];
    }
    Ok(offs)
}

fn build_gather_elements(node: &Node) -> Result<Box<dyn Kernel>> {
    let axis = node.get_i("axis", 0)?;
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let ind = tensor_in(inputs, 1)?;
        if x.rank() == 0 {
            bail!("GatherElements data must have rank >= 1");
        }
        let a = norm_axis(axis, x.rank())?;
        let offs = element_targets(x.shape(), ind.shape(), &index_values(ind)?, a)?;
        let dt = x.dtype();
        if offs.is_empty() {
            return out1(Tensor::zeros(dt, ind.shape())?);
        }
        out1(dispatch_item!(dt, T => {
            let src = T::load(x)?;
            T::store(dt, ind.shape(), offs.iter().map(|&o| cl(&src[o])).collect())
        }, else unsupported_type("GatherElements", dt))?)
    })
}

fn build_gather_nd(node: &Node) -> Result<Box<dyn Kernel>> {
    let b = node.get_i("batch_dims", 0)?;
    if b < 0 {
        bail!("GatherND batch_dims must be >= 0");
    }
    let b = b as usize;
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let ind = tensor_in(inputs, 1)?;
        let (offs, slice, oshape) = nd_targets(x.shape(), ind.shape(), &index_values(ind)?, b)?;
        let dt = x.dtype();
        if numel(&oshape)? == 0 {
            return out1(Tensor::zeros(dt, &oshape)?);
        }
        out1(dispatch_item!(dt, T => {
            let src = T::load(x)?;
            let mut out = Vec::with_capacity(offs.len() * slice);
            for &o in &offs {
                out.extend_from_slice(&src[o..o + slice]);
            }
            T::store(dt, &oshape, out)
        }, else unsupported_type("GatherND", dt))?)
    })
}

/// GatherND/ScatterND addressing: the data offset of every index tuple, the size of the slice
/// each one addresses, and the gathered (= updates) shape.
fn nd_targets(
    data: &[usize],
    ishape: &[usize],
    ind: &[i64],
    b: usize,
) -> Result<(Vec<usize>, usize, Vec<usize>)> {
    let r = data.len();
    let q = ishape.len();
    if q == 0 || r == 0 {
        bail!("GatherND/ScatterND data and indices must have rank >= 1");
    }
    let k = ishape[q - 1];
    if b >= q || b + k > r {
        bail!("indices {ishape:?} (batch_dims {b}) do not fit data {data:?}");
    }
    if data[..b] != ishape[..b] {
        bail!("batch dims of data {data:?} and indices {ishape:?} differ");
    }
    let cs = contiguous_strides(data);
    let batch = prod(&data[..b]);
    let bstride = prod(&data[b..]);
    let per = prod(&ishape[b..q - 1]);
    let slice = prod(&data[b + k..]);
    let mut offs = Vec::with_capacity(batch * per);
    for bi in 0..batch {
        for j in 0..per {
            let t = (bi * per + j) * k;
            let mut off = bi * bstride;
            for m in 0..k {
                off += wrap_index(ind[t + m], data[b + m])? * cs[b + m] as usize;
            }
            offs.push(off);
        }
    }
    let mut oshape = ishape[..q - 1].to_vec();
    oshape.extend_from_slice(&data[b + k..]);
    Ok((offs, slice, oshape))
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Reduction {
    None,
    Add,
    Mul,
    Max,
    Min,
}

fn reduction_attr(node: &Node) -> Result<Reduction> {
    Ok(match node.get_s("reduction", "none")?.as_str() {
        "none" => Reduction::None,
        "add" => Reduction::Add,
        "mul" => Reduction::Mul,
        "max" => Reduction::Max,
        "min" => Reduction::Min,
        r => unsupported!("reduction '{r}' is not supported"),
    })
}

/// True for values unequal to themselves (NaN).
#[allow(clippy::eq_op)]
#[inline]
fn is_nan<T: PartialEq>(v: &T) -> bool {
    v != v
}

#[inline]
fn reduce_into<T: Num>(red: Reduction, a: &mut T, b: T) {
    *a = match red {
        Reduction::None => b,
        Reduction::Add => a.add(b),
        Reduction::Mul => a.mul(b),
        Reduction::Max => {
            if b > *a || is_nan(&b) {
                b
            } else {
                *a
            }
        }
        Reduction::Min => {
            if b < *a || is_nan(&b) {
                b
            } else {
                *a
            }
        }
    }
}

/// Writes `upd[j*slice..][..slice]` into `data[offs[j]..][..slice]` for every j, combining
/// with `red`.
fn scatter_into(
    op: &str,
    x: &Tensor,
    upd: &Tensor,
    offs: &[usize],
    slice: usize,
    red: Reduction,
) -> Result<Tensor> {
    let dt = x.dtype();
    if upd.dtype() != dt {
        bail!("{op} updates are {}, data is {dt}", upd.dtype());
    }
    if upd.len() != offs.len() * slice {
        bail!("{op} updates {:?} do not match the indices", upd.shape());
    }
    if red == Reduction::None {
        return dispatch_item!(dt, T => {
            let mut out = T::load(x)?.into_owned();
            let u = T::load(upd)?;
            for (j, &o) in offs.iter().enumerate() {
                out[o..o + slice].clone_from_slice(&u[j * slice..(j + 1) * slice]);
            }
            T::store(dt, x.shape(), out)
        }, else unsupported_type(op, dt));
    }
    if dt == DataType::Bool {
        unsupported!("{op} with a reduction does not support bool");
    }
    dispatch_num!(dt, T => {
        let mut out = T::load(x)?.into_owned();
        let u = T::load(upd)?;
        for (j, &o) in offs.iter().enumerate() {
            for (a, &b) in out[o..o + slice].iter_mut().zip(&u[j * slice..(j + 1) * slice]) {
                reduce_into(red, a, b);
            }
        }
        T::store(dt, x.shape(), out)
    }, else unsupported_type(op, dt))
}

fn build_scatter_elements(node: &Node) -> Result<Box<dyn Kernel>> {
    let axis = node.get_i("axis", 0)?;
    let red = reduction_attr(node)?;
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let ind = tensor_in(inputs, 1)?;
        let upd = tensor_in(inputs, 2)?;
        if x.rank() == 0 {
            bail!("ScatterElements data must have rank >= 1");
        }
        if upd.shape() != ind.shape() {
            bail!(
                "ScatterElements updates {:?} and indices {:?} differ",
                upd.shape(),
                ind.shape()
            );
        }
        let a = norm_axis(axis, x.rank())?;
        let offs = element_targets(x.shape(), ind.shape(), &index_values(ind)?, a)?;
        out1(scatter_into("ScatterElements", x, upd, &offs, 1, red)?)
    })
}

fn build_scatter_nd(node: &Node) -> Result<Box<dyn Kernel>> {
    let red = reduction_attr(node)?;
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let ind = tensor_in(inputs, 1)?;
        let upd = tensor_in(inputs, 2)?;
        let (offs, slice, ushape) = nd_targets(x.shape(), ind.shape(), &index_values(ind)?, 0)?;
        if upd.shape() != ushape.as_slice() {
            bail!(
                "ScatterND updates {:?} should have shape {ushape:?}",
                upd.shape()
            );
        }
        out1(scatter_into("ScatterND", x, upd, &offs, slice, red)?)
    })
}

fn build_expand(_node: &Node) -> Result<Box<dyn Kernel>> {
    kernel(|cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let target = dims_of(&ints_of(tensor_in(inputs, 1)?)?)?;
        let shape = broadcast_shapes(x.shape(), &target)?;
        numel(&shape)?;
        if shape == x.shape() {
            return out1(x.clone());
        }
        let strides = broadcast_strides(x.shape(), &shape)?;
        out1(view_copy(Some(cx), "Expand", x, &shape, &strides, 0)?)
    })
}

fn build_tile(node: &Node) -> Result<Box<dyn Kernel>> {
    let v1 = node.opset < 6;
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let r = x.rank();
        let reps: Vec<usize> = if v1 {
            let tiles = scalar_i64(tensor_in(inputs, 1)?, "Tile tiles")?;
            let axis = norm_axis(scalar_i64(tensor_in(inputs, 2)?, "Tile axis")?, r)?;
            let mut reps = vec![1usize; r];
            reps[axis] = dims_of(&[tiles])?[0];
            reps
        } else {
            dims_of(&ints_of(tensor_in(inputs, 1)?)?)?
        };
        if reps.len() != r {
            bail!("Tile repeats {reps:?} do not match rank {r}");
        }
        out1(tile(x, &reps)?)
    })
}

/// Tiles `x`: output `[r0*d0, r1*d1, ...]` read as `[r0, d0, r1, d1, ...]` with zero strides
/// on the repeat dims.
fn tile(x: &Tensor, reps: &[usize]) -> Result<Tensor> {
    let cs = contiguous_strides(x.shape());
    let mut vshape = Vec::with_capacity(2 * reps.len());
    let mut vstr = Vec::with_capacity(2 * reps.len());
    let mut oshape = Vec::with_capacity(reps.len());
    for i in 0..reps.len() {
        vshape.push(reps[i]);
        vstr.push(0);
        vshape.push(x.shape()[i]);
        vstr.push(cs[i]);
        oshape.push(
            reps[i]
                .checked_mul(x.shape()[i])
                .ok_or_else(|| Error::Shape("Tile output is too large".into()))?,
        );
    }
    numel(&oshape)?;
    if reps.iter().all(|&r| r == 1) {
        return Ok(x.clone());
    }
    view_copy(None, "Tile", x, &vshape, &vstr, 0)?.reshape(&oshape)
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum PadMode {
    Constant,
    Reflect,
    Edge,
    Wrap,
}

fn build_pad(node: &Node) -> Result<Box<dyn Kernel>> {
    let mode = match node.get_s("mode", "constant")?.as_str() {
        "constant" => PadMode::Constant,
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        "wrap" => PadMode::Wrap,
        m => unsupported!("Pad mode '{m}' is not supported"),
    };
    if node.opset < 11 {
        let name = if node.opset < 2 { "paddings" } else { "pads" };
        let Some(pads) = node.attr_ints(name)? else {
            bail!("Pad needs a '{name}' attribute before opset 11");
        };
        let value = node.get_f("value", 0.0)? as f64;
        return kernel(move |cx, inputs| {
            let x = tensor_in(inputs, 0)?;
            let dt = x.dtype();
            out1(
                dispatch_num!(dt, T => pad_t::<T>(cx, x, &pads, mode, T::from_f64(value)),
                else unsupported_type("Pad", dt))?,
            )
        });
    }
    kernel(move |cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let r = x.rank();
        let raw = ints_of(tensor_in(inputs, 1)?)?;
        let cval = opt_tensor_in(inputs, 2)?.filter(|t| !t.is_empty());
        let pads = match opt_tensor_in(inputs, 3)? {
            None => raw,
            Some(axes) => {
                let axes = ints_of(axes)?;
                let n = axes.len();
                if raw.len() != 2 * n {
                    bail!("Pad has {} pads for {n} axes", raw.len());
                }
                let mut full = vec![0i64; 2 * r];
                for (i, &a) in axes.iter().enumerate() {
                    let a = norm_axis(a, r)?;
                    full[a] = raw[i];
                    full[r + a] = raw[n + i];
                }
                full
            }
        };
        let dt = x.dtype();
        out1(dispatch_item!(dt, T => {
            let c = match cval {
                Some(c) => cl(&T::load(c)?[0]),
                None => T::zero(),
            };
            pad_t::<T>(cx, x, &pads, mode, c)
        }, else unsupported_type("Pad", dt))?)
    })
}

/// The uncropped range and the output length of one padded axis: `(lo, cd, pb, out)` with
/// `lo` the first source index kept, `cd` the count kept, `pb` the zero-or-more leading pads.
/// Checked arithmetic: absurd pads are an error, never an overflow.
fn pad_axis(d: usize, pb: i64, pe: i64, mode: PadMode) -> Result<(i64, i64, i64, usize)> {
    let too_big = || Error::Shape(alloc::format!("Pad of {pb} and {pe} around {d} overflows"));
    let d = i64::try_from(d).map_err(|_| too_big())?;
    // negative pads crop first
    let lo = pb.checked_neg().ok_or_else(too_big)?.max(0);
    let hi = d
        .checked_sub(pe.checked_neg().ok_or_else(too_big)?.max(0))
        .ok_or_else(too_big)?;
    let cd = hi.checked_sub(lo).ok_or_else(too_big)?;
    if cd < 0 {
        bail!("Pad crops more than the dimension of {d}");
    }
    let (pb, pe) = (pb.max(0), pe.max(0));
    let out = cd
        .checked_add(pb)
        .and_then(|o| o.checked_add(pe))
        .ok_or_else(too_big)?;
    if out > 0 && cd == 0 && mode != PadMode::Constant {
        bail!("Pad mode {mode:?} cannot pad an empty dimension");
    }
    Ok((lo, cd, pb, usize::try_from(out).map_err(|_| too_big())?))
}

/// Source index along one axis for each output position (`None`: the constant), for the
/// geometry [`pad_axis`] checked.
fn pad_axis_map(
    (lo, cd, pb, out): (i64, i64, i64, usize),
    mode: PadMode,
) -> Result<Vec<Option<usize>>> {
    let mut m = crate::governor::try_with_capacity(out)?;
    m.extend((0..out as i64).map(|o| {
        let j = o - pb;
        let k = if (0..cd).contains(&j) {
            j
        } else {
            match mode {
                PadMode::Constant => return None,
                PadMode::Edge => j.clamp(0, cd - 1),
                PadMode::Wrap => j.rem_euclid(cd),
                PadMode::Reflect => {
                    if cd == 1 {
                        0
                    } else {
                        let p = 2 * (cd - 1);
                        let m = j.rem_euclid(p);
                        if m >= cd {
                            p - m
                        } else {
                            m
                        }
                    }
                }
            }
        };
        Some((lo + k) as usize)
    }));
    Ok(m)
}

fn push_mapped<T: Clone>(out: &mut Vec<T>, src: &[T], b: usize, map: &[Option<usize>], c: &T) {
    out.extend(map.iter().map(|m| match m {
        Some(s) => src[b + s].clone(),
        None => c.clone(),
    }));
}

fn pad_t<T: Item>(
    cx: &KernelCx<'_>,
    x: &Tensor,
    pads: &[i64],
    mode: PadMode,
    cval: T,
) -> Result<Tensor> {
    let shape = x.shape();
    let r = shape.len();
    if pads.len() != 2 * r {
        bail!("Pad has {} pads for rank {r}", pads.len());
    }
    let axes: Vec<_> = (0..r)
        .map(|i| pad_axis(shape[i], pads[i], pads[r + i], mode))
        .collect::<Result<_>>()?;
    let oshape: Vec<usize> = axes.iter().map(|a| a.3).collect();
    let n = numel(&oshape)?;
    let dt = x.dtype();
    if r == 0 {
        return Ok(x.clone());
    }
    // the output's memory is leased before anything is built (every axis map is at most `n`
    // long once `n > 0`)
    let lease = cx.lease_output(n.saturating_mul(core::mem::size_of::<T>()))?;
    let mut out = crate::governor::try_with_capacity(n)?;
    let maps: Vec<Vec<Option<usize>>> = if n > 0 {
        axes.iter()
            .map(|&a| pad_axis_map(a, mode))
            .collect::<Result<_>>()?
    } else {
        Vec::new()
    };
    if n > 0 {
        let src = T::load(x)?;
        let cs = contiguous_strides(shape);
        let last = &maps[r - 1];
        // the run of the last axis that copies a contiguous source range
        let run = last.iter().position(|m| m.is_some()).map(|s| {
            let mut e = s + 1;
            while e < last.len() && last[e].is_some() && last[e] == last[e - 1].map(|v| v + 1) {
                e += 1;
            }
            (s, e)
        });
        let outer = &oshape[..r - 1];
        let mut idx = vec![0usize; r - 1];
        let rows = prod(outer);
        for _ in 0..rows {
            let mut base = Some(0usize);
            for (ax, &i) in idx.iter().enumerate() {
                base = match (base, maps[ax][i]) {
                    (Some(b), Some(s)) => Some(b + s * cs[ax] as usize),
                    _ => None,
                };
            }
            match base {
                None => out.extend(core::iter::repeat_n(&cval, last.len()).cloned()),
                Some(b) => {
                    let (s, e) = run.unwrap_or((last.len(), last.len()));
                    push_mapped(&mut out, &src, b, &last[..s], &cval);
                    if e > s {
                        let s0 = b + last[s].unwrap_or(0);
                        out.extend_from_slice(&src[s0..s0 + (e - s)]);
                    }
                    push_mapped(&mut out, &src, b, &last[e..], &cval);
                }
            }
            let mut ax = r - 1;
            while ax > 0 {
                ax -= 1;
                idx[ax] += 1;
                if idx[ax] < outer[ax] {
                    break;
                }
                idx[ax] = 0;
            }
        }
    }
    let mut t = T::store(dt, &oshape, out)?;
    t.set_lease(lease);
    Ok(t)
}

// ----------------------------------------------------------------------------- generators

fn build_constant_of_shape(node: &Node) -> Result<Box<dyn Kernel>> {
    let value = match node.attr_t("value")? {
        Some(v) => {
            if v.len() != 1 {
                bail!("ConstantOfShape value must have one element");
            }
            v.clone()
        }
        None => Tensor::scalar(0f32),
    };
    kernel(move |cx, inputs| {
        let shape = dims_of(&ints_of(tensor_in(inputs, 0)?)?)?;
        out1(fill(cx, &value, &shape)?)
    })
}

/// `n` copies of `e`, in memory leased from `cx` first (an error, not an abort, when the shape
/// is absurd); the lease goes on the tensor `store` makes of them.
fn filled<T: Clone>(
    cx: &KernelCx<'_>,
    e: T,
    n: usize,
    store: impl FnOnce(Vec<T>) -> Result<Tensor>,
) -> Result<Tensor> {
    let lease = cx.lease_output(n.saturating_mul(core::mem::size_of::<T>()))?;
    let mut v = crate::governor::try_with_capacity(n)?;
    v.resize(n, e);
    let mut t = store(v)?;
    t.set_lease(lease);
    Ok(t)
}

/// A tensor of `shape` filled with the single element of `v`.
fn fill(cx: &KernelCx<'_>, v: &Tensor, shape: &[usize]) -> Result<Tensor> {
    let n = numel(shape)?;
    let dt = v.dtype();
    if dt.is_sub_byte() {
        let bits = dt.bits();
        let e = v.raw_bytes()?.first().copied().unwrap_or(0) & ((1u8 << bits) - 1);
        let pat = if bits == 4 { e | (e << 4) } else { e * 0x55 };
        let len = dt
            .storage_bytes(n)
            .ok_or_else(|| Error::Shape(alloc::format!("the bytes of {shape:?} overflow")))?;
        let mut bytes = crate::governor::try_with_capacity(len)?;
        bytes.resize(len, pat);
        let tail = (n * bits) % 8;
        if let (Some(l), true) = (bytes.last_mut(), tail != 0) {
            *l &= (1u8 << tail) - 1;
        }
        return Tensor::from_data(dt, shape.to_vec(), Data::Raw(bytes));
    }
    dispatch_item!(dt, T => {
        let e = cl(&T::load(v)?[0]);
        filled(cx, e, n, |v| T::store(dt, shape, v))
    }, else unsupported_type("ConstantOfShape", dt))
}

fn build_range(node: &Node) -> Result<Box<dyn Kernel>> {
    let stash = node.get_i("stash_type", 1)?;
    if stash != 1 && stash != 11 {
        unsupported!("Range stash_type {stash} is not supported");
    }
    kernel(move |cx, inputs| {
        let s = tensor_in(inputs, 0)?;
        let l = tensor_in(inputs, 1)?;
        let d = tensor_in(inputs, 2)?;
        let dt = s.dtype();
        if l.dtype() != dt || d.dtype() != dt {
            bail!("Range inputs differ in element type");
        }
        if s.len() != 1 || l.len() != 1 || d.len() != 1 {
            bail!("Range inputs must be scalars");
        }
        if dt == DataType::Bool {
            return out1(unsupported_type("Range", dt)?);
        }
        out1(
            dispatch_num!(dt, T => range_t::<T>(cx, s, l, d, stash), else unsupported_type("Range", dt))?,
        )
    })
}

fn range_t<T: Num>(
    cx: &KernelCx<'_>,
    s: &Tensor,
    l: &Tensor,
    d: &Tensor,
    stash: i64,
) -> Result<Tensor> {
    let dt = s.dtype();
    if dt.is_float() {
        let (s, l, d) = (
            T::load(s)?[0].to_f64(),
            T::load(l)?[0].to_f64(),
            T::load(d)?[0].to_f64(),
        );
        if d == 0.0 {
            bail!("Range delta cannot be 0");
        }
        let n = libm::ceil((l - s) / d);
        let n = if n > 0.0 { n as usize } else { 0 };
        numel(&[n])?;
        if n > (isize::MAX as usize) / 16 {
            bail!("Range output of {n} elements is too large");
        }
        let low = matches!(dt, DataType::Float16 | DataType::Bfloat16) && stash == 1;
        let lease = cx.lease_output(n.saturating_mul(core::mem::size_of::<T>()))?;
        let mut v: Vec<T> = crate::governor::try_with_capacity(n)?;
        v.extend((0..n).map(|i| {
            if low {
                T::from_f64((s as f32 + i as f32 * d as f32) as f64)
            } else {
                T::from_f64(s + i as f64 * d)
            }
        }));
        let mut t = T::store(dt, &[n], v)?;
        t.set_lease(lease);
        return Ok(t);
    }
    let (s, l, d) = (
        scalar_i64(s, "start")? as i128,
        scalar_i64(l, "limit")? as i128,
        scalar_i64(d, "delta")? as i128,
    );
    if d == 0 {
        bail!("Range delta cannot be 0");
    }
    let span = l - s;
    let n = if (span > 0) == (d > 0) && span != 0 {
        (span.abs() + d.abs() - 1) / d.abs()
    } else {
        0
    };
    if n > (isize::MAX as i128) / 16 {
        bail!("Range output of {n} elements is too large");
    }
    let n = n as usize;
    let lease = cx.lease_output(n.saturating_mul(core::mem::size_of::<T>()))?;
    let mut v: Vec<T> = crate::governor::try_with_capacity(n)?;
    v.extend((0..n as i128).map(|i| T::from_i64((s + i * d) as i64)));
    let mut t = T::store(dt, &[n], v)?;
    t.set_lease(lease);
    Ok(t)
}

fn build_constant(node: &Node) -> Result<Box<dyn Kernel>> {
    let t = if let Some(t) = node.attr_t("value")? {
        t.clone()
    } else if let Some(t) = node.attr_t("sparse_value")? {
        t.clone()
    } else if let Some(v) = node.attr_f("value_float")? {
        Tensor::scalar(v)
    } else if let Some(v) = node.attr_floats("value_floats")? {
        Tensor::from_vec(&[v.len()], v)?
    } else if let Some(v) = node.attr_i("value_int")? {
        Tensor::scalar(v)
    } else if let Some(v) = node.attr_ints("value_ints")? {
        Tensor::from_vec(&[v.len()], v)?
    } else if let Some(v) = node.attr_s("value_string")? {
        Tensor::scalar(v)
    } else if let Some(v) = node.attr_strings("value_strings")? {
        Tensor::from_vec(&[v.len()], v)?
    } else {
        bail!("Constant has no value attribute");
    };
    kernel(move |_cx, _inputs| out1(t.clone()))
}

fn build_nonzero(_node: &Node) -> Result<Box<dyn Kernel>> {
    kernel(|_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let dt = x.dtype();
        out1(dispatch_plain!(dt, T => {
            let v = T::load(x)?;
            let shape = if x.rank() == 0 { vec![1] } else { x.shape().to_vec() };
            let r = shape.len();
            let hits: Vec<usize> = (0..v.len()).filter(|&i| v[i].truthy()).collect();
            let nnz = hits.len();
            let mut out = vec![0i64; r * nnz];
            for (j, &h) in hits.iter().enumerate() {
                let mut rem = h;
                for ax in (0..r).rev() {
                    out[ax * nnz + j] = (rem % shape[ax]) as i64;
                    rem /= shape[ax];
                }
            }
            Tensor::from_vec(&[r, nnz], out)
        }, else unsupported_type("NonZero", dt))?)
    })
}

fn build_onehot(node: &Node) -> Result<Box<dyn Kernel>> {
    let axis = node.get_i("axis", -1)?;
    kernel(move |_cx, inputs| {
        let ind = tensor_in(inputs, 0)?;
        let depth = scalar_i64(tensor_in(inputs, 1)?, "OneHot depth")?;
        let vals = tensor_in(inputs, 2)?;
        if depth < 1 {
            bail!("OneHot depth must be positive, is {depth}");
        }
        if vals.len() != 2 {
            bail!("OneHot values must have two elements");
        }
        let idx = ind.to_i64_vec()?;
        let a = norm_axis_incl(axis, ind.rank())?;
        let d = depth as usize;
        let mut oshape = ind.shape().to_vec();
        oshape.insert(a, d);
        let n = numel(&oshape)?;
        let inner = prod(&ind.shape()[a..]);
        let dt = vals.dtype();
        out1(dispatch_item!(dt, T => {
            let v = T::load(vals)?;
            let mut out = vec![cl(&v[0]); n];
            for (p, &i) in idx.iter().enumerate() {
                let i = if i < 0 { i + depth } else { i };
                if (0..depth).contains(&i) {
                    let (o, q) = (p / inner.max(1), p % inner.max(1));
                    out[(o * d + i as usize) * inner + q] = cl(&v[1]);
                }
            }
            T::store(dt, &oshape, out)
        }, else unsupported_type("OneHot", dt))?)
    })
}

fn build_trilu(node: &Node) -> Result<Box<dyn Kernel>> {
    let upper = node.get_i("upper", 1)? != 0;
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let k = match opt_tensor_in(inputs, 1)? {
            Some(t) => scalar_i64(t, "Trilu k")?,
            None => 0,
        };
        let r = x.rank();
        if r < 2 {
            bail!("Trilu input must have rank >= 2");
        }
        let (rows, cols) = (x.shape()[r - 2], x.shape()[r - 1]);
        let dt = x.dtype();
        out1(dispatch_item!(dt, T => {
            let mut v = T::load(x)?.into_owned();
            for (p, e) in v.iter_mut().enumerate() {
                let i = ((p / cols.max(1)) % rows.max(1)) as i64;
                let j = (p % cols.max(1)) as i64;
                let keep = if upper { j - i >= k } else { j - i <= k };
                if !keep {
                    *e = T::zero();
                }
            }
            T::store(dt, x.shape(), v)
        }, else unsupported_type("Trilu", dt))?)
    })
}

fn build_eyelike(node: &Node) -> Result<Box<dyn Kernel>> {
    let dtype = match node.attr_i("dtype")? {
        Some(c) => {
            let dt = i32::try_from(c)
                .ok()
                .and_then(DataType::from_code)
                .ok_or_else(|| Error::Other(alloc::format!("unknown EyeLike dtype {c}")))?;
            // the output types `dispatch_num!` fills below
            if !NUMERIC_BOOL.contains(&dt) {
                unsupported!("EyeLike output type {dt} is not supported");
            }
            Some(dt)
        }
        None => None,
    };
    let k = node.get_i("k", 0)?;
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        if x.rank() != 2 {
            bail!("EyeLike input must be 2-D");
        }
        let (rows, cols) = (x.shape()[0], x.shape()[1]);
        let dt = dtype.unwrap_or(x.dtype());
        out1(dispatch_num!(dt, T => {
            let mut v = vec![T::zero(); rows * cols];
            for i in 0..rows {
                let j = i as i64 + k;
                if (0..cols as i64).contains(&j) {
                    v[i * cols + j as usize] = T::from_f64(1.0);
                }
            }
            T::store(dt, x.shape(), v)
        }, else unsupported_type("EyeLike", dt))?)
    })
}

fn block_mode(node: &Node, op: &str) -> Result<(usize, bool)> {
    let b = match node.attr_i("blocksize")? {
        Some(b) if b > 0 => b as usize,
        _ => bail!("{op} needs a positive 'blocksize' attribute"),
    };
    let crd = match node.get_s("mode", "DCR")?.as_str() {
        "DCR" => false,
        "CRD" => true,
        m => unsupported!("{op} mode '{m}' is not supported"),
    };
    Ok((b, crd))
}

fn build_depth_to_space(node: &Node) -> Result<Box<dyn Kernel>> {
    let (b, crd) = block_mode(node, "DepthToSpace")?;
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let &[n, c, h, w] = x.shape() else {
            bail!("DepthToSpace input must be 4-D");
        };
        if c % (b * b) != 0 {
            bail!("DepthToSpace channels {c} are not a multiple of blocksize^2");
        }
        let c2 = c / (b * b);
        let (v, perm) = if crd {
            ([n, c2, b, b, h, w], [0, 1, 4, 2, 5, 3])
        } else {
            ([n, b, b, c2, h, w], [0, 3, 4, 1, 5, 2])
        };
        let t = permute_copy(None, "DepthToSpace", &x.reshape(&v)?, &perm)?;
        out1(t.reshape(&[n, c2, h * b, w * b])?)
    })
}

fn build_space_to_depth(node: &Node) -> Result<Box<dyn Kernel>> {
    let (b, crd) = block_mode(node, "SpaceToDepth")?;
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let &[n, c, h, w] = x.shape() else {
            bail!("SpaceToDepth input must be 4-D");
        };
        if h % b != 0 || w % b != 0 {
            bail!("SpaceToDepth spatial dims {h}x{w} are not multiples of blocksize {b}");
        }
        let v = [n, c, h / b, b, w / b, b];
        let perm = if crd {
            [0, 1, 3, 5, 2, 4]
        } else {
            [0, 3, 5, 1, 2, 4]
        };
        let t = permute_copy(None, "SpaceToDepth", &x.reshape(&v)?, &perm)?;
        out1(t.reshape(&[n, c * b * b, h / b, w / b])?)
    })
}

fn build_reverse_sequence(node: &Node) -> Result<Box<dyn Kernel>> {
    let ba = node.get_i("batch_axis", 1)?;
    let ta = node.get_i("time_axis", 0)?;
    if !matches!((ba, ta), (0, 1) | (1, 0)) {
        unsupported!("ReverseSequence batch_axis={ba}, time_axis={ta} is not supported");
    }
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let lens = tensor_in(inputs, 1)?.to_i64_vec()?;
        if x.rank() < 2 {
            bail!("ReverseSequence input must have rank >= 2");
        }
        let s = x.shape();
        let (batch, time) = if ba == 0 { (s[0], s[1]) } else { (s[1], s[0]) };
        if lens.len() != batch {
            bail!(
                "ReverseSequence has {} lengths for {batch} sequences",
                lens.len()
            );
        }
        for &l in &lens {
            if l < 0 || l as usize > time {
                bail!("ReverseSequence length {l} is out of range for {time} steps");
            }
        }
        let inner = prod(&s[2..]);
        let dt = x.dtype();
        out1(dispatch_item!(dt, T => {
            let src = T::load(x)?;
            let mut out = Vec::with_capacity(src.len());
            for a0 in 0..s[0] {
                for a1 in 0..s[1] {
                    let (b, t) = if ba == 0 { (a0, a1) } else { (a1, a0) };
                    let l = lens[b] as usize;
                    let st = if t < l { l - 1 - t } else { t };
                    let p = if ba == 0 { b * s[1] + st } else { st * s[1] + b };
                    out.extend_from_slice(&src[p * inner..(p + 1) * inner]);
                }
            }
            T::store(dt, s, out)
        }, else unsupported_type("ReverseSequence", dt))?)
    })
}

fn build_compress(node: &Node) -> Result<Box<dyn Kernel>> {
    let axis = node.attr_i("axis")?;
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let cond = tensor_in(inputs, 1)?;
        if cond.dtype() != DataType::Bool {
            bail!("Compress condition must be bool");
        }
        let c = cond.as_slice::<bool>()?;
        let (x, a) = match axis {
            Some(a) => (x.clone(), norm_axis(a, x.rank())?),
            None => (x.reshape(&[x.len()])?, 0),
        };
        if x.rank() == 0 {
            bail!("Compress input must have rank >= 1");
        }
        let d = x.shape()[a];
        let idx: Vec<usize> = (0..c.len()).filter(|&i| c[i]).collect();
        if idx.last().is_some_and(|&i| i >= d) {
            bail!("Compress condition selects past the end of a dim of {d}");
        }
        out1(gather(&x, a, &idx, &[idx.len()])?)
    })
}

fn build_unique(node: &Node) -> Result<Box<dyn Kernel>> {
    let axis = node.attr_i("axis")?;
    let sorted = node.get_i("sorted", 1)? != 0;
    let n_out = node.outputs.len().clamp(1, 4);
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let dt = x.dtype();
        let mut outs = dispatch_plain!(dt, T => unique_t::<T>(x, axis, sorted),
            else return Err(bad_type("Unique", dt)))?;
        outs.truncate(n_out);
        Ok(outs)
    })
}

fn unique_t<T: Plain>(x: &Tensor, axis: Option<i64>, sorted: bool) -> Result<Vec<Value>> {
    // rows: items along the axis (or single elements), each `w` elements long
    let (rows, n, w, a) = match axis {
        None => (T::load(x)?.into_owned(), x.len(), 1, None),
        Some(ax) => {
            if x.rank() == 0 {
                bail!("Unique with an axis needs rank >= 1");
            }
            let a = norm_axis(ax, x.rank())?;
            let mut perm: Vec<usize> = vec![a];
            perm.extend((0..x.rank()).filter(|&i| i != a));
            let shape: Vec<usize> = perm.iter().map(|&p| x.shape()[p]).collect();
            let cs = contiguous_strides(x.shape());
            let strides: Vec<isize> = perm.iter().map(|&p| cs[p]).collect();
            let v = copy_strided(&T::load(x)?, &shape, &strides, 0)?;
            let n = x.shape()[a];
            (v, n, prod(&shape[1..]), Some(a))
        }
    };
    let row = |i: usize| &rows[i * w..(i + 1) * w];
    let cmp = |i: usize, j: usize| -> Ordering {
        for (p, q) in row(i).iter().zip(row(j)) {
            let o = p.total_cmp(q);
            if o != Ordering::Equal {
                return o;
            }
        }
        Ordering::Equal
    };
    let mut order: Vec<usize> = (0..n).collect();
    if w > 0 {
        order.sort_by(|&i, &j| cmp(i, j).then(i.cmp(&j)));
    }
    // groups in sorted order: (first index, count)
    let mut groups: Vec<(usize, usize)> = Vec::new();
    let mut group_of = vec![0usize; n];
    for &i in &order {
        match groups.last_mut() {
            Some((f, c)) if cmp(*f, i) == Ordering::Equal => {
                *c += 1;
            }
            _ => groups.push((i, 1)),
        }
        group_of[i] = groups.len() - 1;
    }
    let mut pos: Vec<usize> = (0..groups.len()).collect();
    if !sorted {
        let mut by_first: Vec<usize> = (0..groups.len()).collect();
        by_first.sort_by_key(|&g| groups[g].0);
        for (p, &g) in by_first.iter().enumerate() {
            pos[g] = p;
        }
    }
    let u = groups.len();
    let mut firsts = vec![0usize; u];
    let mut counts = vec![0i64; u];
    for (g, &(f, c)) in groups.iter().enumerate() {
        firsts[pos[g]] = f;
        counts[pos[g]] = c as i64;
    }
    let inverse: Vec<i64> = (0..n).map(|i| pos[group_of[i]] as i64).collect();
    let y = match a {
        None => {
            let v: Vec<T> = firsts.iter().map(|&f| rows[f].clone()).collect();
            T::store(x.dtype(), &[u], v)?
        }
        Some(a) => gather(x, a, &firsts, &[u])?,
    };
    Ok(vec![
        Value::Tensor(y),
        Value::Tensor(Tensor::from_vec(
            &[u],
            firsts.iter().map(|&f| f as i64).collect(),
        )?),
        Value::Tensor(Tensor::from_vec(&[n], inverse)?),
        Value::Tensor(Tensor::from_vec(&[u], counts)?),
    ])
}

// ----------------------------------------------------------------------------- dropout

/// MT19937, seeded like numpy's `RandomState(seed)`, so seeded training-mode Dropout draws
/// the same mask as the ONNX reference.
pub(crate) struct Mt19937 {
    mt: [u32; 624],
    idx: usize,
}

impl Mt19937 {
    pub(crate) fn new(seed: u32) -> Self {
        let mut mt = [0u32; 624];
        mt[0] = seed;
        for i in 1..624 {
            mt[i] = 1812433253u32
                .wrapping_mul(mt[i - 1] ^ (mt[i - 1] >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { mt, idx: 624 }
    }
    fn next_u32(&mut self) -> u32 {
        if self.idx >= 624 {
            for i in 0..624 {
                let y = (self.mt[i] & 0x8000_0000) | (self.mt[(i + 1) % 624] & 0x7fff_ffff);
                let mut v = self.mt[(i + 397) % 624] ^ (y >> 1);
                if y & 1 != 0 {
                    v ^= 0x9908_b0df;
                }
                self.mt[i] = v;
            }
            self.idx = 0;
        }
        let mut y = self.mt[self.idx];
        self.idx += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }
    /// A double in [0, 1) with 53 random bits.
    pub(crate) fn next_f64(&mut self) -> f64 {
        let a = (self.next_u32() >> 5) as f64;
        let b = (self.next_u32() >> 6) as f64;
        (a * 67108864.0 + b) / 9007199254740992.0
    }
}

fn build_dropout(node: &Node) -> Result<Box<dyn Kernel>> {
    let opset = node.opset;
    let want_mask = node.outputs.len() > 1 && node.outputs[1].is_some();
    let seed = node.attr_i("seed")?;
    if let Some(s) = seed {
        if !(0..=u32::MAX as i64).contains(&s) {
            unsupported!("Dropout seed {s} is outside [0, 2^32)");
        }
    }
    let attr_ratio = node.get_f("ratio", 0.5)?;
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let dt = x.dtype();
        // before opset 12 an inference runtime runs Dropout in test mode: Y = X
        let (training, ratio, rdt) = if opset >= 12 {
            let training = match opt_tensor_in(inputs, 2)? {
                Some(t) => scalar_i64(t, "Dropout training_mode")? != 0,
                None => false,
            };
            match opt_tensor_in(inputs, 1)? {
                Some(r) if training => {
                    if r.len() != 1 {
                        bail!("Dropout ratio must be a scalar");
                    }
                    (true, r.to_f32_vec()?[0] as f64, r.dtype())
                }
                _ => (training, 0.5, DataType::Float),
            }
        } else {
            (false, attr_ratio as f64, DataType::Float)
        };
        let mut outs = Vec::with_capacity(2);
        if !training || ratio == 0.0 {
            outs.push(Value::Tensor(x.clone()));
            if want_mask {
                let mask = if opset >= 10 {
                    Tensor::from_vec(x.shape(), vec![true; x.len()])?
                } else {
                    dispatch_num!(dt, T => T::store(dt, x.shape(), vec![T::from_f64(1.0); x.len()])?,
                        else return Err(bad_type("Dropout", dt)))
                };
                outs.push(Value::Tensor(mask));
            }
            return Ok(outs);
        }
        if !(0.0..1.0).contains(&ratio) {
            bail!("Dropout ratio {ratio} is outside [0, 1)");
        }
        // numpy computes the scale 1 / (1 - ratio) in the ratio's precision
        let scale = match rdt {
            DataType::Float => (1.0f32 / (1.0f32 - ratio as f32)) as f64,
            DataType::Float16 => {
                let one_minus = f16::from_f64(1.0 - ratio).to_f64();
                f16::from_f64(1.0 / one_minus).to_f64()
            }
            DataType::Bfloat16 => {
                let one_minus = bf16::from_f64(1.0 - ratio).to_f64();
                bf16::from_f64(1.0 / one_minus).to_f64()
            }
            _ => 1.0 / (1.0 - ratio),
        };
        let mut rng = Mt19937::new(seed.unwrap_or(0) as u32);
        let keep: Vec<bool> = (0..x.len()).map(|_| rng.next_f64() >= ratio).collect();
        let y = match dt {
            DataType::Float | DataType::Double | DataType::Float16 | DataType::Bfloat16 => {
                dispatch_num!(dt, T => {
                    let v = T::load(x)?;
                    let y: Vec<T> = v
                        .iter()
                        .zip(&keep)
                        .map(|(&e, &k)| T::from_f64((if k { 1.0 } else { 0.0 } * e.to_f64()) * scale))
                        .collect();
                    T::store(dt, x.shape(), y)?
                }, else return Err(bad_type("Dropout", dt)))
            }
            _ => return Err(bad_type("Dropout", dt)),
        };
        outs.push(Value::Tensor(y));
        if want_mask {
            outs.push(Value::Tensor(Tensor::from_vec(x.shape(), keep)?));
        }
        Ok(outs)
    })
}

#[cfg(test)]
mod tests {
    //! Expected values come from numpy / the ONNX reference implementation (pasted), or from
    //! invariants that do not depend on this file's code.
    use super::*;
    use crate::ir::AttrValue;
    use crate::provider::ReferenceCpu;
    use alloc::string::ToString;

    fn node(op: &str, opset: i64, attrs: Vec<(&str, AttrValue)>, n_out: usize) -> Node {
        Node {
            name: "n".to_string(),
            op_type: op.to_string(),
            domain: String::new(),
            opset,
            inputs: Vec::new(),
            outputs: (0..n_out).map(Some).collect(),
            attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            implicit_inputs: Vec::new(),
        }
    }

    fn run_n(
        op: &str,
        opset: i64,
        attrs: Vec<(&str, AttrValue)>,
        inputs: Vec<Option<Tensor>>,
        n_out: usize,
    ) -> Result<Vec<Tensor>> {
        let n = node(op, opset, attrs, n_out);
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
        Ok(run_n(op, opset, attrs, inputs, 1)?.remove(0))
    }

    fn f(shape: &[usize], v: &[f32]) -> Option<Tensor> {
        Some(Tensor::from_vec(shape, v.to_vec()).unwrap())
    }
    fn i(shape: &[usize], v: &[i64]) -> Option<Tensor> {
        Some(Tensor::from_vec(shape, v.to_vec()).unwrap())
    }
    fn arange(shape: &[usize]) -> Option<Tensor> {
        let n = prod(shape);
        f(shape, &(0..n).map(|v| v as f32).collect::<Vec<_>>())
    }
    fn fv(t: &Tensor) -> Vec<f32> {
        t.as_slice::<f32>().unwrap().into_owned()
    }
    fn iv(t: &Tensor) -> Vec<i64> {
        t.as_slice::<i64>().unwrap().into_owned()
    }
    fn ints(v: &[i64]) -> AttrValue {
        AttrValue::Ints(v.to_vec())
    }

    #[test]
    fn reshape_is_a_view_with_zero_and_minus_one() {
        let x = arange(&[2, 3, 4]).unwrap();
        let y = run(
            "Reshape",
            14,
            vec![],
            vec![Some(x.clone()), i(&[2], &[0, -1])],
        )
        .unwrap();
        assert_eq!(y.shape(), &[2, 12]);
        assert!(y.shares_storage(&x));
        // allowzero keeps a literal 0
        let e = Tensor::zeros(DataType::Float, &[0, 3]).unwrap();
        let y = run(
            "Reshape",
            14,
            vec![("allowzero", AttrValue::Int(1))],
            vec![Some(e), i(&[2], &[3, 0])],
        )
        .unwrap();
        assert_eq!(y.shape(), &[3, 0]);
        // Reshape-1 takes the shape attribute
        let y = run(
            "Reshape",
            1,
            vec![("shape", ints(&[4, -1]))],
            vec![Some(x.clone())],
        )
        .unwrap();
        assert_eq!(y.shape(), &[4, 6]);
        assert!(run(
            "Reshape",
            14,
            vec![],
            vec![Some(x.clone()), i(&[2], &[-1, -1])]
        )
        .is_err());
        assert!(run("Reshape", 14, vec![], vec![Some(x), i(&[2], &[5, -1])]).is_err());
    }

    #[test]
    fn squeeze_unsqueeze_flatten() {
        let x = arange(&[1, 3, 1, 2]).unwrap();
        assert_eq!(
            run("Squeeze", 13, vec![], vec![Some(x.clone())])
                .unwrap()
                .shape(),
            &[3, 2]
        );
        let y = run("Squeeze", 13, vec![], vec![Some(x.clone()), i(&[1], &[-2])]).unwrap();
        assert_eq!(y.shape(), &[1, 3, 2]);
        assert!(y.shares_storage(&x));
        let y = run(
            "Squeeze",
            11,
            vec![("axes", ints(&[0]))],
            vec![Some(x.clone())],
        )
        .unwrap();
        assert_eq!(y.shape(), &[3, 1, 2]);
        assert!(run("Squeeze", 13, vec![], vec![Some(x.clone()), i(&[1], &[1])]).is_err());
        let y = run(
            "Unsqueeze",
            13,
            vec![],
            vec![arange(&[3, 2]), i(&[2], &[-1, 0])],
        )
        .unwrap();
        assert_eq!(y.shape(), &[1, 3, 2, 1]);
        let y = run(
            "Unsqueeze",
            1,
            vec![("axes", ints(&[1]))],
            vec![arange(&[3, 2])],
        )
        .unwrap();
        assert_eq!(y.shape(), &[3, 1, 2]);
        assert!(run(
            "Unsqueeze",
            13,
            vec![],
            vec![arange(&[3]), i(&[2], &[0, 0])]
        )
        .is_err());
        let y = run(
            "Flatten",
            13,
            vec![("axis", AttrValue::Int(-1))],
            vec![Some(x)],
        )
        .unwrap();
        assert_eq!(y.shape(), &[3, 2]);
        let y = run(
            "Flatten",
            13,
            vec![("axis", AttrValue::Int(0))],
            vec![arange(&[2, 3])],
        )
        .unwrap();
        assert_eq!(y.shape(), &[1, 6]);
    }

    #[test]
    fn shape_and_size() {
        let x = arange(&[2, 3, 4, 5]).unwrap();
        let y = run("Shape", 15, vec![], vec![Some(x.clone())]).unwrap();
        assert_eq!(iv(&y), [2, 3, 4, 5]);
        let at = vec![("start", AttrValue::Int(-3)), ("end", AttrValue::Int(-1))];
        assert_eq!(
            iv(&run("Shape", 15, at, vec![Some(x.clone())]).unwrap()),
            [3, 4]
        );
        let at = vec![("start", AttrValue::Int(3)), ("end", AttrValue::Int(1))];
        assert!(run("Shape", 15, at, vec![Some(x.clone())])
            .unwrap()
            .is_empty());
        let y = run("Size", 13, vec![], vec![Some(x)]).unwrap();
        assert_eq!(y.rank(), 0);
        assert_eq!(iv(&y), [120]);
    }

    #[test]
    fn transpose_matches_numpy() {
        let y = run(
            "Transpose",
            13,
            vec![("perm", ints(&[2, 0, 1]))],
            vec![arange(&[2, 3, 4])],
        )
        .unwrap();
        assert_eq!(y.shape(), &[4, 2, 3]);
        // numpy: np.arange(24).reshape(2,3,4).transpose(2,0,1)
        let want = [
            0., 4., 8., 12., 16., 20., 1., 5., 9., 13., 17., 21., 2., 6., 10., 14., 18., 22., 3.,
            7., 11., 15., 19., 23.,
        ];
        assert_eq!(fv(&y), want);
        let y = run("Transpose", 13, vec![], vec![arange(&[2, 3])]).unwrap();
        assert_eq!(fv(&y), [0., 3., 1., 4., 2., 5.]);
        assert!(run(
            "Transpose",
            13,
            vec![("perm", ints(&[0, 0]))],
            vec![arange(&[2, 2])]
        )
        .is_err());
    }

    #[test]
    fn transpose_tiled_and_strings() {
        // large enough for the tiled path: out[b][j][i] == in[b][i][j]
        let (b, r, c) = (3, 37, 45);
        let y = run(
            "Transpose",
            13,
            vec![("perm", ints(&[0, 2, 1]))],
            vec![arange(&[b, r, c])],
        )
        .unwrap();
        let v = fv(&y);
        for bb in 0..b {
            for i in 0..r {
                for j in 0..c {
                    assert_eq!(v[(bb * c + j) * r + i], ((bb * r + i) * c + j) as f32);
                }
            }
        }
        let s: Vec<String> = ["a", "b", "c", "d", "e", "f"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let t = Tensor::from_vec(&[2, 3], s).unwrap();
        let y = run("Transpose", 13, vec![], vec![Some(t)]).unwrap();
        assert_eq!(
            &*y.as_slice::<String>().unwrap(),
            ["a", "d", "b", "e", "c", "f"]
        );
    }

    #[test]
    fn transpose_raw_float8_moves_bytes() {
        let t = Tensor::from_data(
            DataType::Float8E4M3FN,
            vec![2, 3],
            Data::Raw(vec![1, 2, 3, 4, 5, 6]),
        )
        .unwrap();
        let y = run("Transpose", 13, vec![], vec![Some(t)]).unwrap();
        assert_eq!(y.dtype(), DataType::Float8E4M3FN);
        assert_eq!(y.shape(), &[3, 2]);
        assert_eq!(y.raw_bytes().unwrap(), [1, 4, 2, 5, 3, 6]);
    }

    #[test]
    fn concat_and_split() {
        let a = arange(&[2, 1]);
        let b = f(&[2, 2], &[10., 11., 12., 13.]);
        let y = run("Concat", 13, vec![("axis", AttrValue::Int(-1))], vec![a, b]).unwrap();
        assert_eq!(y.shape(), &[2, 3]);
        assert_eq!(fv(&y), [0., 10., 11., 1., 12., 13.]);
        assert!(run(
            "Concat",
            13,
            vec![("axis", AttrValue::Int(0))],
            vec![arange(&[2, 1]), arange(&[2, 2])]
        )
        .is_err());
        // opset 18 num_outputs: ceil-sized chunks, last smaller (ONNX reference: 3, 3, 1)
        let ys = run_n(
            "Split",
            18,
            vec![("num_outputs", AttrValue::Int(3))],
            vec![arange(&[7])],
            3,
        )
        .unwrap();
        let sizes: Vec<usize> = ys.iter().map(|t| t.len()).collect();
        assert_eq!(sizes, [3, 3, 1]);
        assert_eq!(fv(&ys[2]), [6.]);
        let ys = run_n(
            "Split",
            13,
            vec![("axis", AttrValue::Int(1))],
            vec![arange(&[2, 4]), i(&[2], &[1, 3])],
            2,
        )
        .unwrap();
        assert_eq!(fv(&ys[0]), [0., 4.]);
        assert_eq!(fv(&ys[1]), [1., 2., 3., 5., 6., 7.]);
        let ys = run_n(
            "Split",
            2,
            vec![("split", ints(&[3, 1]))],
            vec![arange(&[4])],
            2,
        )
        .unwrap();
        assert_eq!(fv(&ys[1]), [3.]);
        // uneven equal split before opset 18 is an error
        assert!(run_n("Split", 13, vec![], vec![arange(&[5])], 2).is_err());
    }

    #[test]
    fn slice_negative_steps_and_clamping() {
        // numpy: np.arange(20).reshape(4,5)[3:0:-2, 10:-100:-1]
        let y = run(
            "Slice",
            13,
            vec![],
            vec![
                arange(&[4, 5]),
                i(&[2], &[3, 10]),
                i(&[2], &[0, -100]),
                i(&[2], &[0, 1]),
                i(&[2], &[-2, -1]),
            ],
        )
        .unwrap();
        assert_eq!(y.shape(), &[2, 5]);
        assert_eq!(fv(&y), [19., 18., 17., 16., 15., 9., 8., 7., 6., 5.]);
        let y = run(
            "Slice",
            1,
            vec![
                ("starts", ints(&[1])),
                ("ends", ints(&[1000])),
                ("axes", ints(&[1])),
            ],
            vec![arange(&[2, 3])],
        )
        .unwrap();
        assert_eq!(fv(&y), [1., 2., 4., 5.]);
        let y = run(
            "Slice",
            13,
            vec![],
            vec![
                arange(&[2, 3]),
                i(&[1], &[i64::MAX]),
                i(&[1], &[i64::MIN]),
                i(&[1], &[1]),
                i(&[1], &[1]),
            ],
        )
        .unwrap();
        assert_eq!(y.shape(), &[2, 0]);
        let bad = vec![
            arange(&[3]),
            i(&[1], &[0]),
            i(&[1], &[3]),
            i(&[1], &[0]),
            i(&[1], &[0]),
        ];
        assert!(run("Slice", 13, vec![], bad).is_err());
    }

    #[test]
    fn gather_wraps_negative_and_rejects_out_of_range() {
        let y = run(
            "Gather",
            13,
            vec![],
            vec![arange(&[3, 2]), i(&[1, 2], &[-1, 0])],
        )
        .unwrap();
        assert_eq!(y.shape(), &[1, 2, 2]);
        assert_eq!(fv(&y), [4., 5., 0., 1.]);
        let y = run(
            "Gather",
            13,
            vec![("axis", AttrValue::Int(1))],
            vec![arange(&[3, 2]), i(&[], &[1])],
        )
        .unwrap();
        assert_eq!(y.shape(), &[3]);
        assert_eq!(fv(&y), [1., 3., 5.]);
        assert!(run("Gather", 13, vec![], vec![arange(&[3, 2]), i(&[1], &[3])]).is_err());
        assert!(run("Gather", 13, vec![], vec![arange(&[3, 2]), i(&[1], &[-4])]).is_err());
    }

    #[test]
    fn gather_elements_and_nd() {
        // numpy take_along_axis([[1,2],[3,4]], [[0,0],[1,-2]] % 2, axis=1)
        let y = run(
            "GatherElements",
            13,
            vec![("axis", AttrValue::Int(1))],
            vec![f(&[2, 2], &[1., 2., 3., 4.]), i(&[2, 2], &[0, 0, 1, -2])],
        )
        .unwrap();
        assert_eq!(fv(&y), [1., 1., 4., 3.]);
        assert!(run(
            "GatherElements",
            13,
            vec![],
            vec![f(&[2], &[1., 2.]), i(&[1], &[2])]
        )
        .is_err());
        // ONNX GatherND example 5 (batch_dims = 1)
        let y = run(
            "GatherND",
            13,
            vec![("batch_dims", AttrValue::Int(1))],
            vec![arange(&[2, 2, 2]), i(&[2, 1], &[1, 0])],
        )
        .unwrap();
        assert_eq!(y.shape(), &[2, 2]);
        assert_eq!(fv(&y), [2., 3., 4., 5.]);
        // ONNX GatherND example 2
        let y = run(
            "GatherND",
            13,
            vec![],
            vec![arange(&[2, 2]), i(&[2, 1], &[1, 0])],
        )
        .unwrap();
        assert_eq!(fv(&y), [2., 3., 0., 1.]);
        assert!(run(
            "GatherND",
            13,
            vec![],
            vec![arange(&[2, 2]), i(&[1, 2], &[0, 2])]
        )
        .is_err());
    }

    #[test]
    fn scatter_elements_reductions() {
        let data = f(&[1, 5], &[1., 2., 3., 4., 5.]);
        let idx = i(&[1, 2], &[1, -4]);
        let upd = f(&[1, 2], &[1.1, 2.1]);
        let at = |r: &str| {
            vec![
                ("axis", AttrValue::Int(1)),
                ("reduction", AttrValue::String(r.as_bytes().to_vec())),
            ]
        };
        // ONNX reference: duplicate index 1 (and -4 == 1) accumulate
        let y = run(
            "ScatterElements",
            18,
            at("add"),
            vec![data.clone(), idx.clone(), upd.clone()],
        )
        .unwrap();
        assert_eq!(fv(&y), [1., 5.2, 3., 4., 5.]);
        let y = run(
            "ScatterElements",
            18,
            at("mul"),
            vec![data.clone(), idx.clone(), upd.clone()],
        )
        .unwrap();
        assert!((fv(&y)[1] - 4.62).abs() < 1e-5);
        let y = run(
            "ScatterElements",
            18,
            at("max"),
            vec![data.clone(), idx.clone(), upd.clone()],
        )
        .unwrap();
        assert_eq!(fv(&y), [1., 2.1, 3., 4., 5.]);
        let y = run(
            "ScatterElements",
            18,
            at("min"),
            vec![data.clone(), idx.clone(), upd.clone()],
        )
        .unwrap();
        assert_eq!(fv(&y), [1., 1.1, 3., 4., 5.]);
        let y = run(
            "ScatterElements",
            18,
            at("none"),
            vec![data.clone(), idx, upd.clone()],
        )
        .unwrap();
        assert_eq!(fv(&y), [1., 2.1, 3., 4., 5.]);
        let bad = i(&[1, 2], &[1, 5]);
        assert!(run(
            "ScatterElements",
            18,
            at("add"),
            vec![data.clone(), bad, upd.clone()]
        )
        .is_err());
        // Scatter (deprecated) is ScatterElements without reduction
        let y = run(
            "Scatter",
            9,
            vec![],
            vec![f(&[3], &[0., 0., 0.]), i(&[2], &[2, 0]), f(&[2], &[7., 8.])],
        )
        .unwrap();
        assert_eq!(fv(&y), [8., 0., 7.]);
        let n = node("ScatterElements", 18, at("bogus"), 1);
        assert!(matches!(
            build_scatter_elements(&n),
            Err(Error::Unsupported { .. })
        ));
    }

    #[test]
    fn scatter_nd_with_reduction() {
        // data [[1,2],[3,4]], indices [[1],[1]], updates [[10,20],[1,2]], reduction mul
        let at = vec![("reduction", AttrValue::String(b"mul".to_vec()))];
        let y = run(
            "ScatterND",
            18,
            at,
            vec![
                f(&[2, 2], &[1., 2., 3., 4.]),
                i(&[2, 1], &[1, 1]),
                f(&[2, 2], &[10., 20., 1., 2.]),
            ],
        )
        .unwrap();
        assert_eq!(fv(&y), [1., 2., 30., 160.]);
        let y = run(
            "ScatterND",
            13,
            vec![],
            vec![
                f(&[4], &[1., 2., 3., 4.]),
                i(&[2, 1], &[-1, 0]),
                f(&[2], &[9., 8.]),
            ],
        )
        .unwrap();
        assert_eq!(fv(&y), [8., 2., 3., 9.]);
        assert!(run(
            "ScatterND",
            13,
            vec![],
            vec![f(&[4], &[1., 2., 3., 4.]), i(&[1, 1], &[4]), f(&[1], &[9.])]
        )
        .is_err());
    }

    #[test]
    fn expand_tile() {
        let y = run(
            "Expand",
            13,
            vec![],
            vec![f(&[3], &[1., 2., 3.]), i(&[3], &[2, 1, 1])],
        )
        .unwrap();
        assert_eq!(y.shape(), &[2, 1, 3]);
        assert_eq!(fv(&y), [1., 2., 3., 1., 2., 3.]);
        let y = run(
            "Expand",
            13,
            vec![],
            vec![f(&[2, 1], &[1., 2.]), i(&[2], &[1, 3])],
        )
        .unwrap();
        assert_eq!(fv(&y), [1., 1., 1., 2., 2., 2.]);
        assert!(run(
            "Expand",
            13,
            vec![],
            vec![f(&[2], &[1., 2.]), i(&[1], &[3])]
        )
        .is_err());
        // numpy: np.tile([[1,2],[3,4]], (2,3))
        let y = run(
            "Tile",
            13,
            vec![],
            vec![f(&[2, 2], &[1., 2., 3., 4.]), i(&[2], &[2, 3])],
        )
        .unwrap();
        assert_eq!(y.shape(), &[4, 6]);
        let want = [
            1., 2., 1., 2., 1., 2., 3., 4., 3., 4., 3., 4., 1., 2., 1., 2., 1., 2., 3., 4., 3., 4.,
            3., 4.,
        ];
        assert_eq!(fv(&y), want);
        // Tile-1: tiles and axis inputs
        let y = run(
            "Tile",
            1,
            vec![],
            vec![f(&[2], &[1., 2.]), i(&[], &[2]), i(&[], &[0])],
        )
        .unwrap();
        assert_eq!(fv(&y), [1., 2., 1., 2.]);
    }

    fn i32s(shape: &[usize], v: &[i32]) -> Option<Tensor> {
        Some(Tensor::from_vec(shape, v.to_vec()).unwrap())
    }

    #[test]
    fn pad_modes_match_numpy() {
        let x = i32s(&[3, 4], &(0..12).collect::<Vec<_>>());
        let pads = i(&[4], &[1, 2, 2, 3]);
        let mode = |m: &str| vec![("mode", AttrValue::String(m.as_bytes().to_vec()))];
        let get = |m: &str, c: Option<Tensor>| {
            let y = run("Pad", 19, mode(m), vec![x.clone(), pads.clone(), c]).unwrap();
            assert_eq!(y.shape(), &[6, 9]);
            y.as_slice::<i32>().unwrap().into_owned()
        };
        // numpy: np.pad(np.arange(12).reshape(3,4), ((1,2),(2,3)), mode=...)
        assert_eq!(
            get("reflect", None),
            [
                6, 5, 4, 5, 6, 7, 6, 5, 4, 2, 1, 0, 1, 2, 3, 2, 1, 0, 6, 5, 4, 5, 6, 7, 6, 5, 4,
                10, 9, 8, 9, 10, 11, 10, 9, 8, 6, 5, 4, 5, 6, 7, 6, 5, 4, 2, 1, 0, 1, 2, 3, 2, 1,
                0
            ]
        );
        assert_eq!(
            get("edge", None),
            [
                0, 0, 0, 1, 2, 3, 3, 3, 3, 0, 0, 0, 1, 2, 3, 3, 3, 3, 4, 4, 4, 5, 6, 7, 7, 7, 7, 8,
                8, 8, 9, 10, 11, 11, 11, 11, 8, 8, 8, 9, 10, 11, 11, 11, 11, 8, 8, 8, 9, 10, 11,
                11, 11, 11
            ]
        );
        assert_eq!(
            get("wrap", None),
            [
                10, 11, 8, 9, 10, 11, 8, 9, 10, 2, 3, 0, 1, 2, 3, 0, 1, 2, 6, 7, 4, 5, 6, 7, 4, 5,
                6, 10, 11, 8, 9, 10, 11, 8, 9, 10, 2, 3, 0, 1, 2, 3, 0, 1, 2, 6, 7, 4, 5, 6, 7, 4,
                5, 6
            ]
        );
        let c = get("constant", i32s(&[], &[-1]));
        assert_eq!(&c[9..18], [-1, -1, 0, 1, 2, 3, -1, -1, -1]);
        assert_eq!(c.iter().filter(|&&v| v == -1).count(), 54 - 12);
        // negative pads crop: x[1:, :-1]
        let y = run("Pad", 13, vec![], vec![x.clone(), i(&[4], &[-1, 0, 0, -1])]).unwrap();
        assert_eq!(&*y.as_slice::<i32>().unwrap(), [4, 5, 6, 8, 9, 10]);
        // Pad-2 attributes, axes input (opset 18)
        let y = run(
            "Pad",
            2,
            vec![
                ("pads", ints(&[0, 1, 0, 0])),
                ("value", AttrValue::Float(9.0)),
            ],
            vec![f(&[1, 2], &[1., 2.])],
        )
        .unwrap();
        assert_eq!(fv(&y), [9., 1., 2.]);
        let y = run(
            "Pad",
            18,
            vec![],
            vec![
                f(&[1, 2], &[1., 2.]),
                i(&[2], &[0, 2]),
                None,
                i(&[1], &[-1]),
            ],
        )
        .unwrap();
        assert_eq!(fv(&y), [1., 2., 0., 0.]);
        let n = node("Pad", 19, mode("symmetric"), 1);
        assert!(matches!(build_pad(&n), Err(Error::Unsupported { .. })));
    }

    #[test]
    fn generators() {
        let v = Tensor::from_vec(&[1], vec![7i32]).unwrap();
        let y = run(
            "ConstantOfShape",
            20,
            vec![("value", AttrValue::Tensor(v))],
            vec![i(&[2], &[2, 3])],
        )
        .unwrap();
        assert_eq!(y.dtype(), DataType::Int32);
        assert_eq!(&*y.as_slice::<i32>().unwrap(), [7; 6]);
        let y = run("ConstantOfShape", 9, vec![], vec![i(&[0], &[])]).unwrap();
        assert_eq!((y.rank(), fv(&y)), (0, vec![0.]));
        let y = run(
            "Constant",
            13,
            vec![("value_floats", AttrValue::Floats(vec![1.5, 2.5]))],
            vec![],
        )
        .unwrap();
        assert_eq!(fv(&y), [1.5, 2.5]);
        let y = run(
            "Constant",
            13,
            vec![("value_int", AttrValue::Int(4))],
            vec![],
        )
        .unwrap();
        assert_eq!((y.rank(), iv(&y)), (0, vec![4]));
        // Range: numpy arange(10, 4, -2) and arange(1, 2, 0.3)
        let y = run(
            "Range",
            11,
            vec![],
            vec![i32s(&[], &[10]), i32s(&[], &[4]), i32s(&[], &[-2])],
        )
        .unwrap();
        assert_eq!(&*y.as_slice::<i32>().unwrap(), [10, 8, 6]);
        let y = run(
            "Range",
            11,
            vec![],
            vec![f(&[], &[1.]), f(&[], &[2.]), f(&[], &[0.3])],
        )
        .unwrap();
        let want = [1.0f32, 1.3, 1.6, 1.9];
        assert_eq!(y.len(), 4);
        assert!(fv(&y).iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-6));
        assert!(run(
            "Range",
            11,
            vec![],
            vec![f(&[], &[1.]), f(&[], &[2.]), f(&[], &[0.])]
        )
        .is_err());
        let y = run(
            "EyeLike",
            22,
            vec![("k", AttrValue::Int(1)), ("dtype", AttrValue::Int(7))],
            vec![arange(&[2, 3])],
        )
        .unwrap();
        assert_eq!(iv(&y), [0, 1, 0, 0, 0, 1]);
        // an output type it cannot fill is refused when the kernel is built, before any input
        let string = ("dtype", AttrValue::Int(DataType::String.code() as i64));
        let err = build_eyelike(&node("EyeLike", 22, vec![string], 1))
            .err()
            .expect("a string identity is refused");
        assert!(matches!(err, Error::Unsupported { .. }), "{err}");
        assert!(err.to_string().contains("string"), "{err}");
    }

    #[test]
    fn nonzero_onehot_trilu() {
        let b = Tensor::from_vec(&[2, 2], vec![true, false, true, true]).unwrap();
        let y = run("NonZero", 13, vec![], vec![Some(b)]).unwrap();
        assert_eq!(y.shape(), &[2, 3]);
        assert_eq!(iv(&y), [0, 1, 1, 0, 0, 1]);
        // onnx reference one_hot([[1, -1], [5, 0]], depth 3, axis 0): out-of-range stays off
        let y = run(
            "OneHot",
            11,
            vec![("axis", AttrValue::Int(0))],
            vec![
                i(&[2, 2], &[1, -1, 5, 0]),
                f(&[], &[3.]),
                f(&[2], &[0., 1.]),
            ],
        )
        .unwrap();
        assert_eq!(y.shape(), &[3, 2, 2]);
        assert_eq!(fv(&y), [0., 0., 0., 1., 1., 0., 0., 0., 0., 1., 0., 0.]);
        // numpy: np.triu(np.arange(1,10).reshape(3,3), -1) and np.tril(..., 0)
        let x = i(&[3, 3], &[1, 2, 3, 4, 5, 6, 7, 8, 9]);
        let y = run("Trilu", 14, vec![], vec![x.clone(), i(&[], &[-1])]).unwrap();
        assert_eq!(iv(&y), [1, 2, 3, 4, 5, 6, 0, 8, 9]);
        let y = run("Trilu", 14, vec![("upper", AttrValue::Int(0))], vec![x]).unwrap();
        assert_eq!(iv(&y), [1, 0, 0, 4, 5, 0, 7, 8, 9]);
    }

    #[test]
    fn depth_space_round_trip() {
        let mode = |m: &str| {
            vec![
                ("blocksize", AttrValue::Int(2)),
                ("mode", AttrValue::String(m.as_bytes().to_vec())),
            ]
        };
        // numpy reshape/transpose formulas from the ONNX spec on np.arange(16).reshape(1,8,1,2)
        let y = run("DepthToSpace", 13, mode("DCR"), vec![arange(&[1, 8, 1, 2])]).unwrap();
        assert_eq!(y.shape(), &[1, 2, 2, 4]);
        assert_eq!(
            fv(&y),
            [0., 4., 1., 5., 8., 12., 9., 13., 2., 6., 3., 7., 10., 14., 11., 15.]
        );
        let y = run("DepthToSpace", 13, mode("CRD"), vec![arange(&[1, 8, 1, 2])]).unwrap();
        assert_eq!(
            fv(&y),
            [0., 2., 1., 3., 4., 6., 5., 7., 8., 10., 9., 11., 12., 14., 13., 15.]
        );
        for m in ["DCR", "CRD"] {
            let x = arange(&[2, 2, 4, 6]).unwrap();
            let s = run("SpaceToDepth", 28, mode(m), vec![Some(x.clone())]).unwrap();
            assert_eq!(s.shape(), &[2, 8, 2, 3]);
            let back = run("DepthToSpace", 28, mode(m), vec![Some(s)]).unwrap();
            assert_eq!(fv(&back), fv(&x));
        }
        assert!(run("SpaceToDepth", 13, mode("DCR"), vec![arange(&[1, 1, 3, 4])]).is_err());
    }

    #[test]
    fn reverse_sequence_and_compress() {
        // ONNX ReverseSequence example 2
        let y = run(
            "ReverseSequence",
            10,
            vec![
                ("batch_axis", AttrValue::Int(0)),
                ("time_axis", AttrValue::Int(1)),
            ],
            vec![arange(&[4, 4]), i(&[4], &[1, 2, 3, 4])],
        )
        .unwrap();
        let want = [
            0., 1., 2., 3., 5., 4., 6., 7., 10., 9., 8., 11., 15., 14., 13., 12.,
        ];
        assert_eq!(fv(&y), want);
        assert!(run(
            "ReverseSequence",
            10,
            vec![],
            vec![arange(&[4, 4]), i(&[4], &[1, 2, 3, 5])]
        )
        .is_err());
        let c = |v: &[bool]| Some(Tensor::from_vec(&[v.len()], v.to_vec()).unwrap());
        // numpy: np.compress([0,1,1], [[1,2],[3,4],[5,6]], axis=0); np.compress([0,1,0,0,1], arange(6))
        let y = run(
            "Compress",
            11,
            vec![("axis", AttrValue::Int(0))],
            vec![arange(&[3, 2]), c(&[false, true, true])],
        )
        .unwrap();
        assert_eq!(fv(&y), [2., 3., 4., 5.]);
        let y = run(
            "Compress",
            11,
            vec![],
            vec![arange(&[2, 3]), c(&[false, true, false, false, true])],
        )
        .unwrap();
        assert_eq!(fv(&y), [1., 4.]);
        assert!(run(
            "Compress",
            11,
            vec![],
            vec![arange(&[2]), c(&[false, false, true])]
        )
        .is_err());
    }

    #[test]
    fn unique_matches_spec_examples() {
        let ys = run_n(
            "Unique",
            11,
            vec![("sorted", AttrValue::Int(0))],
            vec![f(&[6], &[2., 1., 1., 3., 4., 3.])],
            4,
        )
        .unwrap();
        assert_eq!(fv(&ys[0]), [2., 1., 3., 4.]);
        assert_eq!(iv(&ys[1]), [0, 1, 3, 4]);
        assert_eq!(iv(&ys[2]), [0, 1, 1, 2, 3, 2]);
        assert_eq!(iv(&ys[3]), [1, 2, 2, 1]);
        let ys = run_n("Unique", 11, vec![], vec![f(&[2, 2], &[1., 3., 2., 3.])], 4).unwrap();
        assert_eq!(fv(&ys[0]), [1., 2., 3.]);
        assert_eq!(iv(&ys[1]), [0, 2, 1]);
        assert_eq!(iv(&ys[2]), [0, 2, 1, 2]);
        assert_eq!(iv(&ys[3]), [1, 1, 2]);
        let x = f(&[3, 3], &[1., 0., 0., 1., 0., 0., 2., 3., 4.]);
        let ys = run_n("Unique", 11, vec![("axis", AttrValue::Int(0))], vec![x], 4).unwrap();
        assert_eq!(ys[0].shape(), &[2, 3]);
        assert_eq!(fv(&ys[0]), [1., 0., 0., 2., 3., 4.]);
        assert_eq!(iv(&ys[1]), [0, 2]);
        assert_eq!(iv(&ys[2]), [0, 0, 1]);
        assert_eq!(iv(&ys[3]), [2, 1]);
        let x = f(
            &[2, 4, 2],
            &[
                1., 1., 0., 1., 2., 1., 0., 1., 1., 1., 0., 1., 2., 1., 0., 1.,
            ],
        );
        let ys = run_n("Unique", 11, vec![("axis", AttrValue::Int(1))], vec![x], 4).unwrap();
        assert_eq!(ys[0].shape(), &[2, 3, 2]);
        assert_eq!(fv(&ys[0]), [0., 1., 1., 1., 2., 1., 0., 1., 1., 1., 2., 1.]);
        assert_eq!(iv(&ys[1]), [1, 0, 2]);
        assert_eq!(iv(&ys[2]), [1, 0, 2, 0]);
        assert_eq!(iv(&ys[3]), [2, 1, 1]);
    }

    #[test]
    fn dropout_inference_and_seeded_training() {
        let x = f(&[5], &[1., 2., 3., 4., 5.]);
        let ys = run_n("Dropout", 13, vec![], vec![x.clone()], 2).unwrap();
        assert_eq!(fv(&ys[0]), [1., 2., 3., 4., 5.]);
        assert_eq!(&*ys[1].as_slice::<bool>().unwrap(), [true; 5]);
        // Dropout-7: the mask has the data's type
        let ys = run_n("Dropout", 7, vec![], vec![x.clone()], 2).unwrap();
        assert_eq!(fv(&ys[1]), [1.; 5]);
        // numpy RandomState(0).uniform(0,1,5) = [0.5488, 0.7152, 0.6028, 0.5449, 0.4237]
        let t = Some(Tensor::scalar(true));
        let ys = run_n(
            "Dropout",
            13,
            vec![("seed", AttrValue::Int(0))],
            vec![x.clone(), f(&[], &[0.5]), t.clone()],
            2,
        )
        .unwrap();
        assert_eq!(fv(&ys[0]), [2., 4., 6., 8., 0.]);
        assert_eq!(
            &*ys[1].as_slice::<bool>().unwrap(),
            [true, true, true, true, false]
        );
        let ys = run_n("Dropout", 13, vec![], vec![x.clone(), f(&[], &[0.]), t], 1).unwrap();
        assert_eq!(fv(&ys[0]), [1., 2., 3., 4., 5.]);
        let mut mt = Mt19937::new(0);
        assert!((mt.next_f64() - 0.5488135039273248).abs() < 1e-15);
        assert!((mt.next_f64() - 0.7151893663724195).abs() < 1e-15);
    }

    #[test]
    fn copy_strided_matches_index_arithmetic() {
        // a 3-D permutation with a broadcast dim, checked element by element
        let src: Vec<u32> = (0..2 * 9 * 10).collect();
        let shape = [10, 3, 9, 2];
        let strides = [1isize, 0, 10, 90];
        let out = copy_strided(&src, &shape, &strides, 0).unwrap();
        let mut p = 0;
        for a in 0..10 {
            for b in 0..3 {
                let _ = b;
                for c in 0..9 {
                    for d in 0..2 {
                        assert_eq!(out[p], (a + c * 10 + d * 90) as u32);
                        p += 1;
                    }
                }
            }
        }
        assert_eq!(p, out.len());
    }
}
