//! The portable SIMD layer: hot f32 kernels written once against a small vector trait
//! ([`VF32`]) and instantiated per instruction set:
//!
//! | ISA | vector | chosen |
//! |---|---|---|
//! | wasm SIMD128 | `v128` (4 lanes) | at compile time, when built with `+simd128` |
//! | aarch64 NEON | `float32x4_t` (4 lanes) | at compile time (NEON is baseline on aarch64) |
//! | x86-64 AVX-512F | `__m512` (16 lanes) | at run time (CPUID + XGETBV, no `std` needed) |
//! | x86-64 AVX2 + FMA | `__m256` (8 lanes) | at run time, where AVX-512F is absent or capped |
//! | anything else | `[f32; 4]` in plain Rust (the compiler vectorises it for the baseline ISA) | fallback |
//!
//! Every public function here dispatches once per call and then runs a monomorphised loop with
//! the vector type's intrinsics inlined (the generic bodies are `#[inline(always)]`, and each
//! x86 instantiation sits inside a `#[target_feature]` wrapper). [`set_max_isa`] caps the choice
//! (the native target maps `NXRT_SIMD=avx2|portable` onto it, for A/B measurements).
//!
//! [`Gemm`] (the strided GEMM description) lives here, at the bottom, so the SIMD layer imports
//! nothing from the provider layer above it.

#[cfg(target_arch = "x86_64")]
mod avx512;
pub mod gemm;
mod kernels;
mod nbits;
mod nchwc;
#[cfg(target_arch = "aarch64")]
mod neon;
mod portable;
pub mod qgemm;
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
mod wasm;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use gemm::{Gemm, GemmEpi, Operand};
pub use kernels::{Act, BinOp, Clamp, DwPlane, QBin, DW_BLOCK, Q8};
pub use nbits::{q4_pack, q8_rows, w8_pack, w8_sub, NBits, Q4Packed, Q8Rows, W8Packed, X16Rows};
pub use nchwc::{NcGeom, NCHWC};
pub use portable::Portable;
pub use qgemm::{qcols_pack, QEpi, QGemm, QGeom, QOut, QVec};

use core::sync::atomic::{AtomicU8, Ordering};

/// An instruction set the dispatcher can pick, weakest first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Isa {
    Portable = 1,
    Simd128 = 2,
    Neon = 3,
    Avx2 = 4,
    Avx512 = 5,
}

impl Isa {
    /// The name reports print (`avx512f`, `avx2+fma`, `neon`, `simd128`, `portable`).
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Simd128 => "simd128",
            Isa::Neon => "neon",
            Isa::Avx2 => "avx2+fma",
            Isa::Avx512 => "avx512f",
        }
    }

    /// Parses a name as [`Isa::name`] prints it (also `avx2`, `avx512`).
    pub fn parse(s: &str) -> Option<Isa> {
        Some(match s {
            "portable" | "scalar" => Isa::Portable,
            "simd128" => Isa::Simd128,
            "neon" => Isa::Neon,
            "avx2" | "avx2+fma" => Isa::Avx2,
            "avx512" | "avx512f" => Isa::Avx512,
            _ => return None,
        })
    }
}

static CHOSEN: AtomicU8 = AtomicU8::new(0); // 0: not chosen yet
static BEST: AtomicU8 = AtomicU8::new(0);

/// The best instruction set this machine has (detected once).
fn best() -> Isa {
    match BEST.load(Ordering::Relaxed) {
        0 => {
            let b = detect();
            BEST.store(b as u8, Ordering::Relaxed);
            b
        }
        v => from_u8(v),
    }
}

fn from_u8(v: u8) -> Isa {
    match v {
        5 => Isa::Avx512,
        4 => Isa::Avx2,
        3 => Isa::Neon,
        2 => Isa::Simd128,
        _ => Isa::Portable,
    }
}
static CAP: AtomicU8 = AtomicU8::new(u8::MAX);

/// Caps the instruction set every later dispatch may use (e.g. [`Isa::Avx2`] on an AVX-512
/// machine, to measure one against the other). Takes effect for calls that start after it.
pub fn set_max_isa(cap: Isa) {
    CAP.store(cap as u8, Ordering::Relaxed);
    CHOSEN.store(0, Ordering::Relaxed);
}

fn detect() -> Isa {
    #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
    {
        return Isa::Simd128;
    }
    #[cfg(target_arch = "aarch64")]
    {
        return Isa::Neon;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if avx512::detect() {
            return Isa::Avx512;
        }
        if x86::detect() {
            return Isa::Avx2;
        }
    }
    #[allow(unreachable_code)]
    Isa::Portable
}

/// The instruction set the dispatcher uses on this machine (the best one detected, at most the
/// cap of [`set_max_isa`]).
#[inline]
pub fn isa() -> Isa {
    match CHOSEN.load(Ordering::Relaxed) {
        0 => {
            let best = best();
            let cap = CAP.load(Ordering::Relaxed);
            let isa = if best as u8 <= cap {
                best
            } else if cap >= Isa::Avx2 as u8 && best == Isa::Avx512 {
                Isa::Avx2
            } else {
                Isa::Portable
            };
            CHOSEN.store(isa as u8, Ordering::Relaxed);
            isa
        }
        v => from_u8(v),
    }
}

/// Every instruction set this machine can run, for tests that check each instantiation.
pub fn available_isas() -> alloc::vec::Vec<Isa> {
    let mut v = alloc::vec![Isa::Portable];
    let best = best();
    #[cfg(target_arch = "x86_64")]
    if best >= Isa::Avx2 {
        v.push(Isa::Avx2);
    }
    if best != Isa::Portable && !v.contains(&best) {
        v.push(best);
    }
    v
}

/// Whether [`q4_rows_on`] runs on `isa` here: AVX-512 needs VNNI for its integer dot
/// products (without it, AVX2's take over); the others always can.
pub fn q4_runs_on(isa: Isa) -> bool {
    match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => isa <= best() && vnni(),
        i => i <= best(),
    }
}

/// AVX-512 VNNI and BW, detected once (CPUID is slow under a hypervisor).
#[cfg(target_arch = "x86_64")]
fn vnni() -> bool {
    static VNNI: AtomicU8 = AtomicU8::new(0);
    match VNNI.load(Ordering::Relaxed) {
        0 => {
            let v = avx512::has_vnni();
            VNNI.store(1 + v as u8, Ordering::Relaxed);
            v
        }
        v => v == 2,
    }
}

/// The instruction set [`q4_rows_on`] should run on (the best the dispatcher may use that
/// can), and its vector lanes (what [`q4_pack`] packs for).
pub fn q4_isa() -> (Isa, usize) {
    let mut i = isa();
    if !q4_runs_on(i) {
        i = Isa::Avx2.min(i);
    }
    (i, isa_lanes(i))
}

/// The geometry of an integer product's packed operands ([`qgemm`]) for `k x n` columns on
/// `isa` (one [`q4_runs_on`] accepts): its lanes and its row form.
pub fn qgeom(isa: Isa, k: usize, n: usize) -> QGeom {
    let pairs = match isa {
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => <x86::Avx2 as VF32>::Q_PAIRS,
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => <avx512::Avx512 as VF32>::Q_PAIRS,
        #[cfg(target_arch = "aarch64")]
        Isa::Neon => <neon::Neon as VF32>::Q_PAIRS,
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        Isa::Simd128 => <wasm::V128 as VF32>::Q_PAIRS,
        _ => <Portable as VF32>::Q_PAIRS,
    };
    QGeom {
        lanes: isa_lanes(isa),
        pairs,
        k,
        n,
    }
}

