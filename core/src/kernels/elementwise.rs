//! Element-wise kernels: broadcasting arithmetic, comparisons, logic, variadic ops, unary maths, activations, Where, Clip and Cast.

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use core::ops::{Add, BitAnd, BitOr, BitXor, Div, Mul, Neg, Not, Sub};

use half::{bf16, f16};

use super::par::{even_chunk, par_chunks_mut};
use super::{bad_type, broadcast_shapes, def, opt_tensor_in, out1, tensor_in, LATEST};
use crate::arena::OutBuf;
use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::{AttrValue, Node};
use crate::kernels::types::{BOOL, CASTABLE, FLOATS, INTS, NUMERIC, NUMERIC_BOOL, PLAIN};
use crate::provider::{CpuBackend, Kernel, KernelCx, KernelDef};
use crate::simd;
use crate::tensor::{Data, Elem, Tensor};
use crate::value::Value;
use crate::{bail, unsupported};

// ============================================================================ registrations

pub(crate) const KERNELS: &[KernelDef] = &[
    // binary arithmetic
    def("Add", 1, LATEST, build_add).types(NUMERIC),
    def("Sub", 1, LATEST, build_sub).types(NUMERIC),
    def("Mul", 1, LATEST, build_mul).types(NUMERIC),
    def("Div", 1, LATEST, build_div).types(NUMERIC),
    // the exponent (input 1) may be any numeric type; the kernel checks it
    def("Pow", 1, LATEST, build_pow).types(NUMERIC),
    def("Mod", 10, LATEST, build_mod).types(NUMERIC),
    def("BitShift", 11, LATEST, build_bitshift).types(INTS),
    def("BitwiseAnd", 18, LATEST, build_bitwise_and).types(INTS),
    def("BitwiseOr", 18, LATEST, build_bitwise_or).types(INTS),
    def("BitwiseXor", 18, LATEST, build_bitwise_xor).types(INTS),
    def("BitwiseNot", 18, LATEST, build_bitwise_not).types(INTS),
    def("And", 1, LATEST, build_and).types(BOOL),
    def("Or", 1, LATEST, build_or).types(BOOL),
    def("Xor", 1, LATEST, build_xor).types(BOOL),
    def("Not", 1, LATEST, build_not).types(BOOL),
    // comparisons
    def("Equal", 1, LATEST, build_equal).types(PLAIN),
    def("Less", 1, LATEST, build_less).types(NUMERIC_BOOL),
    def("LessOrEqual", 12, LATEST, build_less_equal).types(NUMERIC_BOOL),
    def("Greater", 1, LATEST, build_greater).types(NUMERIC_BOOL),
    def("GreaterOrEqual", 12, LATEST, build_greater_equal).types(NUMERIC_BOOL),
    // variadic
    def("Max", 1, LATEST, build_max).types(NUMERIC),
    def("Min", 1, LATEST, build_min).types(NUMERIC),
    def("Sum", 1, LATEST, build_sum).types(NUMERIC),
    def("Mean", 1, LATEST, build_mean).types(NUMERIC),
    // unary maths
    def("Abs", 1, LATEST, build_abs).types(NUMERIC),
    def("Neg", 1, LATEST, build_neg).types(NUMERIC),
    def("Sign", 9, LATEST, build_sign).types(NUMERIC),
    def("Exp", 1, LATEST, build_exp).types(FLOATS),
    def("Log", 1, LATEST, build_log).types(FLOATS),
    def("Sqrt", 1, LATEST, build_sqrt).types(FLOATS),
    def("Reciprocal", 1, LATEST, build_reciprocal).types(FLOATS),
    def("Sin", 7, LATEST, build_sin).types(FLOATS),
    def("Cos", 7, LATEST, build_cos).types(FLOATS),
    def("Tan", 7, LATEST, build_tan).types(FLOATS),
    def("Asin", 7, LATEST, build_asin).types(FLOATS),
    def("Acos", 7, LATEST, build_acos).types(FLOATS),
    def("Atan", 7, LATEST, build_atan).types(FLOATS),
    def("Sinh", 9, LATEST, build_sinh).types(FLOATS),
    def("Cosh", 9, LATEST, build_cosh).types(FLOATS),
    def("Asinh", 9, LATEST, build_asinh).types(FLOATS),
    def("Acosh", 9, LATEST, build_acosh).types(FLOATS),
    def("Atanh", 9, LATEST, build_atanh).types(FLOATS),
    def("Tanh", 1, LATEST, build_tanh).types(FLOATS),
    def("Sigmoid", 1, LATEST, build_sigmoid).types(FLOATS),
    def("Erf", 9, LATEST, build_erf).types(FLOATS),
    def("Floor", 1, LATEST, build_floor).types(FLOATS),
    def("Ceil", 1, LATEST, build_ceil).types(FLOATS),
    def("Round", 11, LATEST, build_round).types(FLOATS),
    def("IsNaN", 9, LATEST, build_isnan).types(FLOATS),
    def("IsInf", 10, LATEST, build_isinf).types(FLOATS),
    // activations
    def("Relu", 1, LATEST, build_relu).types(NUMERIC),
    def("LeakyRelu", 1, LATEST, build_leaky_relu).types(FLOATS),
    def("HardSigmoid", 1, LATEST, build_hard_sigmoid).types(FLOATS),
    def("HardSwish", 14, LATEST, build_hard_swish).types(FLOATS),
    def("Swish", 24, LATEST, build_swish).types(FLOATS),
    def("Elu", 1, LATEST, build_elu).types(FLOATS),
    def("Selu", 1, LATEST, build_selu).types(FLOATS),
    def("Celu", 12, LATEST, build_celu).types(FLOATS),
    def("Softplus", 1, LATEST, build_softplus).types(FLOATS),
    def("Softsign", 1, LATEST, build_softsign).types(FLOATS),
    def("ThresholdedRelu", 10, LATEST, build_thresholded_relu).types(FLOATS),
    def("PRelu", 1, LATEST, build_prelu).types(NUMERIC),
    def("Gelu", 20, LATEST, build_gelu).types(FLOATS),
    def("Mish", 18, LATEST, build_mish).types(FLOATS),
    def("Shrink", 9, LATEST, build_shrink).types(NUMERIC),
    // selection, clipping, conversion
    // X decides; the kernel checks that the condition is bool and Y is X's type
    def("Where", 9, LATEST, build_where).types_at(1, PLAIN),
    // bounds were float attributes before opset 11, inputs of the data's type after
    def("Clip", 1, 10, build_clip).types(FLOATS),
    def("Clip", 11, LATEST, build_clip).types(NUMERIC),
    def("Cast", 1, LATEST, build_cast).types(CASTABLE),
    // the target type is input 1's, checked by the kernel
    def("CastLike", 15, LATEST, build_cast_like).types(CASTABLE),
];

/// Wraps a closure that also takes the kernel context (for planned output memory).
fn kernel_cx<F>(f: F) -> Result<Box<dyn Kernel>>
where
    F: Fn(&KernelCx<'_>, &[Option<&Value>]) -> Result<Vec<Value>> + Send + Sync + 'static,
{
    Ok(Box::new(f))
}

/// Runs `f(tmp, out_chunk)` over `out` in chunks, with `tmp` a copy of the chunk: lets a
/// kernel written for separate input and output run in place.
#[inline]
fn in_place_chunks(out: &mut [f32], mut f: impl FnMut(usize, &[f32], &mut [f32])) {
    let mut tmp = [0f32; 256];
    let mut i = 0;
    for ch in out.chunks_mut(256) {
        let t = &mut tmp[..ch.len()];
        t.copy_from_slice(ch);
        f(i, t, ch);
        i += ch.len();
    }
}

/// `out = out op b`, with `b` repeating over `out`'s trailing elements (or a scalar).
fn binary_in_place(op: simd::BinOp, out: &mut [f32], b: &[f32]) {
    // a b that divides the chunk (a scalar, a blocked layout's 16 lanes) repeats whole in each
    if 256 % b.len() == 0 {
        return in_place_chunks(out, |_, t, o| simd::binary_repeat(op, t, b, o));
    }
    for row in out.chunks_mut(b.len()) {
        in_place_chunks(row, |j, t, o| {
            simd::binary_repeat(op, t, &b[j..j + o.len()], o)
        });
    }
}

/// `out = a op out`, with `a` repeating over `out`'s trailing elements (or a scalar).
fn binary_in_place_lhs(op: simd::BinOp, a: &[f32], out: &mut [f32]) {
    if 256 % a.len() == 0 {
        return in_place_chunks(out, |_, t, o| simd::binary_repeat_lhs(op, a, t, o));
    }
    for row in out.chunks_mut(a.len()) {
        in_place_chunks(row, |j, t, o| {
            simd::binary_repeat_lhs(op, &a[j..j + o.len()], t, o)
        });
    }
}

/// Wraps an input-only closure as a kernel.
fn kernel<F>(f: F) -> Result<Box<dyn Kernel>>
where
    F: Fn(&[Option<&Value>]) -> Result<Vec<Value>> + Send + Sync + 'static,
{
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| f(inputs),
    ))
}

// ============================================================================ numeric traits

/// Arithmetic over every numeric element type: f16/bf16 compute through f32, integers wrap.
pub(crate) trait Num: Elem + Copy + PartialOrd + Default {
    const FLOAT: bool;
    fn zero() -> Self;
    fn one() -> Self;
    fn add_(self, o: Self) -> Self;
    fn sub_(self, o: Self) -> Self;
    fn mul_(self, o: Self) -> Self;
    /// Division; integers truncate toward zero (callers reject a zero integer divisor).
    fn div_(self, o: Self) -> Self;
    /// Remainder with the sign of the dividend (C `fmod`).
    fn rem_t(self, o: Self) -> Self;
    /// Remainder with the sign of the divisor (numpy `mod`).
    fn rem_f(self, o: Self) -> Self;
    fn abs_(self) -> Self;
    fn neg_(self) -> Self;
    fn sign_(self) -> Self;
    fn is_nan_(self) -> bool;
    fn to_f64(self) -> f64;
    /// From f64: floats round to nearest, integers truncate toward zero (saturating).
    fn of_f64(v: f64) -> Self;
}

/// Larger of two values; NaN propagates.
#[inline(always)]
fn max_n<T: Num>(a: T, b: T) -> T {
    if b > a || b.is_nan_() {
        b
    } else {
        a
    }
}

/// Smaller of two values; NaN propagates.
#[inline(always)]
fn min_n<T: Num>(a: T, b: T) -> T {
    if b < a || b.is_nan_() {
        b
    } else {
        a
    }
}

/// Floor-mod for floats with the special cases of the Mod spec (result takes the divisor's sign).
#[inline]
fn fmod_floor64(a: f64, b: f64) -> f64 {
    let r = libm::fmod(a, b);
    if r == 0.0 {
        libm::copysign(0.0, b)
    } else if (r < 0.0) != (b < 0.0) {
        r + b
    } else {
        r
    }
}

#[inline]
fn fmod_floor32(a: f32, b: f32) -> f32 {
    let r = libm::fmodf(a, b);
    if r == 0.0 {
        libm::copysignf(0.0, b)
    } else if (r < 0.0) != (b < 0.0) {
        r + b
    } else {
        r
    }
}

impl Num for f32 {
    const FLOAT: bool = true;
    #[inline(always)]
    fn zero() -> Self {
        0.0
    }
    #[inline(always)]
    fn one() -> Self {
        1.0
    }
    #[inline(always)]
    fn add_(self, o: Self) -> Self {
        self + o
    }
    #[inline(always)]
    fn sub_(self, o: Self) -> Self {
        self - o
    }
    #[inline(always)]
    fn mul_(self, o: Self) -> Self {
        self * o
    }
    #[inline(always)]
    fn div_(self, o: Self) -> Self {
        self / o
    }
    #[inline]
    fn rem_t(self, o: Self) -> Self {
        libm::fmodf(self, o)
    }
    #[inline]
    fn rem_f(self, o: Self) -> Self {
        fmod_floor32(self, o)
    }
    #[inline(always)]
    fn abs_(self) -> Self {
        libm::fabsf(self)
    }
    #[inline(always)]
    fn neg_(self) -> Self {
        -self
    }
    #[inline(always)]
    fn sign_(self) -> Self {
        if self > 0.0 {
            1.0
        } else if self < 0.0 {
            -1.0
        } else {
            self
        }
    }
    #[inline(always)]
    fn is_nan_(self) -> bool {
        self.is_nan()
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline(always)]
    fn of_f64(v: f64) -> Self {
        v as f32
    }
}

impl Num for f64 {
    const FLOAT: bool = true;
    #[inline(always)]
    fn zero() -> Self {
        0.0
    }
    #[inline(always)]
    fn one() -> Self {
        1.0
    }
    #[inline(always)]
    fn add_(self, o: Self) -> Self {
        self + o
    }
    #[inline(always)]
    fn sub_(self, o: Self) -> Self {
        self - o
    }
    #[inline(always)]
    fn mul_(self, o: Self) -> Self {
        self * o
    }
    #[inline(always)]
    fn div_(self, o: Self) -> Self {
        self / o
    }
    #[inline]
    fn rem_t(self, o: Self) -> Self {
        libm::fmod(self, o)
    }
    #[inline]
    fn rem_f(self, o: Self) -> Self {
        fmod_floor64(self, o)
    }
    #[inline(always)]
    fn abs_(self) -> Self {
        libm::fabs(self)
    }
    #[inline(always)]
    fn neg_(self) -> Self {
        -self
    }
    #[inline(always)]
    fn sign_(self) -> Self {
        if self > 0.0 {
            1.0
        } else if self < 0.0 {
            -1.0
        } else {
            self
        }
    }
    #[inline(always)]
    fn is_nan_(self) -> bool {
        self.is_nan()
    }
    #[inline(always)]
    fn to_f64(self) -> f64 {
        self
    }
    #[inline(always)]
    fn of_f64(v: f64) -> Self {
        v
    }
}

macro_rules! num_half {
    ($t:ty) => {
        impl Num for $t {
            const FLOAT: bool = true;
            #[inline(always)]
            fn zero() -> Self {
                <$t>::ZERO
            }
            #[inline(always)]
            fn one() -> Self {
                <$t>::ONE
            }
            #[inline(always)]
            fn add_(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() + o.to_f32())
            }
            #[inline(always)]
            fn sub_(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() - o.to_f32())
            }
            #[inline(always)]
            fn mul_(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() * o.to_f32())
            }
            #[inline(always)]
            fn div_(self, o: Self) -> Self {
                <$t>::from_f32(self.to_f32() / o.to_f32())
            }
            #[inline]
            fn rem_t(self, o: Self) -> Self {
                <$t>::from_f32(libm::fmodf(self.to_f32(), o.to_f32()))
            }
            #[inline]
            fn rem_f(self, o: Self) -> Self {
                <$t>::from_f32(fmod_floor32(self.to_f32(), o.to_f32()))
            }
            #[inline(always)]
            fn abs_(self) -> Self {
                <$t>::from_bits(self.to_bits() & 0x7fff)
            }
            #[inline(always)]
            fn neg_(self) -> Self {
                -self
            }
            #[inline(always)]
            fn sign_(self) -> Self {
                <$t>::from_f32(self.to_f32().sign_())
            }
            #[inline(always)]
            fn is_nan_(self) -> bool {
                self.is_nan()
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self.to_f32() as f64
            }
            #[inline(always)]
            fn of_f64(v: f64) -> Self {
                <$t>::from_f64(v)
            }
        }
    };
}
num_half!(f16);
num_half!(bf16);

