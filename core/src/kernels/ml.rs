//! Classical ML operators of domain ai.onnx.ml (linear models, preprocessing, encoders, trees).
//!
//! Semantics follow onnxruntime where the ONNX text is loose (binary linear classifiers,
//! post-transforms, 1-D inputs treated as one row).

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;
use hashbrown::HashMap;

use super::{def_in, out1, tensor_in, LATEST};
use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::Node;
use crate::kernels::types::{FLOATS, NUMERIC, PLAIN};
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::tensor::Tensor;
use crate::value::{MapValue, TypeInfo, Value};
use crate::{bail, unsupported};

const ML: &str = "ai.onnx.ml";

/// What Imputer's float path (float, double) and integer path (int32, int64) read.
const IMPUTER_TYPES: &[DataType] = &[
    DataType::Float,
    DataType::Double,
    DataType::Int32,
    DataType::Int64,
];

/// LabelEncoder-1 maps strings to int64 and int64 to strings.
const LABEL_ENCODER1_TYPES: &[DataType] = &[DataType::String, DataType::Int64];

/// What `keys_of` turns into lookup keys (LabelEncoder-2+; the keys' kind is checked at run).
const KEY_TYPES: &[DataType] = &[
    DataType::String,
    DataType::Float,
    DataType::Double,
    DataType::Int8,
    DataType::Int16,
    DataType::Int32,
    DataType::Int64,
    DataType::Uint8,
    DataType::Uint16,
    DataType::Uint32,
    DataType::Uint64,
];

/// OneHotEncoder: strings, or numbers read as int64 (`to_i64_vec`, which has no bfloat16).
const ONE_HOT_ENCODER_TYPES: &[DataType] = &[
    DataType::String,
    DataType::Float,
    DataType::Double,
    DataType::Float16,
    DataType::Int8,
    DataType::Int16,
    DataType::Int32,
    DataType::Int64,
    DataType::Uint8,
    DataType::Uint16,
    DataType::Uint32,
    DataType::Uint64,
];

/// What `tree_input` reads (the opset-1 tree ensembles; TreeEnsemble-5 is float only).
const TREE_INPUT_TYPES: &[DataType] = &[
    DataType::Float,
    DataType::Double,
    DataType::Float16,
    DataType::Bfloat16,
    DataType::Int32,
    DataType::Int64,
];

pub(crate) const KERNELS: &[KernelDef] = &[
    def_in(ML, "LinearClassifier", 1, LATEST, build_linear_classifier).types(NUMERIC),
    def_in(ML, "LinearRegressor", 1, LATEST, build_linear_regressor).types(NUMERIC),
    def_in(ML, "Normalizer", 1, LATEST, build_normalizer).types(NUMERIC),
    def_in(ML, "ZipMap", 1, LATEST, build_zipmap).types(&[DataType::Float]),
    def_in(ML, "Scaler", 1, LATEST, build_scaler).types(NUMERIC),
    def_in(ML, "Binarizer", 1, LATEST, build_binarizer).types(FLOATS),
    def_in(ML, "Imputer", 1, LATEST, build_imputer).types(IMPUTER_TYPES),
    def_in(ML, "LabelEncoder", 1, 1, build_label_encoder1).types(LABEL_ENCODER1_TYPES),
    def_in(ML, "LabelEncoder", 2, LATEST, build_label_encoder).types(KEY_TYPES),
    def_in(
        ML,
        "ArrayFeatureExtractor",
        1,
        LATEST,
        build_array_feature_extractor,
    )
    .types(PLAIN),
    // every input, not only the first, is checked by the kernel
    def_in(ML, "FeatureVectorizer", 1, LATEST, build_feature_vectorizer).types(NUMERIC),
    def_in(ML, "OneHotEncoder", 1, LATEST, build_one_hot_encoder).types(ONE_HOT_ENCODER_TYPES),
    def_in(ML, "TreeEnsembleRegressor", 1, LATEST, build_tree_regressor).types(TREE_INPUT_TYPES),
    def_in(
        ML,
        "TreeEnsembleClassifier",
        1,
        LATEST,
        build_tree_classifier,
    )
    .types(TREE_INPUT_TYPES),
    def_in(ML, "TreeEnsemble", 5, LATEST, build_tree_ensemble).types(FLOATS),
];

// ----------------------------------------------------------------------------- helpers

/// A numeric input read as an f32 matrix `[rows, cols]`: rank 0/1 is one row, rank 2 as is.
fn matrix(t: &Tensor, op: &str) -> Result<(usize, usize, Vec<f32>)> {
    let (n, c) = match *t.shape() {
        [] => (1, 1),
        [c] => (1, c),
        [n, c] => (n, c),
        _ => bail!(
            "{op}: input must have rank 1 or 2, has shape {:?}",
            t.shape()
        ),
    };
    numeric_only(t.dtype(), op)?;
    Ok((n, c, t.to_f32_vec()?))
}

fn numeric_only(dt: DataType, op: &str) -> Result<()> {
    match dt {
        DataType::Float
        | DataType::Double
        | DataType::Float16
        | DataType::Bfloat16
        | DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::Uint8
        | DataType::Uint16
        | DataType::Uint32
        | DataType::Uint64 => Ok(()),
        _ => Err(super::bad_type(op, dt)),
    }
}

fn floats_attr(node: &Node, name: &str) -> Result<Vec<f32>> {
    Ok(node.attr_floats(name)?.unwrap_or_default())
}

fn ints_attr(node: &Node, name: &str) -> Result<Vec<i64>> {
    Ok(node.attr_ints(name)?.unwrap_or_default())
}

fn strings_attr(node: &Node, name: &str) -> Result<Vec<String>> {
    Ok(node.attr_strings(name)?.unwrap_or_default())
}

/// The post-transform applied to scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Post {
    None,
    Softmax,
    Logistic,
    SoftmaxZero,
    Probit,
}

fn parse_post(node: &Node) -> Result<Post> {
    Ok(match node.get_s("post_transform", "NONE")?.as_str() {
        "NONE" => Post::None,
        "SOFTMAX" => Post::Softmax,
        "LOGISTIC" => Post::Logistic,
        "SOFTMAX_ZERO" => Post::SoftmaxZero,
        "PROBIT" => Post::Probit,
        other => unsupported!("post_transform '{other}' is not supported"),
    })
}

fn logistic(x: f32) -> f32 {
    let v = 1.0 / (1.0 + libm::expf(-x.abs()));
    if x < 0.0 {
        1.0 - v
    } else {
        v
    }
}

/// Inverse error function, by the closed-form approximation (a = 0.147) onnxruntime uses
/// (±1 map to ±inf, values outside [-1, 1] to NaN).
fn erf_inv(x: f32) -> f32 {
    let sgn = if x < 0.0 { -1.0 } else { 1.0 };
    let x = (1.0 - x) * (1.0 + x);
    let log = libm::logf(x);
    let v = 2.0 / (core::f32::consts::PI * 0.147) + 0.5 * log;
    let v2 = 1.0 / 0.147 * log;
    let v3 = -v + libm::sqrtf(v * v - v2);
    sgn * libm::sqrtf(v3)
}

fn probit(x: f32) -> f32 {
    core::f32::consts::SQRT_2 * erf_inv(2.0 * x - 1.0)
}

/// Applies a post-transform to one row of scores in place.
fn post_row(p: Post, row: &mut [f32]) {
    match p {
        Post::None => {}
        Post::Logistic => row.iter_mut().for_each(|v| *v = logistic(*v)),
        Post::Probit => row.iter_mut().for_each(|v| *v = probit(*v)),
        Post::Softmax => {
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut s = 0.0;
            for v in row.iter_mut() {
                *v = libm::expf(*v - m);
                s += *v;
            }
            row.iter_mut().for_each(|v| *v /= s);
        }
        Post::SoftmaxZero => {
            // zero scores stay (nearly) zero: they mark classes that got no vote
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let e = libm::expf(-m);
            let mut s = 0.0;
            for v in row.iter_mut() {
                if *v > 1e-7 || *v < -1e-7 {
                    *v = libm::expf(*v - m);
                } else {
                    *v *= e;
                }
                s += *v;
            }
            if s == 0.0 {
                row.iter_mut().for_each(|v| *v = 0.5);
            } else {
                row.iter_mut().for_each(|v| *v /= s);
            }
        }
    }
}

/// `scores[n×k] = x[n×c] · coef[k×c]^T + intercepts`.
fn linear(x: &[f32], n: usize, c: usize, coef: &[f32], icpt: &[f32], k: usize) -> Vec<f32> {
    let mut out = vec![0f32; n * k];
    for i in 0..n {
        let xr = &x[i * c..(i + 1) * c];
        for j in 0..k {
            let w = &coef[j * c..(j + 1) * c];
            let s: f32 = xr.iter().zip(w).map(|(a, b)| a * b).sum();
            out[i * k + j] = s + icpt.get(j).copied().unwrap_or(0.0);
        }
    }
    out
}

/// Class labels of a classifier: int64 or string.
#[derive(Clone, Debug)]
enum Labels {
    Ints(Vec<i64>),
    Strings(Vec<String>),
}

impl Labels {
    fn parse(node: &Node, ints: &str, strings: &str) -> Result<Option<Labels>> {
        let i = node.attr_ints(ints)?;
        let s = node.attr_strings(strings)?;
        Ok(match (i, s) {
            (Some(i), None) => Some(Labels::Ints(i)),
            (None, Some(s)) => Some(Labels::Strings(s)),
            (None, None) => None,
            (Some(i), Some(s)) if s.is_empty() => Some(Labels::Ints(i)),
            (Some(i), Some(s)) if i.is_empty() => Some(Labels::Strings(s)),
            _ => bail!("only one of {ints} and {strings} may be set"),
        })
    }
    fn len(&self) -> usize {
        match self {
            Labels::Ints(v) => v.len(),
            Labels::Strings(v) => v.len(),
        }
    }
    /// Labels tensor from class indices.
    fn pick(&self, idx: &[usize]) -> Result<Tensor> {
        match self {
            Labels::Ints(v) => Tensor::from_vec(&[idx.len()], idx.iter().map(|&i| v[i]).collect()),
            Labels::Strings(v) => Tensor::from_vec(
                &[idx.len()],
                idx.iter().map(|&i| v[i].clone()).collect::<Vec<String>>(),
            ),
        }
    }
}