/// Lanes of `isa`'s f32 vector.
pub fn isa_lanes(isa: Isa) -> usize {
    match isa {
        Isa::Avx512 => 16,
        Isa::Avx2 => 8,
        _ => 4,
    }
}

/// Runs the generic integer kernel `$f::<V>` on `$isa` (which [`q4_runs_on`] accepted): the
/// vector type of the build's ISA in wasm and on aarch64, AVX-512 with VNNI or AVX2 inside
/// `#[target_feature]` wrappers on x86-64, the portable type otherwise.
macro_rules! q_dispatch {
    ($isa:expr, $($f:ident)::+($($a:ident: $t:ty = $v:expr),*)) => {{
        #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
        {
            let _ = $isa;
            return $($f)::+::<wasm::V128>($($v),*);
        }
        #[cfg(target_arch = "aarch64")]
        if $isa == Isa::Neon {
            return $($f)::+::<neon::Neon>($($v),*);
        }
        #[cfg(target_arch = "x86_64")]
        {
            if $isa == Isa::Avx512 {
                #[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma")]
                unsafe fn wide($($a: $t),*) {
                    $($f)::+::<avx512::Avx512>($($a),*)
                }
                // SAFETY: q4_runs_on checked AVX-512F, BW and VNNI (and the OS's ZMM state).
                return unsafe { wide($($v),*) };
            }
            if $isa == Isa::Avx2 {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn wide($($a: $t),*) {
                    $($f)::+::<x86::Avx2>($($a),*)
                }
                // SAFETY: q4_runs_on checked AVX2 and FMA.
                return unsafe { wide($($v),*) };
            }
        }
        #[allow(unreachable_code)]
        $($f)::+::<Portable>($($v),*)
    }};
}

/// Int8 x 4-bit products of quantized rows with packed weights (see [`nbits::q4_rows`]),
/// on `isa`, which must satisfy [`q4_runs_on`] and be what `p` was packed for.
pub fn q4_rows_on(
    isa: Isa,
    p: &Q4Packed,
    a: &Q8Rows,
    groups: (usize, usize),
    y: &mut [f32],
    ldy: usize,
    bias: Option<&[f32]>,
) {
    assert!(
        q4_runs_on(isa) && p.lanes == isa_lanes(isa),
        "q4_rows_on: {isa:?}"
    );
    q_dispatch!(isa, nbits::q4_rows(p: &Q4Packed = p, a: &Q8Rows = a, g: (usize, usize) = groups, y: &mut [f32] = y, l: usize = ldy, b: Option<&[f32]> = bias));
}

/// Float rows (split by [`x16_rows`]) times int8 weights packed by [`w8_pack`] (see
/// [`nbits::w8_rows`]), on `isa`, which must satisfy [`q4_runs_on`] and be what `p` was
/// packed for (its lanes: [`q4_isa`]).
pub fn w8_rows_on(
    isa: Isa,
    p: &W8Packed,
    a: &X16Rows,
    groups: (usize, usize),
    y: &mut [f32],
    ldy: usize,
) {
    assert!(
        q4_runs_on(isa) && p.lanes == isa_lanes(isa),
        "w8_rows_on: {isa:?}"
    );
    q_dispatch!(isa, nbits::w8_rows(p: &W8Packed = p, a: &X16Rows = a, g: (usize, usize) = groups, y: &mut [f32] = y, l: usize = ldy));
}

/// Columns of int8 weights packed by [`w8_pack`] dequantized into SGEMM B panels `nr` wide
/// (see [`nbits::w8_panels`]), on `isa`, which must satisfy [`q4_runs_on`] and be what `p`
/// was packed for; `nr` a multiple of its lanes.
pub fn w8_panels_on(
    isa: Isa,
    p: &W8Packed,
    k: usize,
    cols: (usize, usize),
    nr: usize,
    out: &mut [f32],
) {
    let l = isa_lanes(isa);
    assert!(
        q4_runs_on(isa)
            && p.lanes == l
            && nr.is_multiple_of(l)
            && cols.0.is_multiple_of(l)
            && k <= p.kp,
        "w8_panels_on: {isa:?}"
    );
    assert!(
        out.len() >= cols.1.div_ceil(nr) * k * nr,
        "w8_panels_on: output too short"
    );
    q_dispatch!(isa, nbits::w8_panels(p: &W8Packed = p, k: usize = k, c: (usize, usize) = cols, nr: usize = nr, out: &mut [f32] = out));
}

/// The integer products of [`qgemm::qgemm_rows`] on `isa` (which must satisfy
/// [`q4_runs_on`], with `p.g.lanes` its lanes: see [`q4_isa`]): rows `r0..r1` into `out`.
/// [`qgemm::qrows_pack`] compiled for `isa` (the one `g` was made for).
#[allow(clippy::too_many_arguments)]
pub fn qrows_pack_on(
    isa: Isa,
    g: &QGeom,
    src: &[u8],
    m: usize,
    ld: usize,
    flip: u8,
    out: &mut [u8],
    sums: &mut [i32],
) {
    assert!(
        q4_runs_on(isa) && g.lanes == isa_lanes(isa),
        "qrows_pack_on: {isa:?}"
    );
    q_dispatch!(isa, qgemm::qrows_pack(g: &QGeom = g, src: &[u8] = src, m: usize = m, ld: usize = ld, flip: u8 = flip, out: &mut [u8] = out, sums: &mut [i32] = sums));
}