macro_rules! num_int {
    ($t:ty, signed) => {
        num_int!(@impl $t);
        impl Int for $t {
            #[inline(always)]
            fn is_neg(self) -> bool {
                self < 0
            }
            #[inline(always)]
            fn all_ones() -> Self {
                -1
            }
            #[inline(always)]
            fn shift_amount(self) -> Option<u32> {
                if self < 0 || (self as i128) >= <$t>::BITS as i128 {
                    None
                } else {
                    Some(self as u32)
                }
            }
            #[inline(always)]
            fn shl_(self, n: u32) -> Self {
                self.wrapping_shl(n)
            }
            #[inline(always)]
            fn shr_(self, n: u32) -> Self {
                self.wrapping_shr(n)
            }
        }
    };
    ($t:ty, unsigned) => {
        num_int!(@impl $t);
        impl Int for $t {
            #[inline(always)]
            fn is_neg(self) -> bool {
                false
            }
            #[inline(always)]
            fn all_ones() -> Self {
                <$t>::MAX
            }
            #[inline(always)]
            fn shift_amount(self) -> Option<u32> {
                if (self as u128) >= <$t>::BITS as u128 {
                    None
                } else {
                    Some(self as u32)
                }
            }
            #[inline(always)]
            fn shl_(self, n: u32) -> Self {
                self.wrapping_shl(n)
            }
            #[inline(always)]
            fn shr_(self, n: u32) -> Self {
                self.wrapping_shr(n)
            }
        }
    };
    (@impl $t:ty) => {
        impl Num for $t {
            const FLOAT: bool = false;
            #[inline(always)]
            fn zero() -> Self {
                0
            }
            #[inline(always)]
            fn one() -> Self {
                1
            }
            #[inline(always)]
            fn add_(self, o: Self) -> Self {
                self.wrapping_add(o)
            }
            #[inline(always)]
            fn sub_(self, o: Self) -> Self {
                self.wrapping_sub(o)
            }
            #[inline(always)]
            fn mul_(self, o: Self) -> Self {
                self.wrapping_mul(o)
            }
            #[inline(always)]
            fn div_(self, o: Self) -> Self {
                if o == 0 {
                    0
                } else {
                    self.wrapping_div(o)
                }
            }
            #[inline(always)]
            fn rem_t(self, o: Self) -> Self {
                if o == 0 {
                    0
                } else {
                    self.wrapping_rem(o)
                }
            }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn rem_f(self, o: Self) -> Self {
                let r = self.rem_t(o);
                if r != 0 && ((r < 0) != (o < 0)) {
                    r.wrapping_add(o)
                } else {
                    r
                }
            }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn abs_(self) -> Self {
                if self < 0 {
                    self.wrapping_neg()
                } else {
                    self
                }
            }
            #[inline(always)]
            fn neg_(self) -> Self {
                self.wrapping_neg()
            }
            #[inline(always)]
            #[allow(unused_comparisons)]
            fn sign_(self) -> Self {
                if self > 0 {
                    1
                } else if self < 0 {
                    (0 as $t).wrapping_sub(1)
                } else {
                    0
                }
            }
            #[inline(always)]
            fn is_nan_(self) -> bool {
                false
            }
            #[inline(always)]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn of_f64(v: f64) -> Self {
                v as $t
            }
        }
    };
}

/// Integer element types: bitwise ops and shifts.
pub(crate) trait Int:
    Num + BitAnd<Output = Self> + BitOr<Output = Self> + BitXor<Output = Self> + Not<Output = Self>
{
    fn is_neg(self) -> bool;
    fn all_ones() -> Self;
    /// The shift count when it is in `0..BITS`.
    fn shift_amount(self) -> Option<u32>;
    fn shl_(self, n: u32) -> Self;
    /// Arithmetic (sign-extending) for signed types.
    fn shr_(self, n: u32) -> Self;
}

num_int!(i8, signed);
num_int!(i16, signed);
num_int!(i32, signed);
num_int!(i64, signed);
num_int!(u8, unsigned);
num_int!(u16, unsigned);
num_int!(u32, unsigned);
num_int!(u64, unsigned);

/// Binds `$T` to the Rust type of every numeric element type (including f16/bf16).
macro_rules! num_dispatch {
    ($dt:expr, $T:ident => $body:expr, else $other:expr) => {{
        match $dt {
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
            _ => $other,
        }
    }};
}

/// Binds `$T` to the Rust type of every integer element type.
macro_rules! int_dispatch {
    ($dt:expr, $T:ident => $body:expr, else $other:expr) => {{
        match $dt {
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
            _ => $other,
        }
    }};
}

/// Real-number maths for f32 and f64, so each formula is written once (see `float_map!`).
trait Real:
    Copy
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
{
    fn c(v: f64) -> Self;
    fn exp_(self) -> Self;
    fn expm1_(self) -> Self;
    fn ln_(self) -> Self;
    fn ln1p_(self) -> Self;
    fn sqrt_(self) -> Self;
    fn abs_r(self) -> Self;
    fn sin_(self) -> Self;
    fn cos_(self) -> Self;
    fn tan_(self) -> Self;
    fn asin_(self) -> Self;
    fn acos_(self) -> Self;
    fn atan_(self) -> Self;
    fn sinh_(self) -> Self;
    fn cosh_(self) -> Self;
    fn tanh_(self) -> Self;
    fn asinh_(self) -> Self;
    fn acosh_(self) -> Self;
    fn atanh_(self) -> Self;
    fn erf_(self) -> Self;
    fn floor_(self) -> Self;
    fn ceil_(self) -> Self;
    fn rint_(self) -> Self;
}