/// Index of the first maximum of a row.
fn argmax(row: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in row.iter().enumerate() {
        if v > row[best] {
            best = i;
        }
    }
    best
}

// ----------------------------------------------------------------------------- linear models

fn build_linear_classifier(node: &Node) -> Result<Box<dyn Kernel>> {
    let coef = floats_attr(node, "coefficients")?;
    let icpt = floats_attr(node, "intercepts")?;
    let labels = Labels::parse(node, "classlabels_ints", "classlabels_strings")?;
    let post = parse_post(node)?;
    let n_labels = labels.as_ref().map_or(0, Labels::len);
    if coef.is_empty() {
        bail!("LinearClassifier needs coefficients");
    }
    // a single score column is the binary case: labels are [negative, positive]
    let binary = icpt.len() == 1;
    if binary && labels.is_some() && n_labels != 2 {
        bail!("LinearClassifier with one score column needs 2 class labels, has {n_labels}");
    }
    if !binary && labels.is_none() {
        bail!("LinearClassifier needs classlabels_ints or classlabels_strings");
    }
    if binary && labels.is_some() && post == Post::Probit {
        // onnxruntime leaves the second score column undefined here
        unsupported!("LinearClassifier: PROBIT on a binary classifier is not supported");
    }
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| {
            let (n, c, x) = matrix(tensor_in(inputs, 0)?, "LinearClassifier")?;
            // the class count comes from the intercepts when given; like onnxruntime, the
            // coefficients are then read as that many rows of `c` (extra values are unused)
            let k = if icpt.is_empty() {
                if c == 0 || coef.len() % c != 0 {
                    bail!(
                        "LinearClassifier: {} coefficients do not divide into rows of {c} features",
                        coef.len()
                    );
                }
                coef.len() / c
            } else {
                icpt.len()
            };
            if coef.len() < k * c {
                bail!(
                    "LinearClassifier: {} coefficients for {k} classes of {c} features",
                    coef.len()
                );
            }
            let mut raw = linear(&x, n, c, &coef, &icpt, k);
            if k == 1 {
                // label by the sign of the score; scores become [1 - p, p] (p after the
                // transform, except that SOFTMAX/SOFTMAX_ZERO leave a lone score unchanged)
                let y = match &labels {
                    Some(Labels::Ints(l)) => Tensor::from_vec(
                        &[n],
                        raw.iter()
                            .map(|&s| if s > 0.0 { l[1] } else { l[0] })
                            .collect(),
                    )?,
                    Some(Labels::Strings(l)) => Tensor::from_vec(
                        &[n],
                        raw.iter()
                            .map(|&s| l[usize::from(s > 0.0)].clone())
                            .collect::<Vec<String>>(),
                    )?,
                    None => {
                        Tensor::from_vec(&[n], raw.iter().map(|&s| i64::from(s > 0.0)).collect())?
                    }
                };
                let one = |s: f32| match post {
                    Post::Logistic => logistic(s),
                    Post::Probit => probit(s),
                    _ => s,
                };
                let z = if labels.is_some() {
                    let mut z = Vec::with_capacity(2 * n);
                    for s in raw {
                        let p = one(s);
                        z.push(1.0 - p);
                        z.push(p);
                    }
                    Tensor::from_vec(&[n, 2], z)?
                } else {
                    Tensor::from_vec(&[n, 1], raw.into_iter().map(one).collect())?
                };
                return Ok(vec![Value::Tensor(y), Value::Tensor(z)]);
            }
            let Some(labels) = &labels else {
                bail!("LinearClassifier needs class labels")
            };
            if n_labels != k {
                bail!("LinearClassifier: {n_labels} class labels for {k} classes");
            }
            // labels from the raw scores, then the transform
            let idx: Vec<usize> = raw.chunks_exact(k).map(argmax).collect();
            if post != Post::None {
                raw.chunks_exact_mut(k).for_each(|r| post_row(post, r));
            }
            Ok(vec![
                Value::Tensor(labels.pick(&idx)?),
                Value::Tensor(Tensor::from_vec(&[n, k], raw)?),
            ])
        },
    ))
}

fn build_linear_regressor(node: &Node) -> Result<Box<dyn Kernel>> {
    let coef = floats_attr(node, "coefficients")?;
    let icpt = floats_attr(node, "intercepts")?;
    let targets = node.get_i("targets", 1)?;
    if targets <= 0 {
        bail!("LinearRegressor: targets must be positive, is {targets}");
    }
    let k = targets as usize;
    let post = parse_post(node)?;
    if !icpt.is_empty() && icpt.len() != k {
        bail!("LinearRegressor: {} intercepts for {k} targets", icpt.len());
    }
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| {
            let (n, c, x) = matrix(tensor_in(inputs, 0)?, "LinearRegressor")?;
            if coef.len() != k * c {
                bail!(
                    "LinearRegressor: {} coefficients for {k} targets of {c} features",
                    coef.len()
                );
            }
            let mut y = linear(&x, n, c, &coef, &icpt, k);
            if post != Post::None {
                y.chunks_exact_mut(k).for_each(|r| post_row(post, r));
            }
            out1(Tensor::from_vec(&[n, k], y)?)
        },
    ))
}

// ----------------------------------------------------------------------------- preprocessing

fn build_normalizer(node: &Node) -> Result<Box<dyn Kernel>> {
    #[derive(Clone, Copy)]
    enum Norm {
        Max,
        L1,
        L2,
    }
    let norm = match node.get_s("norm", "MAX")?.as_str() {
        "MAX" => Norm::Max,
        "L1" => Norm::L1,
        "L2" => Norm::L2,
        other => unsupported!("norm '{other}' is not supported"),
    };
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| {
            let t = tensor_in(inputs, 0)?;
            let (n, c, mut x) = matrix(t, "Normalizer")?;
            for row in x.chunks_exact_mut(c.max(1)) {
                let d = match norm {
                    Norm::Max => row.iter().copied().fold(f32::NEG_INFINITY, f32::max),
                    Norm::L1 => row.iter().map(|v| v.abs()).sum(),
                    Norm::L2 => libm::sqrtf(row.iter().map(|v| v * v).sum()),
                };
                if d != 0.0 {
                    row.iter_mut().for_each(|v| *v /= d);
                }
            }
            let shape: Vec<usize> = if t.rank() == 2 { vec![n, c] } else { vec![c] };
            out1(Tensor::from_vec(&shape, x)?)
        },
    ))
}

fn build_zipmap(node: &Node) -> Result<Box<dyn Kernel>> {
    let labels = match Labels::parse(node, "classlabels_int64s", "classlabels_strings")? {
        Some(l) => l,
        None => bail!("ZipMap needs classlabels_int64s or classlabels_strings"),
    };
    // keys in ascending order, as onnxruntime's maps come out; a repeated label keeps the
    // column that comes last
    let n_labels = labels.len();
    let mut order: Vec<usize> = (0..n_labels).collect();
    let keys = match &labels {
        Labels::Ints(v) => {
            order.sort_by(|&a, &b| v[a].cmp(&v[b]).then(b.cmp(&a)));
            order.dedup_by(|a, b| v[*a] == v[*b]);
            Tensor::from_vec(&[order.len()], order.iter().map(|&i| v[i]).collect())?
        }
        Labels::Strings(v) => {
            order.sort_by(|&a, &b| v[a].cmp(&v[b]).then(b.cmp(&a)));
            order.dedup_by(|a, b| v[*a] == v[*b]);
            Tensor::from_vec(
                &[order.len()],
                order.iter().map(|&i| v[i].clone()).collect::<Vec<String>>(),
            )?
        }
    };
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| {
            let t = tensor_in(inputs, 0)?;
            if t.dtype() != DataType::Float {
                return Err(super::bad_type("ZipMap", t.dtype()));
            }
            let (_, c, x) = matrix(t, "ZipMap")?;
            if c != n_labels {
                bail!("ZipMap: {n_labels} labels for {c} columns");
            }
            let items = if c == 0 {
                Vec::new()
            } else {
                x.chunks_exact(c)
                    .map(|row| {
                        Value::Map(MapValue {
                            keys: keys.clone(),
                            values: order
                                .iter()
                                .map(|&j| Value::Tensor(Tensor::scalar(row[j])))
                                .collect(),
                        })
                    })
                    .collect()
            };
            Ok(vec![Value::Sequence {
                elem: TypeInfo::Map {
                    key: keys.dtype(),
                    value: Box::new(TypeInfo::tensor(DataType::Float, Vec::new())),
                },
                items,
            }])
        },
    ))
}

/// Per-column parameters given as one value (broadcast) or one per column.
fn per_col(v: &[f32], c: usize, what: &str) -> Result<Vec<f32>> {
    match v.len() {
        1 => Ok(vec![v[0]; c]),
        l if l == c => Ok(v.to_vec()),
        l => bail!("{what} has {l} values for {c} columns"),
    }
}

fn build_scaler(node: &Node) -> Result<Box<dyn Kernel>> {
    let offset = floats_attr(node, "offset")?;
    let scale = floats_attr(node, "scale")?;
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| {
            let t = tensor_in(inputs, 0)?;
            numeric_only(t.dtype(), "Scaler")?;
            let c = t.shape().last().copied().unwrap_or(1);
            let off = if offset.is_empty() {
                vec![0.0; c]
            } else {
                per_col(&offset, c, "Scaler offset")?
            };
            let sc = if scale.is_empty() {
                vec![1.0; c]
            } else {
                per_col(&scale, c, "Scaler scale")?
            };
            let mut x = t.to_f32_vec()?;
            for (i, v) in x.iter_mut().enumerate() {
                let j = i % c.max(1);
                *v = (*v - off[j]) * sc[j];
            }
            out1(Tensor::from_vec(t.shape(), x)?)
        },
    ))
}