pub fn qgemm_rows_on(
    isa: Isa,
    p: &QGemm<'_>,
    e: &QEpi<'_>,
    r0: usize,
    r1: usize,
    out: QOut<'_>,
    ld: usize,
) {
    assert!(
        q4_runs_on(isa) && p.g.lanes == isa_lanes(isa),
        "qgemm_rows_on: {isa:?}"
    );
    q_dispatch!(isa, qgemm::qgemm_rows(p: &QGemm<'_> = p, e: &QEpi<'_> = e, r0: usize = r0, r1: usize = r1, out: QOut<'_> = out, ld: usize = ld));
}

/// A vector of f32 lanes. Implementations are thin wrappers over one ISA's registers; every
/// method must be `#[inline(always)]` so that generic kernels compile to straight intrinsics.
pub trait VF32: Copy {
    const LANES: usize;
    /// Rows of the SGEMM micro-kernel (its tile is `GEMM_MR x 2*LANES`); ISAs with more
    /// registers take more rows.
    const GEMM_MR: usize = 4;
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
    /// Lane-wise maximum; where either lane is NaN, `self`'s (a NaN in `self` propagates, a
    /// NaN in `o` is ignored).
    fn max(self, o: Self) -> Self;
    /// Lane-wise minimum; where either lane is NaN, `self`'s.
    fn min(self, o: Self) -> Self;
    /// Rounds to the nearest integer (ties to even).
    fn round(self) -> Self;
    /// `2^self` for lanes holding integers in [-126, 127].
    fn pow2i(self) -> Self;
    fn hsum(self) -> f32;
    fn hmax(self) -> f32;
    /// `|self|` (clears the sign bit; NaN stays NaN).
    fn abs(self) -> Self;
    /// `|self|` with the sign bit of `sign`.
    fn copysign(self, sign: Self) -> Self;
    /// Per lane: `a` where `self < t`, else `b` (a NaN in `self` takes `b`).
    fn lt_select(self, t: Self, a: Self, b: Self) -> Self;
    /// The even and the odd lanes of `self` followed by `b`: `([s0, s2, .., b0, b2, ..],
    /// [s1, s3, .., b1, b3, ..])`.
    fn deinterleave(self, b: Self) -> (Self, Self);
    /// Transposes the `LANES x LANES` block held in `v` (`v.len() == LANES`; row `r` is
    /// `v[r]`): afterwards lane `c` of `v[r]` is what lane `r` of `v[c]` was.
    fn transpose(v: &mut [Self]);
    /// The low and the high nibbles of the bytes `b[0..LANES]` as floats in 0..=15:
    /// `([b0 & 15, b1 & 15, ..], [b0 >> 4, b1 >> 4, ..])` (panics if `b` is shorter).
    fn nibbles(b: &[u8]) -> (Self, Self);
    /// The bytes `b[0..LANES]` as floats in 0..=255 (panics if `b` is shorter).
    fn bytes(b: &[u8]) -> Self;

    /// An integer register of `4 * LANES` bytes, read as `LANES` i32 lanes by [`VF32::q_dot`]
    /// (int8 products of 4-bit codes).
    type Q: Copy;
    /// Zero i32 lanes.
    fn q_zero() -> Self::Q;
    /// The low and the high nibbles of the bytes `b[0..4 * LANES]`, each left in its byte's
    /// place as 0..=15 (panics if `b` is shorter).
    fn q_nibbles(b: &[u8]) -> (Self::Q, Self::Q);
    /// Lane `j` of `acc` plus `sum_{t < 4} codes.byte(4j + t) * q[t]`, the codes unsigned
    /// bytes below 128 and `q` four int8 values (`q4`'s bytes, least significant first).
    fn q_dot(acc: Self::Q, codes: Self::Q, q4: u32) -> Self::Q;
    /// The i32 lanes as floats.
    fn q_f32(acc: Self::Q) -> Self;
    /// [`VF32::q_dot`] for codes over the whole unsigned byte range (0..=255): exact where
    /// `q_dot`'s pair sums could saturate (AVX2's `maddubs`) or its products read the codes
    /// as signed (NEON).
    #[inline(always)]
    fn q_dot8(acc: Self::Q, codes: Self::Q, q4: u32) -> Self::Q {
        Self::q_dot(acc, codes, q4)
    }
    /// Whether the integer products ([`qgemm`]) multiply in i16 pairs: their signed rows
    /// hold each quad as two i16 pairs, and [`VF32::q_split`] readies the unsigned codes,
    /// so that the inner loop is two [`VF32::q_dot16`] with nothing to unpack per row (AVX2,
    /// whose byte products saturate). Otherwise [`VF32::q_dot8`] on the bytes.
    const Q_PAIRS: bool = false;
    /// For ISAs with [`VF32::Q_PAIRS`]: the bytes at `4j, 4j + 2` of each lane `j` and those
    /// at `4j + 1, 4j + 3`, each zero-extended into the lane's two i16 halves (the operands
    /// of [`VF32::q_dot16`]).
    #[inline(always)]
    fn q_split(codes: Self::Q) -> (Self::Q, Self::Q) {
        let _ = codes;
        unreachable!("q_split is only called where Q_PAIRS is set")
    }
    /// For ISAs with [`VF32::Q_PAIRS`]: four quads of `s[..16]`, each byte `xor flip` read as
    /// int8, as the i16 values `v0, v2, v1, v3` of each quad (little-endian) in `d[..32]`, the
    /// row layout of [`qgemm::qrows_pack`].
    #[inline(always)]
    fn q_pairs16(s: &[u8], flip: u8, d: &mut [u8]) {
        for (sq, dq) in s[..16].chunks_exact(4).zip(d[..32].chunks_exact_mut(8)) {
            for (dd, t) in dq.chunks_exact_mut(2).zip([0, 2, 1, 3]) {
                dd.copy_from_slice(&(((sq[t] ^ flip) as i8) as i16).to_le_bytes());
            }
        }
    }
    /// The bytes `b[0..4 * LANES]` as they are (panics if `b` is shorter).
    fn q_load(b: &[u8]) -> Self::Q;
    /// `LANES` i32 lanes from `s[0..LANES]` (panics if `s` is shorter).
    fn q_load_i32(s: &[i32]) -> Self::Q;
    /// Stores the i32 lanes into `d[0..LANES]` (panics if `d` is shorter).
    fn q_store_i32(v: Self::Q, d: &mut [i32]);
    /// Every i32 lane `v`.
    fn q_splat(v: i32) -> Self::Q;
    /// Lane-wise `a + b` (wrapping).
    fn q_add(a: Self::Q, b: Self::Q) -> Self::Q;
    /// Lane-wise `acc + v * s` (wrapping).
    fn q_mul_add(acc: Self::Q, v: Self::Q, s: i32) -> Self::Q;
    /// The int8 values `b[0..2 * LANES]` widened to i16, two to an i32 lane (lane `j` holds
    /// `b[2j]` in its low half and `b[2j + 1]` in its high half; panics if `b` is shorter).
    fn q_wide(b: &[u8]) -> Self::Q;
    /// Lane `j` of `acc` plus `w.lo(j) * x.lo + w.hi(j) * x.hi` over i16 halves ([`VF32::q_wide`]'s
    /// pairs against `x2`'s two i16, low first), exact in i32 (AVX-512 VNNI `vpdpwssd`, AVX2
    /// `pmaddwd`, SIMD128 `i32x4.dot_i16x8_s`, NEON widening products).
    fn q_dot16(acc: Self::Q, w: Self::Q, x2: u32) -> Self::Q;
    /// Stores lanes holding integers in -128..=255 as bytes (each lane's low byte) into
    /// `d[0..LANES]` (panics if `d` is shorter).
    fn store_bytes(self, d: &mut [u8]);

    /// `self * 2^n` for lanes of `n` holding integers in [-252, 254] whose product is a
    /// normal float or an overflow (two exact power-of-two factors; AVX-512 has it as one
    /// instruction).
    #[inline(always)]
    fn scale2(self, n: Self) -> Self {
        let half = n.mul(Self::splat(0.5)).round();
        self.mul(half.pow2i()).mul(n.sub(half).pow2i())
    }

    /// `1 / self` for finite `self` to within about an ulp: the hardware's reciprocal
    /// estimate refined by one Newton step where the ISA has one (a vector division takes
    /// ten or more cycles per vector), else a division. Callers keep `self` finite and
    /// nonzero (an infinity gives NaN on the estimate's path).
    #[inline(always)]
    fn recip(self) -> Self {
        Self::splat(1.0).div(self)
    }

    /// `1 / (1 + e^-x)` as ONNX Runtime computes it (its MLAS logistic kernel, itself
    /// Eigen's): x clamped to [-18, 18], then `0.5 + x P(x^2) / Q(x^2)` with P of degree 4
    /// and Q of degree 5 in x^2 (Horner, fused multiply-adds), clamped to [0, 1]. Within
    /// 1.2e-7 of the exact value, and where the fma is fused (x86 with FMA, NEON) equal to
    /// ONNX Runtime's output bit for bit (measured on 200 000 inputs): a last-bit difference
    /// in a decoder's SiLU becomes a whole int8 step in the next int4 MatMulNBits at
    /// accuracy level 4. NaN propagates.
    #[inline(always)]
    fn sigmoid(self) -> Self {
        let x = self.max(Self::splat(-18.0)).min(Self::splat(18.0));
        let x2 = x.mul(x);
        let mut p = x2.fma(Self::splat(4.370_31e-11), Self::splat(1.156_273_2e-7));
        p = p.fma(x2, Self::splat(6.085_749e-5));
        p = p.fma(x2, Self::splat(8.513_771e-3));
        p = p.fma(x2, Self::splat(2.482_879_5e-1));
        let p = p.mul(x);
        let mut q = x2.fma(Self::splat(6.102_473_7e-13), Self::splat(5.761_021_4e-9));
        q = q.fma(x2, Self::splat(6.291_068e-6));
        q = q.fma(x2, Self::splat(1.701_988_2e-3));
        q = q.fma(x2, Self::splat(1.168_176_5e-1));
        q = q.fma(x2, Self::splat(9.931_519e-1));
        p.div(q)
            .add(Self::splat(0.5))
            .max(Self::splat(0.0))
            .min(Self::splat(1.0))
    }

    /// `tanh(x)` to within a few ulp: an odd Taylor polynomial (through x^19) below |x| = 0.5,
    /// `1 - 2 / (1 + e^2|x|)` above, with the sign restored; NaN propagates.
    #[inline(always)]
    fn tanh(self) -> Self {
        let ax = self.abs();
        // small |x|: x * P(x^2), the series 1 - x^2/3 + 2x^4/15 - 17x^6/315 + ...
        let x2 = self.mul(self);
        let mut p = Self::splat(-2.391_291e-4); // -443861162/1856156927625
        p = p.fma(x2, Self::splat(5.900_274e-4)); // 6404582/10854718875
        p = p.fma(x2, Self::splat(-1.455_834_4e-3)); // -929569/638512875
        p = p.fma(x2, Self::splat(3.592_128e-3)); // 21844/6081075
        p = p.fma(x2, Self::splat(-8.863_236e-3)); // -1382/155925
        p = p.fma(x2, Self::splat(2.186_949e-2)); // 62/2835
        p = p.fma(x2, Self::splat(-5.396_825_4e-2)); // -17/315
        p = p.fma(x2, Self::splat(1.333_333_4e-1)); // 2/15
        p = p.fma(x2, Self::splat(-3.333_333_4e-1)); // -1/3
        let small = p.mul(x2).fma(self, self);
        // large |x| (from |x| = 10 on, tanh rounds to 1: the clamp keeps e finite)
        let one = Self::splat(1.0);
        let ac = ax.min(Self::splat(10.0));
        let e = ac.add(ac).exp();
        let large = one
            .sub(Self::splat(2.0).mul(one.add(e).recip()))
            .copysign(self);
        ax.lt_select(Self::splat(0.5), small, large)
    }

    /// `erf(x) / x` for |x| < 0.5 (the Maclaurin series through x^16).
    #[inline(always)]
    fn erf_small_over_x(self) -> Self {
        let x2 = self.mul(self);
        // 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1))
        let mut p = Self::splat(1.646_211_4e-6); // n = 8
        p = p.fma(x2, Self::splat(-1.492_565e-5));
        p = p.fma(x2, Self::splat(1.205_533_3e-4));
        p = p.fma(x2, Self::splat(-8.548_327e-4));
        p = p.fma(x2, Self::splat(5.223_977_6e-3));
        p = p.fma(x2, Self::splat(-2.686_617_1e-2));
        p = p.fma(x2, Self::splat(1.128_379_2e-1));
        p = p.fma(x2, Self::splat(-3.761_263_9e-1));
        p = p.fma(x2, Self::splat(core::f32::consts::FRAC_2_SQRT_PI)); // n = 0
        p
    }

    /// `erfc(|x|)` with a relative error near 1e-7 over the whole range: the Chebyshev-fitted
    /// `t e^(-z^2 + P(t))`, t = 2 / (2 + z), of Numerical Recipes' `erfcc`.
    #[inline(always)]
    fn erfc_abs(self) -> Self {
        let z = self.abs();
        let one = Self::splat(1.0);
        let t = one.div(Self::splat(0.5).fma(z, one));
        let mut p = Self::splat(0.170_872_77);
        p = p.fma(t, Self::splat(-0.822_152_23));
        p = p.fma(t, Self::splat(1.488_515_9));
        p = p.fma(t, Self::splat(-1.135_204));
        p = p.fma(t, Self::splat(0.278_868_07));
        p = p.fma(t, Self::splat(-0.186_288_06));
        p = p.fma(t, Self::splat(0.096_784_18));
        p = p.fma(t, Self::splat(0.374_091_96));
        p = p.fma(t, Self::splat(1.000_023_7));
        p = p.fma(t, Self::splat(-1.265_512_2));
        // arg < 0.4 everywhere (about 0 at z = 0): the cheaper exponential, zero below
        // -87.3 (erfc(9.3) is 1e-38, beyond what f32 holds as a normal number)
        let arg = p.sub(z.mul(z));
        t.mul(arg.exp_small())
    }

    /// `e^x` for `x` below about 0.5, to within about 2 ulp: [`VF32::exp_nonpositive`]'s
    /// reduction and polynomial with one power-of-two factor (`m >= -126` keeps it normal),
    /// zero below -87.3 (where `e^x` is not a normal f32); NaN propagates.
    #[inline(always)]
    fn exp_small(self) -> Self {
        let (p, m) = self.max(Self::splat(-87.3)).exp_reduced();
        let y = p.mul(m.pow2i());
        self.lt_select(Self::splat(-87.3), Self::splat(0.0), y)
    }

    /// The shared part of [`VF32::exp_nonpositive`] and [`VF32::exp_small`] for a clamped
    /// `x`: `(p, m)` with `e^x = p * 2^m`, `m = round(x / ln 2)` by the 1.5 * 2^23 rounding
    /// bias, `r = x - m ln2` in two fused steps, `p` a degree-6 polynomial in `r` by fused
    /// Horner steps (its last two coefficients 1).
    #[inline(always)]
    fn exp_reduced(self) -> (Self, Self) {
        let bias = Self::splat(12_582_912.0);
        let biased = self.fma(Self::splat(core::f32::consts::LOG2_E), bias);
        let m = biased.sub(bias);
        let r = m.fma(Self::splat(-6.931_457_5e-1), self);
        let r = m.fma(Self::splat(-1.428_606_8e-6), r);
        let mut p = Self::splat(1.378_059_4e-3);
        p = p.fma(r, Self::splat(8.373_124_5e-3));
        p = p.fma(r, Self::splat(4.166_953_6e-2));
        p = p.fma(r, Self::splat(1.666_647_2e-1));
        p = p.fma(r, Self::splat(4.999_998_5e-1));
        p = p.fma(r, Self::splat(1.0));
        p = p.fma(r, Self::splat(1.0));
        (p, m)
    }

    /// `erf(x)`: the Maclaurin series below |x| = 0.5, `1 - erfc(|x|)` with the sign restored
    /// above; NaN propagates.
    #[inline(always)]
    fn erf(self) -> Self {
        let ax = self.abs();
        let small = self.erf_small_over_x().mul(self);
        let large = Self::splat(1.0).sub(self.erfc_abs()).copysign(self);
        ax.lt_select(Self::splat(0.5), small, large)
    }

    /// `1 + erf(x)` without cancellation for negative x, as GELU needs: `erfc(|x|)` there,
    /// `2 - erfc(x)` from 0 on. `erfc_abs`'s relative error (about 1e-7) is an ulp or two of
    /// the result everywhere: near 0 the result is near 1 and the erfc near 1 too, so no
    /// series is needed for small |x| (it is for `erf` itself, whose value goes to 0 there).
    #[inline(always)]
    fn one_plus_erf(self) -> Self {
        let e = self.erfc_abs();
        self.lt_select(Self::splat(0.0), e, Self::splat(2.0).sub(e))
    }

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
        // n may be 128 at the top of the range (beyond pow2i's)
        let y = y.scale2(n);
        // below the clamp the result would be subnormal or zero: give zero, so that what
        // follows (softmax over masked scores, then a product) never meets subnormals, which
        // cost some CPUs a microcode assist per operation
        self.lt_select(Self::splat(-87.33), Self::splat(0.0), y)
    }

    /// `e^x` for `x <= 0` (a score less its row's maximum) as ONNX Runtime's softmax computes
    /// it (MLAS's sum-of-exponentials kernel): x clamped below at -88.376, `m = round(x /
    /// ln 2)` by the 1.5 * 2^23 rounding bias, `r = x - m ln2` in two fused steps, a degree-6
    /// polynomial by fused Horner steps (its last two coefficients 1), times `2^m`. Equal to
    /// ONNX Runtime's values bit for bit where the fma is fused (fitted on this project's
    /// attention references); within about 2 ulp of `e^x`.
    #[inline(always)]
    fn exp_nonpositive(self) -> Self {
        let (p, m) = self.max(Self::splat(-88.376_26)).exp_reduced();
        // m is in [-128, 0]: two halves keep each power of two normal
        p.scale2(m)
    }
}

/// Reusable scratch buffers (GEMM packing panels, im2col tiles): taking one from this pool
/// instead of allocating keeps large temporaries from being mapped, faulted in and trimmed
/// away again on every call. Buffers are kept as u64 words (aligned for every element type);
/// at most `POOL_MAX` are kept, each handed to one caller at a time.
static SCRATCH: spin::Mutex<alloc::vec::Vec<alloc::vec::Vec<u64>>> =
    spin::Mutex::new(alloc::vec::Vec::new());
const POOL_MAX: usize = 16;
/// Buffers above this many bytes are not kept (a one-off huge temporary is freed).
const POOL_MAX_BYTES: usize = 64 << 20;

/// A scratch buffer of the pool (see [`scratch`]); returned to the pool on drop.
pub struct Scratch<T: bytemuck::Pod = f32> {
    buf: alloc::vec::Vec<u64>,
    len: usize,
    _t: core::marker::PhantomData<T>,
}

/// Words from the start of `buf` to its first cache-line (64-byte) boundary: a scratch slice
/// starts there, so a vector load never straddles two lines because of where the allocator
/// put the buffer (a 64-byte load across lines costs two).
fn line_skip(buf: &[u64]) -> usize {
    (64 - buf.as_ptr() as usize % 64) % 64 / 8
}

impl<T: bytemuck::Pod> core::ops::Deref for Scratch<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        let bytes: &[u8] = bytemuck::cast_slice(&self.buf[line_skip(&self.buf)..]);
        &bytemuck::cast_slice(bytes)[..self.len]
    }
}