macro_rules! real_impl {
    ($t:ty, $exp:ident, $expm1:ident, $ln:ident, $ln1p:ident, $sqrt:ident, $abs:ident, $sin:ident,
     $cos:ident, $tan:ident, $asin:ident, $acos:ident, $atan:ident, $sinh:ident, $cosh:ident,
     $tanh:ident, $asinh:ident, $acosh:ident, $atanh:ident, $erf:ident, $floor:ident,
     $ceil:ident, $rint:ident) => {
        impl Real for $t {
            #[inline(always)]
            fn c(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn exp_(self) -> Self {
                libm::$exp(self)
            }
            #[inline(always)]
            fn expm1_(self) -> Self {
                libm::$expm1(self)
            }
            #[inline(always)]
            fn ln_(self) -> Self {
                libm::$ln(self)
            }
            #[inline(always)]
            fn ln1p_(self) -> Self {
                libm::$ln1p(self)
            }
            #[inline(always)]
            fn sqrt_(self) -> Self {
                libm::$sqrt(self)
            }
            #[inline(always)]
            fn abs_r(self) -> Self {
                libm::$abs(self)
            }
            #[inline(always)]
            fn sin_(self) -> Self {
                libm::$sin(self)
            }
            #[inline(always)]
            fn cos_(self) -> Self {
                libm::$cos(self)
            }
            #[inline(always)]
            fn tan_(self) -> Self {
                libm::$tan(self)
            }
            #[inline(always)]
            fn asin_(self) -> Self {
                libm::$asin(self)
            }
            #[inline(always)]
            fn acos_(self) -> Self {
                libm::$acos(self)
            }
            #[inline(always)]
            fn atan_(self) -> Self {
                libm::$atan(self)
            }
            #[inline(always)]
            fn sinh_(self) -> Self {
                libm::$sinh(self)
            }
            #[inline(always)]
            fn cosh_(self) -> Self {
                libm::$cosh(self)
            }
            #[inline(always)]
            fn tanh_(self) -> Self {
                libm::$tanh(self)
            }
            #[inline(always)]
            fn asinh_(self) -> Self {
                libm::$asinh(self)
            }
            #[inline(always)]
            fn acosh_(self) -> Self {
                libm::$acosh(self)
            }
            #[inline(always)]
            fn atanh_(self) -> Self {
                libm::$atanh(self)
            }
            #[inline(always)]
            fn erf_(self) -> Self {
                libm::$erf(self)
            }
            #[inline(always)]
            fn floor_(self) -> Self {
                libm::$floor(self)
            }
            #[inline(always)]
            fn ceil_(self) -> Self {
                libm::$ceil(self)
            }
            #[inline(always)]
            fn rint_(self) -> Self {
                libm::$rint(self)
            }
        }
    };
}
real_impl!(
    f32, expf, expm1f, logf, log1pf, sqrtf, fabsf, sinf, cosf, tanf, asinf, acosf, atanf, sinhf,
    coshf, tanhf, asinhf, acoshf, atanhf, erff, floorf, ceilf, rintf
);
real_impl!(
    f64, exp, expm1, log, log1p, sqrt, fabs, sin, cos, tan, asin, acos, atan, sinh, cosh, tanh,
    asinh, acosh, atanh, erf, floor, ceil, rint
);

/// Numerically stable `ln(1 + e^x)`.
#[inline(always)]
fn softplus<R: Real>(x: R) -> R {
    if x > R::c(0.0) {
        x + (-x).exp_().ln1p_()
    } else {
        x.exp_().ln1p_()
    }
}

/// Stable logistic function.
#[inline(always)]
fn sigmoid<R: Real>(x: R) -> R {
    if x >= R::c(0.0) {
        R::c(1.0) / (R::c(1.0) + (-x).exp_())
    } else {
        let e = x.exp_();
        e / (R::c(1.0) + e)
    }
}

/// Maps a float tensor element-wise: f32 and f64 natively, f16/bf16 through f32.
fn map_float(
    x: &Tensor,
    op: &str,
    f: impl Fn(f32) -> f32,
    g: impl Fn(f64) -> f64,
) -> Result<Tensor> {
    match x.dtype() {
        DataType::Float => map1::<f32, f32>(x, |&v| f(v)),
        DataType::Double => map1::<f64, f64>(x, |&v| g(v)),
        DataType::Float16 => map1::<f16, f16>(x, |&v| f16::from_f32(f(v.to_f32()))),
        DataType::Bfloat16 => map1::<bf16, bf16>(x, |&v| bf16::from_f32(f(v.to_f32()))),
        dt => Err(bad_type(op, dt)),
    }
}

/// `map_float` with one formula written over a [`Real`] type `$R`.
macro_rules! float_map {
    ($x:expr, $op:expr, |$v:ident : $R:ident| $body:expr) => {
        map_float(
            $x,
            $op,
            |$v: f32| {
                #[allow(dead_code)]
                type $R = f32;
                $body
            },
            |$v: f64| {
                #[allow(dead_code)]
                type $R = f64;
                $body
            },
        )
    };
}

// ============================================================================ broadcasting

/// Iteration plan for up to three operands broadcast to one output shape. Size-1 output dims
/// are dropped and adjacent dims that are contiguous for every operand are merged; the
/// innermost merged dim is a run of `inner` elements along which each operand either advances
/// (`istr` 1) or repeats one element (`istr` 0), so inner loops need no index arithmetic.
struct Plan {
    inner: usize,
    istr: [usize; 3],
    /// Outer dims, innermost first, with each operand's stride.
    outer: Vec<(usize, [usize; 3])>,
}

impl Plan {
    fn new(out: &[usize], shapes: &[&[usize]]) -> Plan {
        let r = out.len();
        let mut st = vec![[0usize; 3]; r];
        for (j, s) in shapes.iter().enumerate() {
            let pad = r - s.len();
            let mut acc = 1usize;
            for i in (0..s.len()).rev() {
                st[pad + i][j] = if s[i] == 1 { 0 } else { acc };
                acc *= s[i];
            }
        }
        let k = shapes.len();
        // innermost first, merging contiguous neighbours
        let mut merged: Vec<(usize, [usize; 3])> = Vec::new();
        for i in (0..r).rev() {
            if out[i] == 1 {
                continue;
            }
            if let Some(last) = merged.last_mut() {
                if (0..k).all(|j| st[i][j] == last.1[j] * last.0) {
                    last.0 *= out[i];
                    continue;
                }
            }
            merged.push((out[i], st[i]));
        }
        if merged.is_empty() {
            return Plan {
                inner: 1,
                istr: [0; 3],
                outer: Vec::new(),
            };
        }
        let (inner, istr) = merged.remove(0);
        Plan {
            inner,
            istr,
            outer: merged,
        }
    }

    /// Calls `f` with each operand's start offset for every inner run, in row-major order.
    fn for_rows(&self, mut f: impl FnMut([usize; 3])) {
        let nd = self.outer.len();
        let mut idx = vec![0usize; nd];
        let mut off = [0usize; 3];
        loop {
            f(off);
            let mut d = 0;
            loop {
                if d == nd {
                    return;
                }
                let (size, s) = self.outer[d];
                idx[d] += 1;
                for j in 0..3 {
                    off[j] += s[j];
                }
                if idx[d] < size {
                    break;
                }
                for j in 0..3 {
                    off[j] -= s[j] * size;
                }
                idx[d] = 0;
                d += 1;
            }
        }
    }
}

/// Broadcasts two row-major buffers to `out` and applies `f` element-wise.
fn bcast2_vec<A, B, O: Clone>(
    a: &[A],
    sa: &[usize],
    b: &[B],
    sb: &[usize],
    out: &[usize],
    f: impl Fn(&A, &B) -> O,
) -> Vec<O> {
    let n: usize = out.iter().product();
    if n == 0 {
        return Vec::new();
    }
    if sa == sb {
        return a.iter().zip(b).map(|(x, y)| f(x, y)).collect();
    }
    if b.len() == 1 && a.len() == n {
        let y = &b[0];
        return a.iter().map(|x| f(x, y)).collect();
    }
    if a.len() == 1 && b.len() == n {
        let x = &a[0];
        return b.iter().map(|y| f(x, y)).collect();
    }
    let p = Plan::new(out, &[sa, sb]);
    let m = p.inner;
    let mut v = Vec::with_capacity(n);
    p.for_rows(|o| {
        let (oa, ob) = (o[0], o[1]);
        match (p.istr[0], p.istr[1]) {
            (1, 1) => v.extend(
                a[oa..oa + m]
                    .iter()
                    .zip(&b[ob..ob + m])
                    .map(|(x, y)| f(x, y)),
            ),
            (1, _) => {
                let y = &b[ob];
                v.extend(a[oa..oa + m].iter().map(|x| f(x, y)))
            }
            (_, 1) => {
                let x = &a[oa];
                v.extend(b[ob..ob + m].iter().map(|y| f(x, y)))
            }
            _ => {
                let r = f(&a[oa], &b[ob]);
                v.extend(core::iter::repeat_n(r, m))
            }
        }
    });
    v
}

/// Numpy-broadcasting binary map over two tensors.
fn bcast2<A: Elem, B: Elem, O: Elem>(
    a: &Tensor,
    b: &Tensor,
    f: impl Fn(&A, &B) -> O,
) -> Result<Tensor> {
    let out = broadcast_shapes(a.shape(), b.shape())?;
    let av = a.as_slice::<A>()?;
    let bv = b.as_slice::<B>()?;
    let v = bcast2_vec(&av, a.shape(), &bv, b.shape(), &out, f);
    Tensor::from_vec(&out, v)
}

/// Element-wise map of one tensor.
fn map1<A: Elem, O: Elem>(x: &Tensor, f: impl Fn(&A) -> O) -> Result<Tensor> {
    let s = x.as_slice::<A>()?;
    Tensor::from_vec(x.shape(), s.iter().map(f).collect())
}

/// Checks that two inputs share an element type.
fn same_type(op: &str, a: &Tensor, b: &Tensor) -> Result<()> {
    if a.dtype() != b.dtype() {
        bail!(
            "{op}: inputs have different element types ({} and {})",
            a.dtype(),
            b.dtype()
        );
    }
    Ok(())
}

/// Rejects a zero integer divisor (integer division by zero is undefined).
fn check_divisor<T: Num>(op: &str, b: &Tensor) -> Result<()> {
    if !T::FLOAT && b.as_slice::<T>()?.iter().any(|&v| v == T::zero()) {
        bail!("{op}: integer division by zero");
    }
    Ok(())
}

/// Opset < 7 broadcasting: `broadcast`=0 needs equal shapes; `broadcast`=1 lines B up with A
/// starting at `axis` (default: trailing dims) and broadcasts B only.
#[derive(Clone, Copy)]
struct Legacy {
    on: bool,
    broadcast: bool,
    axis: Option<i64>,
}

impl Legacy {
    fn from_node(node: &Node, first_numpy_opset: i64) -> Result<Legacy> {
        if node.opset >= first_numpy_opset {
            return Ok(Legacy {
                on: false,
                broadcast: false,
                axis: None,
            });
        }
        Ok(Legacy {
            on: true,
            broadcast: node.get_i("broadcast", 0)? != 0,
            axis: node.attr_i("axis")?,
        })
    }

    /// B reshaped so that numpy broadcasting gives the legacy result.
    fn apply(&self, a: &Tensor, b: &Tensor) -> Result<Tensor> {
        if !self.on {
            return Ok(b.clone());
        }
        if !self.broadcast {
            if a.shape() != b.shape() {
                bail!(
                    "shapes {:?} and {:?} differ and broadcast is not set",
                    a.shape(),
                    b.shape()
                );
            }
            return Ok(b.clone());
        }
        let (ra, rb) = (a.rank(), b.rank());
        if b.len() == 1 {
            return b.reshape(&vec![1; ra]);
        }
        if rb > ra {
            bail!("cannot broadcast {:?} onto {:?}", b.shape(), a.shape());
        }
        let axis = match self.axis {
            None => ra - rb,
            Some(ax) => {
                let ax = if ax < 0 { ax + ra as i64 } else { ax };
                if ax < 0 || ax as usize + rb > ra {
                    bail!(
                        "axis {ax} does not fit {:?} into {:?}",
                        b.shape(),
                        a.shape()
                    );
                }
                ax as usize
            }
        };
        let mut shape = vec![1usize; ra];
        for (i, &d) in b.shape().iter().enumerate() {
            if d != a.shape()[axis + i] && d != 1 {
                bail!(
                    "cannot broadcast {:?} onto {:?} at axis {axis}",
                    b.shape(),
                    a.shape()
                );
            }
            shape[axis + i] = d;
        }
        b.reshape(&shape)
    }
}

// ============================================================================ arithmetic

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Arith {
    Add,
    Sub,
    Mul,
    Div,
}

/// Drops leading 1s from a shape.
fn squeeze_front(s: &[usize]) -> &[usize] {
    let k = s.iter().take_while(|&&d| d == 1).count();
    &s[k..]
}

/// The part of an operand a chunk at `at` of `len` elements reads: its own elements when the
/// operand has the output's length (`same`), else all of it (it repeats from the chunk's start).
#[inline]
fn piece(v: &[f32], same: bool, at: usize, len: usize) -> &[f32] {
    if same {
        &v[at..at + len]
    } else {
        v
    }
}

/// f32 `a op b` through the SIMD layer when one operand repeats over the other's trailing
/// dims (same shape, scalar, or a bias row) and the output has the larger operand's shape;
/// `None` where the general broadcasting loop is needed.
fn arith_f32_simd(cx: &KernelCx<'_>, a: &Tensor, b: &Tensor, op: Arith) -> Result<Option<Tensor>> {
    if a.dtype() != DataType::Float || a.is_empty() || b.is_empty() {
        return Ok(None);
    }
    let op = match op {
        Arith::Add => simd::BinOp::Add,
        Arith::Sub => simd::BinOp::Sub,
        Arith::Mul => simd::BinOp::Mul,
        Arith::Div => simd::BinOp::Div,
    };
    let repeats = |big: &Tensor, small: &Tensor| {
        let s = squeeze_front(small.shape());
        big.rank() >= small.rank() && big.shape().ends_with(s)
    };
    // across the threads in chunks: slices of both operands when they have one shape, else
    // whole repeats of the smaller one (each chunk then starts at its first element)
    let cpu = cx.cpu;
    let split = |len: usize, small: usize| {
        let same = small == len;
        (
            even_chunk(cpu, len, ACT_CHUNK, if same { 16 } else { small }),
            same,
        )
    };
    if repeats(a, b) {
        let bv = b.as_slice::<f32>()?;
        let (ch, same) = split(a.len(), bv.len());
        let bpart = |i: usize, len: usize| piece(&bv, same, i * ch, len);
        // in a planned run the result may overwrite whichever input dies here
        if let Some(mut out) = cx.output_in_place::<f32>(0, a) {
            par_chunks_mut(cpu, &mut out, ch, 1, &|i, o| {
                binary_in_place(op, o, bpart(i, o.len()))
            });
            return Ok(Some(out.into_tensor()));
        }
        let av = a.as_slice::<f32>()?;
        if same {
            if let Some(mut out) = cx.output_in_place::<f32>(1, b) {
                par_chunks_mut(cpu, &mut out, ch, 1, &|i, o| {
                    binary_in_place_lhs(op, &av[i * ch..i * ch + o.len()], o)
                });
                return Ok(Some(out.into_tensor()));
            }
        }
        let planned = cx.output_planned::<f32>(0, a.shape());
        if planned.is_none() && (same || bv.len() == 1) {
            // a fresh vector (a graph output): written once, never zero-filled first
            let v = fresh_f32(cpu, a.len(), ch, &|at, o| {
                let bp = if same { &bv[at..at + o.len()] } else { &bv[..] };
                simd::binary_repeat(op, &av[at..at + o.len()], bp, o)
            });
            return Ok(Some(OutBuf::from_vec(a.shape(), v)?.into_tensor()));
        }
        let mut out = match planned {
            Some(o) => o,
            None => OutBuf::heap(a.shape())?,
        };
        par_chunks_mut(cpu, &mut out, ch, 1, &|i, o| {
            simd::binary_repeat(op, &av[i * ch..i * ch + o.len()], bpart(i, o.len()), o)
        });
        return Ok(Some(out.into_tensor()));
    }
    if repeats(b, a) {
        let av = a.as_slice::<f32>()?;
        let (ch, same) = split(b.len(), av.len());
        let apart = |i: usize, len: usize| piece(&av, same, i * ch, len);
        if let Some(mut out) = cx.output_in_place::<f32>(1, b) {
            par_chunks_mut(cpu, &mut out, ch, 1, &|i, o| {
                binary_in_place_lhs(op, apart(i, o.len()), o)
            });
            return Ok(Some(out.into_tensor()));
        }
        let bv = b.as_slice::<f32>()?;
        let mut out = cx.output::<f32>(0, b.shape())?;
        par_chunks_mut(cpu, &mut out, ch, 1, &|i, o| {
            simd::binary_repeat_lhs(op, apart(i, o.len()), &bv[i * ch..i * ch + o.len()], o)
        });
        return Ok(Some(out.into_tensor()));
    }
    // one operand repeats over a run of middle dims ([N, C, 1, 1] against [N, C, H, W], or a
    // blocked [N, Cb, 1, 1, 16] against [N, Cb, H, W, 16]): each outer index is a repeat of
    // its own inner slice of the small operand
    for swap in [false, true] {
        let (big, small) = if swap { (b, a) } else { (a, b) };
        let Some((outer, mid, inner)) = mid_broadcast(big.shape(), small.shape()) else {
            continue;
        };
        let (bv, sv) = (big.as_slice::<f32>()?, small.as_slice::<f32>()?);
        let slab = mid * inner;
        let per = even_chunk(cpu, big.len(), ACT_CHUNK, slab) / slab;
        let mut out = cx.output::<f32>(0, big.shape())?;
        par_chunks_mut(cpu, &mut out, per * slab, 1, &|i, o| {
            for (j, os) in o.chunks_mut(slab).enumerate() {
                let k = i * per + j;
                let (bs, ss) = (
                    &bv[k * slab..(k + 1) * slab],
                    &sv[k * inner..(k + 1) * inner],
                );
                if swap {
                    simd::binary_repeat_lhs(op, ss, bs, os)
                } else {
                    simd::binary_repeat(op, bs, ss, os)
                }
            }
        });
        debug_assert_eq!(out.len(), outer * slab);
        return Ok(Some(out.into_tensor()));
    }
    Ok(None)
}

/// A new vector of `n` f32 values written by `f(offset, piece)` for pieces of at most 256
/// values (computed into a stack buffer in L1, then moved into the vector's spare capacity),
/// chunks of `ch` values to the threads: no zero-fill before the values are written.
fn fresh_f32(
    cpu: &dyn CpuBackend,
    n: usize,
    ch: usize,
    f: &(dyn Fn(usize, &mut [f32]) + Sync),
) -> Vec<f32> {
    let mut v: Vec<f32> = Vec::with_capacity(n);
    par_chunks_mut(cpu, &mut v.spare_capacity_mut()[..n], ch, 1, &|i, dst| {
        let mut tmp = [0f32; 256];
        for (j, piece) in dst.chunks_mut(256).enumerate() {
            let t = &mut tmp[..piece.len()];
            f(i * ch + j * 256, t);
            for (d, &x) in piece.iter_mut().zip(t.iter()) {
                d.write(x);
            }
        }
    });
    // SAFETY: the chunks cover 0..n and every element of each was written above
    unsafe { v.set_len(n) };
    v
}

/// For `small` broadcasting into `big` (the result has `big`'s shape) over one run of middle
/// dims only: `(outer, mid, inner)`, the element counts of `big`'s dims before, in and after
/// the run where `small` has 1s (`small` matches `big` everywhere else).
fn mid_broadcast(big: &[usize], small: &[usize]) -> Option<(usize, usize, usize)> {
    if small.len() > big.len() {
        return None;
    }
    let lead = big.len() - small.len();
    let s = |i: usize| if i < lead { 1 } else { small[i - lead] };
    let p = (0..big.len()).find(|&i| s(i) != big[i])?;
    if s(p) != 1 {
        return None;
    }
    let q = (p..big.len()).find(|&i| s(i) != 1).unwrap_or(big.len());
    if (q..big.len()).any(|i| s(i) != big[i]) {
        return None;
    }
    let prod = |r: core::ops::Range<usize>| big[r].iter().product::<usize>();
    let (outer, mid, inner) = (prod(0..p), prod(p..q), prod(q..big.len()));
    (mid > 1 && outer * inner > 0).then_some((outer, mid, inner))
}

fn arith(cx: &KernelCx<'_>, a: &Tensor, b: &Tensor, op: Arith) -> Result<Tensor> {
    let name = match op {
        Arith::Add => "Add",
        Arith::Sub => "Sub",
        Arith::Mul => "Mul",
        Arith::Div => "Div",
    };
    same_type(name, a, b)?;
    if let Some(t) = arith_f32_simd(cx, a, b, op)? {
        return Ok(t);
    }
    num_dispatch!(a.dtype(), T => match op {
        Arith::Add => bcast2::<T, T, T>(a, b, |x, y| x.add_(*y)),
        Arith::Sub => bcast2::<T, T, T>(a, b, |x, y| x.sub_(*y)),
        Arith::Mul => bcast2::<T, T, T>(a, b, |x, y| x.mul_(*y)),
        Arith::Div => {
            check_divisor::<T>(name, b)?;
            bcast2::<T, T, T>(a, b, |x, y| x.div_(*y))
        }
    }, else Err(bad_type(name, a.dtype())))
}

fn build_arith(node: &Node, op: Arith) -> Result<Box<dyn Kernel>> {
    let legacy = Legacy::from_node(node, 7)?;
    kernel_cx(move |cx, inputs| {
        let a = tensor_in(inputs, 0)?;
        let b = legacy.apply(a, tensor_in(inputs, 1)?)?;
        out1(arith(cx, a, &b, op)?)
    })
}

fn build_add(node: &Node) -> Result<Box<dyn Kernel>> {
    build_arith(node, Arith::Add)
}
fn build_sub(node: &Node) -> Result<Box<dyn Kernel>> {
    build_arith(node, Arith::Sub)
}
fn build_mul(node: &Node) -> Result<Box<dyn Kernel>> {
    build_arith(node, Arith::Mul)
}
fn build_div(node: &Node) -> Result<Box<dyn Kernel>> {
    build_arith(node, Arith::Div)
}

fn build_mod(node: &Node) -> Result<Box<dyn Kernel>> {
    let fmod = node.get_i("fmod", 0)?;
    if fmod != 0 && fmod != 1 {
        unsupported!("Mod: fmod must be 0 or 1, got {fmod}");
    }
    kernel(move |inputs| {
        let a = tensor_in(inputs, 0)?;
        let b = tensor_in(inputs, 1)?;
        same_type("Mod", a, b)?;
        let t = num_dispatch!(a.dtype(), T => {
            check_divisor::<T>("Mod", b)?;
            if fmod == 1 {
                bcast2::<T, T, T>(a, b, |x, y| x.rem_t(*y))
            } else {
                bcast2::<T, T, T>(a, b, |x, y| x.rem_f(*y))
            }
        }, else Err(bad_type("Mod", a.dtype())))?;
        out1(t)
    })
}

// ---------------------------------------------------------------------------- Pow

/// Integer power with wrapping; negative exponents truncate `1/base^n` toward zero.
fn ipow<T: Num>(base: T, e: i64) -> Result<T> {
    if e < 0 {
        if base == T::zero() {
            bail!("Pow: integer zero raised to a negative power");
        }
        if base == T::one() {
            return Ok(T::one());
        }
        if base.to_f64() == -1.0 {
            return Ok(if e % 2 == 0 { T::one() } else { base });
        }
        return Ok(T::zero());
    }
    let (mut acc, mut b, mut e) = (T::one(), base, e as u64);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.mul_(b);
        }
        b = b.mul_(b);
        e >>= 1;
    }
    Ok(acc)
}

/// A tensor's numeric elements as f64.
fn to_f64_vec(t: &Tensor) -> Result<Vec<f64>> {
    num_dispatch!(t.dtype(), T => Ok(t.as_slice::<T>()?.iter().map(|v| v.to_f64()).collect()),
    else match t.dtype() {
        DataType::Bool => Ok(t.as_slice::<bool>()?.iter().map(|&v| v as u8 as f64).collect()),
        dt => Err(bad_type("Pow", dt)),
    })
}

/// f32 power with exact shortcuts for common scalar exponents.
fn pow_f32(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if b.len() == 1 && b.rank() <= a.rank() {
        let e = b.as_slice::<f32>()?[0];
        let out = broadcast_shapes(a.shape(), b.shape())?;
        if e == 2.0 {
            return map1::<f32, f32>(a, |&x| x * x)?.reshape(&out);
        }
        if e == 1.0 {
            return map1::<f32, f32>(a, |&x| x)?.reshape(&out);
        }
    }
    bcast2::<f32, f32, f32>(a, b, |&x, &y| libm::powf(x, y))
}

fn pow(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let (ta, tb) = (a.dtype(), b.dtype());
    let float_exp = tb.is_float();
    if !float_exp && !tb.is_int() {
        return Err(bad_type("Pow", tb));
    }
    match ta {
        DataType::Float => {
            if tb == DataType::Float {
                pow_f32(a, b)
            } else {
                let e = Tensor::from_vec(b.shape(), b.to_f32_vec()?)?;
                pow_f32(a, &e)
            }
        }
        DataType::Double => {
            let e = to_f64_vec(b)?;
            let av = a.as_slice::<f64>()?;
            let out = broadcast_shapes(a.shape(), b.shape())?;
            let v = bcast2_vec(&av, a.shape(), &e, b.shape(), &out, |&x, &y| {
                libm::pow(x, y)
            });
            Tensor::from_vec(&out, v)
        }
        DataType::Float16 | DataType::Bfloat16 => {
            let af = Tensor::from_vec(a.shape(), a.to_f32_vec()?)?;
            let ef = Tensor::from_vec(b.shape(), b.to_f32_vec()?)?;
            let r = pow_f32(&af, &ef)?;
            let rv = r.as_slice::<f32>()?;
            if ta == DataType::Float16 {
                Tensor::from_vec(r.shape(), rv.iter().map(|&v| f16::from_f32(v)).collect())
            } else {
                Tensor::from_vec(r.shape(), rv.iter().map(|&v| bf16::from_f32(v)).collect())
            }
        }
        _ => int_dispatch!(ta, T => {
            let av = a.as_slice::<T>()?;
            let out = broadcast_shapes(a.shape(), b.shape())?;
            let v: Vec<T> = if float_exp {
                let e = to_f64_vec(b)?;
                bcast2_vec(&av, a.shape(), &e, b.shape(), &out, |&x, &y| {
                    T::of_f64(libm::pow(x.to_f64(), y))
                })
            } else {
                let e = b.to_i64_vec()?;
                let r = bcast2_vec(&av, a.shape(), &e, b.shape(), &out, |&x, &y| ipow(x, y));
                r.into_iter().collect::<Result<Vec<T>>>()?
            };
            Tensor::from_vec(&out, v)
        }, else Err(bad_type("Pow", ta))),
    }
}