fn build_binarizer(node: &Node) -> Result<Box<dyn Kernel>> {
    let th = node.get_f("threshold", 0.0)? as f64;
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| {
            let t = tensor_in(inputs, 0)?;
            crate::dispatch_float!(t.dtype(), T => {
                let v: Vec<T> = t
                    .as_slice::<T>()?
                    .iter()
                    .map(|&x| {
                        let one = if super::Float::to_f64(x) > th { 1.0 } else { 0.0 };
                        <T as super::Float>::from_f64(one)
                    })
                    .collect();
                out1(Tensor::from_vec(t.shape(), v)?)
            }, else Err(super::bad_type("Binarizer", t.dtype())))
        },
    ))
}

fn build_imputer(node: &Node) -> Result<Box<dyn Kernel>> {
    let vf = floats_attr(node, "imputed_value_floats")?;
    let vi = ints_attr(node, "imputed_value_int64s")?;
    let rf = node.get_f("replaced_value_float", 0.0)?;
    let ri = node.get_i("replaced_value_int64", 0)?;
    if vf.is_empty() && vi.is_empty() {
        bail!("Imputer needs imputed_value_floats or imputed_value_int64s");
    }
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| {
            let t = tensor_in(inputs, 0)?;
            let c = t.shape().last().copied().unwrap_or(1).max(1);
            let pick = |n: usize, i: usize| if n == 1 { 0 } else { i % c };
            match t.dtype() {
                DataType::Float | DataType::Double => {
                    if vf.len() != 1 && vf.len() != c {
                        bail!("Imputer: {} imputed floats for {c} columns", vf.len());
                    }
                    crate::dispatch_float!(t.dtype(), T => {
                        let x = t.as_slice::<T>()?;
                        let v: Vec<T> = x
                            .iter()
                            .enumerate()
                            .map(|(i, &e)| {
                                let f = super::Float::to_f32(e);
                                let hit = if rf.is_nan() { f.is_nan() } else { f == rf };
                                if hit {
                                    <T as super::Float>::from_f32(vf[pick(vf.len(), i)])
                                } else {
                                    e
                                }
                            })
                            .collect();
                        out1(Tensor::from_vec(t.shape(), v)?)
                    }, else unreachable!())
                }
                DataType::Int64 | DataType::Int32 => {
                    if vi.len() != 1 && vi.len() != c {
                        bail!("Imputer: {} imputed int64s for {c} columns", vi.len());
                    }
                    let x = t.to_i64_vec()?;
                    let v: Vec<i64> = x
                        .iter()
                        .enumerate()
                        .map(|(i, &e)| if e == ri { vi[pick(vi.len(), i)] } else { e })
                        .collect();
                    if t.dtype() == DataType::Int64 {
                        out1(Tensor::from_vec(t.shape(), v)?)
                    } else {
                        out1(Tensor::from_vec(
                            t.shape(),
                            v.into_iter().map(|e| e as i32).collect::<Vec<i32>>(),
                        )?)
                    }
                }
                dt => Err(super::bad_type("Imputer", dt)),
            }
        },
    ))
}

// ----------------------------------------------------------------------------- LabelEncoder

/// A lookup key: strings, integers (any width) or floats (-0 matches 0; NaN matches nothing,
/// as in onnxruntime).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Key {
    S(String),
    I(i64),
    F(u64),
    Nan,
}

fn float_key(v: f64) -> Key {
    if v.is_nan() {
        Key::Nan
    } else if v == 0.0 {
        Key::F(0)
    } else {
        Key::F(v.to_bits())
    }
}

/// The keys of a tensor's elements, by its element type.
fn keys_of(t: &Tensor) -> Result<Vec<Key>> {
    Ok(match t.dtype() {
        DataType::String => t
            .as_slice::<String>()?
            .iter()
            .cloned()
            .map(Key::S)
            .collect(),
        DataType::Float => t
            .as_slice::<f32>()?
            .iter()
            .map(|&v| float_key(v as f64))
            .collect(),
        DataType::Double => t.as_slice::<f64>()?.iter().map(|&v| float_key(v)).collect(),
        DataType::Int8
        | DataType::Int16
        | DataType::Int32
        | DataType::Int64
        | DataType::Uint8
        | DataType::Uint16
        | DataType::Uint32
        | DataType::Uint64 => t.to_i64_vec()?.into_iter().map(Key::I).collect(),
        dt => return Err(super::bad_type("LabelEncoder", dt)),
    })
}

/// Whether a key tensor type and an input type are the same kind.
fn key_kind(dt: DataType) -> u8 {
    match dt {
        DataType::String => 0,
        DataType::Float | DataType::Double => 2,
        _ => 1,
    }
}

/// A mapping from keys to positions in a value tensor, with a default value.
struct Encoder {
    key_dtype: DataType,
    map: HashMap<Key, usize>,
    values: Tensor,
    default: Tensor,
}

impl Encoder {
    fn new(keys: Tensor, values: Tensor, default: Tensor) -> Result<Encoder> {
        if keys.len() != values.len() {
            bail!(
                "LabelEncoder has {} keys but {} values",
                keys.len(),
                values.len()
            );
        }
        if default.len() != 1 || default.dtype() != values.dtype() {
            bail!("LabelEncoder default must be one value of the values' type");
        }
        let mut map = HashMap::new();
        for (i, k) in keys_of(&keys)?.into_iter().enumerate() {
            if k != Key::Nan {
                map.entry(k).or_insert(i);
            }
        }
        Ok(Encoder {
            key_dtype: keys.dtype(),
            map,
            values: values.reshape(&[values.len()])?,
            default: default.reshape(&[1])?,
        })
    }

    fn apply(&self, x: &Tensor) -> Result<Tensor> {
        if key_kind(x.dtype()) != key_kind(self.key_dtype) {
            bail!(
                "LabelEncoder keys are {} but the input is {}",
                self.key_dtype,
                x.dtype()
            );
        }
        let idx: Vec<Option<usize>> = keys_of(x)?
            .iter()
            .map(|k| self.map.get(k).copied())
            .collect();
        crate::dispatch_any!(self.values.dtype(), T => {
            let vals = self.values.as_slice::<T>()?;
            let d = &self.default.as_slice::<T>()?[0];
            Tensor::from_vec(x.shape(), pick_or(&vals, &idx, d))
        }, else Err(super::bad_type("LabelEncoder", self.values.dtype())))
    }
}

/// `vals[i]` for each `Some(i)`, `d` for each `None`.
fn pick_or<T: Clone>(vals: &[T], idx: &[Option<usize>], d: &T) -> Vec<T> {
    idx.iter()
        .map(|i| match i {
            Some(i) => vals[*i].clone(),
            None => d.clone(),
        })
        .collect()
}

/// Columns `idx` of each row of a row-major `[rows, c]` array.
fn gather_cols<T: Clone>(xs: &[T], rows: usize, c: usize, idx: &[i64]) -> Vec<T> {
    let mut v = Vec::with_capacity(rows * idx.len());
    for r in 0..rows {
        for &i in idx {
            v.push(xs[r * c + i as usize].clone());
        }
    }
    v
}

fn str_tensor(v: Vec<String>) -> Result<Tensor> {
    Tensor::from_vec(&[v.len()], v)
}

/// LabelEncoder-1: `classes_strings` maps strings to their index, or indices to strings.
fn build_label_encoder1(node: &Node) -> Result<Box<dyn Kernel>> {
    let classes = strings_attr(node, "classes_strings")?;
    let n = classes.len();
    let idx: Vec<i64> = (0..n as i64).collect();
    let to_int = Encoder::new(
        str_tensor(classes.clone())?,
        Tensor::from_vec(&[n], idx.clone())?,
        Tensor::scalar(node.get_i("default_int64", -1)?),
    )?;
    let to_str = Encoder::new(
        Tensor::from_vec(&[n], idx)?,
        str_tensor(classes)?,
        Tensor::scalar(node.get_s("default_string", "_Unused")?),
    )?;
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| {
            let x = tensor_in(inputs, 0)?;
            match x.dtype() {
                DataType::String => out1(to_int.apply(x)?),
                DataType::Int64 => out1(to_str.apply(x)?),
                dt => Err(super::bad_type("LabelEncoder", dt)),
            }
        },
    ))
}

