//! aarch64 NEON: four f32 lanes in a `float32x4_t`. NEON is part of the aarch64 baseline, so
//! this instantiation is chosen at compile time.

use super::VF32;
use core::arch::aarch64::*;

/// Four f32 lanes in one NEON register.
#[derive(Clone, Copy)]
pub struct Neon(float32x4_t);

/// The bytes `b[0..4]` zero-extended to four u32 lanes.
#[inline(always)]
fn widen(b: &[u8]) -> uint32x4_t {
    let w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    // SAFETY: plain register arithmetic (NEON is always present)
    unsafe { vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(w))))) }
}

// SAFETY (for every `unsafe` below): NEON is always present on aarch64; loads and stores go
// through slices of at least 4 floats, and NEON loads/stores need no alignment.
impl VF32 for Neon {
    const LANES: usize = 4;
    // 32 vector registers: an 8 x 8 tile keeps 16 accumulators
    const GEMM_MR: usize = 8;
    #[inline(always)]
    fn splat(v: f32) -> Self {
        Neon(unsafe { vdupq_n_f32(v) })
    }
    #[inline(always)]
    fn load(s: &[f32]) -> Self {
        let s = &s[..4];
        Neon(unsafe { vld1q_f32(s.as_ptr()) })
    }
    #[inline(always)]
    fn store(self, d: &mut [f32]) {
        let d = &mut d[..4];
        unsafe { vst1q_f32(d.as_mut_ptr(), self.0) }
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        Neon(unsafe { vaddq_f32(self.0, o.0) })
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        Neon(unsafe { vsubq_f32(self.0, o.0) })
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        Neon(unsafe { vmulq_f32(self.0, o.0) })
    }
    #[inline(always)]
    fn div(self, o: Self) -> Self {
        Neon(unsafe { vdivq_f32(self.0, o.0) })
    }
    #[inline(always)]
    fn fma(self, b: Self, c: Self) -> Self {
        // vfmaq_f32(c, a, b) = c + a * b, fused
        Neon(unsafe { vfmaq_f32(c.0, self.0, b.0) })
    }
    #[inline(always)]
    fn max(self, o: Self) -> Self {
        // FMAX propagates a NaN from either operand; keep self's NaN, and o's value when only
        // o is NaN, as the other ISAs do
        unsafe {
            let o_nan = vmvnq_u32(vceqq_f32(o.0, o.0));
            let m = vmaxq_f32(self.0, o.0);
            Neon(vbslq_f32(o_nan, self.0, m))
        }
    }
    #[inline(always)]
    fn min(self, o: Self) -> Self {
        unsafe {
            let o_nan = vmvnq_u32(vceqq_f32(o.0, o.0));
            let m = vminq_f32(self.0, o.0);
            Neon(vbslq_f32(o_nan, self.0, m))
        }
    }
    #[inline(always)]
    fn round(self) -> Self {
        Neon(unsafe { vrndnq_f32(self.0) })
    }
    #[inline(always)]
    fn pow2i(self) -> Self {
        unsafe {
            let n = vcvtnq_s32_f32(self.0);
            let e = vshlq_n_s32::<23>(vaddq_s32(n, vdupq_n_s32(127)));
            Neon(vreinterpretq_f32_s32(e))
        }
    }
    #[inline(always)]
    fn hsum(self) -> f32 {
        unsafe {
            let v = self.0;
            (vgetq_lane_f32::<0>(v) + vgetq_lane_f32::<2>(v))
                + (vgetq_lane_f32::<1>(v) + vgetq_lane_f32::<3>(v))
        }
    }
    #[inline(always)]
    fn hmax(self) -> f32 {
        let mut b = [0f32; 4];
        self.store(&mut b);
        let m = |a: f32, b: f32| if a.is_nan() || a >= b { a } else { b };
        m(m(b[0], b[2]), m(b[1], b[3]))
    }
    #[inline(always)]
    fn abs(self) -> Self {
        Neon(unsafe { vabsq_f32(self.0) })
    }
    #[inline(always)]
    fn copysign(self, sign: Self) -> Self {
        unsafe {
            let s = vdupq_n_u32(0x8000_0000);
            Neon(vbslq_f32(s, sign.0, self.0))
        }
    }
    #[inline(always)]
    fn lt_select(self, t: Self, a: Self, b: Self) -> Self {
        unsafe { Neon(vbslq_f32(vcltq_f32(self.0, t.0), a.0, b.0)) }
    }
    #[inline(always)]
    fn deinterleave(self, b: Self) -> (Self, Self) {
        unsafe {
            let r = vuzpq_f32(self.0, b.0);
            (Neon(r.0), Neon(r.1))
        }
    }
    #[inline(always)]
    fn nibbles(b: &[u8]) -> (Self, Self) {
        let w = widen(b);
        // SAFETY: plain register arithmetic (NEON is always present)
        unsafe {
            let lo = vandq_u32(w, vdupq_n_u32(15));
            let hi = vshrq_n_u32::<4>(w);
            (Neon(vcvtq_f32_u32(lo)), Neon(vcvtq_f32_u32(hi)))
        }
    }
    type Q = int32x4_t;
    #[inline(always)]
    fn q_zero() -> int32x4_t {
        unsafe { vdupq_n_s32(0) }
    }
    #[inline(always)]
    fn q_nibbles(b: &[u8]) -> (int32x4_t, int32x4_t) {
        let b = &b[..16];
        // SAFETY: `b` has 16 bytes; NEON loads need no alignment.
        unsafe {
            let x = vld1q_u8(b.as_ptr());
            (
                vreinterpretq_s32_u8(vandq_u8(x, vdupq_n_u8(15))),
                vreinterpretq_s32_u8(vshrq_n_u8::<4>(x)),
            )
        }
    }
    #[inline(always)]
    fn q_dot(acc: int32x4_t, codes: int32x4_t, q4: u32) -> int32x4_t {
        // SAFETY: plain register arithmetic (NEON is always present)
        unsafe {
            let c = vreinterpretq_s8_s32(codes);
            let q = vreinterpretq_s8_u32(vdupq_n_u32(q4));
            // products of bytes 0..8 and 8..16 (i16), adjacent pairs summed, then pairs of
            // those added into the i32 lanes: lane j gets bytes 4j..4j + 4
            let p = vpaddq_s16(
                vmull_s8(vget_low_s8(c), vget_low_s8(q)),
                vmull_high_s8(c, q),
            );
            vpadalq_s16(acc, p)
        }
    }
    #[inline(always)]
    fn q_f32(acc: int32x4_t) -> Self {
        Neon(unsafe { vcvtq_f32_s32(acc) })
    }
    #[inline(always)]
    fn q_dot8(acc: int32x4_t, codes: int32x4_t, q4: u32) -> int32x4_t {
        // codes unsigned: widen both to i16 (products of 255 and -128 fit), then sum pairs
        // and pairs of pairs into the i32 lanes
        unsafe {
            let c = vreinterpretq_u8_s32(codes);
            let q = vreinterpretq_s8_u32(vdupq_n_u32(q4));
            let lo = vmulq_s16(
                vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(c))),
                vmovl_s8(vget_low_s8(q)),
            );
            let hi = vmulq_s16(vreinterpretq_s16_u16(vmovl_high_u8(c)), vmovl_high_s8(q));
            vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)))
        }
    }
    #[inline(always)]
    fn q_load(b: &[u8]) -> int32x4_t {
        let b = &b[..16];
        // SAFETY: `b` has 16 bytes; the load has no alignment requirement.
        unsafe { vreinterpretq_s32_u8(vld1q_u8(b.as_ptr())) }
    }
    #[inline(always)]
    fn q_load_i32(s: &[i32]) -> int32x4_t {
        let s = &s[..4];
        // SAFETY: `s` has 4 lanes.
        unsafe { vld1q_s32(s.as_ptr()) }
    }
    #[inline(always)]
    fn q_store_i32(v: int32x4_t, d: &mut [i32]) {
        let d = &mut d[..4];
        // SAFETY: `d` has 4 lanes.
        unsafe { vst1q_s32(d.as_mut_ptr(), v) }
    }
    #[inline(always)]
    fn q_splat(v: i32) -> int32x4_t {
        unsafe { vdupq_n_s32(v) }
    }
    #[inline(always)]
    fn q_add(a: int32x4_t, b: int32x4_t) -> int32x4_t {
        unsafe { vaddq_s32(a, b) }
    }
    #[inline(always)]
    fn q_mul_add(acc: int32x4_t, v: int32x4_t, s: i32) -> int32x4_t {
        unsafe { vmlaq_n_s32(acc, v, s) }
    }
    #[inline(always)]
    fn q_wide(b: &[u8]) -> int32x4_t {
        let b = &b[..8];
        // SAFETY: `b` has 8 bytes.
        unsafe { vreinterpretq_s32_s16(vmovl_s8(vld1_s8(b.as_ptr() as *const i8))) }
    }
    #[inline(always)]
    fn q_dot16(acc: int32x4_t, w: int32x4_t, x2: u32) -> int32x4_t {
        // the eight products widened to i32, then each lane's pair summed
        unsafe {
            let w = vreinterpretq_s16_s32(w);
            let x = vreinterpretq_s16_u32(vdupq_n_u32(x2));
            let lo = vmull_s16(vget_low_s16(w), vget_low_s16(x));
            let hi = vmull_high_s16(w, x);
            vaddq_s32(acc, vpaddq_s32(lo, hi))
        }
    }
    #[inline(always)]
    fn store_bytes(self, d: &mut [u8]) {
        let d = &mut d[..4];
        unsafe {
            let i = vcvtq_s32_f32(self.0);
            let n = vmovn_s32(i);
            let b = vmovn_s16(vcombine_s16(n, n));
            let w = vget_lane_u32::<0>(vreinterpret_u32_s8(b));
            d.copy_from_slice(&w.to_le_bytes());
        }
    }
    #[inline(always)]
    fn bytes(b: &[u8]) -> Self {
        // SAFETY: plain register arithmetic (NEON is always present)
        Neon(unsafe { vcvtq_f32_u32(widen(b)) })
    }
    #[inline(always)]
    fn transpose(v: &mut [Self]) {
        let v: &mut [Self; 4] = v.try_into().expect("4 rows");
        unsafe {
            let a = vtrnq_f32(v[0].0, v[1].0);
            let b = vtrnq_f32(v[2].0, v[3].0);
            v[0].0 = vcombine_f32(vget_low_f32(a.0), vget_low_f32(b.0));
            v[1].0 = vcombine_f32(vget_low_f32(a.1), vget_low_f32(b.1));
            v[2].0 = vcombine_f32(vget_high_f32(a.0), vget_high_f32(b.0));
            v[3].0 = vcombine_f32(vget_high_f32(a.1), vget_high_f32(b.1));
        }
    }
}