fn build_pow(node: &Node) -> Result<Box<dyn Kernel>> {
    let legacy = Legacy::from_node(node, 7)?;
    kernel(move |inputs| {
        let a = tensor_in(inputs, 0)?;
        let b = legacy.apply(a, tensor_in(inputs, 1)?)?;
        out1(pow(a, &b)?)
    })
}

// ---------------------------------------------------------------------------- bitwise & logic

#[derive(Clone, Copy, PartialEq, Eq)]
enum Bit {
    And,
    Or,
    Xor,
}

fn bitwise(a: &Tensor, b: &Tensor, op: Bit, name: &'static str) -> Result<Tensor> {
    same_type(name, a, b)?;
    int_dispatch!(a.dtype(), T => match op {
        Bit::And => bcast2::<T, T, T>(a, b, |&x, &y| x & y),
        Bit::Or => bcast2::<T, T, T>(a, b, |&x, &y| x | y),
        Bit::Xor => bcast2::<T, T, T>(a, b, |&x, &y| x ^ y),
    }, else Err(bad_type(name, a.dtype())))
}

fn build_bitwise(op: Bit, name: &'static str) -> Result<Box<dyn Kernel>> {
    kernel(move |inputs| {
        out1(bitwise(
            tensor_in(inputs, 0)?,
            tensor_in(inputs, 1)?,
            op,
            name,
        )?)
    })
}
fn build_bitwise_and(_: &Node) -> Result<Box<dyn Kernel>> {
    build_bitwise(Bit::And, "BitwiseAnd")
}
fn build_bitwise_or(_: &Node) -> Result<Box<dyn Kernel>> {
    build_bitwise(Bit::Or, "BitwiseOr")
}
fn build_bitwise_xor(_: &Node) -> Result<Box<dyn Kernel>> {
    build_bitwise(Bit::Xor, "BitwiseXor")
}
fn build_bitwise_not(_: &Node) -> Result<Box<dyn Kernel>> {
    kernel(|inputs| {
        let x = tensor_in(inputs, 0)?;
        out1(int_dispatch!(x.dtype(), T => map1::<T, T>(x, |&v| !v),
            else Err(bad_type("BitwiseNot", x.dtype())))?)
    })
}

/// Shift with the opset-28 rules: counts outside `0..bits` give the sign fill.
#[inline(always)]
fn shift<T: Int>(x: T, y: T, left: bool) -> T {
    match y.shift_amount() {
        Some(n) => {
            if left {
                x.shl_(n)
            } else {
                x.shr_(n)
            }
        }
        None => {
            if !left && x.is_neg() {
                T::all_ones()
            } else {
                T::zero()
            }
        }
    }
}

fn build_bitshift(node: &Node) -> Result<Box<dyn Kernel>> {
    let dir = node.get_s("direction", "")?;
    let left = match dir.as_str() {
        "LEFT" => true,
        "RIGHT" => false,
        other => unsupported!("BitShift: direction must be LEFT or RIGHT, got '{other}'"),
    };
    kernel(move |inputs| {
        let a = tensor_in(inputs, 0)?;
        let b = tensor_in(inputs, 1)?;
        same_type("BitShift", a, b)?;
        out1(
            int_dispatch!(a.dtype(), T => bcast2::<T, T, T>(a, b, |&x, &y| shift(x, y, left)),
            else Err(bad_type("BitShift", a.dtype())))?,
        )
    })
}

fn build_logic(node: &Node, op: Bit, name: &'static str) -> Result<Box<dyn Kernel>> {
    let legacy = Legacy::from_node(node, 7)?;
    kernel(move |inputs| {
        let a = tensor_in(inputs, 0)?;
        let b = legacy.apply(a, tensor_in(inputs, 1)?)?;
        same_type(name, a, &b)?;
        if a.dtype() != DataType::Bool {
            return Err(bad_type(name, a.dtype()));
        }
        out1(match op {
            Bit::And => bcast2::<bool, bool, bool>(a, &b, |&x, &y| x & y)?,
            Bit::Or => bcast2::<bool, bool, bool>(a, &b, |&x, &y| x | y)?,
            Bit::Xor => bcast2::<bool, bool, bool>(a, &b, |&x, &y| x ^ y)?,
        })
    })
}
fn build_and(node: &Node) -> Result<Box<dyn Kernel>> {
    build_logic(node, Bit::And, "And")
}
fn build_or(node: &Node) -> Result<Box<dyn Kernel>> {
    build_logic(node, Bit::Or, "Or")
}
fn build_xor(node: &Node) -> Result<Box<dyn Kernel>> {
    build_logic(node, Bit::Xor, "Xor")
}
fn build_not(_: &Node) -> Result<Box<dyn Kernel>> {
    kernel(|inputs| {
        let x = tensor_in(inputs, 0)?;
        if x.dtype() != DataType::Bool {
            return Err(bad_type("Not", x.dtype()));
        }
        out1(map1::<bool, bool>(x, |&v| !v)?)
    })
}

// ============================================================================ comparisons

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Cmp {
    Eq,
    Lt,
    Le,
    Gt,
    Ge,
}

fn cmp_t<T: Elem + PartialOrd>(a: &Tensor, b: &Tensor, op: Cmp) -> Result<Tensor> {
    match op {
        Cmp::Eq => bcast2::<T, T, bool>(a, b, |x, y| x == y),
        Cmp::Lt => bcast2::<T, T, bool>(a, b, |x, y| x < y),
        Cmp::Le => bcast2::<T, T, bool>(a, b, |x, y| x <= y),
        Cmp::Gt => bcast2::<T, T, bool>(a, b, |x, y| x > y),
        Cmp::Ge => bcast2::<T, T, bool>(a, b, |x, y| x >= y),
    }
}

fn compare(a: &Tensor, b: &Tensor, op: Cmp, name: &str) -> Result<Tensor> {
    same_type(name, a, b)?;
    match a.dtype() {
        DataType::Bool => cmp_t::<bool>(a, b, op),
        DataType::String if op == Cmp::Eq => cmp_t::<String>(a, b, op),
        dt => num_dispatch!(dt, T => cmp_t::<T>(a, b, op), else Err(bad_type(name, dt))),
    }
}

fn build_cmp(node: &Node, op: Cmp, name: &'static str) -> Result<Box<dyn Kernel>> {
    let legacy = Legacy::from_node(node, 7)?;
    kernel(move |inputs| {
        let a = tensor_in(inputs, 0)?;
        let b = legacy.apply(a, tensor_in(inputs, 1)?)?;
        out1(compare(a, &b, op, name)?)
    })
}
fn build_equal(node: &Node) -> Result<Box<dyn Kernel>> {
    build_cmp(node, Cmp::Eq, "Equal")
}
fn build_less(node: &Node) -> Result<Box<dyn Kernel>> {
    build_cmp(node, Cmp::Lt, "Less")
}
fn build_less_equal(node: &Node) -> Result<Box<dyn Kernel>> {
    build_cmp(node, Cmp::Le, "LessOrEqual")
}
fn build_greater(node: &Node) -> Result<Box<dyn Kernel>> {
    build_cmp(node, Cmp::Gt, "Greater")
}
fn build_greater_equal(node: &Node) -> Result<Box<dyn Kernel>> {
    build_cmp(node, Cmp::Ge, "GreaterOrEqual")
}

// ============================================================================ variadic

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Var {
    Max,
    Min,
    Sum,
    Mean,
}

fn variadic(inputs: &[Option<&Value>], op: Var, name: &str) -> Result<Tensor> {
    let mut ts = Vec::with_capacity(inputs.len());
    for i in 0..inputs.len() {
        if let Some(t) = opt_tensor_in(inputs, i)? {
            ts.push(t);
        }
    }
    let Some(first) = ts.first() else {
        bail!("{name} needs at least one input");
    };
    for t in &ts[1..] {
        same_type(name, first, t)?;
    }
    num_dispatch!(first.dtype(), T => {
        let mut acc: Tensor = (*first).clone();
        for t in &ts[1..] {
            acc = match op {
                Var::Max => bcast2::<T, T, T>(&acc, t, |&x, &y| max_n(x, y))?,
                Var::Min => bcast2::<T, T, T>(&acc, t, |&x, &y| min_n(x, y))?,
                Var::Sum | Var::Mean => bcast2::<T, T, T>(&acc, t, |x, y| x.add_(*y))?,
            };
        }
        if op == Var::Mean && ts.len() > 1 {
            let n = T::of_f64(ts.len() as f64);
            acc = map1::<T, T>(&acc, |x| x.div_(n))?;
        }
        Ok(acc)
    }, else Err(bad_type(name, first.dtype())))
}

fn build_variadic(op: Var, name: &'static str) -> Result<Box<dyn Kernel>> {
    kernel(move |inputs| out1(variadic(inputs, op, name)?))
}
fn build_max(_: &Node) -> Result<Box<dyn Kernel>> {
    build_variadic(Var::Max, "Max")
}
fn build_min(_: &Node) -> Result<Box<dyn Kernel>> {
    build_variadic(Var::Min, "Min")
}
fn build_sum(_: &Node) -> Result<Box<dyn Kernel>> {
    build_variadic(Var::Sum, "Sum")
}
fn build_mean(_: &Node) -> Result<Box<dyn Kernel>> {
    build_variadic(Var::Mean, "Mean")
}

// ============================================================================ unary maths

/// f32 `act(x)` through the SIMD layer (in place over a dying input in a planned run); `None`
/// for other element types.
fn act_f32(cx: &KernelCx<'_>, x: &Tensor, act: simd::Act) -> Result<Option<Tensor>> {
    if x.dtype() != DataType::Float {
        return Ok(None);
    }
    // a vector pass in chunks across the threads (transcendental activations cost tens of
    // operations a value: Gelu over a BERT layer's 128 x 1536 is about 0.15 ms on one core)
    let cost = match act {
        simd::Act::Identity
        | simd::Act::Relu
        | simd::Act::LeakyRelu(_)
        | simd::Act::LeakyReluClip { .. }
        | simd::Act::Clip(..)
        | simd::Act::HardSigmoid(..)
        | simd::Act::HardSwish
        | simd::Act::HardSwishParts { .. } => 1,
        _ => 16,
    };
    let chunk = even_chunk(cx.cpu, x.len(), ACT_CHUNK, 16);
    if let Some(mut out) = cx.output_in_place::<f32>(0, x) {
        par_chunks_mut(cx.cpu, &mut out, chunk, cost, &|_, o| {
            simd::unary_inplace(act, o)
        });
        return Ok(Some(out.into_tensor()));
    }
    let xv = x.as_slice::<f32>()?;
    let mut out = cx.output::<f32>(0, x.shape())?;
    par_chunks_mut(cx.cpu, &mut out, chunk, cost, &|i, o| {
        simd::unary(act, &xv[i * chunk..i * chunk + o.len()], o)
    });
    Ok(Some(out.into_tensor()))
}

/// Values per task of a threaded elementwise pass (about; 64 KiB of f32).
const ACT_CHUNK: usize = 1 << 14;

/// Defines a factory for a float-only unary op with an f32 SIMD path ([`simd::Act`]) and the
/// [`Real`] formula for the other float types.
macro_rules! unary_act {
    ($fname:ident, $op:literal, $act:expr, |$v:ident : $R:ident| $body:expr) => {
        fn $fname(_: &Node) -> Result<Box<dyn Kernel>> {
            kernel_cx(|cx, inputs| {
                let x = tensor_in(inputs, 0)?;
                if let Some(t) = act_f32(cx, x, $act)? {
                    return out1(t);
                }
                out1(float_map!(x, $op, |$v: $R| $body)?)
            })
        }
    };
}

/// Defines a factory for a float-only unary op from one [`Real`] formula.
macro_rules! unary_real {
    ($fname:ident, $op:literal, |$v:ident : $R:ident| $body:expr) => {
        fn $fname(_: &Node) -> Result<Box<dyn Kernel>> {
            kernel(|inputs| out1(float_map!(tensor_in(inputs, 0)?, $op, |$v: $R| $body)?))
        }
    };
}

unary_act!(build_exp, "Exp", simd::Act::Exp, |v: R| v.exp_());
unary_real!(build_log, "Log", |v: R| v.ln_());
unary_real!(build_sqrt, "Sqrt", |v: R| v.sqrt_());
unary_real!(build_reciprocal, "Reciprocal", |v: R| R::c(1.0) / v);
unary_real!(build_sin, "Sin", |v: R| v.sin_());
unary_real!(build_cos, "Cos", |v: R| v.cos_());
unary_real!(build_tan, "Tan", |v: R| v.tan_());
unary_real!(build_asin, "Asin", |v: R| v.asin_());
unary_real!(build_acos, "Acos", |v: R| v.acos_());
unary_real!(build_atan, "Atan", |v: R| v.atan_());
unary_real!(build_sinh, "Sinh", |v: R| v.sinh_());
unary_real!(build_cosh, "Cosh", |v: R| v.cosh_());
unary_real!(build_asinh, "Asinh", |v: R| v.asinh_());
unary_real!(build_acosh, "Acosh", |v: R| v.acosh_());
unary_real!(build_atanh, "Atanh", |v: R| v.atanh_());
unary_act!(build_tanh, "Tanh", simd::Act::Tanh, |v: R| v.tanh_());
fn build_sigmoid(_: &Node) -> Result<Box<dyn Kernel>> {
    kernel_cx(|cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        if x.dtype() == DataType::Float {
            if let Some(mut out) = cx.output_in_place::<f32>(0, x) {
                in_place_chunks(&mut out, |_, t, o| simd::sigmoid(t, o));
                return out1(out.into_tensor());
            }
            let xv = x.as_slice::<f32>()?;
            let mut out = cx.output::<f32>(0, x.shape())?;
            simd::sigmoid(&xv, &mut out);
            return out1(out.into_tensor());
        }
        out1(float_map!(x, "Sigmoid", |v: R| sigmoid(v))?)
    })
}
unary_act!(build_erf, "Erf", simd::Act::Erf, |v: R| v.erf_());
unary_real!(build_floor, "Floor", |v: R| v.floor_());
unary_real!(build_ceil, "Ceil", |v: R| v.ceil_());
unary_real!(build_round, "Round", |v: R| v.rint_());
unary_real!(build_softplus, "Softplus", |v: R| softplus(v));
unary_real!(build_softsign, "Softsign", |v: R| v
    / (R::c(1.0) + v.abs_r()));
unary_real!(build_mish, "Mish", |v: R| v * softplus(v).tanh_());

/// Defines a factory for a unary op over every numeric type from one [`Num`] method.
macro_rules! unary_num {
    ($fname:ident, $op:literal, $method:ident) => {
        fn $fname(_: &Node) -> Result<Box<dyn Kernel>> {
            kernel(|inputs| {
                let x = tensor_in(inputs, 0)?;
                out1(num_dispatch!(x.dtype(), T => map1::<T, T>(x, |v| v.$method()),
                    else Err(bad_type($op, x.dtype())))?)
            })
        }
    };
}

unary_num!(build_abs, "Abs", abs_);
unary_num!(build_neg, "Neg", neg_);
unary_num!(build_sign, "Sign", sign_);

fn build_relu(_: &Node) -> Result<Box<dyn Kernel>> {
    kernel_cx(|cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        if x.dtype() == DataType::Float {
            if let Some(mut out) = cx.output_in_place::<f32>(0, x) {
                in_place_chunks(&mut out, |_, t, o| simd::relu(t, o));
                return out1(out.into_tensor());
            }
            let xv = x.as_slice::<f32>()?;
            let mut out = cx.output::<f32>(0, x.shape())?;
            simd::relu(&xv, &mut out);
            return out1(out.into_tensor());
        }
        out1(
            num_dispatch!(x.dtype(), T => map1::<T, T>(x, |&v| if v < T::zero() { T::zero() } else { v }),
            else Err(bad_type("Relu", x.dtype())))?,
        )
    })
}

