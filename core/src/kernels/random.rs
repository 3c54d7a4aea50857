//! Kernel family: random sampling (Bernoulli, RandomUniform(Like), RandomNormal(Like)).
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
use crate::kernels::types::{ALL, FLOATS};
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::tensor::Tensor;
use crate::value::Value;
use crate::{bail, unsupported};

pub(crate) const KERNELS: &[KernelDef] = &[
    def("Bernoulli", 15, LATEST, build_bernoulli).types(FLOATS),
    // no inputs (types::UNDECLARED); the dtype attribute is checked when the kernel is built
    def("RandomUniform", 1, LATEST, build_random_uniform),
    // only the input's shape is used, and its type when there is no dtype attribute (then the
    // kernel requires a float type)
    def("RandomUniformLike", 1, LATEST, build_random_uniform_like).types(ALL),
    def("RandomNormal", 1, LATEST, build_random_normal),
    def("RandomNormalLike", 1, LATEST, build_random_normal_like).types(ALL),
];

/// Which distribution a Random* node draws from.
#[derive(Clone, Copy)]
enum Dist {
    /// `low + (high - low) * u`, u uniform in [0, 1).
    Uniform { low: f64, high: f64 },
    /// `mean + scale * z`, z standard normal (Box-Muller over two uniform draws).
    Normal { mean: f64, scale: f64 },
}

fn draw(dist: Dist, rng: &mut Mt19937, n: usize) -> Vec<f64> {
    match dist {
        Dist::Uniform { low, high } => (0..n)
            .map(|_| low + (high - low) * rng.next_f64())
            .collect(),
        Dist::Normal { mean, scale } => (0..n)
            .map(|_| {
                // 1 - u keeps the logarithm's argument in (0, 1]
                let u1 = 1.0 - rng.next_f64();
                let u2 = rng.next_f64();
                let z =
                    libm::sqrt(-2.0 * libm::log(u1)) * libm::cos(2.0 * core::f64::consts::PI * u2);
                mean + scale * z
            })
            .collect(),
    }
}

/// A float tensor of type `dt` from f64 values.
fn float_tensor(dt: DataType, shape: &[usize], v: Vec<f64>, op: &str) -> Result<Tensor> {
    match dt {
        DataType::Float => {
            Tensor::from_vec(shape, v.into_iter().map(|x| x as f32).collect::<Vec<_>>())
        }
        DataType::Double => Tensor::from_vec(shape, v),
        DataType::Float16 => {
            Tensor::from_vec(shape, v.into_iter().map(f16::from_f64).collect::<Vec<_>>())
        }
        DataType::Bfloat16 => {
            Tensor::from_vec(shape, v.into_iter().map(bf16::from_f64).collect::<Vec<_>>())
        }
        other => Err(bad_type(op, other)),
    }
}

fn dist_attrs(node: &Node, uniform: bool) -> Result<Dist> {
    Ok(if uniform {
        let (low, high) = (
            node.get_f("low", 0.0)? as f64,
            node.get_f("high", 1.0)? as f64,
        );
        if low.is_nan() || high.is_nan() || low > high {
            bail!("{}: low {low} is above high {high}", node.op_type);
        }
        Dist::Uniform { low, high }
    } else {
        Dist::Normal {
            mean: node.get_f("mean", 0.0)? as f64,
            scale: node.get_f("scale", 1.0)? as f64,
        }
    })
}

fn dtype_attr(node: &Node) -> Result<Option<DataType>> {
    match node.attr_i("dtype")? {
        None => Ok(None),
        Some(c) => {
            let dt = i32::try_from(c)
                .ok()
                .and_then(DataType::from_code)
                .ok_or_else(|| {
                    Error::Other(alloc::format!("unknown {} dtype {c}", node.op_type))
                })?;
            if !dt.is_float() {
                unsupported!(
                    "{} output type {dt} is not supported (float types only)",
                    node.op_type
                );
            }
            Ok(Some(dt))
        }
    }
}

/// RandomUniform / RandomNormal: the output shape comes from the `shape` attribute.
fn build_random(node: &Node, uniform: bool) -> Result<Box<dyn Kernel>> {
    let op = node.op_type.clone();
    let dist = dist_attrs(node, uniform)?;
    let dt = dtype_attr(node)?.unwrap_or(DataType::Float);
    let shape: Vec<usize> = node
        .attr_ints("shape")?
        .ok_or_else(|| Error::Other(alloc::format!("{op} needs a shape attribute")))?
        .iter()
        .map(|&d| {
            usize::try_from(d).map_err(|_| Error::Shape(alloc::format!("{op}: negative dim {d}")))
        })
        .collect::<Result<_>>()?;
    let n = crate::tensor::numel(&shape)?;
    if n > (1 << 31) {
        bail!("{op}: {n} elements is too many");
    }
    let seed = seed_attr(node, &op)?;
    let runs = AtomicU64::new(0);
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, _inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let s = seed.unwrap_or_else(|| mix64(runs.fetch_add(1, Ordering::Relaxed)) as u32);
            let mut rng = Mt19937::new(s);
            out1(float_tensor(dt, &shape, draw(dist, &mut rng, n), &op)?)
        },
    ))
}

