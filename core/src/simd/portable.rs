//! The fallback vector: four f32 lanes in plain Rust. The compiler maps it onto the baseline
//! SIMD of the target (SSE2 on x86-64, NEON on aarch64) where it can.

use super::VF32;

/// Four f32 lanes without intrinsics.
#[derive(Clone, Copy, Debug)]
pub struct Portable(pub [f32; 4]);

#[inline(always)]
fn zip(a: Portable, b: Portable, f: impl Fn(f32, f32) -> f32) -> Portable {
    Portable([
        f(a.0[0], b.0[0]),
        f(a.0[1], b.0[1]),
        f(a.0[2], b.0[2]),
        f(a.0[3], b.0[3]),
    ])
}

#[inline(always)]
fn each(a: Portable, f: impl Fn(f32) -> f32) -> Portable {
    Portable([f(a.0[0]), f(a.0[1]), f(a.0[2]), f(a.0[3])])
}

impl VF32 for Portable {
    const LANES: usize = 4;
    #[inline(always)]
    fn splat(v: f32) -> Self {
        Portable([v; 4])
    }
    #[inline(always)]
    fn load(s: &[f32]) -> Self {
        Portable([s[0], s[1], s[2], s[3]])
    }
    #[inline(always)]
    fn store(self, d: &mut [f32]) {
        d[..4].copy_from_slice(&self.0);
    }
    #[inline(always)]
    fn add(self, o: Self) -> Self {
        zip(self, o, |a, b| a + b)
    }
    #[inline(always)]
    fn sub(self, o: Self) -> Self {
        zip(self, o, |a, b| a - b)
    }
    #[inline(always)]
    fn mul(self, o: Self) -> Self {
        zip(self, o, |a, b| a * b)
    }
    #[inline(always)]
    fn div(self, o: Self) -> Self {
        zip(self, o, |a, b| a / b)
    }
    #[inline(always)]
    fn fma(self, b: Self, c: Self) -> Self {
        self.mul(b).add(c)
    }
    #[inline(always)]
    fn max(self, o: Self) -> Self {
        zip(self, o, |a, b| {
            if a.is_nan() || b.is_nan() || a >= b {
                a
            } else {
                b
            }
        })
    }
    #[inline(always)]
    fn min(self, o: Self) -> Self {
        zip(self, o, |a, b| {
            if a.is_nan() || b.is_nan() || a <= b {
                a
            } else {
                b
            }
        })
    }
    #[inline(always)]
    fn round(self) -> Self {
        each(self, libm::rintf)
    }
    #[inline(always)]
    fn pow2i(self) -> Self {
        each(self, |n| f32::from_bits(((n as i32 + 127) as u32) << 23))
    }
    #[inline(always)]
    fn hsum(self) -> f32 {
        (self.0[0] + self.0[2]) + (self.0[1] + self.0[3])
    }
    #[inline(always)]
    fn abs(self) -> Self {
        each(self, f32::abs)
    }
    #[inline(always)]
    fn copysign(self, sign: Self) -> Self {
        zip(self, sign, f32::copysign)
    }
    #[inline(always)]
    fn lt_select(self, t: Self, a: Self, b: Self) -> Self {
        Portable(core::array::from_fn(|i| {
            if self.0[i] < t.0[i] {
                a.0[i]
            } else {
                b.0[i]
            }
        }))
    }
    #[inline(always)]
    fn deinterleave(self, b: Self) -> (Self, Self) {
        let (a, b) = (self.0, b.0);
        (
            Portable([a[0], a[2], b[0], b[2]]),
            Portable([a[1], a[3], b[1], b[3]]),
        )
    }
    #[inline(always)]
    fn nibbles(b: &[u8]) -> (Self, Self) {
        let b = &b[..4];
        (
            Portable(core::array::from_fn(|i| (b[i] & 15) as f32)),
            Portable(core::array::from_fn(|i| (b[i] >> 4) as f32)),
        )
    }
    type Q = [i32; 4];
    #[inline(always)]
    fn q_zero() -> [i32; 4] {
        [0; 4]
    }
    #[inline(always)]
    fn q_nibbles(b: &[u8]) -> ([i32; 4], [i32; 4]) {
        let b = &b[..16];
        let word = |j: usize, f: fn(u8) -> u8| {
            i32::from_le_bytes(core::array::from_fn(|t| f(b[4 * j + t])))
        };
        (
            core::array::from_fn(|j| word(j, |x| x & 15)),
            core::array::from_fn(|j| word(j, |x| x >> 4)),
        )
    }
    #[inline(always)]
    fn q_dot(acc: [i32; 4], codes: [i32; 4], q4: u32) -> [i32; 4] {
        let q = q4.to_le_bytes();
        core::array::from_fn(|j| {
            let c = codes[j].to_le_bytes();
            acc[j] + (0..4).map(|t| c[t] as i32 * q[t] as i8 as i32).sum::<i32>()
        })
    }
    #[inline(always)]
    fn q_f32(acc: [i32; 4]) -> Self {
        Portable(acc.map(|x| x as f32))
    }
    #[inline(always)]
    fn q_load(b: &[u8]) -> [i32; 4] {
        let b = &b[..16];
        core::array::from_fn(|j| {
            i32::from_le_bytes([b[4 * j], b[4 * j + 1], b[4 * j + 2], b[4 * j + 3]])
        })
    }
    #[inline(always)]
    fn q_load_i32(s: &[i32]) -> [i32; 4] {
        [s[0], s[1], s[2], s[3]]
    }
    #[inline(always)]
    fn q_store_i32(v: [i32; 4], d: &mut [i32]) {
        d[..4].copy_from_slice(&v);
    }
    #[inline(always)]
    fn q_splat(v: i32) -> [i32; 4] {
        [v; 4]
    }
    #[inline(always)]
    fn q_add(a: [i32; 4], b: [i32; 4]) -> [i32; 4] {
        core::array::from_fn(|j| a[j].wrapping_add(b[j]))
    }
    #[inline(always)]
    fn q_mul_add(acc: [i32; 4], v: [i32; 4], s: i32) -> [i32; 4] {
        core::array::from_fn(|j| acc[j].wrapping_add(v[j].wrapping_mul(s)))
    }
    #[inline(always)]
    fn q_wide(b: &[u8]) -> [i32; 4] {
        let b = &b[..8];
        let mut out = [0i32; 4];
        for (j, o) in out.iter_mut().enumerate() {
            let (lo, hi) = (b[2 * j] as i8 as i16, b[2 * j + 1] as i8 as i16);
            *o = (lo as u16 as u32 | ((hi as u16 as u32) << 16)) as i32;
        }
        out
    }
    #[inline(always)]
    fn q_dot16(acc: [i32; 4], w: [i32; 4], x2: u32) -> [i32; 4] {
        let (xl, xh) = (x2 as u16 as i16 as i32, (x2 >> 16) as u16 as i16 as i32);
        let mut out = acc;
        for (o, &w) in out.iter_mut().zip(&w) {
            let (wl, wh) = (
                w as u32 as u16 as i16 as i32,
                (w as u32 >> 16) as u16 as i16 as i32,
            );
            *o = o.wrapping_add(wl * xl + wh * xh);
        }
        out
    }
    #[inline(always)]
    fn store_bytes(self, d: &mut [u8]) {
        for (o, &v) in d[..4].iter_mut().zip(&self.0) {
            *o = v as i32 as u8;
        }
    }
    #[inline(always)]
    fn bytes(b: &[u8]) -> Self {
        let b = &b[..4];
        Portable(core::array::from_fn(|i| b[i] as f32))
    }
    #[inline(always)]
    fn transpose(v: &mut [Self]) {
        let v: &mut [Self; 4] = v.try_into().expect("4 rows");
        let r = *v;
        for (i, o) in v.iter_mut().enumerate() {
            o.0 = core::array::from_fn(|j| r[j].0[i]);
        }
    }
    #[inline(always)]
    fn hmax(self) -> f32 {
        let m = |a: f32, b: f32| if a.is_nan() || a >= b { a } else { b };
        m(m(self.0[0], self.0[2]), m(self.0[1], self.0[3]))
    }
}
