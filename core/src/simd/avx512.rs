//! x86-64 AVX-512F: sixteen f32 lanes in a `__m512`, detected at run time through CPUID and
//! XGETBV (the OS must save the opmask and ZMM state), so core keeps its `no_std`.

use super::VF32;
use core::arch::x86_64::*;

/// Whether the CPU has AVX-512F (beside AVX2 and FMA) and the OS saves opmask and ZMM state.
pub fn detect() -> bool {
    if !super::x86::detect() {
        return false;
    }
    // SAFETY: CPUID exists on every x86-64 CPU; XGETBV runs only after x86::detect() saw
    // OSXSAVE.
    unsafe {
        // XCR0: SSE, AVX, opmask, ZMM_Hi256 and Hi16_ZMM state
        if _xgetbv(0) & 0xe6 != 0xe6 {
            return false;
        }
        __cpuid_count(7, 0).ebx & (1 << 16) != 0
    }
}

/// Whether the CPU has AVX-512 VNNI (`vpdpbusd`, `vpdpwssd`) and BW, beside what [`detect`]
/// checks.
pub fn has_vnni() -> bool {
    // SAFETY: as in `detect`, which runs first
    // VNNI (ECX bit 11) and BW (EBX bit 30: the byte and word widenings of `q_wide`)
    detect() && {
        let r = __cpuid_count(7, 0);
        r.ecx & (1 << 11) != 0 && r.ebx & (1 << 30) != 0
    }
}

/// Sixteen f32 lanes in one ZMM register. Only constructed inside `avx512f` code.
#[derive(Clone, Copy)]
pub struct Avx512(__m512);