fn build_isnan(_: &Node) -> Result<Box<dyn Kernel>> {
    kernel(|inputs| {
        let x = tensor_in(inputs, 0)?;
        if !x.dtype().is_float() {
            return Err(bad_type("IsNaN", x.dtype()));
        }
        out1(
            num_dispatch!(x.dtype(), T => map1::<T, bool>(x, |v| v.is_nan_()),
            else Err(bad_type("IsNaN", x.dtype())))?,
        )
    })
}

fn build_isinf(node: &Node) -> Result<Box<dyn Kernel>> {
    let neg = node.get_i("detect_negative", 1)? != 0;
    let pos = node.get_i("detect_positive", 1)? != 0;
    kernel(move |inputs| {
        let x = tensor_in(inputs, 0)?;
        if !x.dtype().is_float() {
            return Err(bad_type("IsInf", x.dtype()));
        }
        out1(num_dispatch!(x.dtype(), T => map1::<T, bool>(x, |v| {
            let f = v.to_f64();
            f.is_infinite() && if f > 0.0 { pos } else { neg }
        }), else Err(bad_type("IsInf", x.dtype())))?)
    })
}

// ============================================================================ activations

fn build_leaky_relu(node: &Node) -> Result<Box<dyn Kernel>> {
    let alpha = node.get_f("alpha", 0.01)? as f64;
    kernel_cx(move |cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        if let Some(t) = act_f32(cx, x, simd::Act::LeakyRelu(alpha as f32))? {
            return out1(t);
        }
        out1(float_map!(x, "LeakyRelu", |v: R| if v < R::c(0.0) {
            v * R::c(alpha)
        } else {
            v
        })?)
    })
}

fn build_hard_sigmoid(node: &Node) -> Result<Box<dyn Kernel>> {
    let alpha = node.get_f("alpha", 0.2)? as f64;
    let beta = node.get_f("beta", 0.5)? as f64;
    kernel_cx(move |cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        if let Some(t) = act_f32(cx, x, simd::Act::HardSigmoid(alpha as f32, beta as f32))? {
            return out1(t);
        }
        out1(float_map!(x, "HardSigmoid", |v: R| {
            let y = R::c(alpha) * v + R::c(beta);
            if y < R::c(0.0) {
                R::c(0.0)
            } else if y > R::c(1.0) {
                R::c(1.0)
            } else {
                y
            }
        })?)
    })
}

fn build_hard_swish(_: &Node) -> Result<Box<dyn Kernel>> {
    kernel_cx(|cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        if let Some(t) = act_f32(cx, x, simd::Act::HardSwish)? {
            return out1(t);
        }
        out1(float_map!(x, "HardSwish", |v: R| {
            let y = R::c(1.0 / 6.0) * v + R::c(0.5);
            if y < R::c(0.0) {
                R::c(0.0)
            } else if y > R::c(1.0) {
                v
            } else {
                v * y
            }
        })?)
    })
}

/// Swish: `x * sigmoid(alpha * x)`.
fn build_swish(node: &Node) -> Result<Box<dyn Kernel>> {
    let alpha = node.get_f("alpha", 1.0)? as f64;
    kernel_cx(move |cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        if let Some(t) = act_f32(cx, x, simd::Act::Swish(alpha as f32))? {
            return out1(t);
        }
        out1(float_map!(x, "Swish", |v: R| v * sigmoid(R::c(alpha) * v))?)
    })
}

fn build_elu(node: &Node) -> Result<Box<dyn Kernel>> {
    let alpha = node.get_f("alpha", 1.0)? as f64;
    kernel(move |inputs| {
        out1(float_map!(
            tensor_in(inputs, 0)?,
            "Elu",
            |v: R| if v < R::c(0.0) {
                R::c(alpha) * v.expm1_()
            } else {
                v
            }
        )?)
    })
}

fn build_selu(node: &Node) -> Result<Box<dyn Kernel>> {
    let alpha = node.get_f("alpha", 1.673_263_2)? as f64;
    let gamma = node.get_f("gamma", 1.050_701)? as f64;
    kernel(move |inputs| {
        out1(float_map!(
            tensor_in(inputs, 0)?,
            "Selu",
            |v: R| if v > R::c(0.0) {
                R::c(gamma) * v
            } else {
                R::c(gamma) * (R::c(alpha) * v.exp_() - R::c(alpha))
            }
        )?)
    })
}

fn build_celu(node: &Node) -> Result<Box<dyn Kernel>> {
    let alpha = node.get_f("alpha", 1.0)? as f64;
    if alpha == 0.0 {
        unsupported!("Celu: alpha must be non-zero");
    }
    kernel(move |inputs| {
        out1(float_map!(
            tensor_in(inputs, 0)?,
            "Celu",
            |v: R| if v > R::c(0.0) {
                v
            } else {
                R::c(alpha) * (v / R::c(alpha)).expm1_()
            }
        )?)
    })
}

fn build_thresholded_relu(node: &Node) -> Result<Box<dyn Kernel>> {
    let alpha = node.get_f("alpha", 1.0)? as f64;
    kernel(move |inputs| {
        out1(float_map!(
            tensor_in(inputs, 0)?,
            "ThresholdedRelu",
            |v: R| if v > R::c(alpha) { v } else { R::c(0.0) }
        )?)
    })
}

fn build_gelu(node: &Node) -> Result<Box<dyn Kernel>> {
    let tanh = match node.get_s("approximate", "none")?.as_str() {
        "none" => false,
        "tanh" => true,
        other => unsupported!("Gelu: approximate='{other}' is not supported (none, tanh)"),
    };
    kernel_cx(move |cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        let act = if tanh {
            simd::Act::GeluTanh
        } else {
            simd::Act::Gelu
        };
        if let Some(t) = act_f32(cx, x, act)? {
            return out1(t);
        }
        out1(if tanh {
            float_map!(x, "Gelu", |v: R| {
                let k = R::c(0.797_884_560_802_865_4); // sqrt(2/pi)
                R::c(0.5) * v * (R::c(1.0) + (k * (v + R::c(0.044715) * v * v * v)).tanh_())
            })?
        } else {
            float_map!(x, "Gelu", |v: R| {
                R::c(0.5) * v * (R::c(1.0) + (v * R::c(core::f64::consts::FRAC_1_SQRT_2)).erf_())
            })?
        })
    })
}

fn build_shrink(node: &Node) -> Result<Box<dyn Kernel>> {
    let bias = node.get_f("bias", 0.0)? as f64;
    let lambd = node.get_f("lambd", 0.5)? as f64;
    kernel(move |inputs| {
        let x = tensor_in(inputs, 0)?;
        out1(num_dispatch!(x.dtype(), T => map1::<T, T>(x, |v| {
            let f = v.to_f64();
            if f < -lambd {
                T::of_f64(f + bias)
            } else if f > lambd {
                T::of_f64(f - bias)
            } else {
                T::zero()
            }
        }), else Err(bad_type("Shrink", x.dtype())))?)
    })
}

fn build_prelu(node: &Node) -> Result<Box<dyn Kernel>> {
    let legacy = node.opset < 7;
    kernel(move |inputs| {
        let x = tensor_in(inputs, 0)?;
        let mut slope = tensor_in(inputs, 1)?.clone();
        same_type("PRelu", x, &slope)?;
        if legacy {
            if slope.len() == 1 {
                slope = slope.reshape(&[])?;
            } else if slope.shape() != x.shape() {
                unsupported!(
                    "PRelu before opset 7: slope {:?} is neither one element nor X's shape {:?}",
                    slope.shape(),
                    x.shape()
                );
            }
        }
        let y = num_dispatch!(x.dtype(), T => bcast2::<T, T, T>(x, &slope, |&v, &s| {
            if v < T::zero() { v.mul_(s) } else { v }
        }), else Err(bad_type("PRelu", x.dtype())))?;
        if y.shape() != x.shape() {
            bail!(
                "PRelu: slope {:?} does not broadcast to X {:?}",
                slope.shape(),
                x.shape()
            );
        }
        out1(y)
    })
}

// ============================================================================ Where, Clip

fn where_t<T: Elem>(c: &Tensor, x: &Tensor, y: &Tensor) -> Result<Tensor> {
    let out = broadcast_shapes(&broadcast_shapes(c.shape(), x.shape())?, y.shape())?;
    let cs = c.as_slice::<bool>()?;
    let xs = x.as_slice::<T>()?;
    let ys = y.as_slice::<T>()?;
    let n: usize = out.iter().product();
    if n == 0 {
        return Tensor::from_vec(&out, Vec::<T>::new());
    }
    if c.shape() == x.shape() && x.shape() == y.shape() {
        let v = cs
            .iter()
            .zip(xs.iter().zip(ys.iter()))
            .map(|(&c, (a, b))| if c { a.clone() } else { b.clone() })
            .collect();
        return Tensor::from_vec(&out, v);
    }
    let p = Plan::new(&out, &[c.shape(), x.shape(), y.shape()]);
    let m = p.inner;
    let [ic, ix, iy] = p.istr;
    let mut v = Vec::with_capacity(n);
    p.for_rows(|o| {
        if ic == 1 && ix == 1 && iy == 1 {
            v.extend(
                cs[o[0]..o[0] + m]
                    .iter()
                    .zip(xs[o[1]..o[1] + m].iter().zip(&ys[o[2]..o[2] + m]))
                    .map(|(&c, (a, b))| if c { a.clone() } else { b.clone() }),
            );
        } else {
            for i in 0..m {
                v.push(if cs[o[0] + i * ic] {
                    xs[o[1] + i * ix].clone()
                } else {
                    ys[o[2] + i * iy].clone()
                });
            }
        }
    });
    Tensor::from_vec(&out, v)
}

fn build_where(_: &Node) -> Result<Box<dyn Kernel>> {
    kernel(|inputs| {
        let c = tensor_in(inputs, 0)?;
        let x = tensor_in(inputs, 1)?;
        let y = tensor_in(inputs, 2)?;
        if c.dtype() != DataType::Bool {
            bail!("Where: condition must be bool, is {}", c.dtype());
        }
        same_type("Where", x, y)?;
        out1(crate::dispatch_any!(x.dtype(), T => where_t::<T>(c, x, y)?,
            else return Err(bad_type("Where", x.dtype()))))
    })
}

/// The single value of an optional bound input.
fn bound<T: Num>(x: &Tensor, t: Option<&Tensor>) -> Result<Option<T>> {
    match t {
        None => Ok(None),
        Some(t) => {
            same_type("Clip", x, t)?;
            if t.len() != 1 {
                bail!(
                    "Clip: bounds must hold one element, got shape {:?}",
                    t.shape()
                );
            }
            Ok(Some(t.as_slice::<T>()?[0]))
        }
    }
}

fn clip_t<T: Num>(x: &Tensor, lo: Option<T>, hi: Option<T>) -> Result<Tensor> {
    match (lo, hi) {
        (Some(l), Some(h)) => map1::<T, T>(x, |&v| {
            let v = if v < l { l } else { v };
            if v > h {
                h
            } else {
                v
            }
        }),
        (Some(l), None) => map1::<T, T>(x, |&v| if v < l { l } else { v }),
        (None, Some(h)) => map1::<T, T>(x, |&v| if v > h { h } else { v }),
        (None, None) => Ok(x.clone()),
    }
}

fn build_clip(node: &Node) -> Result<Box<dyn Kernel>> {
    if node.opset < 11 {
        // bounds are attributes; opset 6 defaults to the f32 range, opset 1 to none
        let dflt = |v: f32| if node.opset >= 6 { Some(v) } else { None };
        let lo = node.attr_f("min")?.or(dflt(f32::MIN));
        let hi = node.attr_f("max")?.or(dflt(f32::MAX));
        return kernel(move |inputs| {
            let x = tensor_in(inputs, 0)?;
            if !x.dtype().is_float() {
                return Err(bad_type("Clip", x.dtype()));
            }
            out1(num_dispatch!(x.dtype(), T => clip_t::<T>(
                x,
                lo.map(|v| T::of_f64(v as f64)),
                hi.map(|v| T::of_f64(v as f64)),
            ), else Err(bad_type("Clip", x.dtype())))?)
        });
    }
    kernel(|inputs| {
        let x = tensor_in(inputs, 0)?;
        let lo = opt_tensor_in(inputs, 1)?;
        let hi = opt_tensor_in(inputs, 2)?;
        out1(
            num_dispatch!(x.dtype(), T => clip_t::<T>(x, bound::<T>(x, lo)?, bound::<T>(x, hi)?),
            else Err(bad_type("Clip", x.dtype())))?,
        )
    })
}

// ============================================================================ Cast

/// A value widened for conversion: floats as f64, integers exactly.
#[derive(Clone, Copy, Debug)]
enum Wide {
    F(f64),
    I(i64),
    U(u64),
}

/// 2^63 as f64.
const TWO63: f64 = (1u64 << 63) as f64;

/// Float → 64-bit integer like numpy on x86: truncation, NaN and out-of-range give `i64::MIN`.
#[inline]
fn f2i64(v: f64) -> i64 {
    if v.is_nan() || !(-TWO63..TWO63).contains(&v) {
        i64::MIN
    } else {
        v as i64
    }
}

/// Float → 32-bit integer like numpy on x86 (narrower integers wrap from this).
#[inline]
fn f2i32(v: f64) -> i32 {
    if v.is_nan() || v >= 2_147_483_648.0 || v <= -2_147_483_649.0 {
        i32::MIN
    } else {
        v as i32
    }
}

#[inline]
fn wide_f64(w: Wide) -> f64 {
    match w {
        Wide::F(v) => v,
        Wide::I(v) => v as f64,
        Wide::U(v) => v as f64,
    }
}

#[inline]
fn wide_i64(w: Wide) -> i64 {
    match w {
        Wide::F(v) => f2i64(v),
        Wide::I(v) => v,
        Wide::U(v) => v as i64,
    }
}

/// Element types Cast converts between natively.
trait Cvt: Elem + Copy {
    fn wide(self) -> Wide;
    fn from_wide(w: Wide) -> Self;
    /// numpy-style `str()` of the value.
    fn fmt_s(self) -> String;
}

/// Shortest scientific digits of a 16-bit float that parse back to it.
fn short_sci16(v: f32, back: impl Fn(f64) -> u16, bits: u16) -> String {
    for p in 0..8 {
        let s = alloc::format!("{v:.p$e}");
        if let Ok(f) = s.parse::<f64>() {
            if back(f) == bits {
                return s;
            }
        }
    }
    alloc::format!("{v:e}")
}

