//! com.microsoft MatMulNBits on WebGPU against core's CPU kernel: 2, 4 and 8 bits, block sizes
//! 16 to 128, K not a multiple of the block, packed and float zero points or none, bias, one
//! to seven rows (a workgroup takes four) and a batch of rows, `accuracy_level` 4 (int8
//! activations) and float activations; `g_idx` stays on the CPU.
#![cfg(all(not(target_arch = "wasm32"), feature = "webgpu"))]

mod gpu_common;
use gpu_common::*;

use nxrt_core::Tensor;

fn bytes(n: usize, seed: u32) -> Tensor {
    let mut s = seed.wrapping_mul(747796405).wrapping_add(2891336453);
    let v: Vec<u8> = (0..n)
        .map(|_| {
            s = s.wrapping_mul(1664525).wrapping_add(1013904223);
            (s >> 24) as u8
        })
        .collect();
    Tensor::from_vec(&[n], v).unwrap()
}

/// Zero points: packed codes, floats, or none.
#[derive(Clone, Copy, PartialEq)]
enum Zp {
    None,
    Packed,
    Float,
}

#[allow(clippy::too_many_arguments)]
fn nbits(
    a: &[usize],
    n: usize,
    bits: usize,
    bs: usize,
    zp: Zp,
    bias: bool,
    level: i64,
    seed: u32,
) -> Case {
    let k = *a.last().unwrap();
    let blocks = k.div_ceil(bs);
    let blob = bs * bits / 8;
    let b = bytes(n * blocks * blob, seed);
    let b = Tensor::from_vec(&[n, blocks, blob], b.as_slice::<u8>().unwrap().to_vec()).unwrap();
    let scales: Vec<f32> = vals(n * blocks, seed + 1)
        .iter()
        .map(|x| 0.01 + 0.02 * x.abs())
        .collect();
    let mut consts = vec![
        Some(b),
        Some(Tensor::from_vec(&[n * blocks], scales).unwrap()),
    ];
    match zp {
        Zp::None => consts.push(None),
        Zp::Packed => consts.push(Some(bytes(n * (blocks * bits).div_ceil(8), seed + 2))),
        Zp::Float => consts.push(Some(
            Tensor::from_vec(
                &[n * blocks],
                vals(n * blocks, seed + 3).iter().map(|x| 4.0 + x).collect(),
            )
            .unwrap(),
        )),
    }
    if bias {
        consts.push(None);
        consts.push(Some(ft(&[n], seed + 4)));
    }
    Case::new("MatMulNBits", vec![ft(a, seed + 5)])
        .domain("com.microsoft")
        .attr(ai("K", k as i64))
        .attr(ai("N", n as i64))
        .attr(ai("bits", bits as i64))
        .attr(ai("block_size", bs as i64))
        .attr(ai("accuracy_level", level))
        .consts(consts)
        .atol(1e-4)
}

#[test]
fn nbits_4_bits_decode_rows() {
    for level in [0, 4] {
        for zp in [Zp::None, Zp::Packed, Zp::Float] {
            nbits(&[1, 96], 37, 4, 32, zp, false, level, 1).check();
        }
        // K not a multiple of the block (the last one partial), bias, 5 rows (two groups)
        nbits(&[5, 100], 19, 4, 16, Zp::Packed, true, level, 2).check();
        // a batch of rows, more columns than a dispatch of 16-column groups rounds to
        nbits(&[2, 3, 256], 301, 4, 128, Zp::None, true, level, 3).check();
        // more blocks than a column has lanes (35: each lane takes two or three)
        nbits(&[2, 1100], 21, 4, 32, Zp::Packed, false, level, 9).check();
    }
}

#[test]
fn nbits_8_and_2_bits() {
    for level in [0, 4] {
        nbits(&[3, 200], 17, 8, 64, Zp::Packed, false, level, 4).check();
        nbits(&[7, 64], 40, 8, 16, Zp::None, true, level, 5).check();
        // 2 bits: float activations at every level (as the CPU)
        nbits(&[2, 64], 33, 2, 16, Zp::Packed, false, level, 6).check();
        nbits(&[1, 48], 9, 2, 32, Zp::None, false, level, 7).check();
    }
}

#[test]
fn nbits_with_g_idx_stays_on_the_cpu() {
    let Some(g) = gpu() else { return };
    let mut c = nbits(&[1, 64], 8, 4, 32, Zp::None, false, 0, 8);
    let gidx: Vec<i32> = (0..64).map(|i| i / 32).collect();
    c.consts.push(Some(Tensor::from_vec(&[64], gidx).unwrap()));
    let (s, got) = c.run_all(vec![g, cpu()]);
    assert_eq!(s.partition().assignments[0].2, "cpu");
    let (_, want) = c.run_all(vec![cpu()]);
    assert_eq!(got, want);
}