// SAFETY (for every `unsafe` below): these methods are only reached from functions compiled
// with `#[target_feature(enable = "avx512f,avx2,fma")]` after `detect()` returned true; loads
// and stores go through slices of at least 16 floats, and these loads/stores need no alignment.
impl VF32 for Avx512 {
    const LANES: usize = 16;
    const GEMM_MR: usize = 12;
    #[inline(always)]
    fn splat(v: f32) -> Self {
        Avx512(unsafe { _mm512_set1_ps(v) })
    }
    #[inline(always)]
    fn load(s: &[f32]) -> Self {
        let s = &s[..16];
        Avx512(unsafe { _mm512_loadu_ps(s.as_ptr()) })
    }
    #[inline(always)]
    fn store(self, d: &mut [f32]) {
        let d = &mut d[..16];
        unsafe { _mm512_storeu_ps(d.as_mut_ptr(), self.0) }
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        Avx512(unsafe { _mm512_add_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        Avx512(unsafe { _mm512_sub_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        Avx512(unsafe { _mm512_mul_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn div(self, o: Self) -> Self {
        Avx512(unsafe { _mm512_div_ps(self.0, o.0) })
    }
    #[inline(always)]
    fn recip(self) -> Self {
        unsafe {
            // a 14-bit estimate, then r + r (1 - x r)
            let r = _mm512_rcp14_ps(self.0);
            let e = _mm512_fnmadd_ps(self.0, r, _mm512_set1_ps(1.0));
            Avx512(_mm512_fmadd_ps(r, e, r))
        }
    }
    #[inline(always)]
    fn fma(self, b: Self, c: Self) -> Self {
        Avx512(unsafe { _mm512_fmadd_ps(self.0, b.0, c.0) })
    }
    #[inline(always)]
    fn max(self, o: Self) -> Self {
        // VMAXPS returns its second operand when either is NaN: put self second
        Avx512(unsafe { _mm512_max_ps(o.0, self.0) })
    }
    #[inline(always)]
    fn min(self, o: Self) -> Self {
        Avx512(unsafe { _mm512_min_ps(o.0, self.0) })
    }
    #[inline(always)]
    fn round(self) -> Self {
        Avx512(unsafe {
            _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(self.0)
        })
    }
    #[inline(always)]
    fn scale2(self, n: Self) -> Self {
        Avx512(unsafe { _mm512_scalef_ps(self.0, n.0) })
    }
    #[inline(always)]
    fn pow2i(self) -> Self {
        unsafe {
            let n = _mm512_cvtps_epi32(self.0);
            let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(n, _mm512_set1_epi32(127)));
            Avx512(_mm512_castsi512_ps(e))
        }
    }
    #[inline(always)]
    fn abs(self) -> Self {
        unsafe {
            let m = _mm512_set1_epi32(0x7fff_ffff);
            Avx512(_mm512_castsi512_ps(_mm512_and_si512(
                _mm512_castps_si512(self.0),
                m,
            )))
        }
    }
    #[inline(always)]
    fn copysign(self, sign: Self) -> Self {
        unsafe {
            let s = _mm512_set1_epi32(i32::MIN);
            let mag = _mm512_andnot_si512(s, _mm512_castps_si512(self.0));
            let sg = _mm512_and_si512(s, _mm512_castps_si512(sign.0));
            Avx512(_mm512_castsi512_ps(_mm512_or_si512(mag, sg)))
        }
    }
    #[inline(always)]
    fn lt_select(self, t: Self, a: Self, b: Self) -> Self {
        unsafe {
            let m = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(self.0, t.0);
            Avx512(_mm512_mask_blend_ps(m, b.0, a.0))
        }
    }
    #[inline(always)]
    fn deinterleave(self, b: Self) -> (Self, Self) {
        unsafe {
            let ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
            let od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
            (
                Avx512(_mm512_permutex2var_ps(self.0, ev, b.0)),
                Avx512(_mm512_permutex2var_ps(self.0, od, b.0)),
            )
        }
    }
    #[inline(always)]
    fn nibbles(b: &[u8]) -> (Self, Self) {
        let b = &b[..16];
        // SAFETY: `b` has 16 bytes; the load has no alignment requirement.
        unsafe {
            let w = _mm512_cvtepu8_epi32(_mm_loadu_si128(b.as_ptr() as *const __m128i));
            let lo = _mm512_and_si512(w, _mm512_set1_epi32(15));
            let hi = _mm512_srli_epi32::<4>(w);
            (
                Avx512(_mm512_cvtepi32_ps(lo)),
                Avx512(_mm512_cvtepi32_ps(hi)),
            )
        }
    }
    type Q = __m512i;
    #[inline(always)]
    fn q_zero() -> __m512i {
        unsafe { _mm512_setzero_si512() }
    }
    #[inline(always)]
    fn q_nibbles(b: &[u8]) -> (__m512i, __m512i) {
        let b = &b[..64];
        // SAFETY: `b` has 64 bytes; the load has no alignment requirement.
        unsafe {
            let x = _mm512_loadu_si512(b.as_ptr() as *const _);
            let m = _mm512_set1_epi32(0x0f0f_0f0f);
            (
                _mm512_and_si512(x, m),
                _mm512_and_si512(_mm512_srli_epi32::<4>(x), m),
            )
        }
    }
    #[inline(always)]
    fn q_dot(acc: __m512i, codes: __m512i, q4: u32) -> __m512i {
        // SAFETY: only instantiated under `simd::q4_rows_on`'s wrapper, which enables
        // AVX-512 VNNI after the CPU reported it.
        unsafe { _mm512_dpbusd_epi32(acc, codes, _mm512_set1_epi32(q4 as i32)) }
    }
    #[inline(always)]
    fn q_f32(acc: __m512i) -> Self {
        Avx512(unsafe { _mm512_cvtepi32_ps(acc) })
    }
    #[inline(always)]
    fn q_load(b: &[u8]) -> __m512i {
        let b = &b[..64];
        // SAFETY: `b` has 64 bytes; the load has no alignment requirement.
        unsafe { _mm512_loadu_si512(b.as_ptr() as *const _) }
    }
    #[inline(always)]
    fn q_load_i32(s: &[i32]) -> __m512i {
        let s = &s[..16];
        // SAFETY: `s` has 16 lanes; the load has no alignment requirement.
        unsafe { _mm512_loadu_si512(s.as_ptr() as *const _) }
    }
    #[inline(always)]
    fn q_store_i32(v: __m512i, d: &mut [i32]) {
        let d = &mut d[..16];
        // SAFETY: `d` has 16 lanes; the store has no alignment requirement.
        unsafe { _mm512_storeu_si512(d.as_mut_ptr() as *mut _, v) }
    }
    #[inline(always)]
    fn q_splat(v: i32) -> __m512i {
        unsafe { _mm512_set1_epi32(v) }
    }
    #[inline(always)]
    fn q_add(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_add_epi32(a, b) }
    }
    #[inline(always)]
    fn q_mul_add(acc: __m512i, v: __m512i, s: i32) -> __m512i {
        unsafe { _mm512_add_epi32(acc, _mm512_mullo_epi32(v, _mm512_set1_epi32(s))) }
    }
    #[inline(always)]
    fn q_wide(b: &[u8]) -> __m512i {
        let b = &b[..32];
        // SAFETY: `b` has 32 bytes; the load has no alignment requirement.
        unsafe { _mm512_cvtepi8_epi16(_mm256_loadu_si256(b.as_ptr() as *const __m256i)) }
    }
    #[inline(always)]
    fn q_dot16(acc: __m512i, w: __m512i, x2: u32) -> __m512i {
        // SAFETY: only instantiated under the integer kernels' wrapper, which enables AVX-512
        // VNNI after the CPU reported it.
        unsafe { _mm512_dpwssd_epi32(acc, w, _mm512_set1_epi32(x2 as i32)) }
    }
    #[inline(always)]
    fn store_bytes(self, d: &mut [u8]) {
        let d = &mut d[..16];
        // SAFETY: `d` has 16 bytes; the store has no alignment requirement.
        unsafe {
            let b = _mm512_cvtepi32_epi8(_mm512_cvttps_epi32(self.0));
            _mm_storeu_si128(d.as_mut_ptr() as *mut __m128i, b)
        }
    }
    #[inline(always)]
    fn bytes(b: &[u8]) -> Self {
        let b = &b[..16];
        // SAFETY: `b` has 16 bytes; the load has no alignment requirement.
        unsafe {
            let w = _mm512_cvtepu8_epi32(_mm_loadu_si128(b.as_ptr() as *const __m128i));
            Avx512(_mm512_cvtepi32_ps(w))
        }
    }
    #[inline(always)]
    fn transpose(v: &mut [Self]) {
        let v: &mut [Self; 16] = v.try_into().expect("16 rows");
        unsafe {
            let r: [__m512; 16] = core::array::from_fn(|i| v[i].0);
            // pairs of rows interleaved, then pairs of pairs: each 128-bit lane k of u[4i + m]
            // holds column 4k + m of rows 4i..4i + 4
            let t: [__m512; 16] = core::array::from_fn(|i| {
                let (a, b) = (r[i & !1], r[i | 1]);
                if i % 2 == 0 {
                    _mm512_unpacklo_ps(a, b)
                } else {
                    _mm512_unpackhi_ps(a, b)
                }
            });
            let u: [__m512; 16] = core::array::from_fn(|i| {
                let (q, m) = (i / 4, i % 4);
                let (a, b) = (t[4 * q + m / 2], t[4 * q + 2 + m / 2]);
                if m % 2 == 0 {
                    _mm512_shuffle_ps::<0x44>(a, b)
                } else {
                    _mm512_shuffle_ps::<0xee>(a, b)
                }
            });
            // then the 128-bit lanes: rows 8h..8h+8 gathered, then all 16
            let w: [__m512; 16] = core::array::from_fn(|i| {
                let (h, j) = (i / 8, i % 8);
                let (a, b) = (u[8 * h + j % 4], u[8 * h + 4 + j % 4]);
                if j < 4 {
                    _mm512_shuffle_f32x4::<0x88>(a, b)
                } else {
                    _mm512_shuffle_f32x4::<0xdd>(a, b)
                }
            });
            for (i, o) in v.iter_mut().enumerate() {
                let (a, b) = (w[i % 8], w[8 + i % 8]);
                o.0 = if i < 8 {
                    _mm512_shuffle_f32x4::<0x88>(a, b)
                } else {
                    _mm512_shuffle_f32x4::<0xdd>(a, b)
                };
            }
        }
    }
    #[inline(always)]
    fn hsum(self) -> f32 {
        unsafe {
            let lo = _mm512_castps512_ps256(self.0);
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(self.0)));
            let s = _mm256_add_ps(lo, hi);
            let l = _mm256_castps256_ps128(s);
            let h = _mm256_extractf128_ps::<1>(s);
            let s = _mm_add_ps(l, h);
            let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
            let s = _mm_add_ss(s, _mm_shuffle_ps::<0b01>(s, s));
            _mm_cvtss_f32(s)
        }
    }
    #[inline(always)]
    fn hmax(self) -> f32 {
        let mut b = [0f32; 16];
        self.store(&mut b);
        let m = |a: f32, b: f32| if a.is_nan() || a >= b { a } else { b };
        let mut r = [0f32; 8];
        for i in 0..8 {
            r[i] = m(b[i], b[i + 8]);
        }
        m(
            m(m(r[0], r[4]), m(r[1], r[5])),
            m(m(r[2], r[6]), m(r[3], r[7])),
        )
    }
}