impl<T: bytemuck::Pod> core::ops::DerefMut for Scratch<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        let skip = line_skip(&self.buf);
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut self.buf[skip..]);
        &mut bytemuck::cast_slice_mut(bytes)[..self.len]
    }
}

/// f32s that start on a cache-line (64-byte) boundary (weights packed at load: the SGEMM
/// streams them with full-line vector loads).
pub struct AlignedF32 {
    buf: alloc::vec::Vec<f32>,
    skip: usize,
    len: usize,
}

impl AlignedF32 {
    /// A line-aligned copy of `v`.
    pub fn from_slice(v: &[f32]) -> AlignedF32 {
        let mut buf = alloc::vec![0f32; v.len() + 16];
        let skip = (64 - buf.as_ptr() as usize % 64) % 64 / 4;
        buf[skip..skip + v.len()].copy_from_slice(v);
        AlignedF32 {
            buf,
            skip,
            len: v.len(),
        }
    }
}

impl core::ops::Deref for AlignedF32 {
    type Target = [f32];
    fn deref(&self) -> &[f32] {
        &self.buf[self.skip..self.skip + self.len]
    }
}

impl<T: bytemuck::Pod> Drop for Scratch<T> {
    fn drop(&mut self) {
        if self.buf.capacity() * 8 > POOL_MAX_BYTES {
            return;
        }
        // never wait long for the pool (a spin lock held by a preempted thread would stall
        // this one for a whole time slice): when it stays busy, the buffer is just freed
        if let Some(mut pool) = try_lock_briefly() {
            if pool.len() < POOL_MAX {
                pool.push(core::mem::take(&mut self.buf));
            } else if let Some(small) = pool.iter_mut().min_by_key(|b| b.capacity()) {
                // a full pool keeps its largest buffers
                if small.capacity() < self.buf.capacity() {
                    core::mem::swap(small, &mut self.buf);
                }
            }
        }
    }
}