/// RandomUniformLike / RandomNormalLike: the shape (and by default the type) of the input.
fn build_random_like(node: &Node, uniform: bool) -> Result<Box<dyn Kernel>> {
    let op = node.op_type.clone();
    let dist = dist_attrs(node, uniform)?;
    let dt = dtype_attr(node)?;
    let seed = seed_attr(node, &op)?;
    let runs = AtomicU64::new(0);
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| -> Result<Vec<Value>> {
            let x = tensor_in(inputs, 0)?;
            let out_dt = dt.unwrap_or(x.dtype());
            let s = seed.unwrap_or_else(|| mix64(runs.fetch_add(1, Ordering::Relaxed)) as u32);
            let mut rng = Mt19937::new(s);
            out1(float_tensor(
                out_dt,
                x.shape(),
                draw(dist, &mut rng, x.len()),
                &op,
            )?)
        },
    ))
}

fn build_random_uniform(node: &Node) -> Result<Box<dyn Kernel>> {
    build_random(node, true)
}
fn build_random_normal(node: &Node) -> Result<Box<dyn Kernel>> {
    build_random(node, false)
}
fn build_random_uniform_like(node: &Node) -> Result<Box<dyn Kernel>> {
    build_random_like(node, true)
}
fn build_random_normal_like(node: &Node) -> Result<Box<dyn Kernel>> {
    build_random_like(node, false)
}

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

    fn run_op(op: &str, attrs: Vec<(&str, AttrValue)>, x: Option<Tensor>) -> Result<Tensor> {
        let node = Node {
            name: "n".to_string(),
            op_type: op.to_string(),
            domain: String::new(),
            opset: 22,
            inputs: Vec::new(),
            outputs: vec![Some(0)],
            attrs: attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            implicit_inputs: Vec::new(),
        };
        let k = (KERNELS.iter().find(|d| d.op == op).unwrap().build)(&node)?;
        let v = x.map(Value::Tensor);
        let out = k.compute(&KernelCx::new(&ReferenceCpu), &[v.as_ref()])?;
        out.into_iter().next().unwrap().into_tensor()
    }

    fn mean_var(v: &[f32]) -> (f64, f64) {
        let n = v.len() as f64;
        let m = v.iter().map(|&x| x as f64).sum::<f64>() / n;
        (
            m,
            v.iter()
                .map(|&x| (x as f64 - m) * (x as f64 - m))
                .sum::<f64>()
                / n,
        )
    }

    #[test]
    fn bernoulli_draws_ones_at_rate_p() {
        // 100k draws at p = 0.3: the rate's standard error is 0.0014, so 0.3 +- 0.01 is > 7 sigma
        let x = Tensor::from_vec(&[100_000], vec![0.3f32; 100_000]).unwrap();
        let y = run(vec![("seed", AttrValue::Float(11.0))], x).unwrap();
        let (m, _) = mean_var(&y.as_slice::<f32>().unwrap());
        assert!((m - 0.3).abs() < 0.01, "rate {m}");
    }

    #[test]
    fn random_uniform_and_normal_have_their_moments_shape_and_seed() {
        let shape = AttrValue::Ints(vec![200, 500]);
        let u = run_op(
            "RandomUniform",
            vec![
                ("shape", shape.clone()),
                ("low", AttrValue::Float(-2.0)),
                ("high", AttrValue::Float(4.0)),
                ("seed", AttrValue::Float(5.0)),
            ],
            None,
        )
        .unwrap();
        assert_eq!(u.shape(), &[200, 500]);
        let uv = u.as_slice::<f32>().unwrap().into_owned();
        assert!(uv.iter().all(|&x| (-2.0..4.0).contains(&x)));
        // uniform on [-2, 4): mean 1, variance 36/12 = 3
        let (m, v) = mean_var(&uv);
        assert!(
            (m - 1.0).abs() < 0.03 && (v - 3.0).abs() < 0.05,
            "mean {m} var {v}"
        );
        let n = run_op(
            "RandomNormal",
            vec![
                ("shape", shape),
                ("mean", AttrValue::Float(3.0)),
                ("scale", AttrValue::Float(0.5)),
                ("seed", AttrValue::Float(5.0)),
                ("dtype", AttrValue::Int(11)),
            ],
            None,
        )
        .unwrap();
        assert_eq!(n.dtype(), DataType::Double);
        let nv: Vec<f32> = n.to_f32_vec().unwrap();
        let (m, v) = mean_var(&nv);
        assert!(
            (m - 3.0).abs() < 0.01 && (v - 0.25).abs() < 0.01,
            "mean {m} var {v}"
        );
        // same seed, same draws; the Like forms take the input's shape and type
        let like = run_op(
            "RandomUniformLike",
            vec![
                ("low", AttrValue::Float(-2.0)),
                ("high", AttrValue::Float(4.0)),
                ("seed", AttrValue::Float(5.0)),
            ],
            Some(Tensor::zeros(DataType::Float, &[200, 500]).unwrap()),
        )
        .unwrap();
        assert_eq!(like.as_slice::<f32>().unwrap().into_owned(), uv);
        let h = run_op(
            "RandomNormalLike",
            vec![],
            Some(Tensor::zeros(DataType::Float16, &[3, 7]).unwrap()),
        )
        .unwrap();
        assert_eq!(
            (h.dtype(), h.shape()),
            (DataType::Float16, &[3usize, 7][..])
        );
        assert!(run_op(
            "RandomUniform",
            vec![
                ("shape", AttrValue::Ints(vec![2])),
                ("dtype", AttrValue::Int(7))
            ],
            None
        )
        .is_err());
    }
}