/// Formats like numpy's `astype(str)`: shortest round-trip digits (`sci` is them in Rust's
/// `{:e}` form), positional when `1e-4 <= |v| < 10^hi`, else scientific as in `1.5e+20`.
fn fmt_float(v: f64, sci: &str, hi: i32) -> String {
    if v.is_nan() {
        return String::from("nan");
    }
    if v.is_infinite() {
        return String::from(if v > 0.0 { "inf" } else { "-inf" });
    }
    let neg = v.is_sign_negative();
    if v == 0.0 {
        return String::from(if neg { "-0.0" } else { "0.0" });
    }
    let s = sci.trim_start_matches('-');
    let (mant, exp) = s.split_once('e').unwrap_or((s, "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let all: String = mant.chars().filter(|c| *c != '.').collect();
    let digits = all.trim_end_matches('0');
    let digits = if digits.is_empty() { "0" } else { digits };
    let a = libm::fabs(v);
    let mut out = String::new();
    if neg {
        out.push('-');
    }
    if a < 1e-4 || a >= libm::pow(10.0, hi as f64) {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push_str(&alloc::format!(
            "e{}{:02}",
            if exp < 0 { '-' } else { '+' },
            exp.abs()
        ));
    } else if exp >= 0 {
        let e = exp as usize;
        if digits.len() > e + 1 {
            out.push_str(&digits[..e + 1]);
            out.push('.');
            out.push_str(&digits[e + 1..]);
        } else {
            out.push_str(digits);
            for _ in digits.len()..e + 1 {
                out.push('0');
            }
            out.push_str(".0");
        }
    } else {
        out.push_str("0.");
        for _ in 0..(-exp - 1) {
            out.push('0');
        }
        out.push_str(digits);
    }
    out
}

impl Cvt for f32 {
    #[inline(always)]
    fn wide(self) -> Wide {
        Wide::F(self as f64)
    }
    #[inline(always)]
    fn from_wide(w: Wide) -> Self {
        match w {
            Wide::F(v) => v as f32,
            Wide::I(v) => v as f32,
            Wide::U(v) => v as f32,
        }
    }
    fn fmt_s(self) -> String {
        fmt_float(self as f64, &alloc::format!("{self:e}"), 6)
    }
}

impl Cvt for f64 {
    #[inline(always)]
    fn wide(self) -> Wide {
        Wide::F(self)
    }
    #[inline(always)]
    fn from_wide(w: Wide) -> Self {
        wide_f64(w)
    }
    fn fmt_s(self) -> String {
        fmt_float(self, &alloc::format!("{self:e}"), 16)
    }
}

impl Cvt for f16 {
    #[inline(always)]
    fn wide(self) -> Wide {
        Wide::F(self.to_f64())
    }
    #[inline(always)]
    fn from_wide(w: Wide) -> Self {
        match w {
            Wide::F(v) => f16::from_f64(v),
            Wide::I(v) => f16::from_f64(v as f64),
            Wide::U(v) => f16::from_f64(v as f64),
        }
    }
    fn fmt_s(self) -> String {
        let sci = short_sci16(
            self.to_f32(),
            |f| f16::from_f64(f).to_bits(),
            self.to_bits(),
        );
        fmt_float(self.to_f64(), &sci, 3)
    }
}

impl Cvt for bf16 {
    #[inline(always)]
    fn wide(self) -> Wide {
        Wide::F(self.to_f64())
    }
    #[inline(always)]
    fn from_wide(w: Wide) -> Self {
        match w {
            Wide::F(v) => bf16::from_f64(v),
            Wide::I(v) => bf16::from_f64(v as f64),
            Wide::U(v) => bf16::from_f64(v as f64),
        }
    }
    fn fmt_s(self) -> String {
        let sci = short_sci16(
            self.to_f32(),
            |f| bf16::from_f64(f).to_bits(),
            self.to_bits(),
        );
        fmt_float(self.to_f64(), &sci, 6)
    }
}

macro_rules! cvt_int {
    ($t:ty, $fconv:ident, $wide:ident, $wt:ty) => {
        impl Cvt for $t {
            #[inline(always)]
            fn wide(self) -> Wide {
                Wide::$wide(self as $wt)
            }
            #[inline(always)]
            fn from_wide(w: Wide) -> Self {
                match w {
                    Wide::F(v) => $fconv(v) as $t,
                    Wide::I(v) => v as $t,
                    Wide::U(v) => v as $t,
                }
            }
            fn fmt_s(self) -> String {
                alloc::format!("{self}")
            }
        }
    };
}
cvt_int!(i8, f2i32, I, i64);
cvt_int!(i16, f2i32, I, i64);
cvt_int!(i32, f2i32, I, i64);
cvt_int!(u8, f2i32, I, i64);
cvt_int!(u16, f2i32, I, i64);
cvt_int!(u32, f2i64, I, i64);
cvt_int!(i64, f2i64, I, i64);
cvt_int!(u64, f2u64, U, u64);

/// Float → u64 like numpy on x86: values in `[2^63, 2^64)` convert exactly, others go through i64.
#[inline]
fn f2u64(v: f64) -> u64 {
    if (TWO63..2.0 * TWO63).contains(&v) {
        v as u64
    } else {
        f2i64(v) as u64
    }
}

impl Cvt for bool {
    #[inline(always)]
    fn wide(self) -> Wide {
        Wide::I(self as i64)
    }
    #[inline(always)]
    fn from_wide(w: Wide) -> Self {
        match w {
            Wide::F(v) => v != 0.0,
            Wide::I(v) => v != 0,
            Wide::U(v) => v != 0,
        }
    }
    fn fmt_s(self) -> String {
        String::from(if self { "True" } else { "False" })
    }
}

/// Binds `$T` to every element type with a [`Cvt`] implementation.
macro_rules! cvt_dispatch {
    ($dt:expr, $T:ident => $body:expr, else $other:expr) => {{
        match $dt {
            DataType::Bool => {
                type $T = bool;
                $body
            }
            dt => num_dispatch!(dt, $T => $body, else $other),
        }
    }};
}

/// Parses a string as a number: integers exactly, otherwise as a float (`inf`, `nan`, any case).
fn parse_wide(s: &str) -> Result<Wide> {
    let t = s.trim();
    if let Ok(i) = t.parse::<i64>() {
        return Ok(Wide::I(i));
    }
    if let Ok(u) = t.parse::<u64>() {
        return Ok(Wide::U(u));
    }
    if let Ok(f) = t.parse::<f64>() {
        return Ok(Wide::F(f));
    }
    if t.eq_ignore_ascii_case("true") {
        return Ok(Wide::I(1));
    }
    if t.eq_ignore_ascii_case("false") {
        return Ok(Wide::I(0));
    }
    bail!("Cast: cannot parse '{s}' as a number")
}

/// Rounding of casts to float8e8m0.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum E8Round {
    Up,
    Down,
    Nearest,
}

#[derive(Clone, Copy, Debug)]
struct CastOpts {
    saturate: bool,
    round: E8Round,
}

/// Kinds of small float formats, by how they encode NaN and infinity.
#[derive(Clone, Copy, PartialEq, Eq)]
enum MiniKind {
    /// E4M3FN: no infinity, NaN is S.1111.111.
    Fn,
    /// FNUZ: no infinity, no negative zero, NaN is 0x80.
    Fnuz,
    /// E5M2: IEEE-like infinities and NaNs.
    Ieee,
    /// E2M1: no NaN or infinity.
    Fp4,
}

/// A small float format: mantissa bits, exponent bias, largest finite code, sign bit.
#[derive(Clone, Copy)]
pub(crate) struct Mini {
    mbits: i32,
    bias: i32,
    max_code: u8,
    sign: u8,
    kind: MiniKind,
}

const E4M3FN: Mini = Mini {
    mbits: 3,
    bias: 7,
    max_code: 0x7E,
    sign: 0x80,
    kind: MiniKind::Fn,
};
const E4M3FNUZ: Mini = Mini {
    mbits: 3,
    bias: 8,
    max_code: 0x7F,
    sign: 0x80,
    kind: MiniKind::Fnuz,
};
const E5M2: Mini = Mini {
    mbits: 2,
    bias: 15,
    max_code: 0x7B,
    sign: 0x80,
    kind: MiniKind::Ieee,
};
const E5M2FNUZ: Mini = Mini {
    mbits: 2,
    bias: 16,
    max_code: 0x7F,
    sign: 0x80,
    kind: MiniKind::Fnuz,
};
const E2M1: Mini = Mini {
    mbits: 1,
    bias: 1,
    max_code: 0x7,
    sign: 0x8,
    kind: MiniKind::Fp4,
};

pub(crate) fn mini_of(dt: DataType) -> Option<&'static Mini> {
    Some(match dt {
        DataType::Float8E4M3FN => &E4M3FN,
        DataType::Float8E4M3FNUZ => &E4M3FNUZ,
        DataType::Float8E5M2 => &E5M2,
        DataType::Float8E5M2FNUZ => &E5M2FNUZ,
        DataType::Float4E2M1 => &E2M1,
        _ => return None,
    })
}

/// Encodes `v` with round-to-nearest-even; overflow saturates to the largest finite value or,
/// without `saturate`, becomes infinity/NaN as the format allows (E2M1 always saturates).
pub(crate) fn mini_encode(m: &Mini, v: f64, saturate: bool) -> u8 {
    let neg = v.is_sign_negative();
    let s = if neg { m.sign } else { 0 };
    if v.is_nan() {
        return match m.kind {
            MiniKind::Fn => 0x7F | s,
            MiniKind::Fnuz => 0x80,
            MiniKind::Ieee => 0x7E | s,
            // what ml_dtypes (the ONNX reference) produces
            MiniKind::Fp4 => s ^ m.sign,
        };
    }
    let a = libm::fabs(v);
    let emin = 1 - m.bias;
    let code: u64 = if a.is_infinite() {
        u64::MAX
    } else if a == 0.0 {
        0
    } else {
        let (_, e2) = libm::frexp(a);
        let e = (e2 - 1).max(emin);
        let q = libm::ldexp(a, m.mbits - e);
        let n = libm::rint(q) as u64;
        (((e - emin) as u64) << m.mbits) + n
    };
    if code > m.max_code as u64 {
        if saturate || m.kind == MiniKind::Fp4 {
            return m.max_code | s;
        }
        return match m.kind {
            MiniKind::Ieee => 0x7C | s,
            MiniKind::Fnuz => 0x80,
            _ => 0x7F | s,
        };
    }
    if code == 0 && m.kind == MiniKind::Fnuz {
        return 0;
    }
    code as u8 | s
}

/// Decodes one small-float code (exactly representable in f32).
pub(crate) fn mini_decode(m: &Mini, b: u8) -> f32 {
    let neg = b & m.sign != 0;
    let mag = b & (m.sign - 1);
    match m.kind {
        MiniKind::Fnuz if b == 0x80 => return f32::NAN,
        MiniKind::Fn if mag == 0x7F => return if neg { -f32::NAN } else { f32::NAN },
        MiniKind::Ieee if mag >= 0x7C => {
            let v = if mag == 0x7C { f32::INFINITY } else { f32::NAN };
            return if neg { -v } else { v };
        }
        _ => {}
    }
    let e = (mag >> m.mbits) as i32;
    let f = (mag & ((1 << m.mbits) - 1)) as f64;
    let v = if e == 0 {
        libm::ldexp(f, 1 - m.bias - m.mbits)
    } else {
        libm::ldexp(f + (1 << m.mbits) as f64, e - m.bias - m.mbits)
    };
    (if neg { -v } else { v }) as f32
}

/// float8e8m0 (a power-of-two exponent) from f32, following the ONNX reference rounding.
fn e8m0_encode(v: f32, saturate: bool, round: E8Round) -> u8 {
    let bits = v.to_bits();
    let exp = (bits >> 23) & 0xFF;
    if exp == 0xFF {
        return 0xFF;
    }
    let up = match round {
        E8Round::Down => false,
        E8Round::Up => bits & 0x7F_FFFF != 0,
        E8Round::Nearest => {
            let g = bits & 0x40_0000 != 0;
            let r = bits & 0x20_0000 != 0;
            let s = bits & 0x1F_FFFF != 0;
            g && (r || s || exp > 0)
        }
    };
    if up && !(saturate && exp == 0xFE) {
        (exp + 1) as u8
    } else {
        exp as u8
    }
}

pub(crate) fn e8m0_decode(b: u8) -> f32 {
    if b == 0xFF {
        f32::NAN
    } else {
        libm::ldexpf(1.0, b as i32 - 127)
    }
}

/// Element types stored as raw bytes that Cast converts.
pub(crate) fn is_raw(dt: DataType) -> bool {
    dt.is_float8()
        || matches!(
            dt,
            DataType::Float4E2M1
                | DataType::Int4
                | DataType::Uint4
                | DataType::Int2
                | DataType::Uint2
        )
}

/// The bytes holding a raw tensor's elements.
pub(crate) fn raw_data(x: &Tensor) -> Result<&[u8]> {
    if !x.is_contiguous() {
        unsupported!("strided views of {} tensors are not supported", x.dtype());
    }
    let need = x.dtype().storage_bytes(x.len()).unwrap_or(usize::MAX);
    let b = x.raw_bytes()?;
    if b.len() < need {
        bail!("{} tensor storage is too short", x.dtype());
    }
    Ok(&b[..need])
}

/// Element `i` of packed `bits`-wide codes (low bits first).
#[inline]
pub(crate) fn packed(bytes: &[u8], i: usize, bits: usize) -> u8 {
    let per = 8 / bits;
    (bytes[i / per] >> ((i % per) * bits)) & ((1u8 << bits) - 1)
}

/// Packs `bits`-wide codes, low bits first.
pub(crate) fn pack(codes: impl Iterator<Item = u8>, bits: usize, n: usize) -> Vec<u8> {
    let per = 8 / bits;
    let mut out = vec![0u8; (n * bits).div_ceil(8)];
    for (i, c) in codes.enumerate() {
        out[i / per] |= (c & ((1u8 << bits) - 1)) << ((i % per) * bits);
    }
    out
}

/// A raw tensor decoded to a native one that holds its values exactly (f32, i8 or u8).
pub(crate) fn decode_raw(x: &Tensor) -> Result<Tensor> {
    let n = x.len();
    let b = raw_data(x)?;
    let dt = x.dtype();
    let shape = x.shape();
    if let Some(m) = mini_of(dt) {
        let v: Vec<f32> = if dt == DataType::Float4E2M1 {
            (0..n).map(|i| mini_decode(m, packed(b, i, 4))).collect()
        } else {
            b.iter().map(|&c| mini_decode(m, c)).collect()
        };
        return Tensor::from_vec(shape, v);
    }
    match dt {
        DataType::Float8E8M0 => {
            Tensor::from_vec(shape, b.iter().map(|&c| e8m0_decode(c)).collect())
        }
        DataType::Int4 => Tensor::from_vec(
            shape,
            (0..n)
                .map(|i| ((packed(b, i, 4) << 4) as i8) >> 4)
                .collect(),
        ),
        DataType::Uint4 => Tensor::from_vec(shape, (0..n).map(|i| packed(b, i, 4)).collect()),
        DataType::Int2 => Tensor::from_vec(
            shape,
            (0..n)
                .map(|i| ((packed(b, i, 2) << 6) as i8) >> 6)
                .collect(),
        ),
        DataType::Uint2 => Tensor::from_vec(shape, (0..n).map(|i| packed(b, i, 2)).collect()),
        _ => unsupported!("Cast from {dt} is not supported"),
    }
}

/// Every element of a native or string tensor, widened.
fn wide_vec(x: &Tensor) -> Result<Vec<Wide>> {
    if x.dtype() == DataType::String {
        return x
            .as_slice::<String>()?
            .iter()
            .map(|s| parse_wide(s))
            .collect();
    }
    cvt_dispatch!(x.dtype(), S => Ok(x.as_slice::<S>()?.iter().map(|v| v.wide()).collect()),
        else unsupported!("Cast from {} is not supported", x.dtype()))
}

/// Casts a native or string tensor to a raw-byte element type.
fn encode_raw(x: &Tensor, to: DataType, o: CastOpts) -> Result<Tensor> {
    let n = x.len();
    let w = wide_vec(x)?;
    let bytes = if let Some(m) = mini_of(to) {
        let codes = w.iter().map(|&v| mini_encode(m, wide_f64(v), o.saturate));
        if to == DataType::Float4E2M1 {
            pack(codes, 4, n)
        } else {
            codes.collect()
        }
    } else {
        match to {
            DataType::Float8E8M0 => w
                .iter()
                .map(|&v| e8m0_encode(wide_f64(v) as f32, o.saturate, o.round))
                .collect(),
            DataType::Int4 | DataType::Uint4 => pack(w.iter().map(|&v| wide_i64(v) as u8), 4, n),
            DataType::Int2 | DataType::Uint2 => pack(w.iter().map(|&v| wide_i64(v) as u8), 2, n),
            _ => unsupported!("Cast to {to} is not supported"),
        }
    };
    Tensor::from_data(to, x.shape().to_vec(), Data::Raw(bytes))
}

fn cast_from_string(x: &Tensor, to: DataType) -> Result<Tensor> {
    let s = x.as_slice::<String>()?;
    let shape = x.shape();
    match to {
        DataType::Float => {
            let v: Result<Vec<f32>> = s
                .iter()
                .map(|t| {
                    t.trim()
                        .parse::<f32>()
                        .or_else(|_| parse_wide(t).map(f32::from_wide))
                })
                .collect();
            Tensor::from_vec(shape, v?)
        }
        DataType::Double => {
            let v: Result<Vec<f64>> = s.iter().map(|t| parse_wide(t).map(wide_f64)).collect();
            Tensor::from_vec(shape, v?)
        }
        _ => cvt_dispatch!(to, D => {
            let v: Result<Vec<D>> = s.iter().map(|t| parse_wide(t).map(D::from_wide)).collect();
            Tensor::from_vec(shape, v?)
        }, else unsupported!("Cast to {to} is not supported")),
    }
}