/// The pool's lock after at most a few dozen tries (its critical sections are a scan of at
/// most `POOL_MAX` entries, so a lock held longer belongs to a preempted thread).
fn try_lock_briefly() -> Option<spin::MutexGuard<'static, alloc::vec::Vec<alloc::vec::Vec<u64>>>> {
    for _ in 0..64 {
        if let Some(g) = SCRATCH.try_lock() {
            return Some(g);
        }
        core::hint::spin_loop();
    }
    None
}

/// A scratch slice of `len` elements of `T` (contents unspecified: callers write before they
/// read), taken from a process-wide pool. (A guard rather than a closure: a closure would be
/// compiled without the calling kernel's target features.)
pub fn scratch<T: bytemuck::Pod>(len: usize) -> Scratch<T> {
    let size = core::mem::size_of::<T>();
    assert!(
        size > 0 && 8 % size == 0,
        "scratch elements are 1, 2, 4 or 8 bytes"
    );
    // room to start the slice on a cache line (see `line_skip`)
    let words = (len * size).div_ceil(8) + 8;
    // the smallest buffer that fits; else the largest, to grow (a pool that stays busy means
    // a fresh buffer, never a long wait: see Drop)
    let taken = try_lock_briefly().and_then(|mut pool| {
        let fit = (0..pool.len())
            .filter(|&i| pool[i].capacity() >= words)
            .min_by_key(|&i| pool[i].capacity());
        let i = fit.or_else(|| (0..pool.len()).max_by_key(|&i| pool[i].capacity()))?;
        Some(pool.swap_remove(i))
    });
    let mut buf = taken.unwrap_or_default();
    if buf.len() < words {
        buf.resize(words, 0);
    }
    Scratch {
        buf,
        len,
        _t: core::marker::PhantomData,
    }
}