/// LabelEncoder-2/4: keys and values as typed lists or (opset 4) tensors.
fn build_label_encoder(node: &Node) -> Result<Box<dyn Kernel>> {
    let mut keys: Vec<Tensor> = Vec::new();
    let ks = strings_attr(node, "keys_strings")?;
    if !ks.is_empty() {
        keys.push(str_tensor(ks)?);
    }
    let ki = ints_attr(node, "keys_int64s")?;
    if !ki.is_empty() {
        keys.push(Tensor::from_vec(&[ki.len()], ki)?);
    }
    let kf = floats_attr(node, "keys_floats")?;
    if !kf.is_empty() {
        keys.push(Tensor::from_vec(&[kf.len()], kf)?);
    }
    if let Some(t) = node.attr_t("keys_tensor")? {
        keys.push(t.clone());
    }
    let mut values: Vec<Tensor> = Vec::new();
    let vs = strings_attr(node, "values_strings")?;
    if !vs.is_empty() {
        values.push(str_tensor(vs)?);
    }
    let vi = ints_attr(node, "values_int64s")?;
    if !vi.is_empty() {
        values.push(Tensor::from_vec(&[vi.len()], vi)?);
    }
    let vf = floats_attr(node, "values_floats")?;
    if !vf.is_empty() {
        values.push(Tensor::from_vec(&[vf.len()], vf)?);
    }
    if let Some(t) = node.attr_t("values_tensor")? {
        values.push(t.clone());
    }
    if keys.len() != 1 || values.len() != 1 {
        bail!("LabelEncoder needs exactly one keys_* and one values_* attribute");
    }
    let (keys, values) = (keys.remove(0), values.remove(0));
    // `Encoder::apply` copies values out through `dispatch_any!`
    if !PLAIN.contains(&values.dtype()) {
        unsupported!(
            "LabelEncoder values of type {} are not supported",
            values.dtype()
        );
    }
    let default = match node.attr_t("default_tensor")? {
        Some(t) => t.clone(),
        None => match values.dtype() {
            DataType::String => Tensor::scalar(node.get_s("default_string", "_Unused")?),
            DataType::Int64 => Tensor::scalar(node.get_i("default_int64", -1)?),
            DataType::Float => Tensor::scalar(node.get_f("default_float", -0.0)?),
            DataType::Double => Tensor::scalar(node.get_f("default_float", -0.0)? as f64),
            DataType::Int32 => Tensor::scalar(node.get_i("default_int64", -1)? as i32),
            DataType::Int16 => Tensor::scalar(node.get_i("default_int64", -1)? as i16),
            dt => unsupported!("LabelEncoder values of type {dt} need a default_tensor"),
        },
    };
    let enc = Encoder::new(keys, values, default)?;
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| {
            out1(enc.apply(tensor_in(inputs, 0)?)?)
        },
    ))
}

// ----------------------------------------------------------------------------- feature ops

fn build_array_feature_extractor(_node: &Node) -> Result<Box<dyn Kernel>> {
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| {
            let x = tensor_in(inputs, 0)?;
            let idx = tensor_in(inputs, 1)?.to_i64_vec()?;
            let shape = x.shape();
            let c = shape.last().copied().unwrap_or(1);
            let rows = x.len().checked_div(c).unwrap_or(0);
            for &i in &idx {
                if i < 0 || i as usize >= c {
                    bail!("ArrayFeatureExtractor: index {i} is out of range for {c} columns");
                }
            }
            let out_shape: Vec<usize> = if shape.len() <= 1 {
                vec![1, idx.len()]
            } else {
                let mut s = shape[..shape.len() - 1].to_vec();
                s.push(idx.len());
                s
            };
            crate::dispatch_any!(x.dtype(), T => {
                let xs = x.as_slice::<T>()?;
                out1(Tensor::from_vec(&out_shape, gather_cols(&xs, rows, c, &idx))?)
            }, else Err(super::bad_type("ArrayFeatureExtractor", x.dtype())))
        },
    ))
}

fn build_feature_vectorizer(node: &Node) -> Result<Box<dyn Kernel>> {
    let dims = ints_attr(node, "inputdimensions")?;
    let dims = super::dims_of(&dims)?;
    let total: usize = dims.iter().sum();
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| {
            if inputs.len() != dims.len() {
                bail!(
                    "FeatureVectorizer: {} inputs but {} inputdimensions",
                    inputs.len(),
                    dims.len()
                );
            }
            let mut parts = Vec::with_capacity(dims.len());
            let mut rows = None;
            let mut lead: Vec<usize> = Vec::new();
            for i in 0..inputs.len() {
                let t = tensor_in(inputs, i)?;
                numeric_only(t.dtype(), "FeatureVectorizer")?;
                let c = t.shape().last().copied().unwrap_or(1);
                let n = t.len().checked_div(c).unwrap_or(0);
                match rows {
                    None => {
                        rows = Some(n);
                        lead = t.shape()[..t.rank().saturating_sub(1)].to_vec();
                    }
                    Some(r) if r != n => {
                        bail!("FeatureVectorizer: inputs have different numbers of rows")
                    }
                    _ => {}
                }
                parts.push((c, t.to_f32_vec()?));
            }
            let n = rows.unwrap_or(0);
            let mut out = vec![0f32; n * total];
            let mut off = 0;
            for ((c, v), &d) in parts.iter().zip(&dims) {
                for r in 0..n {
                    for j in 0..d.min(*c) {
                        out[r * total + off + j] = v[r * c + j];
                    }
                }
                off += d;
            }
            if lead.is_empty() {
                lead.push(1);
            }
            lead.push(total);
            out1(Tensor::from_vec(&lead, out)?)
        },
    ))
}

fn build_one_hot_encoder(node: &Node) -> Result<Box<dyn Kernel>> {
    let ci = ints_attr(node, "cats_int64s")?;
    let cs = strings_attr(node, "cats_strings")?;
    let zeros = node.get_i("zeros", 1)? != 0;
    let (map, n_cats) = if !ci.is_empty() {
        let mut m = HashMap::new();
        for (i, &v) in ci.iter().enumerate() {
            m.entry(Key::I(v)).or_insert(i);
        }
        (m, ci.len())
    } else if !cs.is_empty() {
        let mut m = HashMap::new();
        for (i, v) in cs.iter().enumerate() {
            m.entry(Key::S(v.clone())).or_insert(i);
        }
        (m, cs.len())
    } else {
        bail!("OneHotEncoder needs cats_int64s or cats_strings");
    };
    let strings = ci.is_empty();
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| {
            let x = tensor_in(inputs, 0)?;
            let keys: Vec<Key> = match (x.dtype(), strings) {
                (DataType::String, true) => keys_of(x)?,
                (DataType::String, false) | (_, true) => {
                    bail!(
                        "OneHotEncoder: input type {} does not match the categories",
                        x.dtype()
                    )
                }
                (dt, false) => {
                    numeric_only(dt, "OneHotEncoder")?;
                    // floats are compared as integers, as onnxruntime does
                    x.to_i64_vec()?.into_iter().map(Key::I).collect()
                }
            };
            let mut out = vec![0f32; keys.len() * n_cats];
            for (i, k) in keys.iter().enumerate() {
                match map.get(k) {
                    Some(&j) => out[i * n_cats + j] = 1.0,
                    None if !zeros => bail!("OneHotEncoder: a value is not among the categories"),
                    None => {}
                }
            }
            let mut shape = x.shape().to_vec();
            shape.push(n_cats);
            out1(Tensor::from_vec(&shape, out)?)
        },
    ))
}

// ----------------------------------------------------------------------------- tree ensembles

/// A branch comparison `x CMP value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cmp {
    Leq,
    Lt,
    Gte,
    Gt,
    Eq,
    Neq,
    Member,
}

/// Where a branch leads.
#[derive(Clone, Copy, Debug)]
enum Next {
    Node(usize),
    Leaf(usize),
}

#[derive(Clone, Debug)]
struct Split {
    feature: usize,
    cmp: Cmp,
    value: f64,
    /// For `Member`: the range of `Forest::members` holding the set.
    set: (usize, usize),
    missing_true: bool,
    t: Next,
    f: Next,
}

/// Trees over a shared node table; each leaf carries `(target, weight)` pairs.
#[derive(Clone, Debug, Default)]
struct Forest {
    splits: Vec<Split>,
    roots: Vec<Next>,
    leaves: Vec<Vec<(usize, f64)>>,
    members: Vec<f64>,
    n_features: usize,
}

impl Forest {
    fn leaf(&self, root: Next, x: &[f64]) -> Result<usize> {
        let mut cur = root;
        // a well-formed tree reaches a leaf in at most as many steps as it has nodes
        for _ in 0..=self.splits.len() {
            match cur {
                Next::Leaf(l) => return Ok(l),
                Next::Node(i) => {
                    let s = &self.splits[i];
                    let v = x[s.feature];
                    let hit = match s.cmp {
                        Cmp::Leq => v <= s.value,
                        Cmp::Lt => v < s.value,
                        Cmp::Gte => v >= s.value,
                        Cmp::Gt => v > s.value,
                        Cmp::Eq => v == s.value,
                        Cmp::Neq => v != s.value,
                        Cmp::Member => self.members[s.set.0..s.set.1].contains(&v),
                    } || (s.missing_true && v.is_nan());
                    cur = if hit { s.t } else { s.f };
                }
            }
        }
        bail!("tree ensemble has a cycle")
    }