/// Converts a tensor to element type `to` with the ONNX Cast rules.
fn cast(x: &Tensor, to: DataType, o: CastOpts) -> Result<Tensor> {
    let from = x.dtype();
    if from == to {
        return Ok(x.clone());
    }
    if is_raw(from) {
        return cast(&decode_raw(x)?, to, o);
    }
    if is_raw(to) {
        return encode_raw(x, to, o);
    }
    if from == DataType::String {
        return cast_from_string(x, to);
    }
    if to == DataType::String {
        return cvt_dispatch!(from, S => map1::<S, String>(x, |v| v.fmt_s()),
            else unsupported!("Cast from {from} is not supported"));
    }
    match (from, to) {
        (DataType::Float, DataType::Float16) => map1::<f32, f16>(x, |&v| f16::from_f32(v)),
        (DataType::Float16, DataType::Float) => map1::<f16, f32>(x, |v| v.to_f32()),
        (DataType::Float, DataType::Bfloat16) => map1::<f32, bf16>(x, |&v| bf16::from_f32(v)),
        (DataType::Bfloat16, DataType::Float) => map1::<bf16, f32>(x, |v| v.to_f32()),
        _ => {
            cvt_dispatch!(from, S => cvt_dispatch!(to, D => map1::<S, D>(x, |&v| D::from_wide(v.wide())),
                else unsupported!("Cast to {to} is not supported")),
            else unsupported!("Cast from {from} is not supported"))
        }
    }
}

fn cast_opts(node: &Node) -> Result<CastOpts> {
    let saturate = node.get_i("saturate", 1)? != 0;
    let round = match node.get_s("round_mode", "up")?.as_str() {
        "up" => E8Round::Up,
        "down" => E8Round::Down,
        "nearest" => E8Round::Nearest,
        other => unsupported!("Cast: round_mode '{other}' is not supported (up, down, nearest)"),
    };
    Ok(CastOpts { saturate, round })
}

/// Whether Cast can produce or read this element type at all.
fn castable(dt: DataType) -> bool {
    !matches!(dt, DataType::Complex64 | DataType::Complex128)
}

fn build_cast(node: &Node) -> Result<Box<dyn Kernel>> {
    let to = match node.attr("to") {
        Some(AttrValue::Int(c)) => match i32::try_from(*c).ok().and_then(DataType::from_code) {
            Some(dt) => dt,
            None => unsupported!("Cast: unknown target element type code {c}"),
        },
        // opset 1 names the type (`"FLOAT"`)
        Some(AttrValue::String(s)) => {
            let name = String::from_utf8_lossy(s);
            match DataType::ALL
                .iter()
                .find(|d| d.name().eq_ignore_ascii_case(&name))
            {
                Some(&dt) => dt,
                None => unsupported!("Cast: unknown target element type '{name}'"),
            }
        }
        Some(v) => bail!("Cast: attribute 'to' should be an int, is {}", v.kind()),
        None => bail!("Cast: attribute 'to' is required"),
    };
    if !castable(to) {
        unsupported!("Cast to {to} is not supported");
    }
    let o = cast_opts(node)?;
    kernel(move |inputs| {
        let x = tensor_in(inputs, 0)?;
        if !castable(x.dtype()) {
            unsupported!("Cast from {} is not supported", x.dtype());
        }
        out1(cast(x, to, o)?)
    })
}

fn build_cast_like(node: &Node) -> Result<Box<dyn Kernel>> {
    let o = cast_opts(node)?;
    kernel(move |inputs| {
        let x = tensor_in(inputs, 0)?;
        let to = tensor_in(inputs, 1)?.dtype();
        if !castable(x.dtype()) || !castable(to) {
            unsupported!("CastLike from {} to {to} is not supported", x.dtype());
        }
        out1(cast(x, to, o)?)
    })
}

#[cfg(test)]
mod tests {
    //! Expected values come from numpy / ml_dtypes / torch (pasted), or from independent
    //! index formulas.
    use super::*;
    use crate::error::Error;
    use crate::provider::ReferenceCpu;
    use alloc::string::ToString;

    /// A node with no outputs declared.
    fn node(op: &str, opset: i64, attrs: Vec<(&str, AttrValue)>) -> Node {
        crate::kernels::test_util::node(op, opset, attrs, 0)
    }

    fn build(op: &str, opset: i64, attrs: Vec<(&str, AttrValue)>) -> Result<Box<dyn Kernel>> {
        let d = KERNELS
            .iter()
            .find(|d| d.op == op && d.since <= opset && opset <= d.until)
            .expect("registered");
        (d.build)(&node(op, opset, attrs))
    }

    fn run_opt(
        op: &str,
        opset: i64,
        attrs: Vec<(&str, AttrValue)>,
        inputs: &[Option<Tensor>],
    ) -> Result<Tensor> {
        let k = build(op, opset, attrs)?;
        let vals: Vec<Option<Value>> = inputs
            .iter()
            .map(|t| t.clone().map(Value::Tensor))
            .collect();
        let refs: Vec<Option<&Value>> = vals.iter().map(|v| v.as_ref()).collect();
        let cx = KernelCx::new(&ReferenceCpu);
        match k.compute(&cx, &refs)?.into_iter().next() {
            Some(Value::Tensor(t)) => Ok(t),
            _ => panic!("no tensor output"),
        }
    }

    fn run(
        op: &str,
        opset: i64,
        attrs: Vec<(&str, AttrValue)>,
        inputs: &[Tensor],
    ) -> Result<Tensor> {
        let v: Vec<Option<Tensor>> = inputs.iter().cloned().map(Some).collect();
        run_opt(op, opset, attrs, &v)
    }

    fn t<T: Elem>(shape: &[usize], v: Vec<T>) -> Tensor {
        Tensor::from_vec(shape, v).unwrap()
    }

    fn f32s(t: &Tensor) -> Vec<f32> {
        t.as_slice::<f32>().unwrap().into_owned()
    }