/// Which instruction set the dispatcher picks on this machine (for reports).
pub fn isa_name() -> &'static str {
    // the relaxed-SIMD wasm build says so (its fma is relaxed madd)
    #[cfg(all(target_arch = "wasm32", target_feature = "relaxed-simd"))]
    if isa() == Isa::Simd128 {
        return "simd128+relaxed";
    }
    isa().name()
}

/// Defines a public function that runs the generic `$imp::<V>` on the best vector type, and
/// `$name_on(isa, ..)` that runs it on a given one (at most what the machine has; for tests).
macro_rules! dispatch {
    ($(#[$m:meta])* fn $name:ident / $on:ident($($a:ident: $t:ty),*) $(-> $r:ty)? => $imp:ident) => {
        $(#[$m])*
        #[inline]
        pub fn $name($($a: $t),*) $(-> $r)? {
            $on(isa(), $($a),*)
        }

        #[doc(hidden)]
        #[allow(unused_variables)]
        pub fn $on(isa: Isa, $($a: $t),*) $(-> $r)? {
            #[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
            {
                return kernels::$imp::<wasm::V128>($($a),*);
            }
            #[cfg(target_arch = "aarch64")]
            {
                if isa >= Isa::Neon {
                    return kernels::$imp::<neon::Neon>($($a),*);
                }
            }
            #[cfg(target_arch = "x86_64")]
            {
                let isa = isa.min(best());
                if isa == Isa::Avx512 {
                    #[target_feature(enable = "avx512f,avx2,fma")]
                    unsafe fn wide($($a: $t),*) $(-> $r)? {
                        kernels::$imp::<avx512::Avx512>($($a),*)
                    }
                    // SAFETY: the CPU reported AVX-512F (and the OS saves ZMM state).
                    return unsafe { wide($($a),*) };
                }
                if isa == Isa::Avx2 {
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

/// `C = alpha*A*B + beta*C` with a packed, register-blocked micro-kernel (see [`Gemm`]).
/// Operand strides must be non-negative and in bounds (the caller checks; see
/// [`sgemm_checked`]).
#[inline]
pub fn sgemm_unchecked(g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
    sgemm_ops_unchecked(g, Operand::Strided(a), Operand::Strided(b), c)
}

#[doc(hidden)]
pub fn sgemm_unchecked_on(isa: Isa, g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) {
    sgemm_ops_unchecked_on(isa, g, Operand::Strided(a), Operand::Strided(b), c)
}

/// [`sgemm_unchecked`] with operands that may come packed (see [`Operand`]): checked by the
/// caller ([`sgemm_ops_checked`] checks).
#[inline]
pub fn sgemm_ops_unchecked(g: &Gemm, a: Operand<'_>, b: Operand<'_>, c: &mut [f32]) {
    sgemm_ops_unchecked_on(isa(), g, a, b, c)
}

#[doc(hidden)]
pub fn sgemm_ops_unchecked_on(isa: Isa, g: &Gemm, a: Operand<'_>, b: Operand<'_>, c: &mut [f32]) {
    sgemm_ops_epi_unchecked_on(isa, g, a, b, c, GemmEpi::NONE)
}

/// [`sgemm_ops_unchecked`] then `epi` (a bias per row of C, a clamp), applied to each tile of
/// C as the micro-kernel stores it (by a pass over C on the few-row and narrow paths).
#[inline]
pub fn sgemm_ops_epi_unchecked(
    g: &Gemm,
    a: Operand<'_>,
    b: Operand<'_>,
    c: &mut [f32],
    epi: GemmEpi<'_>,
) {
    sgemm_ops_epi_unchecked_on(isa(), g, a, b, c, epi)
}

#[doc(hidden)]
pub fn sgemm_ops_epi_unchecked_on(
    isa: Isa,
    g: &Gemm,
    a: Operand<'_>,
    b: Operand<'_>,
    c: &mut [f32],
    epi: GemmEpi<'_>,
) {
    if sgemm_narrow_fits_on(isa, g, &a, &b) {
        sgemm_narrow_on(isa, g, a, b, c);
        return epi.apply(g.m, g.n, g.ldc, c);
    }
    if let (Operand::Strided(a), Operand::Panels { data, .. }) = (a, b) {
        if kernels::few_panels_fit(g.m) {
            sgemm_few_panels_on(isa, g, a, data, c);
            return epi.apply(g.m, g.n, g.ldc, c);
        }
    }
    match sgemm_panel_height_on(isa, g, &a) {
        12 => sgemm_mr12_on(isa, g, a, b, c, epi),
        8 => sgemm_mr8_on(isa, g, a, b, c, epi),
        _ => sgemm_mr4_on(isa, g, a, b, c, epi),
    }
}

dispatch!(
    /// Whether the narrow product (packed A, a C of a few columns) takes `g`.
    fn sgemm_narrow_fits / sgemm_narrow_fits_on(g: &Gemm, a: &Operand<'_>, b: &Operand<'_>) -> bool => sgemm_narrow_fits
);

dispatch!(
    /// The narrow product: C's few columns from A's packed panels, B's values broadcast.
    fn sgemm_narrow / sgemm_narrow_on(g: &Gemm, a: Operand<'_>, b: Operand<'_>, c: &mut [f32]) => sgemm_narrow
);

dispatch!(
    /// The product of a few rows of a strided A with B's packed panels (a GEMV over weights
    /// packed at load).
    fn sgemm_few_panels / sgemm_few_panels_on(g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) => sgemm_few_panels
);

dispatch!(
    /// The A panel height the SGEMM runs `g` with (a packed A's own, else [`gemm_mr_for`]'s).
    fn sgemm_panel_height / sgemm_panel_height_on(g: &Gemm, a: &Operand<'_>) -> usize => sgemm_panel_height
);

dispatch!(
    /// The SGEMM on 12-row A panels (each height is a function of its own: see
    /// `kernels::sgemm_ops`).
    fn sgemm_mr12 / sgemm_mr12_on(g: &Gemm, a: Operand<'_>, b: Operand<'_>, c: &mut [f32], epi: GemmEpi<'_>) => sgemm_ops_12
);

dispatch!(
    /// The SGEMM on 8-row A panels.
    fn sgemm_mr8 / sgemm_mr8_on(g: &Gemm, a: Operand<'_>, b: Operand<'_>, c: &mut [f32], epi: GemmEpi<'_>) => sgemm_ops_8
);

dispatch!(
    /// The SGEMM on 4-row A panels.
    fn sgemm_mr4 / sgemm_mr4_on(g: &Gemm, a: Operand<'_>, b: Operand<'_>, c: &mut [f32], epi: GemmEpi<'_>) => sgemm_ops_4
);

dispatch!(
    /// The SGEMM micro-kernel's tile on this machine: (rows of A's panels, columns of B's
    /// panels), the `panel` sizes [`Operand::Panels`] must have.
    fn gemm_tile / gemm_tile_on() -> (usize, usize) => gemm_tile
);

dispatch!(
    /// The height of A's panels the SGEMM takes for an `m`-row product on this machine (what
    /// weights packed at load for that product should use).
    fn gemm_mr_for / gemm_mr_for_on(m: usize) -> usize => gemm_mr_for
);

dispatch!(
    /// Whether this machine's SGEMM has a micro-kernel for A panels `panel` rows high.
    fn gemm_panel_ok / gemm_panel_ok_on(panel: usize) -> bool => gemm_panel_ok
);

dispatch!(
    /// `(min, max)` of `x` and 0; NaN, NaN where `x` holds a NaN.
    fn range_with_zero / range_with_zero_on(x: &[f32]) -> (f32, f32) => range_with_zero
);

dispatch!(
    /// QuantizeLinear into int8/uint8: `out = round(x / s) + zp`, saturated (see [`Q8`]).
    fn quantize_q8 / quantize_q8_on(x: &[f32], s: f32, q: Q8, out: &mut [u8]) => quantize_q8
);

dispatch!(
    /// DequantizeLinear of int8 (`signed`) or uint8: `out = (x - z) * s`.
    fn dequantize_q8 / dequantize_q8_on(x: &[u8], signed: bool, z: f32, s: f32, out: &mut [f32]) => dequantize_q8
);

dispatch!(
    /// `out = round(acc * m) + zp`, saturated (see [`Q8`]).
    fn requantize_q8 / requantize_q8_on(acc: &[f32], m: f32, q: Q8, out: &mut [u8]) => requantize_q8
);

dispatch!(
    /// Quantized add or multiply of byte tensors (see [`QBin`]); `b` one per element,
    /// repeating, or (`per_b` > 1) one per `per_b` elements.
    fn qbinary_q8 / qbinary_q8_on(p: QBin, a: &[u8], b: &[u8], per_b: usize, signed: bool, q: Q8, out: &mut [u8]) => qbinary_q8
);

dispatch!(
    /// `out[i] = a[i] op b[i % b.len()]` (b repeats; `b.len()` divides `a.len()`).
    fn binary_repeat / binary_repeat_on(op: BinOp, a: &[f32], b: &[f32], out: &mut [f32]) => binary_repeat
);

dispatch!(
    /// `out[i] = a[i % a.len()] op b[i]` (a repeats; `a.len()` divides `b.len()`).
    fn binary_repeat_lhs / binary_repeat_lhs_on(op: BinOp, a: &[f32], b: &[f32], out: &mut [f32]) => binary_repeat_lhs
);

dispatch!(
    /// `acc[i] = bias + sum over taps t of ws[t] * src[offs[t] + i]` (direct convolution taps).
    fn conv_taps / conv_taps_on(ws: &[f32], offs: &[usize], src: &[f32], bias: f32, acc: &mut [f32]) => conv_taps
);

dispatch!(
    /// Output rows `r0..` of one plane of a depthwise convolution with horizontal stride 1,
    /// read straight from the input plane, clamped (see [`DwPlane`]).
    fn dw_plane_rows / dw_plane_rows_on(g: &DwPlane, x: &[f32], w: &[f32], bias: f32, clamp: Option<Clamp>, r0: usize, y: &mut [f32]) => dw_plane_rows
);

dispatch!(
    /// `out[j]` = the larger of `src[2j]` and `src[2j + 1]` as max pooling folds them (from
    /// -inf; a NaN never replaces a number).
    fn pair_max / pair_max_on(src: &[f32], out: &mut [f32]) => pair_max
);

dispatch!(
    /// The two phases of a zero-padded stride-2 row: `ph0[q] = src[2q - pad]`, `ph1[q] =
    /// src[2q + 1 - pad]`, zero outside `src`.
    fn phases2 / phases2_on(src: &[f32], pad: isize, ph0: &mut [f32], ph1: &mut [f32]) => phases2
);

dispatch!(
    /// `dst[c * ldd + r] = src[r * lds + c]` for `r < rows`, `c < cols` (a matrix transpose,
    /// through registers a square block at a time).
    fn transpose_matrix / transpose_matrix_on(src: &[f32], lds: usize, rows: usize, cols: usize, dst: &mut [f32], ldd: usize) => transpose_matrix
);

dispatch!(
    /// `dst[c][r] = src[r * lds + c]` for `r < rows`, `c < cols`: [`transpose_matrix`] into
    /// rows that lie anywhere (each at least `rows` long).
    fn transpose_to_rows / transpose_to_rows_on(src: &[f32], lds: usize, rows: usize, cols: usize, dst: &mut [&mut [f32]]) => transpose_to_rows
);

dispatch!(
    /// Depthwise taps over channel-interleaved rows of [`DW_BLOCK`] channels per position
    /// (the SIMD kernels' `dw_rows`): `out[r*n + i] = bias[i % 16] + sum over taps t of
    /// w[t*16 + i % 16] * src[r*pitch + offs[t] + i]`.
    fn dw_rows / dw_rows_on(w: &[f32], bias: &[f32], offs: &[usize], src: &[f32], pitch: usize, n: usize, out: &mut [f32]) => dw_rows
);

dispatch!(
    /// One output row segment of a group-1 convolution into the blocked channel layout, for
    /// one or two output blocks (see `simd::nchwc`).
    fn nchwc_conv_seg / nchwc_conv_seg_on(g: &NcGeom, x: &[f32], w: (&[f32], &[f32]), b: (&[f32], &[f32]), oh: usize, ow0: usize, ow1: usize, y: (&mut [f32], &mut [f32])) => nchwc_conv_seg
);

dispatch!(
    /// One output row segment of a depthwise convolution of one block of the blocked channel
    /// layout (see `simd::nchwc`).
    fn nchwc_dw_seg / nchwc_dw_seg_on(g: &NcGeom, x: &[f32], w: &[f32], b: &[f32], oh: usize, ow0: usize, ow1: usize, y: &mut [f32]) => nchwc_dw_seg
);

dispatch!(
    /// Whether [`nbits_rows`] takes this geometry on the vector type `isa` picks.
    fn nbits_fits / nbits_fits_on(g: &NBits) -> bool => nbits_fits
);

dispatch!(
    /// Rows of f32 activations times block-quantized weight columns (MatMulNBits; see
    /// [`NBits`]); the geometry must satisfy [`nbits_fits`] on the same `isa`.
    fn nbits_rows / nbits_rows_on(g: &NBits, a: &[f32], rows: usize, b: &[u8], scales: &[f32], zp: Option<&[f32]>, cols: usize, y: &mut [f32], ldy: usize) => nbits_rows
);

dispatch!(
    /// Splits float activation rows into two int16 parts per sub-block for [`w8_rows_on`]
    /// (see [`X16Rows`]).
    fn x16_rows / x16_rows_on(a: &[f32], rows: usize, k: usize, kp: usize, sub: usize) -> X16Rows => x16_rows
);

dispatch!(
    /// Reorders a padded activation row for [`nbits_dequant`]'s weight layout.
    fn nbits_permute / nbits_permute_on(g: &NBits, a: &mut [f32]) => nbits_permute
);

dispatch!(
    /// Dequantizes weight columns of a MatMulNBits product to f32 (codes reordered within
    /// groups as [`nbits_permute`] reorders activations).
    fn nbits_dequant / nbits_dequant_on(g: &NBits, b: &[u8], scales: &[f32], zp: Option<&[f32]>, cols: usize, out: &mut [f32]) => nbits_dequant
);

dispatch!(
    /// `out[i] = max(x[i], 0)`.
    fn relu / relu_on(x: &[f32], out: &mut [f32]) => relu
);

dispatch!(
    /// `out[i] = 1 / (1 + e^-x[i])`.
    fn sigmoid / sigmoid_on(x: &[f32], out: &mut [f32]) => sigmoid
);

dispatch!(
    /// `out[i] = act(x[i])` (see [`Act`]).
    fn unary / unary_on(act: Act, x: &[f32], out: &mut [f32]) => unary
);

dispatch!(
    /// `x[i] = act(x[i])` in place.
    fn unary_inplace / unary_inplace_on(act: Act, x: &mut [f32]) => unary_inplace
);

dispatch!(
    /// `out[i] = e^x[i]`.
    fn exp / exp_on(x: &[f32], out: &mut [f32]) => exp
);

dispatch!(
    /// `out[i] = e^(x[i] + shift)` for `x[i] + shift <= 0`, rounded as ONNX Runtime's softmax
    /// rounds it (see `VF32::exp_nonpositive`).
    fn exp_shifted / exp_shifted_on(x: &[f32], shift: f32, out: &mut [f32]) => exp_shifted
);

dispatch!(
    /// `out[t] = q · keys[t * ld..][..q.len()]` as ONNX Runtime's one-row GEMM kernel rounds
    /// it: unfused products summed into 8 partial sums (element k into sum k % 8), folded as
    /// `((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))`. Runs on at most AVX2 (its vectors
    /// are the 8 sums; an AVX-512 vector is 16).
    fn dots_lanes8 / dots_lanes8_on(keys: &[f32], ld: usize, q: &[f32], out: &mut [f32]) => dots_lanes8
);

dispatch!(
    /// Rotary embedding of one head, halves layout: `x[i], x[i + n]` rotated by `cos[i],
    /// sin[i]` (`n = cos.len()`), as `fma(a, cos, -(b sin))` and `fma(a, sin, b cos)` (ONNX
    /// Runtime's rounding where the fma is fused).
    fn rotate_halves / rotate_halves_on(x: &mut [f32], cos: &[f32], sin: &[f32]) => rotate_halves
);

dispatch!(
    /// `out[j] = sum_k q[k] * kt[k * ld + j]` for `j < out.len()`, each as one chain of fused
    /// multiply-adds in order of k from 0 (a GEMM micro-kernel's rounding): queries against
    /// keys stored transposed.
    fn fma_chains / fma_chains_on(kt: &[f32], ld: usize, q: &[f32], out: &mut [f32]) => fma_chains
);

dispatch!(
    /// Softmax of one contiguous row (`y = e^(x - max) / sum`).
    fn softmax_row / softmax_row_on(x: &[f32], y: &mut [f32]) => softmax_row
);

dispatch!(
    /// `out[r] = m[r * ld..][..x.len()] · x` for every `r < out.len()`.
    fn dot_rows / dot_rows_on(m: &[f32], ld: usize, x: &[f32], out: &mut [f32]) => dot_rows
);

dispatch!(
    /// `out[e] += sum_t p[t] * m[t * ld + e]` for every `e < out.len()`.
    fn axpy_rows / axpy_rows_on(p: &[f32], m: &[f32], ld: usize, out: &mut [f32]) => axpy_rows
);

dispatch!(
    /// Sum of a slice (pairwise over vector lanes).
    fn sum / sum_on(x: &[f32]) -> f32 => sum
);

dispatch!(
    /// Mean and population variance of a slice (f32 lanes within blocks, f64 across them).
    fn moments / moments_on(x: &[f32]) -> (f64, f64) => moments
);

dispatch!(
    /// Maximum of a non-empty slice (NaN propagates).
    fn max / max_on(x: &[f32]) -> f32 => max
);

dispatch!(
    /// `y = (x - mean) * inv_std * scale + bias` over one row (`scale`/`bias` as long as `x`).
    fn normalize_row / normalize_row_on(x: &[f32], mean: f32, inv_std: f32, scale: &[f32], bias: Option<&[f32]>, y: &mut [f32]) => normalize_row
);

/// Like [`sgemm_unchecked`] but checks every stride and bound first; returns `false` (and does
/// nothing) when the operands do not fit, so the caller can take a bounds-checked path.
pub fn sgemm_checked(g: &Gemm, a: &[f32], b: &[f32], c: &mut [f32]) -> bool {
    let ok = gemm::gemm_fits(g, a.len(), b.len(), c.len());
    if ok && g.m > 0 && g.n > 0 {
        sgemm_unchecked(g, a, b, c);
    }
    ok
}

/// Whether an `m x n` product should take packed operands: below four rows or with C no
/// wider than half a B panel, the SGEMM's strided paths (unpacked rows, the transposed narrow
/// product) beat panels that would be mostly padding.
pub fn panels_pay(m: usize, n: usize) -> bool {
    m >= 4 && 2 * n > gemm_tile().1
}

/// Whether an `m x n` product with a strided A should read B from panels packed at load: for
/// every C wider than half a panel (a product of one to three rows streams the panels through
/// the few-row product, as fast as B's own rows and 2-3x faster than a transposed B's).
pub fn b_panels_pay(m: usize, n: usize) -> bool {
    let _ = m;
    2 * n > gemm_tile().1
}

/// Whether operands (strided ones through `g`'s strides, packed ones as
/// [`Operand::panels_fit`] says, a row operand only as B) and a C of `c_len` elements fit the
/// product, on this machine's panel sizes.
pub fn sgemm_ops_fit(g: &Gemm, a: &Operand<'_>, b: &Operand<'_>, c_len: usize) -> bool {
    let (mr, nr) = gemm_tile();
    // a packed A may have any panel height the micro-kernels take
    let a_panel = match a {
        Operand::Panels { panel, .. } if gemm_panel_ok(*panel) => *panel,
        _ => mr,
    };
    let (m, n, k) = (g.m, g.n, g.k);
    let strided_len = |o: &Operand<'_>| match o {
        Operand::Strided(d) => d.len(),
        // a packed side is checked below; give the strided check a length it accepts
        _ => usize::MAX,
    };
    let mut gs = *g;
    if !matches!(a, Operand::Strided(_)) {
        (gs.a_rs, gs.a_cs) = (0, 0);
    }
    if !matches!(b, Operand::Strided(_)) {
        (gs.b_rs, gs.b_cs) = (0, 0);
    }
    !matches!(a, Operand::Rows { .. })
        && gemm::gemm_fits(&gs, strided_len(a), strided_len(b), c_len)
        && a.panels_fit(m, k, a_panel)
        && b.panels_fit(n, k, nr)
}

/// [`sgemm_ops_unchecked`] after checking both operands and C; returns `false` (doing
/// nothing) when they do not fit. A packed A with `alpha != 1` is unpacked first (the packed
/// path folds no alpha into A).
pub fn sgemm_ops_checked(g: &Gemm, a: Operand<'_>, b: Operand<'_>, c: &mut [f32]) -> bool {
    let (m, n, k) = (g.m, g.n, g.k);
    if !sgemm_ops_fit(g, &a, &b, c.len()) {
        return false;
    }
    if m == 0 || n == 0 {
        return true;
    }
    if let (Operand::Panels { data, panel }, true) = (a, g.alpha != 1.0) {
        let mut dense = scratch::<f32>(m * k);
        for i in 0..m {
            for p in 0..k {
                dense[i * k + p] = data[(i / panel * k + p) * panel + i % panel];
            }
        }
        let gd = Gemm {
            a_rs: k as isize,
            a_cs: 1,
            ..*g
        };
        sgemm_ops_unchecked(&gd, Operand::Strided(&dense), b, c);
        return true;
    }
    sgemm_ops_unchecked(g, a, b, c);
    true
}

#[cfg(test)]
mod tests;
