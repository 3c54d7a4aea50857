//! Kernel family: random sampling (Bernoulli).
//!
//! Draws come from MT19937 (numpy's `RandomState` generator). With a `seed` attribute every run
//! starts from that seed, so a seeded node is deterministic; without one each run of the kernel
//! seeds from a mixed per-kernel run counter, so successive runs differ (there is no entropy
//! source in `no_std`).

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::sync::atomic::{AtomicU64, Ordering};

use half::{bf16, f16};

use super::shape::Mt19937;
use super::{bad_type, def, out1, tensor_in, LATEST};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::ir::Node;
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::tensor::Tensor;
use crate::value::Value;
use crate::{bail, unsupported};

pub(crate) const KERNELS: &[KernelDef] = &[def("Bernoulli", 15, LATEST, build_bernoulli)];

/// splitmix64's output function: spreads a counter over all 64 bits.
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The seed attribute as numpy's `RandomState(int(seed))` takes it: `None` when absent or NaN
/// (unseeded), an error outside `[0, 2^32)`.
fn seed_attr(node: &Node, op: &str) -> Result<Option<u32>> {
    match node.attr_f("seed")? {
        None => Ok(None),
        Some(s) if s.is_nan() => Ok(None),
        Some(s) => {
            let t = libm::trunc(s as f64);
            if !(0.0..=u32::MAX as f64).contains(&t) {
                unsupported!("{op} seed {s} is outside [0, 2^32)");
            }
            Ok(Some(t as u32))
        }
    }
}

/// A tensor of element type `dt` holding 1 where `bits` is set and 0 elsewhere.
fn zeros_ones(dt: DataType, shape: &[usize], bits: &[bool], op: &str) -> Result<Tensor> {
    fn conv<T: crate::tensor::Elem + Copy>(
        shape: &[usize],
        bits: &[bool],
        one: T,
        zero: T,
    ) -> Result<Tensor> {
        Tensor::from_vec(
            shape,
            bits.iter()
                .map(|&b| if b { one } else { zero })
                .collect::<Vec<T>>(),
        )
    }
    match dt {
        DataType::Float => conv(shape, bits, 1.0f32, 0.0),
        DataType::Double => conv(shape, bits, 1.0f64, 0.0),
        DataType::Float16 => conv(shape, bits, f16::ONE, f16::ZERO),
        DataType::Bfloat16 => conv(shape, bits, bf16::ONE, bf16::ZERO),
        DataType::Int8 => conv(shape, bits, 1i8, 0),
        DataType::Int16 => conv(shape, bits, 1i16, 0),
        DataType::Int32 => conv(shape, bits, 1i32, 0),
        DataType::Int64 => conv(shape, bits, 1i64, 0),
        DataType::Uint8 => conv(shape, bits, 1u8, 0),
        DataType::Uint16 => conv(shape, bits, 1u16, 0),
        DataType::Uint32 => conv(shape, bits, 1u32, 0),
        DataType::Uint64 => conv(shape, bits, 1u64, 0),
        DataType::Bool => Tensor::from_vec(shape, bits.to_vec()),
        other => Err(bad_type(op, other)),
    }
}

fn build_bernoulli(node: &Node) -> Result<Box<dyn Kernel>> {
    const OP: &str = "Bernoulli";
    let out_dt = match node.attr_i("dtype")? {
        Some(c) => {
            let dt = i32::try_from(c)
                .ok()
                .and_then(DataType::from_code)
                .ok_or_else(|| Error::Other(alloc::format!("unknown Bernoulli dtype {c}")))?;
            // numeric and bool outputs only
            if zeros_ones(dt, &[0], &[], OP).is_err() {
                unsupported!("Bernoulli output type {dt} is not supported");
            }
            Some(dt)
        }
        None => None,
    };
    let seed = seed_attr(node, OP)?;
    let runs = AtomicU64::new(0);
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let p = match x.dtype() {
                DataType::Float | DataType::Double | DataType::Float16 | DataType::Bfloat16 => {
                    super::loss::load_f64(x, OP)?
                }
                other => return Err(bad_type(OP, other)),
            };
            if let Some(bad) = p.iter().find(|v| !(0.0..=1.0).contains(*v)) {
                bail!("Bernoulli probability {bad} is outside [0, 1]");
            }
            let s = seed.unwrap_or_else(|| mix64(runs.fetch_add(1, Ordering::Relaxed)) as u32);
            let mut rng = Mt19937::new(s);
            // 1 with probability p: a uniform draw in [0, 1) falls below p
            let bits: Vec<bool> = p.iter().map(|&pv| rng.next_f64() < pv).collect();
            out1(zeros_ones(
                out_dt.unwrap_or(x.dtype()),
                x.shape(),
                &bits,
                OP,
            )?)
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::AttrValue;
    use crate::provider::ReferenceCpu;
    use alloc::string::{String, ToString};
    use alloc::vec;

    fn run(attrs: Vec<(&str, AttrValue)>, x: Tensor) -> Result<Tensor> {
        let node = Node {
            name: "n".to_string(),
            op_type: "Bernoulli".to_string(),
            domain: String::new(),
            opset: 22,
            inputs: Vec::new(),
            outputs: vec![Some(0)],
            attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            implicit_inputs: Vec::new(),
        };
        let k = build_bernoulli(&node)?;
        let v = Value::Tensor(x);
        let out = k.compute(&KernelCx::new(&ReferenceCpu), &[Some(&v)])?;
        out.into_iter().next().unwrap().into_tensor()
    }

    #[test]
    fn bernoulli_values_types_and_seed() {
        // p = 0 and p = 1 are certain; the rest only need to be 0 or 1
        let p: Vec<f32> = (0..64).map(|i| (i % 5) as f32 / 4.0).collect();
        let x = Tensor::from_vec(&[8, 8], p.clone()).unwrap();
        let seeded = vec![("seed", AttrValue::Float(3.0))];
        let y = run(seeded.clone(), x.clone()).unwrap();
        assert_eq!(y.shape(), &[8, 8]);
        assert_eq!(y.dtype(), DataType::Float);
        let yv = y.as_slice::<f32>().unwrap().into_owned();
        for (&pv, &yv) in p.iter().zip(&yv) {
            assert!(yv == 0.0 || yv == 1.0);
            if pv == 0.0 {
                assert_eq!(yv, 0.0);
            }
            if pv == 1.0 {
                assert_eq!(yv, 1.0);
            }
        }
        // same seed, same draws
        let y2 = run(seeded, x.clone()).unwrap();
        assert_eq!(yv, y2.as_slice::<f32>().unwrap().into_owned());
        // numpy RandomState(0) draws 0.5488, 0.7152, 0.6028: p = 0.65 gives 1, 0, 1
        let y = run(
            vec![
                ("seed", AttrValue::Float(0.0)),
                ("dtype", AttrValue::Int(DataType::Int64 as i64)),
            ],
            Tensor::from_vec(&[3], vec![0.65f64; 3]).unwrap(),
        )
        .unwrap();
        assert_eq!(y.dtype(), DataType::Int64);
        assert_eq!(&*y.as_slice::<i64>().unwrap(), [1, 0, 1]);
        // bad probabilities and types are errors
        assert!(run(vec![], Tensor::from_vec(&[1], vec![1.5f32]).unwrap()).is_err());
        assert!(run(vec![], Tensor::from_vec(&[1], vec![1i64]).unwrap()).is_err());
        assert!(run(
            vec![("dtype", AttrValue::Int(DataType::String as i64))],
            Tensor::from_vec(&[1], vec![0.5f32]).unwrap()
        )
        .is_err());
    }
}
