//! x86-64 AVX2 + FMA: eight f32 lanes in a `__m256`, detected at run time through CPUID
//! (no `std` needed, so core keeps its `no_std`).

use super::VF32;
use core::arch::x86_64::*;

/// Whether the CPU has AVX2 and FMA and the OS saves YMM state.
pub fn detect() -> bool {
    // SAFETY: CPUID exists on every x86-64 CPU; XGETBV is only executed once CPUID reports
    // OSXSAVE.
    unsafe {
        let l1 = __cpuid(1);
        let osxsave = l1.ecx & (1 << 27) != 0;
        let avx = l1.ecx & (1 << 28) != 0;
        let fma = l1.ecx & (1 << 12) != 0;
        if !(osxsave && avx && fma) || __get_cpuid_max(0).0 < 7 {
            return false;
        }
        // the OS must save XMM and YMM state
        if _xgetbv(0) & 0b110 != 0b110 {
            return false;
        }
        __cpuid_count(7, 0).ebx & (1 << 5) != 0
    }
}

/// Eight f32 lanes in one AVX register. Only constructed inside `avx2,fma` code.
#[derive(Clone, Copy)]
pub struct Avx2(__m256);

// SAFETY (for every `unsafe` below): these methods are only reached from functions compiled
// with `#[target_feature(enable = "avx2,fma")]` after `detect()` returned true; loads and
// stores go through slices of at least 8 floats, and AVX loads/stores have no alignment needs.
impl VF32 for Avx2 {
    const LANES: usize = 8;
    #[inline(always)]
    fn splat(v: f32) -> Self {
        Avx2(unsafe { _mm256_set1_ps(v) })
    }
    #[inline(always)]
    fn load(s: &[f32]) -> Self {
        let s = &s[..8];
        Avx2(unsafe { _mm256_loadu_ps(s.as_ptr()) })
    }
    #[inline(always)]
    fn store(self, d: &mut [f32]) {
        let d = &mut d[..8];
        unsafe { _mm256_storeu_ps(d.as_mut_ptr(), self.0) }
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        Avx2(unsafe { _mm256_add_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        Avx2(unsafe { _mm256_sub_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        Avx2(unsafe { _mm256_mul_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn div(self, o: Self) -> Self {
        Avx2(unsafe { _mm256_div_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn recip(self) -> Self {
        unsafe {
            // a 12-bit estimate, then r + r (1 - x r)
            let r = _mm256_rcp_ps(self.0);
            let e = _mm256_fnmadd_ps(self.0, r, _mm256_set1_ps(1.0));
            Avx2(_mm256_fmadd_ps(r, e, r))
        }
    }
    #[inline(always)]
    fn fma(self, b: Self, c: Self) -> Self {
        Avx2(unsafe { _mm256_fmadd_ps(self.0, b.0, c.0) })
    }
    #[inline(always)]
    fn max(self, o: Self) -> Self {
        // MAXPS returns its second operand when either is NaN: put self second
        Avx2(unsafe { _mm256_max_ps(o.0, self.0) })
    }
    #[inline(always)]
    fn min(self, o: Self) -> Self {
        Avx2(unsafe { _mm256_min_ps(o.0, self.0) })
    }
    #[inline(always)]
    fn round(self) -> Self {
        Avx2(unsafe {
            _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(self.0)
        })
    }
    #[inline(always)]
    fn pow2i(self) -> Self {
        unsafe {
            let n = _mm256_cvtps_epi32(self.0);
            let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(n, _mm256_set1_epi32(127)));
            Avx2(_mm256_castsi256_ps(e))
        }
    }
    #[inline(always)]
    fn hsum(self) -> f32 {
        unsafe {
            let lo = _mm256_castps256_ps128(self.0);
            let hi = _mm256_extractf128_ps::<1>(self.0);
            let s = _mm_add_ps(lo, hi);
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
            _mm_cvtss_f32(s)
        }
    }
    #[inline(always)]
    fn abs(self) -> Self {
        Avx2(unsafe { _mm256_andnot_ps(_mm256_set1_ps(-0.0), self.0) })
    }
    #[inline(always)]
    fn copysign(self, sign: Self) -> Self {
        unsafe {
            let s = _mm256_set1_ps(-0.0);
            Avx2(_mm256_or_ps(
                _mm256_andnot_ps(s, self.0),
                _mm256_and_ps(s, sign.0),
            ))
        }
    }
    #[inline(always)]
    fn lt_select(self, t: Self, a: Self, b: Self) -> Self {
        unsafe {
            let m = _mm256_cmp_ps::<_CMP_LT_OQ>(self.0, t.0);
            Avx2(_mm256_blendv_ps(b.0, a.0, m))
        }
    }
    #[inline(always)]
    fn deinterleave(self, b: Self) -> (Self, Self) {
        unsafe {
            // per 128-bit half: [a0 a2 b0 b2 | a4 a6 b4 b6], then the 64-bit pieces reordered
            let ev = _mm256_shuffle_ps::<0x88>(self.0, b.0);
            let od = _mm256_shuffle_ps::<0xdd>(self.0, b.0);
            let fix =
                |v: __m256| _mm256_castpd_ps(_mm256_permute4x64_pd::<0xd8>(_mm256_castps_pd(v)));
            (Avx2(fix(ev)), Avx2(fix(od)))
        }
    }
    #[inline(always)]
    fn nibbles(b: &[u8]) -> (Self, Self) {
        let b = &b[..8];
        // SAFETY: `b` has 8 bytes; the load has no alignment requirement.
        unsafe {
            let w = _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.as_ptr() as *const __m128i));
            let lo = _mm256_and_si256(w, _mm256_set1_epi32(15));
            let hi = _mm256_srli_epi32::<4>(w);
            (Avx2(_mm256_cvtepi32_ps(lo)), Avx2(_mm256_cvtepi32_ps(hi)))
        }
    }
    type Q = __m256i;
    #[inline(always)]
    fn q_zero() -> __m256i {
        unsafe { _mm256_setzero_si256() }
    }
    #[inline(always)]
    fn q_nibbles(b: &[u8]) -> (__m256i, __m256i) {
        let b = &b[..32];
        // SAFETY: `b` has 32 bytes; the load has no alignment requirement.
        unsafe {
            let x = _mm256_loadu_si256(b.as_ptr() as *const __m256i);
            let m = _mm256_set1_epi32(0x0f0f_0f0f);
            (
                _mm256_and_si256(x, m),
                _mm256_and_si256(_mm256_srli_epi32::<4>(x), m),
            )
        }
    }
    #[inline(always)]
    fn q_dot(acc: __m256i, codes: __m256i, q4: u32) -> __m256i {
        unsafe {
            // byte pairs into i16 (at most 2 * 127 * 128: no saturation), then pairs of
            // those into i32
            let p = _mm256_maddubs_epi16(codes, _mm256_set1_epi32(q4 as i32));
            _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
        }
    }
    #[inline(always)]
    fn q_f32(acc: __m256i) -> Self {
        Avx2(unsafe { _mm256_cvtepi32_ps(acc) })
    }
    #[inline(always)]
    fn q_dot8(acc: __m256i, codes: __m256i, q4: u32) -> __m256i {
        // maddubs could saturate (2 * 255 * 128 > 2^15): widen to i16 instead, the even and
        // the odd bytes apart, and let madd sum each pair into i32 lanes
        unsafe {
            let q = _mm256_set1_epi32(q4 as i32);
            let m = _mm256_set1_epi16(0xff);
            let c_even = _mm256_and_si256(codes, m);
            let c_odd = _mm256_srli_epi16::<8>(codes);
            let q_even = _mm256_srai_epi16::<8>(_mm256_slli_epi16::<8>(q));
            let q_odd = _mm256_srai_epi16::<8>(q);
            let s = _mm256_add_epi32(
                _mm256_madd_epi16(c_even, q_even),
                _mm256_madd_epi16(c_odd, q_odd),
            );
            _mm256_add_epi32(acc, s)
        }
    }
    const Q_PAIRS: bool = true;
    #[inline(always)]
    fn q_split(codes: __m256i) -> (__m256i, __m256i) {
        unsafe {
            (
                _mm256_and_si256(codes, _mm256_set1_epi16(0xff)),
                _mm256_srli_epi16::<8>(codes),
            )
        }
    }
    #[inline(always)]
    fn q_pairs16(s: &[u8], flip: u8, d: &mut [u8]) {
        let (s, d) = (&s[..16], &mut d[..32]);
        // SAFETY: 16 bytes read, 32 written (the slices just taken); no alignment needed.
        unsafe {
            let x = _mm_xor_si128(
                _mm_loadu_si128(s.as_ptr() as *const __m128i),
                _mm_set1_epi8(flip as i8),
            );
            // v0 v1 v2 v3 -> v0 v2 v1 v3 in each quad (each 64-bit group of i16)
            let w = _mm256_cvtepi8_epi16(x);
            let w = _mm256_shufflehi_epi16::<0xD8>(_mm256_shufflelo_epi16::<0xD8>(w));
            _mm256_storeu_si256(d.as_mut_ptr() as *mut __m256i, w);
        }
    }
    #[inline(always)]
    fn q_load(b: &[u8]) -> __m256i {
        let b = &b[..32];
        // SAFETY: `b` has 32 bytes; the load has no alignment requirement.
        unsafe { _mm256_loadu_si256(b.as_ptr() as *const __m256i) }
    }
    #[inline(always)]
    fn q_load_i32(s: &[i32]) -> __m256i {
        let s = &s[..8];
        // SAFETY: `s` has 8 lanes; the load has no alignment requirement.
        unsafe { _mm256_loadu_si256(s.as_ptr() as *const __m256i) }
    }
    #[inline(always)]
    fn q_store_i32(v: __m256i, d: &mut [i32]) {
        let d = &mut d[..8];
        // SAFETY: `d` has 8 lanes; the store has no alignment requirement.
        unsafe { _mm256_storeu_si256(d.as_mut_ptr() as *mut __m256i, v) }
    }
    #[inline(always)]
    fn q_splat(v: i32) -> __m256i {
        unsafe { _mm256_set1_epi32(v) }
    }
    #[inline(always)]
    fn q_add(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_add_epi32(a, b) }
    }
    #[inline(always)]
    fn q_mul_add(acc: __m256i, v: __m256i, s: i32) -> __m256i {
        unsafe { _mm256_add_epi32(acc, _mm256_mullo_epi32(v, _mm256_set1_epi32(s))) }
    }
    #[inline(always)]
    fn q_wide(b: &[u8]) -> __m256i {
        let b = &b[..16];
        // SAFETY: `b` has 16 bytes; the load has no alignment requirement.
        unsafe { _mm256_cvtepi8_epi16(_mm_loadu_si128(b.as_ptr() as *const __m128i)) }
    }
    #[inline(always)]
    fn q_dot16(acc: __m256i, w: __m256i, x2: u32) -> __m256i {
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(w, _mm256_set1_epi32(x2 as i32))) }
    }
    #[inline(always)]
    fn store_bytes(self, d: &mut [u8]) {
        let d = &mut d[..8];
        unsafe {
            // byte 0 of each i32 to the front of its 128-bit half
            let i = _mm256_cvttps_epi32(self.0);
            let sel = _mm256_setr_epi8(
                0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 0, 4, 8, 12, -1, -1,
                -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
            );
            let p = _mm256_shuffle_epi8(i, sel);
            let lo = _mm256_cvtsi256_si32(p) as u32;
            let hi = _mm256_extract_epi32::<4>(p) as u32;
            d[..4].copy_from_slice(&lo.to_le_bytes());
            d[4..].copy_from_slice(&hi.to_le_bytes());
        }
    }
    #[inline(always)]
    fn bytes(b: &[u8]) -> Self {
        let b = &b[..8];
        // SAFETY: `b` has 8 bytes; the load has no alignment requirement.
        unsafe {
            let w = _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.as_ptr() as *const __m128i));
            Avx2(_mm256_cvtepi32_ps(w))
        }
    }
    #[inline(always)]
    fn transpose(v: &mut [Self]) {
        let v: &mut [Self; 8] = v.try_into().expect("8 rows");
        unsafe {
            let r: [__m256; 8] = core::array::from_fn(|i| v[i].0);
            let t: [__m256; 8] = core::array::from_fn(|i| {
                let (a, b) = (r[i & !1], r[i | 1]);
                if i % 2 == 0 {
                    _mm256_unpacklo_ps(a, b)
                } else {
                    _mm256_unpackhi_ps(a, b)
                }
            });
            // each 128-bit half k of u[4h + m] holds column 4k + m of rows 4h..4h + 4
            let u: [__m256; 8] = core::array::from_fn(|i| {
                let (h, m) = (i / 4, i % 4);
                let (a, b) = (t[4 * h + m / 2], t[4 * h + 2 + m / 2]);
                if m % 2 == 0 {
                    _mm256_shuffle_ps::<0x44>(a, b)
                } else {
                    _mm256_shuffle_ps::<0xee>(a, b)
                }
            });
            for (i, o) in v.iter_mut().enumerate() {
                let (a, b) = (u[i % 4], u[4 + i % 4]);
                o.0 = if i < 4 {
                    _mm256_permute2f128_ps::<0x20>(a, b)
                } else {
                    _mm256_permute2f128_ps::<0x31>(a, b)
                };
            }
        }
    }
    #[inline(always)]
    fn hmax(self) -> f32 {
        let mut b = [0f32; 8];
        self.store(&mut b);
        let m = |a: f32, b: f32| if a.is_nan() || a >= b { a } else { b };
        m(
            m(m(b[0], b[4]), m(b[1], b[5])),
            m(m(b[2], b[6]), m(b[3], b[7])),
        )
    }
}
