//! The portable SIMD layer: hot f32 kernels written once against a small vector trait
//! ([`VF32`]) and instantiated per instruction set:
//!
//! | ISA | vector | chosen |
//! |---|---|---|
//! | wasm SIMD128 | `v128` (4 lanes) | at compile time, when built with `+simd128` |
//! | x86-64 AVX2 + FMA | `__m256` (8 lanes) | at run time (CPUID, no `std` needed) |
//! | anything else | `[f32; 4]` in plain Rust (the compiler vectorises it for the baseline ISA) | fallback |
//!
//! Every public function here dispatches once per call and then runs a monomorphised loop with
//! the vector type's intrinsics inlined (the generic bodies are `#[inline(always)]`, and the x86
//! instantiation sits inside a `#[target_feature(enable = "avx2,fma")]` wrapper).
//!
//! The native target also uses the `gemm` crate for SGEMM (it is faster on x86 than our
//! micro-kernel); the kernels below are what core's reference kernels call on every target.

mod kernels;
mod portable;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use kernels::BinOp;
pub use portable::Portable;

use crate::provider::Gemm;

/// A vector of f32 lanes. Implementations are thin wrappers over one ISA's registers; every
/// method must be `#[inline(always)]` so that generic kernels compile to straight intrinsics.
pub trait VF32: Copy {
    const LANES: usize;
    fn splat(v: f32) -> Self;
    /// Loads `LANES` floats from `s[0..LANES]` (panics if `s` is shorter).
    fn load(s: &[f32]) -> Self;
    /// Stores `LANES` floats into `d[0..LANES]` (panics if `d` is shorter).
    fn store(self, d: &mut [f32]);
    fn add(self, o: Self) -> Self;
    fn sub(self, o: Self) -> Self;
    fn mul(self, o: Self) -> Self;
    fn div(self, o: Self) -> Self;
    /// `self * b + c` (fused where the ISA has it).
    fn fma(self, b: Self, c: Self) -> Self;
    /// Lane-wise maximum; NaN in `self` propagates.
    fn max(self, o: Self) -> Self;
    /// Lane-wise minimum; NaN in `self` propagates.
    fn min(self, o: Self) -> Self;
    /// Rounds to the nearest integer (ties to even).
    fn round(self) -> Self;
    /// `2^self` for lanes holding integers in [-126, 127].
    fn pow2i(self) -> Self;
    fn hsum(self) -> f32;
    fn hmax(self) -> f32;

    /// `e^x` to within about 2 ulp over the whole f32 range (Cephes-style range reduction and
    /// a degree-6 polynomial); NaN propagates, overflow saturates to `e^88.7`.
    #[inline(always)]
    fn exp(self) -> Self {
        let x = self.max(Self::splat(-87.33)).min(Self::splat(88.72));
        let n = x.mul(Self::splat(core::f32::consts::LOG2_E)).round();
        // r = x - n*ln2 in two steps (hi part exact in f32)
        let r = n.mul(Self::splat(-0.693_359_4)).add(x);
        let r = n.mul(Self::splat(2.121_944_4e-4)).add(r);
        let mut p = Self::splat(1.987_569_1e-4);
        p = p.fma(r, Self::splat(1.398_199_9e-3));
        p = p.fma(r, Self::splat(8.333_452e-3));
        p = p.fma(r, Self::splat(4.166_579_6e-2));
        p = p.fma(r, Self::splat(1.666_666_5e-1));
        p = p.fma(r, Self::splat(0.5));
        let r2 = r.mul(r);
        let y = p.fma(r2, r).add(Self::splat(1.0));
        // n may be 128 at the top of the range: split 2^n into two factors
        let half = n.mul(Self::splat(0.5)).round();
        y.mul(half.pow2i()).mul(n.sub(half).pow2i())
    }
}

/// Which instruction set the dispatcher picks on this machine (for reports).
pub fn isa_name() -> &'static str {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        return "simd128";
    }
    #[cfg(target_arch = "x86_64")]
    {
        if x86::avx2_fma() {
            return "avx2+fma";
        }
    }
    #[allow(unreachable_code)]
    "portable"
}

/// Defines a public function that runs the generic `$imp::<V>` on the best vector type.
macro_rules! dispatch {
    ($(#[$m:meta])* fn $name:ident($($a:ident: $t:ty),*) $(-> $r:ty)? => $imp:ident) => {
        $(#[$m])*
        pub fn $name($($a: $t),*) $(-> $r)? {
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            {
                return kernels::$imp::<wasm::V128>($($a),*);
            }
            #[cfg(target_arch = "x86_64")]
            {
                if x86::avx2_fma() {
                    #[target_feature(enable = "avx2,fma")]
                    unsafe fn wide($($a: $t),*) $(-> $r)? {
                        kernels::$imp::<x86::Avx2>($($a),*)
                    }
                    // SAFETY: the CPU reported AVX2 and FMA (and the OS saves YMM state).
                    return unsafe { wide($($a),*) };
                }
            }
            #[allow(unreachable_code)]
            kernels::$imp::<Portable>($($a),*)
        }
    };
}

dispatch!(
    /// `C = alpha*A*B + beta*C` with a packed, register-blocked micro-kernel (see [`Gemm`]).
    /// Operand strides must be non-negative and in bounds (the caller checks; see
    /// [`sgemm_checked`]).
    fn sgemm_unchecked(g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) => sgemm
);

dispatch!(
    /// `out[i] = a[i] op b[i % b.len()]` (b repeats; `b.len()` divides `a.len()`).
    fn binary_repeat(op: BinOp, a: &[f32], b: &[f32], out: &mut [f32]) => binary_repeat
);

dispatch!(
    /// `out[i] = a[i % a.len()] op b[i]` (a repeats; `a.len()` divides `b.len()`).
    fn binary_repeat_lhs(op: BinOp, a: &[f32], b: &[f32], out: &mut [f32]) => binary_repeat_lhs
);

dispatch!(
    /// `out[i] = max(x[i], 0)`.
    fn relu(x: &[f32], out: &mut [f32]) => relu
);

dispatch!(
    /// `out[i] = 1 / (1 + e^-x[i])`.
    fn sigmoid(x: &[f32], out: &mut [f32]) => sigmoid
);

dispatch!(
    /// `out[i] = e^x[i]`.
    fn exp(x: &[f32], out: &mut [f32]) => exp
);

dispatch!(
    /// Softmax of one contiguous row (`y = e^(x - max) / sum`).
    fn softmax_row(x: &[f32], y: &mut [f32]) => softmax_row
);

dispatch!(
    /// Sum of a slice (pairwise over vector lanes).
    fn sum(x: &[f32]) -> f32 => sum
);

dispatch!(
    /// Maximum of a non-empty slice (NaN propagates).
    fn max(x: &[f32]) -> f32 => max
);

dispatch!(
    /// `y = (x - mean) * inv_std * scale + bias` over one row (`scale`/`bias` as long as `x`).
    fn normalize_row(x: &[f32], mean: f32, inv_std: f32, scale: &[f32], bias: Option<&[f32]>, y: &mut [f32]) => normalize_row
);

/// Like [`sgemm_unchecked`] but checks every stride and bound first; returns `false` (and does
/// nothing) when the operands do not fit, so the caller can take a bounds-checked path.
pub fn sgemm_checked(g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) -> bool {
    let ok = crate::provider::gemm_fits(g, a.len(), b.len(), c.len());
    if ok && g.m > 0 && g.n > 0 {
        sgemm_unchecked(g, a, b, c);
    }
    ok
}

#[cfg(test)]
mod tests;