    fn check(&self, n_targets: usize) -> Result<()> {
        let ok = |n: Next| match n {
            Next::Node(i) => i < self.splits.len(),
            Next::Leaf(l) => l < self.leaves.len(),
        };
        for s in &self.splits {
            if !ok(s.t) || !ok(s.f) {
                bail!("tree ensemble node points outside the tree");
            }
        }
        if !self.roots.iter().all(|&r| ok(r)) {
            bail!("tree ensemble root is out of range");
        }
        if self.leaves.iter().flatten().any(|&(t, _)| t >= n_targets) {
            bail!("tree ensemble leaf targets a class or target out of range");
        }
        Ok(())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Agg {
    Sum,
    Average,
    Min,
    Max,
}

/// Per-target scores of one sample before finalization, with whether any leaf hit the target.
fn accumulate(f: &Forest, x: &[f64], n_targets: usize, agg: Agg) -> Result<(Vec<f64>, Vec<bool>)> {
    let mut score = vec![0f64; n_targets];
    let mut has = vec![false; n_targets];
    for &r in &f.roots {
        let l = f.leaf(r, x)?;
        for &(t, w) in &f.leaves[l] {
            score[t] = match agg {
                Agg::Sum | Agg::Average => score[t] + w,
                Agg::Min if has[t] => score[t].min(w),
                Agg::Max if has[t] => score[t].max(w),
                _ => w,
            };
            has[t] = true;
        }
    }
    Ok((score, has))
}

/// The input rows as f64, checking that every split's feature exists.
fn tree_input(t: &Tensor, f: &Forest, op: &str) -> Result<(usize, usize, Vec<f64>)> {
    let (n, c) = match *t.shape() {
        [c] => (1, c),
        [n, c] => (n, c),
        _ => bail!(
            "{op}: input must have rank 1 or 2, has shape {:?}",
            t.shape()
        ),
    };
    if c < f.n_features {
        bail!(
            "{op}: splits use feature {} but the input has {c}",
            f.n_features - 1
        );
    }
    let x: Vec<f64> = match t.dtype() {
        DataType::Double => t.as_slice::<f64>()?.into_owned(),
        DataType::Int32 | DataType::Int64 => {
            t.to_i64_vec()?.into_iter().map(|v| v as f64).collect()
        }
        DataType::Float | DataType::Float16 | DataType::Bfloat16 => {
            t.to_f32_vec()?.into_iter().map(f64::from).collect()
        }
        dt => return Err(super::bad_type(op, dt)),
    };
    Ok((n, c, x))
}

/// Regression finalization as onnxruntime does it: a single target gets `base_values[0]` and
/// only PROBIT; several targets get per-target base values and the full post-transform, and
/// read as 0 when no leaf reached them.
fn finalize_regression(
    (mut score, has): (Vec<f64>, Vec<bool>),
    agg: Agg,
    n_trees: usize,
    base: &[f64],
    post: Post,
) -> Vec<f64> {
    let k = score.len();
    if k == 1 {
        let origin = if base.len() == 1 { base[0] } else { 0.0 };
        let s = match agg {
            Agg::Sum => score[0] + origin,
            Agg::Average => score[0] / n_trees as f64 + origin,
            Agg::Min | Agg::Max => {
                if has[0] {
                    score[0] + origin
                } else {
                    origin
                }
            }
        };
        return vec![if post == Post::Probit {
            f64::from(probit(s as f32))
        } else {
            s
        }];
    }
    // a target no leaf reached reads as 0 (onnxruntime's scores carry a "has score" flag)
    let use_base = base.len() == k;
    for j in 0..k {
        let b = if use_base { base[j] } else { 0.0 };
        score[j] = if !has[j] {
            0.0
        } else if agg == Agg::Average {
            score[j] / n_trees as f64 + b
        } else {
            score[j] + b
        };
    }
    if post == Post::None {
        return score;
    }
    let mut row: Vec<f32> = score.into_iter().map(|v| v as f32).collect();
    post_row(post, &mut row);
    row.into_iter().map(f64::from).collect()
}

fn parse_agg(s: &str) -> Result<Agg> {
    Ok(match s {
        "SUM" => Agg::Sum,
        "AVERAGE" => Agg::Average,
        "MIN" => Agg::Min,
        "MAX" => Agg::Max,
        other => unsupported!("aggregate_function '{other}' is not supported"),
    })
}

/// A float list attribute, or its `*_as_tensor` variant (opset 3).
fn floats_or_tensor(node: &Node, name: &str) -> Result<Vec<f64>> {
    let t_name = alloc::format!("{name}_as_tensor");
    match node.attr_t(&t_name)? {
        Some(t) => Ok(match t.dtype() {
            DataType::Double => t.as_slice::<f64>()?.into_owned(),
            _ => t.to_f32_vec()?.into_iter().map(f64::from).collect(),
        }),
        None => Ok(floats_attr(node, name)?
            .into_iter()
            .map(f64::from)
            .collect()),
    }
}

/// Builds the forest of TreeEnsembleRegressor/Classifier (opsets 1 and 3): nodes keyed by
/// (tree id, node id), leaves by mode LEAF, leaf weights from the `prefix`_* attributes.
fn forest_v1(node: &Node, prefix: &str) -> Result<Forest> {
    let tree = ints_attr(node, "nodes_treeids")?;
    let ids = ints_attr(node, "nodes_nodeids")?;
    let feat = ints_attr(node, "nodes_featureids")?;
    let vals = floats_or_tensor(node, "nodes_values")?;
    let modes = strings_attr(node, "nodes_modes")?;
    let tids = ints_attr(node, "nodes_truenodeids")?;
    let fids = ints_attr(node, "nodes_falsenodeids")?;
    let miss = ints_attr(node, "nodes_missing_value_tracks_true")?;
    let n = tree.len();
    if [ids.len(), feat.len(), modes.len(), tids.len(), fids.len()]
        .iter()
        .any(|&l| l != n)
        || (vals.len() != n && !vals.is_empty())
        || (!miss.is_empty() && miss.len() != n)
    {
        bail!("tree ensemble nodes_* attributes have different lengths");
    }
    let mut index: HashMap<(i64, i64), usize> = HashMap::new();
    for i in 0..n {
        if index.insert((tree[i], ids[i]), i).is_some() {
            bail!(
                "tree ensemble node ({}, {}) is defined twice",
                tree[i],
                ids[i]
            );
        }
    }
    // node i -> split index or leaf index
    let mut slot = vec![Next::Leaf(0); n];
    let (mut n_splits, mut n_leaves) = (0, 0);
    let mut cmps = Vec::with_capacity(n);
    for i in 0..n {
        let cmp = match modes[i].as_str() {
            "LEAF" => None,
            "BRANCH_LEQ" => Some(Cmp::Leq),
            "BRANCH_LT" => Some(Cmp::Lt),
            "BRANCH_GTE" => Some(Cmp::Gte),
            "BRANCH_GT" => Some(Cmp::Gt),
            "BRANCH_EQ" => Some(Cmp::Eq),
            "BRANCH_NEQ" => Some(Cmp::Neq),
            other => unsupported!("tree node mode '{other}' is not supported"),
        };
        slot[i] = if cmp.is_some() {
            n_splits += 1;
            Next::Node(n_splits - 1)
        } else {
            n_leaves += 1;
            Next::Leaf(n_leaves - 1)
        };
        cmps.push(cmp);
    }
    let child = |t: i64, id: i64| -> Result<Next> {
        match index.get(&(t, id)) {
            Some(&j) => Ok(slot[j]),
            None => bail!("tree ensemble node ({t}, {id}) is referenced but not defined"),
        }
    };
    let mut f = Forest::default();
    let mut referenced = vec![false; n];
    for i in 0..n {
        let Some(cmp) = cmps[i] else { continue };
        let fe = usize::try_from(feat[i])
            .map_err(|_| crate::Error::Other(alloc::format!("negative feature id {}", feat[i])))?;
        f.n_features = f.n_features.max(fe + 1);
        let (t, fl) = (child(tree[i], tids[i])?, child(tree[i], fids[i])?);
        referenced[index[&(tree[i], tids[i])]] = true;
        referenced[index[&(tree[i], fids[i])]] = true;
        f.splits.push(Split {
            feature: fe,
            cmp,
            value: vals.get(i).copied().unwrap_or(0.0),
            set: (0, 0),
            missing_true: miss.get(i).is_some_and(|&m| m != 0),
            t,
            f: fl,
        });
    }
    // roots: per tree (in order of first appearance), the node no other node points to
    let mut seen: Vec<i64> = Vec::new();
    for i in 0..n {
        if seen.contains(&tree[i]) {
            continue;
        }
        seen.push(tree[i]);
        let roots: Vec<usize> = (0..n)
            .filter(|&j| tree[j] == tree[i] && !referenced[j])
            .collect();
        if roots.len() != 1 {
            bail!("tree {} of the ensemble has {} roots", tree[i], roots.len());
        }
        f.roots.push(slot[roots[0]]);
    }
    // leaf weights
    let wt = ints_attr(node, &alloc::format!("{prefix}_treeids"))?;
    let wn = ints_attr(node, &alloc::format!("{prefix}_nodeids"))?;
    let wi = ints_attr(node, &alloc::format!("{prefix}_ids"))?;
    let ww = floats_or_tensor(node, &alloc::format!("{prefix}_weights"))?;
    if wn.len() != wt.len() || wi.len() != wt.len() || ww.len() != wt.len() {
        bail!("tree ensemble {prefix}_* attributes have different lengths");
    }
    f.leaves = vec![Vec::new(); n_leaves];
    for k in 0..wt.len() {
        let Next::Leaf(l) = child(wt[k], wn[k])? else {
            bail!("tree ensemble weight is attached to a branch node");
        };
        let target = usize::try_from(wi[k])
            .map_err(|_| crate::Error::Other(alloc::format!("negative target id {}", wi[k])))?;
        f.leaves[l].push((target, ww[k]));
    }
    Ok(f)
}

fn build_tree_regressor(node: &Node) -> Result<Box<dyn Kernel>> {
    let f = forest_v1(node, "target")?;
    let n_targets = node.get_i("n_targets", 1)?;
    if n_targets <= 0 {
        bail!("n_targets must be positive, is {n_targets}");
    }
    let k = n_targets as usize;
    f.check(k)?;
    let agg = parse_agg(&node.get_s("aggregate_function", "SUM")?)?;
    let post = parse_post(node)?;
    let base = floats_or_tensor(node, "base_values")?;
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| {
            let (n, c, x) = tree_input(tensor_in(inputs, 0)?, &f, "TreeEnsembleRegressor")?;
            let mut out = Vec::with_capacity(n * k);
            for r in 0..n {
                let acc = accumulate(&f, &x[r * c..(r + 1) * c], k, agg)?;
                out.extend(
                    finalize_regression(acc, agg, f.roots.len(), &base, post)
                        .into_iter()
                        .map(|v| v as f32),
                );
            }
            out1(Tensor::from_vec(&[n, k], out)?)
        },
    ))
}