    fn close(got: &[f32], want: &[f32], tol: f32) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!(
                (g - w).abs() <= tol * (1.0 + w.abs()) || (g.is_nan() && w.is_nan()),
                "{got:?} vs {want:?}"
            );
        }
    }

    #[test]
    fn add_broadcasts_column_into_3d() {
        let a = t(&[2, 3, 4], (0..24).map(|i| i as f32 * 0.5 - 3.0).collect());
        let b = t(&[3, 1], vec![1.5f32, -2.0, 4.0]);
        let y = run("Add", 14, vec![], &[a, b]).unwrap();
        assert_eq!(y.shape(), &[2, 3, 4]);
        let want = [
            -1.5, -1.0, -0.5, 0.0, -3.0, -2.5, -2.0, -1.5, 5.0, 5.5, 6.0, 6.5, 4.5, 5.0, 5.5, 6.0,
            3.0, 3.5, 4.0, 4.5, 11.0, 11.5, 12.0, 12.5,
        ];
        assert_eq!(f32s(&y), want);
    }

    #[test]
    fn one_element_broadcasts_over_matrix_both_ways() {
        let s = t(&[1], vec![3f32]);
        let m = t(&[2, 2], vec![1f32, 2., 3., 4.]);
        let y = run("Mul", 14, vec![], &[s.clone(), m.clone()]).unwrap();
        assert_eq!(y.shape(), &[2, 2]);
        assert_eq!(f32s(&y), [3., 6., 9., 12.]);
        let y = run("Sub", 14, vec![], &[m, s]).unwrap();
        assert_eq!(f32s(&y), [-2., -1., 0., 1.]);
    }

    #[test]
    fn both_operands_broadcast() {
        let x = t(&[2, 1, 3], (0..6).map(|i| i as f32).collect());
        let y = t(&[4, 1], vec![10f32, 20., 30., 40.]);
        let z = run("Sub", 14, vec![], &[x, y]).unwrap();
        assert_eq!(z.shape(), &[2, 4, 3]);
        let want = [
            -10., -9., -8., -20., -19., -18., -30., -29., -28., -40., -39., -38., -7., -6., -5.,
            -17., -16., -15., -27., -26., -25., -37., -36., -35.,
        ];
        assert_eq!(f32s(&z), want);
    }

    #[test]
    fn strided_input_views_broadcast() {
        // a transposed (non-contiguous) view plus a row
        let a = t(&[3, 2], vec![1i32, 2, 3, 4, 5, 6])
            .permute(&[1, 0])
            .unwrap();
        let b = t(&[3], vec![10i32, 20, 30]);
        let y = run("Add", 14, vec![], &[a, b]).unwrap();
        assert_eq!(&*y.as_slice::<i32>().unwrap(), &[11, 23, 35, 12, 24, 36]);
    }

    #[test]
    fn legacy_broadcast_with_axis() {
        let a = t(&[2, 3, 4], (0..24).map(|i| i as f32).collect());
        let b = t(&[3], vec![100f32, 200., 300.]);
        let y = run(
            "Add",
            6,
            vec![
                ("broadcast", AttrValue::Int(1)),
                ("axis", AttrValue::Int(1)),
            ],
            &[a, b.clone()],
        )
        .unwrap();
        let v = f32s(&y);
        for i in 0..2 {
            for j in 0..3 {
                for k in 0..4 {
                    let idx = i * 12 + j * 4 + k;
                    assert_eq!(v[idx], idx as f32 + 100.0 * (j + 1) as f32);
                }
            }
        }
        // without broadcast=1 the shapes must match
        let a = t(&[2, 3], vec![0f32; 6]);
        assert!(run("Add", 6, vec![], &[a, b]).is_err());
    }

    #[test]
    fn integer_div_truncates_and_rejects_zero() {
        let a = t(&[6], vec![7i32, -7, 7, -7, 9, -9]);
        let b = t(&[6], vec![2i32, 2, -2, -2, 3, 4]);
        let y = run("Div", 14, vec![], &[a.clone(), b]).unwrap();
        assert_eq!(&*y.as_slice::<i32>().unwrap(), &[3, -3, -3, 3, 3, -2]);
        let z = t(&[1], vec![0i32]);
        assert!(run("Div", 14, vec![], &[a, z]).is_err());
    }

    #[test]
    fn integer_mod_follows_divisor_sign_unless_fmod() {
        let a = t(&[6], vec![-4i64, 7, 5, 4, -7, 8]);
        let b = t(&[6], vec![2i64, -3, 8, -2, 3, 5]);
        let y = run("Mod", 13, vec![], &[a.clone(), b.clone()]).unwrap();
        assert_eq!(&*y.as_slice::<i64>().unwrap(), &[0, -2, 5, 0, 2, 3]);
        let y = run("Mod", 13, vec![("fmod", AttrValue::Int(1))], &[a, b]).unwrap();
        assert_eq!(&*y.as_slice::<i64>().unwrap(), &[0, 1, 5, 0, -1, 3]);
        assert!(matches!(
            build("Mod", 13, vec![("fmod", AttrValue::Int(2))]),
            Err(Error::Unsupported { .. })
        ));
    }

    #[test]
    fn float_mod_edge_cases() {
        // from the ONNX node test mod_float_edge_cases_fmod_0_float32
        let inf = f32::INFINITY;
        let a = t(&[8], vec![0f32, -0.0, -3., 3., -1., 1., inf, 1.]);
        let b = t(&[8], vec![-2f32, 2., inf, inf, -inf, -inf, 2., 0.]);
        let y = f32s(&run("Mod", 28, vec![], &[a, b]).unwrap());
        let want = [-0.0f32, 0.0, inf, 3., -1., -inf];
        for (g, w) in y.iter().zip(want) {
            assert_eq!(g.to_bits(), w.to_bits(), "{y:?}");
        }
        assert!(y[6].is_nan() && y[7].is_nan());
    }

    #[test]
    fn pow_mixed_types() {
        let y = run(
            "Pow",
            15,
            vec![],
            &[t(&[3], vec![2i64, -3, 5]), t(&[3], vec![10i64, 3, 0])],
        )
        .unwrap();
        assert_eq!(&*y.as_slice::<i64>().unwrap(), &[1024, -27, 1]);
        let y = run(
            "Pow",
            15,
            vec![],
            &[t(&[3], vec![2i32, -3, 5]), t(&[3], vec![0.5f32, 2., 1.5])],
        )
        .unwrap();
        assert_eq!(&*y.as_slice::<i32>().unwrap(), &[1, 9, 11]);
        let x = t(&[4], vec![1.5f32, -2., 3., 0.1]);
        let sq = run("Pow", 15, vec![], &[x.clone(), Tensor::scalar(2f32)]).unwrap();
        close(&f32s(&sq), &[2.25, 4., 9., 0.01], 1e-6);
        let y = run("Pow", 15, vec![], &[x, t(&[1], vec![3i64])]).unwrap();
        close(&f32s(&y), &[3.375, -8., 27., 0.001], 1e-6);
    }

    #[test]
    fn bitshift_out_of_range_counts() {
        let x = t(&[3], vec![-8i8, 4, -1]);
        let l = run(
            "BitShift",
            28,
            vec![("direction", AttrValue::String(b"LEFT".to_vec()))],
            &[x.clone(), t(&[3], vec![-1i8, -8, -16])],
        )
        .unwrap();
        assert_eq!(&*l.as_slice::<i8>().unwrap(), &[0, 0, 0]);
        let r = run(
            "BitShift",
            28,
            vec![("direction", AttrValue::String(b"RIGHT".to_vec()))],
            &[x, t(&[3], vec![8i8, 9, 127])],
        )
        .unwrap();
        assert_eq!(&*r.as_slice::<i8>().unwrap(), &[-1, 0, -1]);
        let r = run(
            "BitShift",
            11,
            vec![("direction", AttrValue::String(b"RIGHT".to_vec()))],
            &[t(&[2], vec![16u8, 255]), t(&[1], vec![2u8])],
        )
        .unwrap();
        assert_eq!(&*r.as_slice::<u8>().unwrap(), &[4, 63]);
    }

    #[test]
    fn comparisons_and_string_equal() {
        let a = t(&[2, 2], vec![1f32, 2., 3., f32::NAN]);
        let b = t(&[2], vec![2f32, 2.]);
        let y = run("LessOrEqual", 16, vec![], &[a.clone(), b.clone()]).unwrap();
        assert_eq!(&*y.as_slice::<bool>().unwrap(), &[true, true, false, false]);
        let y = run("Greater", 13, vec![], &[a, b]).unwrap();
        assert_eq!(
            &*y.as_slice::<bool>().unwrap(),
            &[false, false, true, false]
        );
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let x = t(&[2, 2], s(&["a", "b", "c", "a"]));
        let y = t(&[2], s(&["a", "c"]));
        let e = run("Equal", 19, vec![], &[x, y]).unwrap();
        assert_eq!(
            &*e.as_slice::<bool>().unwrap(),
            &[true, false, false, false]
        );
    }

    #[test]
    fn variadic_ops_broadcast() {
        let a = t(&[2, 1], vec![1f32, 5.]);
        let b = t(&[3], vec![0f32, 3., f32::NAN]);
        let c = t(&[1], vec![2f32]);
        let m = run("Max", 13, vec![], &[a.clone(), b.clone(), c.clone()]).unwrap();
        assert_eq!(m.shape(), &[2, 3]);
        let v = f32s(&m);
        assert_eq!(&v[..2], &[2., 3.]);
        assert!(v[2].is_nan());
        assert_eq!(&v[3..5], &[5., 5.]);
        let s = run("Mean", 13, vec![], &[a, t(&[3], vec![0f32, 3., 6.]), c]).unwrap();
        close(&f32s(&s), &[1., 2., 3., 7. / 3., 10. / 3., 13. / 3.], 1e-6);
        let one = run("Sum", 13, vec![], &[t(&[2], vec![4i32, 5])]).unwrap();
        assert_eq!(&*one.as_slice::<i32>().unwrap(), &[4, 5]);
    }

    #[test]
    fn where_broadcasts_three_ways() {
        let c = t(&[2, 1], vec![true, false]);
        let x = t(&[1, 3], vec![1f32, 2., 3.]);
        let y = Tensor::scalar(-1f32);
        let w = run("Where", 16, vec![], &[c.clone(), x, y]).unwrap();
        assert_eq!(w.shape(), &[2, 3]);
        assert_eq!(f32s(&w), [1., 2., 3., -1., -1., -1.]);
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let w = run(
            "Where",
            16,
            vec![],
            &[c, t(&[2], s(&["a", "b"])), t(&[1], s(&["z"]))],
        )
        .unwrap();
        assert_eq!(&*w.as_slice::<String>().unwrap(), &s(&["a", "b", "z", "z"]));
    }

    #[test]
    fn clip_inputs_and_attributes() {
        let x = t(&[4], vec![-3i8, -1, 2, 9]);
        let y = run_opt(
            "Clip",
            13,
            vec![],
            &[Some(x), None, Some(Tensor::scalar(1i8))],
        )
        .unwrap();
        assert_eq!(&*y.as_slice::<i8>().unwrap(), &[-3, -1, 1, 1]);
        // min > max gives max everywhere
        let x = t(&[3], vec![-5f32, 0., 5.]);
        let y = run(
            "Clip",
            13,
            vec![],
            &[x.clone(), Tensor::scalar(2f32), Tensor::scalar(1f32)],
        )
        .unwrap();
        assert_eq!(f32s(&y), [1., 1., 1.]);
        let y = run(
            "Clip",
            6,
            vec![
                ("min", AttrValue::Float(-1.0)),
                ("max", AttrValue::Float(1.0)),
            ],
            &[x],
        )
        .unwrap();
        assert_eq!(f32s(&y), [-1., 0., 1.]);
    }

    /// (op, opset, attributes, expected outputs)
    type Case = (&'static str, i64, Vec<(&'static str, AttrValue)>, [f32; 5]);

    #[test]
    fn unary_and_activations_match_torch() {
        let x = || t(&[5], vec![-3.0f32, -0.5, 0.0, 0.7, 2.5]);
        let cases: Vec<Case> = vec![
            (
                "Selu",
                22,
                vec![],
                [-1.6705687, -0.6917582, 0.0, 0.7354907, 2.6267526],
            ),
            (
                "Elu",
                22,
                vec![("alpha", AttrValue::Float(0.5))],
                [-0.4751065, -0.19673467, 0.0, 0.7, 2.5],
            ),
            (
                "Celu",
                12,
                vec![("alpha", AttrValue::Float(2.0))],
                [-1.5537397, -0.44239843, 0.0, 0.7, 2.5],
            ),
            (
                "HardSwish",
                22,
                vec![],
                [0.0, -0.20833333, 0.0, 0.43166664, 2.2916667],
            ),
            ("HardSigmoid", 22, vec![], [0.0, 0.4, 0.5, 0.64, 1.0]),
            // x * sigmoid(2x)
            (
                "Swish",
                24,
                vec![("alpha", AttrValue::Float(2.0))],
                [-0.0074178695, -0.13447071, 0.0, 0.5615287, 2.4832679],
            ),
            (
                "Softplus",
                22,
                vec![],
                [
                    0.048587352,
                    0.474077,
                    core::f32::consts::LN_2,
                    1.103186,
                    2.5788898,
                ],
            ),
            (
                "Mish",
                22,
                vec![],
                [-0.14564747, -0.22074376, 0.0, 0.56114835, 2.4713924],
            ),
            (
                "Gelu",
                20,
                vec![],
                [-0.0040498674, -0.15426879, 0.0, 0.53062546, 2.484476],
            ),
            (
                "Gelu",
                20,
                vec![("approximate", AttrValue::String(b"tanh".to_vec()))],
                [-0.003637433, -0.154286, 0.0, 0.53057015, 2.4849157],
            ),
            (
                "Sigmoid",
                13,
                vec![],
                [0.047425874, 0.37754068, 0.5, 0.66818774, 0.9241418],
            ),
            (
                "Softsign",
                22,
                vec![],
                [-0.75, -0.33333334, 0.0, 0.4117647, 0.71428573],
            ),
            (
                "Erf",
                13,
                vec![],
                [-0.9999779, -0.5204999, 0.0, 0.6778012, 0.999593],
            ),
            ("LeakyRelu", 16, vec![], [-0.03, -0.005, 0.0, 0.7, 2.5]),
            (
                "ThresholdedRelu",
                22,
                vec![("alpha", AttrValue::Float(0.7))],
                [0.0, 0.0, 0.0, 0.0, 2.5],
            ),
            (
                "Shrink",
                9,
                vec![
                    ("bias", AttrValue::Float(0.5)),
                    ("lambd", AttrValue::Float(0.6)),
                ],
                [-2.5, 0.0, 0.0, 0.2, 2.0],
            ),
        ];
        for (op, opset, attrs, want) in cases {
            let y = run(op, opset, attrs, &[x()]).unwrap();
            close(&f32s(&y), &want, 1e-5);
            // f64 and f16 go through the same formula
            let xd = cast(&x(), DataType::Double, CAST_DEFAULT).unwrap();
            let yd = run(op, opset, vec![], &[xd]);
            assert!(yd.is_ok(), "{op} f64");
        }
        let r = run(
            "Round",
            22,
            vec![],
            &[t(&[6], vec![0.5f32, 1.5, 2.5, -0.5, -1.5, -2.6])],
        )
        .unwrap();
        assert_eq!(f32s(&r), [0., 2., 2., -0., -2., -3.]);
        let h = cast(
            &t(&[2], vec![-2.5f32, 1.25]),
            DataType::Float16,
            CAST_DEFAULT,
        )
        .unwrap();
        let a = run("Abs", 13, vec![], &[h]).unwrap();
        assert_eq!(a.to_f32_vec().unwrap(), [2.5, 1.25]);
        let inf = t(&[4], vec![f32::INFINITY, -f32::INFINITY, 1., f32::NAN]);
        let y = run(
            "IsInf",
            20,
            vec![("detect_negative", AttrValue::Int(0))],
            core::slice::from_ref(&inf),
        )
        .unwrap();
        assert_eq!(
            &*y.as_slice::<bool>().unwrap(),
            &[true, false, false, false]
        );
        let y = run("IsNaN", 20, vec![], &[inf]).unwrap();
        assert_eq!(
            &*y.as_slice::<bool>().unwrap(),
            &[false, false, false, true]
        );
        assert!(matches!(
            build(
                "Gelu",
                20,
                vec![("approximate", AttrValue::String(b"erf".to_vec()))]
            ),
            Err(Error::Unsupported { .. })
        ));
    }

    #[test]
    fn prelu_slope_broadcasts() {
        let x = t(&[2, 3], vec![-1f32, -2., 3., -4., 5., -6.]);
        let s = t(&[3], vec![0.1f32, 0.2, 0.3]);
        let y = run("PRelu", 16, vec![], &[x, s]).unwrap();
        close(&f32s(&y), &[-0.1, -0.4, 3., -0.4, 5., -1.8], 1e-6);
    }

    const CAST_DEFAULT: CastOpts = CastOpts {
        saturate: true,
        round: E8Round::Up,
    };

    fn cast_to(x: Tensor, to: DataType, attrs: Vec<(&str, AttrValue)>) -> Tensor {
        let mut a = attrs;
        a.push(("to", AttrValue::Int(to.code() as i64)));
        run("Cast", 25, a, &[x]).unwrap()
    }

    #[test]
    fn cast_float_to_int_truncates() {
        let x = t(&[5], vec![1.7f32, -1.7, 2.5, -0.5, -2.9]);
        let y = cast_to(x.clone(), DataType::Int32, vec![]);
        assert_eq!(&*y.as_slice::<i32>().unwrap(), &[1, -1, 2, 0, -2]);
        let y = cast_to(t(&[3], vec![200f32, -3.7, 3.7]), DataType::Uint8, vec![]);
        assert_eq!(&*y.as_slice::<u8>().unwrap(), &[200, 253, 3]);
        let y = cast_to(x, DataType::Bool, vec![]);
        assert_eq!(&*y.as_slice::<bool>().unwrap(), &[true; 5]);
        // int -> narrower int wraps
        let y = cast_to(t(&[2], vec![200i16, -129]), DataType::Int8, vec![]);
        assert_eq!(&*y.as_slice::<i8>().unwrap(), &[-56, 127]);
    }

    #[test]
    fn cast_float8_rounds_to_nearest_even() {
        let x = || {
            t(
                &[11],
                vec![
                    0.3f32,
                    -1.7,
                    100.0,
                    500.0,
                    -1e-3,
                    3e-3,
                    1e5,
                    f32::INFINITY,
                    -f32::INFINITY,
                    17.0,
                    0.0013671875,
                ],
            )
        };
        // ml_dtypes: astype (saturate=0) and clip-then-astype (saturate=1)
        let cases: [(DataType, [u8; 11], [u8; 11]); 4] = [
            (
                DataType::Float8E4M3FN,
                [
                    0x2a, 0xbe, 0x6c, 0x7f, 0x81, 0x2, 0x7f, 0x7f, 0xff, 0x58, 0x1,
                ],
                [
                    0x2a, 0xbe, 0x6c, 0x7e, 0x81, 0x2, 0x7e, 0x7e, 0xfe, 0x58, 0x1,
                ],
            ),
            (
                DataType::Float8E4M3FNUZ,
                [
                    0x32, 0xc6, 0x74, 0x80, 0x81, 0x3, 0x80, 0x80, 0x80, 0x60, 0x1,
                ],
                [
                    0x32, 0xc6, 0x74, 0x7f, 0x81, 0x3, 0x7f, 0x7f, 0xff, 0x60, 0x1,
                ],
            ),
            (
                DataType::Float8E5M2,
                [
                    0x35, 0xbf, 0x56, 0x60, 0x94, 0x1a, 0x7c, 0x7c, 0xfc, 0x4c, 0x16,
                ],
                [
                    0x35, 0xbf, 0x56, 0x60, 0x94, 0x1a, 0x7b, 0x7b, 0xfb, 0x4c, 0x16,
                ],
            ),
            (
                DataType::Float8E5M2FNUZ,
                [
                    0x39, 0xc3, 0x5a, 0x64, 0x98, 0x1e, 0x80, 0x80, 0x80, 0x50, 0x1a,
                ],
                [
                    0x39, 0xc3, 0x5a, 0x64, 0x98, 0x1e, 0x7f, 0x7f, 0xff, 0x50, 0x1a,
                ],
            ),
        ];
        for (dt, nosat, sat) in cases {
            let y = cast_to(x(), dt, vec![("saturate", AttrValue::Int(0))]);
            assert_eq!(y.raw_bytes().unwrap(), &nosat, "{dt} saturate=0");
            let y = cast_to(x(), dt, vec![]);
            assert_eq!(y.raw_bytes().unwrap(), &sat, "{dt} saturate=1");
            // every non-NaN code decodes and re-encodes to itself
            let m = mini_of(dt).unwrap();
            for c in 0..=255u8 {
                let v = mini_decode(m, c);
                if !v.is_nan() {
                    assert_eq!(mini_encode(m, v as f64, false), c, "{dt} code {c:#x}");
                }
            }
        }
    }

    #[test]
    fn cast_packed_4bit_types() {
        // float4e2m1 from ml_dtypes, packed low nibble first
        let x = t(&[8], vec![0.3f32, -1.7, 2.6, 100., -0.2, 0.25, 0.75, 1.25]);
        let y = cast_to(x, DataType::Float4E2M1, vec![]);
        assert_eq!(y.raw_bytes().unwrap(), &[0xb1, 0x75, 0x08, 0x22]);
        let back = cast_to(y, DataType::Float, vec![]);
        assert_eq!(f32s(&back), [0.5, -1.5, 3.0, 6.0, -0.0, 0.0, 1.0, 1.0]);
        // int4 wraps (ONNX node test cast_FLOAT_to_INT4)
        let x = t(&[25], (-9..16).map(|v| v as f32).collect());
        let y = cast_to(x, DataType::Int4, vec![]);
        assert_eq!(
            y.raw_bytes().unwrap(),
            &[0x87, 0xa9, 0xcb, 0xed, 0x0f, 0x21, 0x43, 0x65, 0x87, 0xa9, 0xcb, 0xed, 0x0f]
        );
        let back = cast_to(y, DataType::Int8, vec![]);
        let want: Vec<i8> = (-9..16).map(|v: i32| ((v << 28) >> 28) as i8).collect();
        assert_eq!(&*back.as_slice::<i8>().unwrap(), &want[..]);
    }

    #[test]
    fn cast_strings_like_numpy() {
        let x = t(
            &[9],
            vec![
                1.5f32,
                0.1,
                1e20,
                123456789.0,
                1e-5,
                -0.0,
                f32::NAN,
                f32::INFINITY,
                100.0,
            ],
        );
        let y = cast_to(x, DataType::String, vec![]);
        let want = [
            "1.5",
            "0.1",
            "1e+20",
            "1.2345679e+08",
            "1e-05",
            "-0.0",
            "nan",
            "inf",
            "100.0",
        ];
        assert_eq!(&*y.as_slice::<String>().unwrap(), &want.map(String::from));
        let y = cast_to(
            t(&[3], vec![1e15f64, 0.1, -2.5e-7]),
            DataType::String,
            vec![],
        );
        let want = ["1000000000000000.0", "0.1", "-2.5e-07"];
        assert_eq!(&*y.as_slice::<String>().unwrap(), &want.map(String::from));
        let h = cast_to(
            t(&[4], vec![65504f32, 0.1, 1234.5, -3.]),
            DataType::Float16,
            vec![],
        );
        let y = cast_to(h, DataType::String, vec![]);
        let want = ["6.55e+04", "0.1", "1.234e+03", "-3.0"];
        assert_eq!(&*y.as_slice::<String>().unwrap(), &want.map(String::from));
        let s = ["1.5", " 2", "-inf", "NaN", "+INF", "1e3"]
            .map(String::from)
            .to_vec();
        let y = f32s(&cast_to(t(&[6], s), DataType::Float, vec![]));
        assert_eq!(&y[..3], &[1.5, 2.0, f32::NEG_INFINITY]);
        assert!(y[3].is_nan());
        assert_eq!(&y[4..], &[f32::INFINITY, 1000.0]);
        let s = ["100.5", "-7"].map(String::from).to_vec();
        let y = cast_to(t(&[2], s), DataType::Int64, vec![]);
        assert_eq!(&*y.as_slice::<i64>().unwrap(), &[100, -7]);
    }

    #[test]
    fn cast_like_and_unsupported_targets() {
        let y = run(
            "CastLike",
            21,
            vec![],
            &[t(&[2], vec![1.5f64, -2.0]), Tensor::scalar(half::f16::ZERO)],
        )
        .unwrap();
        assert_eq!(y.dtype(), DataType::Float16);
        assert_eq!(y.to_f32_vec().unwrap(), [1.5, -2.0]);
        assert!(matches!(
            build("Cast", 21, vec![("to", AttrValue::Int(14))]),
            Err(Error::Unsupported { .. })
        ));
        let y = run(
            "Cast",
            1,
            vec![("to", AttrValue::String(b"INT64".to_vec()))],
            &[t(&[1], vec![3.9f32])],
        )
        .unwrap();
        assert_eq!(&*y.as_slice::<i64>().unwrap(), &[3]);
    }

    #[test]
    fn float8e8m0_rounding() {
        // onnx.numpy_helper.to_float8e8m0 semantics
        assert_eq!(e8m0_encode(1.0, true, E8Round::Up), 127);
        assert_eq!(e8m0_encode(1.5, true, E8Round::Up), 128);
        assert_eq!(e8m0_encode(1.5, true, E8Round::Down), 127);
        assert_eq!(e8m0_encode(1.75, true, E8Round::Nearest), 128);
        assert_eq!(e8m0_encode(f32::MAX, true, E8Round::Up), 254);
        assert_eq!(e8m0_encode(f32::MAX, false, E8Round::Up), 255);
        assert_eq!(e8m0_decode(128), 2.0);
        assert!(e8m0_decode(255).is_nan());
    }
}
