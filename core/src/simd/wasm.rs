//! wasm SIMD128: four f32 lanes in a `v128`.

use super::VF32;
use core::arch::wasm32::*;

/// Four f32 lanes in one wasm `v128`.
#[derive(Clone, Copy)]
pub struct V128(v128);

impl V128 {
    /// The bytes `b[0..4]` zero-extended to four u32 lanes.
    #[inline(always)]
    fn widen(b: &[u8]) -> v128 {
        let w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        u32x4_extend_low_u16x8(u16x8_extend_low_u8x16(u32x4_replace_lane::<0>(
            u32x4_splat(0),
            w,
        )))
    }
}

impl VF32 for V128 {
    const LANES: usize = 4;
    #[inline(always)]
    fn splat(v: f32) -> Self {
        V128(f32x4_splat(v))
    }
    #[inline(always)]
    fn load(s: &[f32]) -> Self {
        let s = &s[..4];
        // SAFETY: `s` has 4 floats (16 bytes); v128_load has no alignment requirement.
        V128(unsafe { v128_load(s.as_ptr() as *const v128) })
    }
    #[inline(always)]
    fn store(self, d: &mut [f32]) {
        let d = &mut d[..4];
        // SAFETY: `d` has room for 4 floats; unaligned stores are allowed.
        unsafe { v128_store(d.as_mut_ptr() as *mut v128, self.0) }
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        V128(f32x4_add(self.0, o.0))
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        V128(f32x4_sub(self.0, o.0))
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        V128(f32x4_mul(self.0, o.0))
    }
    #[inline(always)]
    fn div(self, o: Self) -> Self {
        V128(f32x4_div(self.0, o.0))
    }
    #[inline(always)]
    fn fma(self, b: Self, c: Self) -> Self {
        // the relaxed-SIMD build (js/build.sh builds both; the npm package loads it where the
        // browser validates relaxed-SIMD) takes the madd, fused where the machine has FMA;
        // the SIMD128 build multiplies, then adds
        #[cfg(target_feature = "relaxed-simd")]
        {
            V128(f32x4_relaxed_madd(self.0, b.0, c.0))
        }
        #[cfg(not(target_feature = "relaxed-simd"))]
        {
            V128(f32x4_add(f32x4_mul(self.0, b.0), c.0))
        }
    }
    #[inline(always)]
    fn max(self, o: Self) -> Self {
        // pmax(a, b) = a < b ? b : a, so a NaN in self is kept
        V128(f32x4_pmax(self.0, o.0))
    }
    #[inline(always)]
    fn min(self, o: Self) -> Self {
        // pmin(a, b) = b < a ? b : a
        V128(f32x4_pmin(self.0, o.0))
    }
    #[inline(always)]
    fn round(self) -> Self {
        V128(f32x4_nearest(self.0))
    }
    #[inline(always)]
    fn pow2i(self) -> Self {
        let n = i32x4_trunc_sat_f32x4(self.0);
        V128(i32x4_shl(i32x4_add(n, i32x4_splat(127)), 23))
    }
    #[inline(always)]
    fn hsum(self) -> f32 {
        let v = self.0;
        (f32x4_extract_lane::<0>(v) + f32x4_extract_lane::<2>(v))
            + (f32x4_extract_lane::<1>(v) + f32x4_extract_lane::<3>(v))
    }
    #[inline(always)]
    fn abs(self) -> Self {
        V128(f32x4_abs(self.0))
    }
    #[inline(always)]
    fn copysign(self, sign: Self) -> Self {
        let s = f32x4_splat(-0.0);
        V128(v128_bitselect(sign.0, self.0, s))
    }
    #[inline(always)]
    fn lt_select(self, t: Self, a: Self, b: Self) -> Self {
        V128(v128_bitselect(a.0, b.0, f32x4_lt(self.0, t.0)))
    }
    #[inline(always)]
    fn deinterleave(self, b: Self) -> (Self, Self) {
        (
            V128(i32x4_shuffle::<0, 2, 4, 6>(self.0, b.0)),
            V128(i32x4_shuffle::<1, 3, 5, 7>(self.0, b.0)),
        )
    }
    #[inline(always)]
    fn nibbles(b: &[u8]) -> (Self, Self) {
        let w = Self::widen(b);
        let lo = v128_and(w, u32x4_splat(15));
        let hi = u32x4_shr(w, 4);
        (V128(f32x4_convert_i32x4(lo)), V128(f32x4_convert_i32x4(hi)))
    }
    type Q = v128;
    #[inline(always)]
    fn q_zero() -> v128 {
        i32x4_splat(0)
    }
    #[inline(always)]
    fn q_nibbles(b: &[u8]) -> (v128, v128) {
        let b = &b[..16];
        // SAFETY: `b` has 16 bytes; wasm loads need no alignment.
        let x = unsafe { v128_load(b.as_ptr() as *const v128) };
        (v128_and(x, u8x16_splat(15)), u8x16_shr(x, 4))
    }
    #[inline(always)]
    fn q_dot(acc: v128, codes: v128, q4: u32) -> v128 {
        let q = u32x4_splat(q4);
        // i16 pair sums of bytes 0..8 and 8..16, then adjacent i32 lanes added
        let d0 = i32x4_dot_i16x8(u16x8_extend_low_u8x16(codes), i16x8_extend_low_i8x16(q));
        let d1 = i32x4_dot_i16x8(u16x8_extend_high_u8x16(codes), i16x8_extend_high_i8x16(q));
        let even = i32x4_shuffle::<0, 2, 4, 6>(d0, d1);
        let odd = i32x4_shuffle::<1, 3, 5, 7>(d0, d1);
        i32x4_add(acc, i32x4_add(even, odd))
    }
    #[inline(always)]
    fn q_f32(acc: v128) -> Self {
        V128(f32x4_convert_i32x4(acc))
    }
    #[inline(always)]
    fn q_load(b: &[u8]) -> v128 {
        let b = &b[..16];
        // SAFETY: `b` has 16 bytes; wasm loads need no alignment.
        unsafe { v128_load(b.as_ptr() as *const v128) }
    }
    #[inline(always)]
    fn q_load_i32(s: &[i32]) -> v128 {
        let s = &s[..4];
        // SAFETY: `s` has 4 lanes; wasm loads need no alignment.
        unsafe { v128_load(s.as_ptr() as *const v128) }
    }
    #[inline(always)]
    fn q_store_i32(v: v128, d: &mut [i32]) {
        let d = &mut d[..4];
        // SAFETY: `d` has 4 lanes; wasm stores need no alignment.
        unsafe { v128_store(d.as_mut_ptr() as *mut v128, v) }
    }
    #[inline(always)]
    fn q_splat(v: i32) -> v128 {
        i32x4_splat(v)
    }
    #[inline(always)]
    fn q_add(a: v128, b: v128) -> v128 {
        i32x4_add(a, b)
    }
    #[inline(always)]
    fn q_mul_add(acc: v128, v: v128, s: i32) -> v128 {
        i32x4_add(acc, i32x4_mul(v, i32x4_splat(s)))
    }
    #[inline(always)]
    fn q_wide(b: &[u8]) -> v128 {
        let b = &b[..8];
        // SAFETY: `b` has 8 bytes; wasm loads need no alignment.
        i16x8_extend_low_i8x16(unsafe { v128_load64_zero(b.as_ptr() as *const u64) })
    }
    #[inline(always)]
    fn q_dot16(acc: v128, w: v128, x2: u32) -> v128 {
        i32x4_add(acc, i32x4_dot_i16x8(w, u32x4_splat(x2)))
    }
    #[inline(always)]
    fn store_bytes(self, d: &mut [u8]) {
        let d = &mut d[..4];
        let i = i32x4_trunc_sat_f32x4(self.0);
        let p = i8x16_shuffle::<0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0>(i, i);
        d.copy_from_slice(&u32x4_extract_lane::<0>(p).to_le_bytes());
    }
    #[inline(always)]
    fn bytes(b: &[u8]) -> Self {
        V128(f32x4_convert_i32x4(Self::widen(b)))
    }
    #[inline(always)]
    fn transpose(v: &mut [Self]) {
        let v: &mut [Self; 4] = v.try_into().expect("4 rows");
        let t0 = i32x4_shuffle::<0, 4, 1, 5>(v[0].0, v[1].0);
        let t1 = i32x4_shuffle::<2, 6, 3, 7>(v[0].0, v[1].0);
        let t2 = i32x4_shuffle::<0, 4, 1, 5>(v[2].0, v[3].0);
        let t3 = i32x4_shuffle::<2, 6, 3, 7>(v[2].0, v[3].0);
        v[0].0 = i32x4_shuffle::<0, 1, 4, 5>(t0, t2);
        v[1].0 = i32x4_shuffle::<2, 3, 6, 7>(t0, t2);
        v[2].0 = i32x4_shuffle::<0, 1, 4, 5>(t1, t3);
        v[3].0 = i32x4_shuffle::<2, 3, 6, 7>(t1, t3);
    }
    #[inline(always)]
    fn hmax(self) -> f32 {
        let v = self.0;
        let m = |a: f32, b: f32| if a.is_nan() || a >= b { a } else { b };
        m(
            m(f32x4_extract_lane::<0>(v), f32x4_extract_lane::<2>(v)),
            m(f32x4_extract_lane::<1>(v), f32x4_extract_lane::<3>(v)),
        )
    }
}