fn build_tree_classifier(node: &Node) -> Result<Box<dyn Kernel>> {
    let f = forest_v1(node, "class")?;
    let labels = match Labels::parse(node, "classlabels_int64s", "classlabels_strings")? {
        Some(l) if l.len() >= 2 => l,
        _ => unsupported!("TreeEnsembleClassifier needs at least 2 class labels"),
    };
    let k = labels.len();
    f.check(k)?;
    let post = parse_post(node)?;
    let base = floats_or_tensor(node, "base_values")?;
    let class_ids: Vec<usize> = f.leaves.iter().flatten().map(|&(t, _)| t).collect();
    let binary_case = k == 2 && {
        let mut c = class_ids.clone();
        c.sort_unstable();
        c.dedup();
        c.len() == 1
    };
    let all_positive = f.leaves.iter().flatten().all(|&(_, w)| w >= 0.0);
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| {
            let (n, c, x) = tree_input(tensor_in(inputs, 0)?, &f, "TreeEnsembleClassifier")?;
            let mut z = Vec::with_capacity(n * k);
            let mut idx = Vec::with_capacity(n);
            for r in 0..n {
                let (s, h) = accumulate(&f, &x[r * c..(r + 1) * c], k, Agg::Sum)?;
                let (label, row) = classify(s, h, &base, post, binary_case, all_positive)?;
                idx.push(label);
                z.extend(row);
            }
            let y = match (&labels, binary_case || k > 2) {
                (Labels::Ints(_), false) => {
                    // onnxruntime labels this binary case 1/0, not by the class labels
                    Tensor::from_vec(&[n], idx.iter().map(|&i| i as i64).collect())?
                }
                _ => labels.pick(&idx)?,
            };
            Ok(vec![
                Value::Tensor(y),
                Value::Tensor(Tensor::from_vec(&[n, k], z)?),
            ])
        },
    ))
}

/// Class index and score row of one sample, following onnxruntime's classifier aggregator.
fn classify(
    mut s: Vec<f64>,
    mut h: Vec<bool>,
    base: &[f64],
    post: Post,
    binary_case: bool,
    all_positive: bool,
) -> Result<(usize, Vec<f32>)> {
    let k = s.len();
    if k > 2 {
        for (j, &b) in base.iter().enumerate().take(k) {
            if h[j] {
                s[j] += b;
            } else {
                s[j] = b;
                h[j] = true;
            }
        }
        let mut best: Option<usize> = None;
        for j in 0..k {
            if h[j] && best.is_none_or(|b| s[j] > s[b]) {
                best = Some(j);
            }
        }
        let Some(best) = best else {
            bail!("TreeEnsembleClassifier: no class received a score");
        };
        let mut row: Vec<f32> = s.iter().map(|&v| v as f32).collect();
        post_row(post, &mut row);
        return Ok((best, row));
    }
    // two classes
    let mut extra: i32 = -1;
    let mut len = 2;
    match base.len() {
        2 => {
            if h[1] {
                // onnxruntime adds base_values[1] to the first class's score here
                let v = base[1] + s[0];
                s[1] = v;
                s[0] = -v;
            } else {
                s[1] += base[1];
                s[0] += base[0];
            }
        }
        1 => {
            s[0] += base[0];
            if !h[1] {
                len = 1;
            }
        }
        0 => {
            extra = 3;
            if !h[1] {
                len = 1;
            }
        }
        _ => {}
    }
    let pos = if len == 2 && h[1] {
        s[1]
    } else if h[0] {
        s[0]
    } else {
        0.0
    };
    let label = if binary_case {
        if all_positive {
            extra = if pos > 0.5 { 0 } else { 1 };
            usize::from(pos > 0.5)
        } else {
            extra = if pos > 0.0 { 2 } else { 3 };
            usize::from(pos > 0.0)
        }
    } else {
        usize::from(pos > 0.0)
    };
    // as in onnxruntime, a class without a score reads as 0 (even where a base value was added)
    let val = |j: usize| if h[j] { s[j] as f32 } else { 0.0 };
    let row = if len == 2 {
        let mut row = vec![val(0), val(1)];
        post_row(post, &mut row);
        row
    } else {
        let v = val(0);
        match (post, extra) {
            (Post::Probit, _) | (_, -1) => {
                unsupported!(
                    "TreeEnsembleClassifier: this binary configuration leaves a score undefined"
                )
            }
            (_, 0 | 1) => vec![1.0 - v, v],
            (Post::Logistic, _) => vec![logistic(-v), logistic(v)],
            _ => vec![-v, v],
        }
    };
    Ok((label, row))
}

/// TreeEnsemble (opset 5): nodes and leaves by index, modes as a uint8 tensor, set membership.
fn build_tree_ensemble(node: &Node) -> Result<Box<dyn Kernel>> {
    let req_ints = |name: &str| -> Result<Vec<i64>> {
        node.attr_ints(name)?
            .ok_or_else(|| crate::Error::Other(alloc::format!("TreeEnsemble needs {name}")))
    };
    let req_t = |name: &str| -> Result<Vec<f64>> {
        match node.attr_t(name)? {
            Some(t) => Ok(match t.dtype() {
                DataType::Double => t.as_slice::<f64>()?.into_owned(),
                _ => t.to_f32_vec()?.into_iter().map(f64::from).collect(),
            }),
            None => bail!("TreeEnsemble needs {name}"),
        }
    };
    let feat = req_ints("nodes_featureids")?;
    let splits = req_t("nodes_splits")?;
    let modes = match node.attr_t("nodes_modes")? {
        Some(t) => t.to_i64_vec()?,
        None => bail!("TreeEnsemble needs nodes_modes"),
    };
    let tids = req_ints("nodes_truenodeids")?;
    let tleaf = req_ints("nodes_trueleafs")?;
    let fids = req_ints("nodes_falsenodeids")?;
    let fleaf = req_ints("nodes_falseleafs")?;
    let miss = ints_attr(node, "nodes_missing_value_tracks_true")?;
    let leaf_t = req_ints("leaf_targetids")?;
    let leaf_w = req_t("leaf_weights")?;
    let roots = req_ints("tree_roots")?;
    let members = match node.attr_t("membership_values")? {
        Some(t) => match t.dtype() {
            DataType::Double => t.as_slice::<f64>()?.into_owned(),
            _ => t.to_f32_vec()?.into_iter().map(f64::from).collect(),
        },
        None => Vec::new(),
    };
    let n_targets = node.get_i("n_targets", 0)?;
    if n_targets <= 0 {
        bail!("TreeEnsemble needs a positive n_targets");
    }
    let k = n_targets as usize;
    let agg = match node.get_i("aggregate_function", 1)? {
        0 => Agg::Average,
        1 => Agg::Sum,
        2 => Agg::Min,
        3 => Agg::Max,
        v => unsupported!("aggregate_function {v} is not supported"),
    };
    // the spec numbers SOFTMAX 1 and LOGISTIC 2, onnxruntime reads them the other way round:
    // refuse both rather than pick one
    let post = match node.get_i("post_transform", 0)? {
        0 => Post::None,
        3 => Post::SoftmaxZero,
        4 => Post::Probit,
        v => unsupported!("TreeEnsemble post_transform {v} is not supported"),
    };
    let n = feat.len();
    if [
        splits.len(),
        modes.len(),
        tids.len(),
        tleaf.len(),
        fids.len(),
        fleaf.len(),
    ]
    .iter()
    .any(|&l| l != n)
        || (!miss.is_empty() && miss.len() != n)
        || leaf_t.len() != leaf_w.len()
    {
        bail!("TreeEnsemble nodes_* or leaf_* attributes have different lengths");
    }
    let to_usize = |v: i64| -> Result<usize> {
        usize::try_from(v)
            .map_err(|_| crate::Error::Other(alloc::format!("negative index {v} in TreeEnsemble")))
    };
    let mut f = Forest::default();
    // NaN-delimited member sets, one per MEMBER node in node order
    let mut sets = Vec::new();
    let mut start = 0;
    for (i, m) in members.iter().enumerate() {
        if m.is_nan() {
            sets.push((start, i));
            start = i + 1;
        }
    }
    let mut next_set = 0;
    for i in 0..n {
        let cmp = match modes[i] {
            0 => Cmp::Leq,
            1 => Cmp::Lt,
            2 => Cmp::Gte,
            3 => Cmp::Gt,
            4 => Cmp::Eq,
            5 => Cmp::Neq,
            6 => Cmp::Member,
            v => unsupported!("TreeEnsemble node mode {v} is not supported"),
        };
        let set = if cmp == Cmp::Member {
            let Some(&s) = sets.get(next_set) else {
                bail!("TreeEnsemble: membership_values has too few sets");
            };
            next_set += 1;
            s
        } else {
            (0, 0)
        };
        let fe = to_usize(feat[i])?;
        f.n_features = f.n_features.max(fe + 1);
        let link = |id: i64, leaf: i64| -> Result<Next> {
            Ok(if leaf != 0 {
                Next::Leaf(to_usize(id)?)
            } else {
                Next::Node(to_usize(id)?)
            })
        };
        f.splits.push(Split {
            feature: fe,
            cmp,
            value: splits[i],
            set,
            missing_true: miss.get(i).is_some_and(|&m| m != 0),
            t: link(tids[i], tleaf[i])?,
            f: link(fids[i], fleaf[i])?,
        });
    }
    f.members = members;
    for &r in &roots {
        f.roots.push(Next::Node(to_usize(r)?));
    }
    f.leaves = leaf_t
        .iter()
        .zip(&leaf_w)
        .map(|(&t, &w)| Ok(vec![(to_usize(t)?, w)]))
        .collect::<Result<_>>()?;
    f.check(k)?;
    Ok(Box::new(
        move |_cx: &KernelCx<'_>, inputs: &[Option<&Value>]| {
            let t = tensor_in(inputs, 0)?;
            let (n, c, x) = tree_input(t, &f, "TreeEnsemble")?;
            let mut out = Vec::with_capacity(n * k);
            for r in 0..n {
                let acc = accumulate(&f, &x[r * c..(r + 1) * c], k, agg)?;
                out.extend(finalize_regression(acc, agg, f.roots.len(), &[], post));
            }
            let dt = t.dtype();
            crate::dispatch_float!(dt, T => {
                out1(Tensor::from_vec(
                    &[n, k],
                    out.into_iter().map(<T as super::Float>::from_f64).collect::<Vec<T>>(),
                )?)
            }, else Err(super::bad_type("TreeEnsemble", dt)))
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::AttrValue;
    use crate::provider::ReferenceCpu;

    fn node(op: &str, opset: i64, attrs: Vec<(&str, AttrValue)>) -> Node {
        Node {
            name: String::from("n"),
            op_type: String::from(op),
            domain: String::from(ML),
            opset,
            inputs: Vec::new(),
            outputs: vec![Some(0), Some(1)],
            attrs: attrs
                .into_iter()
                .map(|(k, v)| (String::from(k), v))
                .collect(),
            implicit_inputs: Vec::new(),
        }
    }

    fn ints(v: &[i64]) -> AttrValue {
        AttrValue::Ints(v.to_vec())
    }
    fn floats(v: &[f32]) -> AttrValue {
        AttrValue::Floats(v.to_vec())
    }
    fn strs(v: &[&str]) -> AttrValue {
        AttrValue::Strings(v.iter().map(|s| s.as_bytes().to_vec()).collect())
    }
    fn s(v: &str) -> AttrValue {
        AttrValue::String(v.as_bytes().to_vec())
    }

    fn t<T: crate::tensor::Elem>(shape: &[usize], v: Vec<T>) -> Value {
        Value::Tensor(Tensor::from_vec(shape, v).unwrap())
    }

    fn run(n: &Node, inputs: &[Value]) -> Vec<Value> {
        let def = KERNELS
            .iter()
            .find(|d| d.op == n.op_type && n.opset >= d.since && n.opset <= d.until)
            .unwrap();
        let k = (def.build)(n).unwrap();
        let cx = KernelCx::new(&ReferenceCpu);
        let refs: Vec<Option<&Value>> = inputs.iter().map(Some).collect();
        k.compute(&cx, &refs).unwrap()
    }

    fn f32s(v: &Value) -> Vec<f32> {
        v.as_tensor().unwrap().to_f32_vec().unwrap()
    }
    fn i64s(v: &Value) -> Vec<i64> {
        v.as_tensor().unwrap().to_i64_vec().unwrap()
    }
    fn strings(v: &Value) -> Vec<String> {
        v.as_tensor()
            .unwrap()
            .as_slice::<String>()
            .unwrap()
            .into_owned()
    }

    fn close(got: &[f32], want: &[f32]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                "element {i}: got {g}, want {w}"
            );
        }
    }

    /// The corpus model ort_logreg_iris (LinearClassifier -> Normalizer -> ZipMap) on its
    /// reference input; expected values are onnxruntime's.
    #[test]
    fn iris_pipeline_matches_onnxruntime() {
        let lc = node(
            "LinearClassifier",
            1,
            vec![
                ("classlabels_ints", ints(&[0, 1, 2])),
                (
                    "coefficients",
                    floats(&[
                        0.385_741_14,
                        1.380_540_6,
                        -2.131_45,
                        -0.992_804_8,
                        0.642_774_5,
                        -1.748_938_8,
                        0.515_096_6,
                        -1.405_347_6,
                        -1.724_119_2,
                        -1.159_513_7,
                        2.247_884_8,
                        2.428_391_5,
                    ]),
                ),
                (
                    "intercepts",
                    floats(&[0.249_629_2, 0.582_027_8, -0.941_616_6]),
                ),
                ("multi_class", AttrValue::Int(0)),
                ("post_transform", s("LOGISTIC")),
            ],
        );
        let x = t(
            &[3, 2],
            vec![
                0.335_369_65f32,
                3.790_557_1,
                5.221_577,
                0.424_745_95,
                0.642_080_37,
                5.505_163,
            ],
        );
        let o = run(&lc, &[x]);
        assert_eq!(i64s(&o[0]), vec![0, 0, 0]);
        let norm = node("Normalizer", 1, vec![("norm", s("L1"))]);
        let p = run(&norm, &[o[1].clone()]);
        let zm = node("ZipMap", 1, vec![("classlabels_int64s", ints(&[0, 1, 2]))]);
        let z = run(&zm, &[p[0].clone()]);
        let want = [
            [0.979_786_6f32, 0.019_585_399, 0.000_628_040_6],
            [0.528_954_3, 9.605_237e-6, 0.471_036_14],
            [0.998_041_5, 0.001_919_604_5, 3.873_841_7e-5],
        ];
        let Value::Sequence { elem, items } = &z[0] else {
            panic!("ZipMap must return a sequence")
        };
        assert!(matches!(
            elem,
            TypeInfo::Map {
                key: DataType::Int64,
                ..
            }
        ));
        assert_eq!(items.len(), 3);
        for (m, w) in items.iter().zip(want) {
            let Value::Map(m) = m else {
                panic!("not a map")
            };
            assert_eq!(m.keys.to_i64_vec().unwrap(), vec![0, 1, 2]);
            let v: Vec<f32> = m.values.iter().flat_map(f32s).collect();
            for (g, w) in v.iter().zip(w) {
                assert!((g - w).abs() < 2e-6, "got {g}, want {w}");
            }
        }
    }

    #[test]
    fn binary_linear_classifier_matches_onnxruntime() {
        let x = t(&[3, 2], vec![1f32, 0., 0., 1., -2., 0.5]);
        let mk = |post: &str| {
            node(
                "LinearClassifier",
                1,
                vec![
                    ("coefficients", floats(&[0.3, -0.2])),
                    ("intercepts", floats(&[0.1])),
                    ("classlabels_ints", ints(&[4, 9])),
                    ("post_transform", s(post)),
                ],
            )
        };
        let o = run(&mk("NONE"), core::slice::from_ref(&x));
        assert_eq!(i64s(&o[0]), vec![9, 4, 4]);
        close(&f32s(&o[1]), &[0.6, 0.4, 1.1, -0.1, 1.6, -0.6]);
        let o = run(&mk("LOGISTIC"), &[x]);
        close(
            &f32s(&o[1]),
            &[
                0.401_312_35,
                0.598_687_65,
                0.524_979_2,
                0.475_020_83,
                0.645_656_3,
                0.354_343_7,
            ],
        );
        assert!(matches!(
            build_linear_classifier(&mk("PROBIT")),
            Err(crate::Error::Unsupported { .. })
        ));
    }

    #[test]
    fn multiclass_softmax_zero_with_string_labels() {
        let n = node(
            "LinearClassifier",
            1,
            vec![
                ("coefficients", floats(&[0.3, -0.2, 0.1, 0.1, 0., 0.])),
                ("intercepts", floats(&[0.1, 0., 0.])),
                ("classlabels_strings", strs(&["a", "b", "c"])),
                ("post_transform", s("SOFTMAX_ZERO")),
            ],
        );
        let o = run(&n, &[t(&[3, 2], vec![0.1f32, 0., 0., 0.1, -0.2, 0.05])]);
        assert_eq!(strings(&o[0]), vec!["a", "a", "a"]);
        close(
            &f32s(&o[1]),
            &[
                0.529_964,
                0.470_035_94,
                0.,
                0.517_492_9,
                0.482_507_17,
                0.,
                0.511_248_1,
                0.488_751_9,
                0.,
            ],
        );
    }

    #[test]
    fn label_encoders() {
        let n = node(
            "LabelEncoder",
            1,
            vec![
                ("classes_strings", strs(&["a", "b", "c"])),
                ("default_int64", AttrValue::Int(-7)),
            ],
        );
        let o = run(
            &n,
            &[t(
                &[3],
                vec![String::from("b"), String::from("z"), String::from("a")],
            )],
        );
        assert_eq!(i64s(&o[0]), vec![1, -7, 0]);
        let o = run(&n, &[t(&[3], vec![2i64, 0, 5])]);
        assert_eq!(strings(&o[0]), vec!["c", "a", "_Unused"]);
        let n = node(
            "LabelEncoder",
            2,
            vec![
                ("keys_floats", floats(&[0.5, 1.5, f32::NAN])),
                ("values_strings", strs(&["h", "o", "nan"])),
            ],
        );
        // NaN keys match nothing, as in onnxruntime
        let o = run(&n, &[t(&[2, 2], vec![1.5f32, 0.5, 2.0, f32::NAN])]);
        assert_eq!(strings(&o[0]), vec!["o", "h", "_Unused", "_Unused"]);
        assert_eq!(o[0].as_tensor().unwrap().shape(), &[2, 2]);
        let n = node(
            "LabelEncoder",
            4,
            vec![
                ("keys_int64s", ints(&[4, 5])),
                (
                    "values_tensor",
                    AttrValue::Tensor(Tensor::from_vec(&[2], vec![7i16, 8]).unwrap()),
                ),
                (
                    "default_tensor",
                    AttrValue::Tensor(Tensor::from_vec(&[1], vec![-1i16]).unwrap()),
                ),
            ],
        );
        let o = run(&n, &[t(&[3], vec![5i64, 6, 4])]);
        assert_eq!(o[0].as_tensor().unwrap().dtype(), DataType::Int16);
        assert_eq!(i64s(&o[0]), vec![8, -1, 7]);
    }

    #[test]
    fn label_encoder_values_it_cannot_copy_are_refused_when_built() {
        let int4 = |n| {
            Tensor::from_data(
                DataType::Int4,
                vec![n],
                crate::tensor::Data::Raw(vec![0x21]),
            )
            .unwrap()
        };
        let n = node(
            "LabelEncoder",
            4,
            vec![
                ("keys_int64s", ints(&[4, 5])),
                ("values_tensor", AttrValue::Tensor(int4(2))),
                ("default_tensor", AttrValue::Tensor(int4(1))),
            ],
        );
        let err = build_label_encoder(&n)
            .err()
            .expect("int4 values are refused");
        assert!(matches!(err, crate::Error::Unsupported { .. }), "{err}");
        assert!(alloc::format!("{err}").contains("int4"), "{err}");
    }

    #[test]
    fn preprocessing_ops() {
        let x = t(&[2, 3], vec![1f32, f32::NAN, 3., -4., 5., f32::NAN]);
        let n = node(
            "Imputer",
            1,
            vec![
                ("imputed_value_floats", floats(&[9., 8., 7.])),
                ("replaced_value_float", AttrValue::Float(f32::NAN)),
            ],
        );
        close(&f32s(&run(&n, &[x])[0]), &[1., 8., 3., -4., 5., 7.]);
        let n = node(
            "Scaler",
            1,
            vec![("offset", floats(&[1., 2.])), ("scale", floats(&[2., 0.5]))],
        );
        close(
            &f32s(&run(&n, &[t(&[2, 2], vec![3i64, 4, 5, 6])])[0]),
            &[4., 1., 8., 2.],
        );
        let n = node("Binarizer", 1, vec![("threshold", AttrValue::Float(0.5))]);
        close(
            &f32s(&run(&n, &[t(&[3], vec![0.2f32, 0.5, 0.7])])[0]),
            &[0., 0., 1.],
        );
        let n = node("Normalizer", 1, vec![("norm", s("MAX"))]);
        close(
            &f32s(&run(&n, &[t(&[1, 3], vec![-4f32, 2., 1.])])[0]),
            &[-2., 1., 0.5],
        );
        let n = node("Normalizer", 1, vec![("norm", s("L2"))]);
        close(
            &f32s(&run(&n, &[t(&[1, 2], vec![3f32, -4.])])[0]),
            &[0.6, -0.8],
        );
    }

    #[test]
    fn feature_ops() {
        let n = node("ArrayFeatureExtractor", 1, vec![]);
        let o = run(
            &n,
            &[
                t(&[2, 3], vec![1f32, 2., 3., 4., 5., 6.]),
                t(&[2], vec![2i64, 0]),
            ],
        );
        assert_eq!(o[0].as_tensor().unwrap().shape(), &[2, 2]);
        close(&f32s(&o[0]), &[3., 1., 6., 4.]);
        let n = node(
            "FeatureVectorizer",
            1,
            vec![("inputdimensions", ints(&[3, 1]))],
        );
        let o = run(
            &n,
            &[
                t(&[2, 2], vec![1f32, 2., 3., 4.]),
                t(&[2, 1], vec![5i64, 6]),
            ],
        );
        assert_eq!(o[0].as_tensor().unwrap().shape(), &[2, 4]);
        close(&f32s(&o[0]), &[1., 2., 0., 5., 3., 4., 0., 6.]);
        let n = node(
            "OneHotEncoder",
            1,
            vec![("cats_strings", strs(&["x", "y", "z"]))],
        );
        let o = run(
            &n,
            &[t(
                &[3],
                vec![String::from("y"), String::from("q"), String::from("z")],
            )],
        );
        assert_eq!(o[0].as_tensor().unwrap().shape(), &[3, 3]);
        close(&f32s(&o[0]), &[0., 1., 0., 0., 0., 0., 0., 0., 1.]);
        let n = node(
            "OneHotEncoder",
            1,
            vec![("cats_int64s", ints(&[1, 2])), ("zeros", AttrValue::Int(0))],
        );
        let k = build_one_hot_encoder(&n).unwrap();
        let x = t(&[1], vec![3i64]);
        assert!(k
            .compute(&KernelCx::new(&ReferenceCpu), &[Some(&x)])
            .is_err());
    }

    /// One tree: x0 <= 0.5 (NaN goes true) ? (x1 < 0 ? leaf 3 : leaf 4) : leaf 2.
    fn tree_attrs() -> Vec<(&'static str, AttrValue)> {
        vec![
            ("nodes_treeids", ints(&[0, 0, 0, 0, 0])),
            ("nodes_nodeids", ints(&[0, 1, 2, 3, 4])),
            ("nodes_featureids", ints(&[0, 1, 0, 0, 0])),
            ("nodes_values", floats(&[0.5, 0., 0., 0., 0.])),
            (
                "nodes_modes",
                strs(&["BRANCH_LEQ", "BRANCH_LT", "LEAF", "LEAF", "LEAF"]),
            ),
            ("nodes_truenodeids", ints(&[1, 3, 0, 0, 0])),
            ("nodes_falsenodeids", ints(&[2, 4, 0, 0, 0])),
            ("nodes_missing_value_tracks_true", ints(&[1, 0, 0, 0, 0])),
        ]
    }

    fn tree_x() -> Value {
        t(
            &[4, 2],
            vec![0.2f32, 1.0, 0.9, -1.0, f32::NAN, 0.0, 0.5, 2.5],
        )
    }

    // Expected values below: onnxruntime 1.32.
    #[test]
    fn tree_classifier_binary_and_multiclass() {
        let mut a = tree_attrs();
        a.extend([
            ("class_treeids", ints(&[0, 0, 0])),
            ("class_nodeids", ints(&[2, 3, 4])),
            ("class_ids", ints(&[1, 1, 1])),
            ("class_weights", floats(&[0.8, 0.3, 0.6])),
            ("classlabels_int64s", ints(&[4, 9])),
            ("post_transform", s("LOGISTIC")),
        ]);
        let o = run(&node("TreeEnsembleClassifier", 1, a), &[tree_x()]);
        assert_eq!(i64s(&o[0]), vec![9, 9, 9, 9]);
        close(
            &f32s(&o[1]),
            &[
                0.5,
                0.645_656_3,
                0.5,
                0.689_974_5,
                0.5,
                0.645_656_3,
                0.5,
                0.645_656_3,
            ],
        );
        let mut a = tree_attrs();
        a.extend([
            ("class_treeids", ints(&[0, 0, 0, 0, 0])),
            ("class_nodeids", ints(&[2, 3, 4, 4, 2])),
            ("class_ids", ints(&[0, 1, 2, 0, 2])),
            ("class_weights", floats(&[0.8, 0.3, 0.6, 0.1, 0.5])),
            ("classlabels_strings", strs(&["a", "b", "c"])),
            ("base_values", floats(&[0.1, 0.2, 0.3])),
            ("post_transform", s("SOFTMAX")),
        ]);
        let o = run(&node("TreeEnsembleClassifier", 3, a), &[tree_x()]);
        assert_eq!(strings(&o[0]), vec!["c", "a", "c", "c"]);
        let r0 = [0.249_143_4f32, 0.249_143_4, 0.501_713_2];
        let mut want = Vec::new();
        for row in [r0, [0.416_419_86, 0.206_787_97, 0.376_792_25], r0, r0] {
            want.extend(row);
        }
        close(&f32s(&o[1]), &want);
    }

    #[test]
    fn tree_regressor_average_two_trees() {
        let mut a = Vec::new();
        for (k, v) in tree_attrs() {
            let v = match (k, v) {
                ("nodes_modes", AttrValue::Strings(m)) => {
                    AttrValue::Strings(m.iter().chain(m.iter()).cloned().collect())
                }
                ("nodes_treeids", _) => ints(&[0, 0, 0, 0, 0, 1, 1, 1, 1, 1]),
                (_, AttrValue::Ints(v)) => {
                    AttrValue::Ints(v.iter().chain(v.iter()).copied().collect())
                }
                (_, AttrValue::Floats(v)) => {
                    AttrValue::Floats(v.iter().chain(v.iter()).copied().collect())
                }
                (_, v) => v,
            };
            a.push((k, v));
        }
        a.extend([
            ("target_treeids", ints(&[0, 0, 0, 1, 1, 1, 1])),
            ("target_nodeids", ints(&[2, 3, 4, 2, 3, 4, 4])),
            ("target_ids", ints(&[0, 1, 0, 1, 1, 0, 1])),
            ("target_weights", floats(&[1., 2., 3., 4., 5., 6., 7.])),
            ("n_targets", AttrValue::Int(2)),
            ("aggregate_function", s("AVERAGE")),
            ("base_values", floats(&[10., 20.])),
        ]);
        let o = run(&node("TreeEnsembleRegressor", 1, a), &[tree_x()]);
        close(
            &f32s(&o[0]),
            &[14.5, 23.5, 10.5, 22., 14.5, 23.5, 14.5, 23.5],
        );
    }

    #[test]
    fn tree_ensemble_v5_membership() {
        // node 0: x0 in {1, 3} ? leaf 0 : node 1; node 1: x1 > 0 ? leaf 1 : leaf 2
        let n = node(
            "TreeEnsemble",
            5,
            vec![
                ("nodes_featureids", ints(&[0, 1])),
                (
                    "nodes_splits",
                    AttrValue::Tensor(Tensor::from_vec(&[2], vec![0f32, 0.]).unwrap()),
                ),
                (
                    "nodes_modes",
                    AttrValue::Tensor(Tensor::from_vec(&[2], vec![6u8, 3]).unwrap()),
                ),
                ("nodes_truenodeids", ints(&[0, 1])),
                ("nodes_trueleafs", ints(&[1, 1])),
                ("nodes_falsenodeids", ints(&[1, 2])),
                ("nodes_falseleafs", ints(&[0, 1])),
                (
                    "membership_values",
                    AttrValue::Tensor(Tensor::from_vec(&[3], vec![1f32, 3., f32::NAN]).unwrap()),
                ),
                ("leaf_targetids", ints(&[0, 1, 1])),
                (
                    "leaf_weights",
                    AttrValue::Tensor(Tensor::from_vec(&[3], vec![10f32, 20., 30.]).unwrap()),
                ),
                ("tree_roots", ints(&[0])),
                ("n_targets", AttrValue::Int(2)),
            ],
        );
        let x = t(&[3, 2], vec![3f32, 5., 2., 1., 2., -1.]);
        close(&f32s(&run(&n, &[x])[0]), &[10., 0., 0., 20., 0., 30.]);
    }
}
