//! Type and shape inference with symbolic dimensions. Fills in the types of values the model
//! does not declare; declared types are kept. Rules cover the ops real exporters emit most; an
//! op without a rule gets an unknown shape (and, where the output type follows an input, that
//! input's element type).

use alloc::string::String;
use alloc::vec;
use alloc::vec::Vec;

use crate::dtype::DataType;
use crate::error::Result;
use crate::ir::{AttrValue, Graph, Node};
use crate::tensor::Tensor;
use crate::value::{Dim, TypeInfo, Value};

/// Infers every value's type in `g` (and recursively in its subgraphs' own values).
pub fn infer_graph(g: &mut Graph, _outer: &[TypeInfo]) -> Result<()> {
    let consts: Vec<Option<Tensor>> = {
        let mut c = vec![None; g.values.len()];
        for (id, v) in &g.initializers {
            if let Value::Tensor(t) = v {
                c[*id] = Some(t.clone());
            }
        }
        c
    };
    for ni in 0..g.nodes.len() {
        let node = &g.nodes[ni];
        let ins: Vec<TypeInfo> = node
            .inputs
            .iter()
            .map(|i| i.map_or(TypeInfo::Unknown, |id| g.values[id].ty.clone()))
            .collect();
        let cin: Vec<Option<&Tensor>> = node
            .inputs
            .iter()
            .map(|i| i.and_then(|id| consts[id].as_ref()))
            .collect();
        let outs = infer_node(node, &ins, &cin);
        for (k, o) in node.outputs.clone().iter().enumerate() {
            let Some(id) = o else { continue };
            let Some(new) = outs.get(k) else { continue };
            let cur = &mut g.values[*id].ty;
            *cur = merge(cur, new);
        }
    }
    Ok(())
}

/// Keeps declared information, fills gaps from inference.
fn merge(declared: &TypeInfo, inferred: &TypeInfo) -> TypeInfo {
    match (declared, inferred) {
        (TypeInfo::Unknown, x) => x.clone(),
        (
            TypeInfo::Tensor {
                dtype: d1,
                shape: s1,
            },
            TypeInfo::Tensor {
                dtype: d2,
                shape: s2,
            },
        ) => TypeInfo::Tensor {
            dtype: d1.or(*d2),
            shape: match (s1, s2) {
                (None, s) => s.clone(),
                (Some(a), Some(b)) if a.len() == b.len() => Some(
                    a.iter()
                        .zip(b)
                        .map(|(x, y)| match (x, y) {
                            (Dim::Unknown, y) => y.clone(),
                            (x, _) => x.clone(),
                        })
                        .collect(),
                ),
                (s, _) => s.clone(),
            },
        },
        (d, _) => d.clone(),
    }
}

fn t(dtype: Option<DataType>, shape: Option<Vec<Dim>>) -> TypeInfo {
    TypeInfo::Tensor { dtype, shape }
}

fn dt(x: &TypeInfo) -> Option<DataType> {
    x.tensor_dtype()
}

fn shape(x: &TypeInfo) -> Option<Vec<Dim>> {
    x.tensor_shape().map(|s| s.to_vec())
}

fn bcast(a: &[Dim], b: &[Dim]) -> Vec<Dim> {
    let r = a.len().max(b.len());
    (0..r)
        .map(|i| {
            let da = if i + a.len() >= r {
                a[i + a.len() - r].clone()
            } else {
                Dim::Known(1)
            };
            let db = if i + b.len() >= r {
                b[i + b.len() - r].clone()
            } else {
                Dim::Known(1)
            };
            match (&da, &db) {
                (Dim::Known(1), _) => db,
                (_, Dim::Known(1)) => da,
                (Dim::Known(x), Dim::Known(y)) if x == y => da,
                (Dim::Sym(x), Dim::Sym(y)) if x == y => da,
                (Dim::Known(_), _) => da,
                (_, Dim::Known(_)) => db,
                _ => Dim::Unknown,
            }
        })
        .collect()
}

fn axis(a: i64, r: usize) -> Option<usize> {
    let x = if a < 0 { a + r as i64 } else { a };
    (x >= 0 && (x as usize) < r.max(1)).then_some(x as usize)
}

fn to_dtype(code: i64) -> Option<DataType> {
    DataType::from_code(code as i32)
}

fn const_ints(c: Option<&Tensor>) -> Option<Vec<i64>> {
    c.and_then(|t| t.to_i64_vec().ok())
}

fn attr_or_input_ints(
    node: &Node,
    name: &str,
    cin: &[Option<&Tensor>],
    idx: usize,
) -> Option<Vec<i64>> {
    match node.attr(name) {
        Some(AttrValue::Ints(v)) => Some(v.clone()),
        _ => const_ints(cin.get(idx).copied().flatten()),
    }
}

/// The shape MatMul's rule gives for the first two of `ins` (the integer products' operands).
fn matmul_shape(node: &Node, ins: &[TypeInfo]) -> Option<Vec<Dim>> {
    let mm = Node {
        op_type: "MatMul".into(),
        domain: String::new(),
        attrs: Vec::new(),
        ..node.clone()
    };
    infer_node(&mm, &ins[..ins.len().min(2)], &[])
        .first()
        .and_then(shape)
}

/// Output types of one node.
pub fn infer_node(node: &Node, ins: &[TypeInfo], cin: &[Option<&Tensor>]) -> Vec<TypeInfo> {
    let i0 = ins.first().cloned().unwrap_or(TypeInfo::Unknown);
    let d0 = dt(&i0);
    let s0 = shape(&i0);
    let same = || vec![i0.clone()];
    let op = node.op_type.as_str();
    if !node.domain.is_empty() {
        return match (node.domain.as_str(), op) {
            ("ai.onnx.ml", "ZipMap") => {
                vec![TypeInfo::Sequence(alloc::boxed::Box::new(TypeInfo::Map {
                    key: if node.attr("classlabels_strings").is_some() {
                        DataType::String
                    } else {
                        DataType::Int64
                    },
                    value: alloc::boxed::Box::new(t(Some(DataType::Float), Some(vec![]))),
                }))]
            }
            ("ai.onnx.ml", "Normalizer") => vec![t(Some(DataType::Float), s0)],
            // the QLinear element-wise ops: C's zero point's type (else A's)
            ("com.microsoft", "QLinearAdd" | "QLinearMul") => {
                let sh = match (s0, ins.get(3).and_then(shape)) {
                    (Some(a), Some(b)) => Some(bcast(&a, &b)),
                    _ => None,
                };
                vec![t(ins.get(7).and_then(dt).or(d0), sh)]
            }
            // the product's shape (MatMul's rule), float32
            ("com.microsoft", "MatMulIntegerToFloat") => {
                vec![t(Some(DataType::Float), matmul_shape(node, ins))]
            }
            ("com.microsoft", "QLinearSigmoid" | "QLinearLeakyRelu") => {
                vec![t(ins.get(4).and_then(dt).or(d0), s0)]
            }
            ("com.microsoft", "QLinearGlobalAveragePool") => {
                vec![t(ins.get(4).and_then(dt).or(d0), None)]
            }
            ("ai.onnx.ml", "LinearClassifier") => {
                let lab = if node.attr("classlabels_strings").is_some() {
                    DataType::String
                } else {
                    DataType::Int64
                };
                let n = s0
                    .as_ref()
                    .and_then(|s| s.first().cloned())
                    .unwrap_or(Dim::Unknown);
                vec![
                    t(Some(lab), Some(vec![n.clone()])),
                    t(Some(DataType::Float), Some(vec![n, Dim::Unknown])),
                ]
            }
            _ => vec![],
        };
    }
    match op {
        // element-wise, same type as input 0
        "Abs"
        | "Neg"
        | "Exp"
        | "Log"
        | "Sqrt"
        | "Reciprocal"
        | "Sin"
        | "Cos"
        | "Tan"
        | "Tanh"
        | "Sigmoid"
        | "Erf"
        | "Floor"
        | "Ceil"
        | "Round"
        | "Sign"
        | "Relu"
        | "LeakyRelu"
        | "HardSigmoid"
        | "HardSwish"
        | "Swish"
        | "Elu"
        | "Selu"
        | "Celu"
        | "Softplus"
        | "Softsign"
        | "Gelu"
        | "Mish"
        | "Identity"
        | "Softmax"
        | "LogSoftmax"
        | "Hardmax"
        | "Dropout"
        | "BatchNormalization"
        | "InstanceNormalization"
        | "LayerNormalization"
        | "Clip"
        | "LpNormalization"
        | "Asin"
        | "Acos"
        | "Atan"
        | "Sinh"
        | "Cosh"
        | "Asinh"
        | "Acosh"
        | "Atanh"
        | "ThresholdedRelu"
        | "Shrink"
        | "CumSum"
        | "GroupNormalization"
        | "RMSNormalization"
        | "MeanVarianceNormalization"
        | "LRN"
        | "BitwiseNot" => {
            let mut v = same();
            if op == "Dropout" {
                v.push(t(Some(DataType::Bool), s0));
            }
            v
        }
        "Add" | "Sub" | "Mul" | "Div" | "Pow" | "Mod" | "PRelu" | "BitShift" | "BitwiseAnd"
        | "BitwiseOr" | "BitwiseXor" | "Max" | "Min" | "Sum" | "Mean" => {
            let mut sh = s0;
            for x in &ins[1..] {
                sh = match (sh, shape(x)) {
                    (Some(a), Some(b)) => Some(bcast(&a, &b)),
                    _ => None,
                };
            }
            vec![t(d0, sh)]
        }
        "Equal" | "Less" | "Greater" | "LessOrEqual" | "GreaterOrEqual" | "And" | "Or" | "Xor" => {
            let sh = match (s0, ins.get(1).and_then(shape)) {
                (Some(a), Some(b)) => Some(bcast(&a, &b)),
                _ => None,
            };
            vec![t(Some(DataType::Bool), sh)]
        }
        "Not" | "IsNaN" | "IsInf" => vec![t(Some(DataType::Bool), s0)],
        "Where" => {
            let mut sh = s0;
            for x in &ins[1..] {
                sh = match (sh, shape(x)) {
                    (Some(a), Some(b)) => Some(bcast(&a, &b)),
                    _ => None,
                };
            }
            vec![t(ins.get(1).and_then(dt), sh)]
        }
        "Cast" => vec![t(node.get_i("to", 0).ok().and_then(to_dtype), s0)],
        // the zero point's type (else output_dtype, else uint8), the input's shape
        "QuantizeLinear" => {
            let out = node
                .attr_i("output_dtype")
                .ok()
                .flatten()
                .and_then(to_dtype);
            let zp = ins.get(2).and_then(dt);
            vec![t(zp.or(out).or(Some(DataType::Uint8)), s0)]
        }
        // uint8 codes of the input's shape, a float scale and a uint8 zero point (scalars)
        "DynamicQuantizeLinear" => vec![
            t(Some(DataType::Uint8), s0),
            t(Some(DataType::Float), Some(vec![])),
            t(Some(DataType::Uint8), Some(vec![])),
        ],
        // output_dtype, else the scale's type; the input's shape
        "DequantizeLinear" => {
            let out = node
                .attr_i("output_dtype")
                .ok()
                .flatten()
                .filter(|&v| v != 0);
            let scale = ins.get(1).and_then(dt);
            let d = match out {
                Some(v) => to_dtype(v),
                None if scale == Some(DataType::Float8E8M0) => None,
                None => scale,
            };
            vec![t(d, s0)]
        }
        "CastLike" => vec![t(ins.get(1).and_then(dt), s0)],
        "Shape" => {
            let n = s0.map(|s| {
                let r = s.len() as i64;
                let clampi = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r);
                let start = clampi(node.get_i("start", 0).unwrap_or(0));
                let end = clampi(node.attr_i("end").ok().flatten().unwrap_or(r));
                Dim::Known((end - start).max(0) as usize)
            });
            vec![t(
                Some(DataType::Int64),
                Some(vec![n.unwrap_or(Dim::Unknown)]),
            )]
        }
        "Size" => vec![t(Some(DataType::Int64), Some(vec![]))],
        "NonZero" => vec![t(
            Some(DataType::Int64),
            Some(vec![
                s0.map_or(Dim::Unknown, |s| Dim::Known(s.len())),
                Dim::Unknown,
            ]),
        )],
        "ArgMax" | "ArgMin" => {
            let sh = s0.and_then(|s| {
                let a = axis(node.get_i("axis", 0).ok()?, s.len())?;
                let mut s = s;
                if node.get_i("keepdims", 1).ok()? != 0 {
                    s[a] = Dim::Known(1);
                } else {
                    s.remove(a);
                }
                Some(s)
            });
            vec![t(Some(DataType::Int64), sh)]
        }
        "ReduceMean" | "ReduceSum" | "ReduceMax" | "ReduceMin" | "ReduceProd"
        | "ReduceSumSquare" | "ReduceL1" | "ReduceL2" | "ReduceLogSum" | "ReduceLogSumExp" => {
            let axes = attr_or_input_ints(node, "axes", cin, 1);
            let keep = node.get_i("keepdims", 1).unwrap_or(1) != 0;
            let has_axes_input = ins.len() > 1;
            let sh = s0.and_then(|s| {
                let r = s.len();
                let axes: Vec<usize> = match axes {
                    Some(a) if !a.is_empty() => a.iter().filter_map(|&x| axis(x, r)).collect(),
                    None if has_axes_input => return None,
                    _ => {
                        if node.get_i("noop_with_empty_axes", 0).ok()? != 0 {
                            return Some(s);
                        }
                        (0..r).collect()
                    }
                };
                Some(
                    s.into_iter()
                        .enumerate()
                        .filter_map(|(i, d)| {
                            if axes.contains(&i) {
                                keep.then_some(Dim::Known(1))
                            } else {
                                Some(d)
                            }
                        })
                        .collect(),
                )
            });
            vec![t(d0, sh)]
        }
        "MatMul" => {
            let sh = match (s0, ins.get(1).and_then(shape)) {
                (Some(a), Some(b)) if !a.is_empty() && !b.is_empty() => {
                    let (a1, b1) = (a.len() == 1, b.len() == 1);
                    let a2 = if a1 {
                        vec![Dim::Known(1), a[0].clone()]
                    } else {
                        a.clone()
                    };
                    let b2 = if b1 {
                        vec![b[0].clone(), Dim::Known(1)]
                    } else {
                        b.clone()
                    };
                    let batch = bcast(&a2[..a2.len() - 2], &b2[..b2.len() - 2]);
                    let mut s = batch;
                    if !a1 {
                        s.push(a2[a2.len() - 2].clone());
                    }
                    if !b1 {
                        s.push(b2[b2.len() - 1].clone());
                    }
                    Some(s)
                }
                _ => None,
            };
            vec![t(d0, sh)]
        }
        "Gemm" => {
            let ta = node.get_i("transA", 0).unwrap_or(0) != 0;
            let tb = node.get_i("transB", 0).unwrap_or(0) != 0;
            let sh = match (s0, ins.get(1).and_then(shape)) {
                (Some(a), Some(b)) if a.len() == 2 && b.len() == 2 => Some(vec![
                    a[if ta { 1 } else { 0 }].clone(),
                    b[if tb { 0 } else { 1 }].clone(),
                ]),
                _ => None,
            };
            vec![t(d0, sh)]
        }
        "Transpose" => {
            let sh = s0.map(|s| {
                let perm = node
                    .attr_ints("perm")
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| (0..s.len() as i64).rev().collect());
                perm.iter()
                    .map(|&p| s.get(p as usize).cloned().unwrap_or(Dim::Unknown))
                    .collect()
            });
            vec![t(d0, sh)]
        }
        "Unsqueeze" => {
            let axes = attr_or_input_ints(node, "axes", cin, 1);
            let sh = match (s0, axes) {
                (Some(s), Some(axes)) => {
                    let r = s.len() + axes.len();
                    let mut ax: Vec<usize> = axes.iter().filter_map(|&a| axis(a, r)).collect();
                    ax.sort_unstable();
                    let mut out = s;
                    for a in ax {
                        if a <= out.len() {
                            out.insert(a, Dim::Known(1));
                        }
                    }
                    Some(out)
                }
                _ => None,
            };
            vec![t(d0, sh)]
        }
        "Squeeze" => {
            let axes = attr_or_input_ints(node, "axes", cin, 1);
            let has_axes = axes.is_some() || ins.len() > 1;
            let sh = s0.and_then(|s| {
                let r = s.len();
                match axes {
                    Some(axes) => {
                        let ax: Vec<usize> = axes.iter().filter_map(|&a| axis(a, r)).collect();
                        Some(
                            s.into_iter()
                                .enumerate()
                                .filter(|(i, _)| !ax.contains(i))
                                .map(|(_, d)| d)
                                .collect(),
                        )
                    }
                    None if !has_axes && s.iter().all(|d| matches!(d, Dim::Known(_))) => {
                        Some(s.into_iter().filter(|d| *d != Dim::Known(1)).collect())
                    }
                    None => None,
                }
            });
            vec![t(d0, sh)]
        }
        "Flatten" => {
            let sh = s0.and_then(|s| {
                let a = node.get_i("axis", 1).ok()?;
                let a = if a < 0 { a + s.len() as i64 } else { a } as usize;
                let prod = |d: &[Dim]| {
                    d.iter().try_fold(1usize, |acc, x| match x {
                        Dim::Known(n) => Some(acc * n),
                        _ => None,
                    })
                };
                let l = prod(&s[..a.min(s.len())]).map_or(Dim::Unknown, Dim::Known);
                let r = prod(&s[a.min(s.len())..]).map_or(Dim::Unknown, Dim::Known);
                Some(vec![l, r])
            });
            vec![t(d0, sh)]
        }
        "Reshape" => {
            let sh = const_ints(cin.get(1).copied().flatten()).map(|target| {
                let allowzero = node.get_i("allowzero", 0).unwrap_or(0) != 0;
                let mut out: Vec<Dim> = target
                    .iter()
                    .enumerate()
                    .map(|(i, &d)| {
                        if d == 0 && !allowzero {
                            s0.as_ref()
                                .and_then(|s| s.get(i).cloned())
                                .unwrap_or(Dim::Unknown)
                        } else if d < 0 {
                            Dim::Unknown
                        } else {
                            Dim::Known(d as usize)
                        }
                    })
                    .collect();
                // resolve a single -1 when everything is known
                if let Some(s) = &s0 {
                    let total = s.iter().try_fold(1usize, |a, d| match d {
                        Dim::Known(n) => Some(a * n),
                        _ => None,
                    });
                    let unknown: Vec<usize> = (0..out.len()).filter(|&i| target[i] < 0).collect();
                    let known = out
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| !unknown.contains(i))
                        .try_fold(1usize, |a, (_, d)| match d {
                            Dim::Known(n) => Some(a * n),
                            _ => None,
                        });
                    if let (Some(total), Some(known), [u]) = (total, known, unknown.as_slice()) {
                        if let Some(q) = total.checked_div(known) {
                            out[*u] = Dim::Known(q);
                        }
                    }
                }
                out
            });
            vec![t(d0, sh)]
        }
        "Concat" => {
            let sh = (|| {
                let shapes: Vec<Vec<Dim>> = ins.iter().map(shape).collect::<Option<_>>()?;
                let r = shapes.first()?.len();
                let a = axis(node.get_i("axis", 0).ok()?, r)?;
                let mut out = shapes[0].clone();
                let mut total = Some(0usize);
                for s in &shapes {
                    total = match (total, s.get(a)) {
                        (Some(acc), Some(Dim::Known(n))) => Some(acc + n),
                        _ => None,
                    };
                }
                out[a] = total.map_or(Dim::Unknown, Dim::Known);
                Some(out)
            })();
            vec![t(d0, sh)]
        }
        "Gather" => {
            let sh = match (s0, ins.get(1).and_then(shape)) {
                (Some(d), Some(ix)) => node
                    .get_i("axis", 0)
                    .ok()
                    .and_then(|a| axis(a, d.len()))
                    .map(|a| {
                        let mut o = d[..a].to_vec();
                        o.extend(ix);
                        o.extend_from_slice(&d[a + 1..]);
                        o
                    }),
                _ => None,
            };
            vec![t(d0, sh)]
        }
        "ConstantOfShape" => {
            let dtype = match node.attr("value") {
                Some(AttrValue::Tensor(v)) => Some(v.dtype()),
                _ => Some(DataType::Float),
            };
            let sh = const_ints(cin.first().copied().flatten())
                .map(|v| v.iter().map(|&d| Dim::Known(d.max(0) as usize)).collect())
                .or_else(|| match s0.as_deref() {
                    Some([Dim::Known(r)]) => Some(vec![Dim::Unknown; *r]),
                    _ => None,
                });
            vec![t(dtype, sh)]
        }
        "Constant" => {
            let v = node.attrs.first().map(|(n, v)| (n.as_str(), v));
            match v {
                Some(("value", AttrValue::Tensor(x))) => vec![Value::Tensor(x.clone()).type_info()],
                Some(("value_float", _)) => vec![t(Some(DataType::Float), Some(vec![]))],
                Some(("value_floats", AttrValue::Floats(f))) => {
                    vec![t(Some(DataType::Float), Some(vec![Dim::Known(f.len())]))]
                }
                Some(("value_int", _)) => vec![t(Some(DataType::Int64), Some(vec![]))],
                Some(("value_ints", AttrValue::Ints(f))) => {
                    vec![t(Some(DataType::Int64), Some(vec![Dim::Known(f.len())]))]
                }
                Some(("value_string", _)) => vec![t(Some(DataType::String), Some(vec![]))],
                Some(("value_strings", AttrValue::Strings(f))) => {
                    vec![t(Some(DataType::String), Some(vec![Dim::Known(f.len())]))]
                }
                _ => vec![],
            }
        }
        "Range" => vec![t(d0, Some(vec![Dim::Unknown]))],
        // the integer convolutions and products: y_zero_point's type (else x's), or int32
        "QLinearConv" => vec![t(
            ins.get(7).and_then(dt).or(d0),
            conv_shape(node, &s0, ins.get(3).and_then(shape)),
        )],
        "ConvInteger" => vec![t(
            Some(DataType::Int32),
            conv_shape(node, &s0, ins.get(1).and_then(shape)),
        )],
        "QLinearMatMul" => vec![t(
            ins.get(7).and_then(dt).or(d0),
            matmul_shape(
                node,
                &[i0.clone(), ins.get(3).cloned().unwrap_or(TypeInfo::Unknown)],
            ),
        )],
        "MatMulInteger" => vec![t(Some(DataType::Int32), matmul_shape(node, ins))],
        "Conv" | "MaxPool" | "AveragePool" | "ConvTranspose" | "LpPool" => {
            let sh = conv_shape(node, &s0, ins.get(1).and_then(shape));
            let mut v = vec![t(d0, sh.clone())];
            if op == "MaxPool" {
                v.push(t(Some(DataType::Int64), sh));
            }
            v
        }
        "GlobalAveragePool" | "GlobalMaxPool" | "GlobalLpPool" => {
            let sh = s0.map(|s| {
                s.iter()
                    .enumerate()
                    .map(|(i, d)| if i < 2 { d.clone() } else { Dim::Known(1) })
                    .collect()
            });
            vec![t(d0, sh)]
        }
        "Expand" => {
            let sh = match (s0, const_ints(cin.get(1).copied().flatten())) {
                (Some(a), Some(b)) => {
                    let b: Vec<Dim> = b.iter().map(|&d| Dim::Known(d.max(0) as usize)).collect();
                    Some(bcast(&a, &b))
                }
                _ => None,
            };
            vec![t(d0, sh)]
        }
        "Slice" | "Pad" | "Tile" | "Resize" | "Upsample" | "Compress" | "Einsum" | "GatherND"
        | "DepthToSpace" | "SpaceToDepth" | "STFT" | "DFT" | "Trilu" | "ReverseSequence"
        | "GatherElements" | "ScatterElements" | "ScatterND" | "Scatter" => {
            let keep_rank = !matches!(op, "Einsum" | "GatherND" | "Compress");
            let sh = if keep_rank {
                s0.map(|s| {
                    if matches!(op, "GatherElements") {
                        return ins
                            .get(1)
                            .and_then(shape)
                            .unwrap_or(vec![Dim::Unknown; s.len()]);
                    }
                    if matches!(
                        op,
                        "ScatterElements" | "ScatterND" | "Scatter" | "Trilu" | "ReverseSequence"
                    ) {
                        return s;
                    }
                    if op == "STFT" || op == "DFT" {
                        return vec![Dim::Unknown; if op == "STFT" { 4 } else { s.len() }];
                    }
                    vec![Dim::Unknown; s.len()]
                })
            } else {
                None
            };
            vec![t(d0, sh)]
        }
        "Split" => {
            let n = node.outputs.len();
            let sh = s0.map(|s| {
                let mut s = s;
                if let Some(a) = node.get_i("axis", 0).ok().and_then(|a| axis(a, s.len())) {
                    s[a] = Dim::Unknown;
                }
                s
            });
            vec![t(d0, sh); n]
        }
        "TopK" => {
            let sh = s0.map(|s| {
                let mut s = s;
                if let Some(a) = node.get_i("axis", -1).ok().and_then(|a| axis(a, s.len())) {
                    s[a] = match const_ints(cin.get(1).copied().flatten()).as_deref() {
                        Some([k]) => Dim::Known(*k as usize),
                        _ => Dim::Unknown,
                    };
                }
                s
            });
            vec![t(d0, sh.clone()), t(Some(DataType::Int64), sh)]
        }
        "LSTM" | "GRU" | "RNN" => {
            let n = node.outputs.len();
            vec![t(d0, None); n]
        }
        "OneHot" => vec![t(ins.get(2).and_then(dt), None)],
        "If" => {
            // both branches' declared output types
            match node.attr_g("then_branch") {
                Ok(Some(g)) => g
                    .outputs
                    .iter()
                    .map(|&o| {
                        let ty = g.values[o].ty.clone();
                        // branches may differ in shape: keep dtype, drop mismatching dims
                        match ty {
                            TypeInfo::Tensor { dtype, .. } => t(dtype, None),
                            other => other,
                        }
                    })
                    .collect(),
                _ => vec![],
            }
        }
        "Loop" | "Scan" => vec![],
        _ => vec![],
    }
}

/// Convolutions whose output channels are their weight's first dimension.
fn conv_like(op: &str) -> bool {
    matches!(op, "Conv" | "QLinearConv" | "ConvInteger")
}

fn conv_shape(node: &Node, x: &Option<Vec<Dim>>, w: Option<Vec<Dim>>) -> Option<Vec<Dim>> {
    let Some(x) = x.as_ref() else {
        // X's shape unknown: a Conv's output still has W's rank and W's first dimension as
        // its channels (later ops, and the fusions that need a rank, keep knowing it)
        let w = w.filter(|w| conv_like(&node.op_type) && w.len() >= 3)?;
        let mut out = vec![Dim::Unknown; w.len()];
        out[1] = w[0].clone();
        return Some(out);
    };
    if x.len() < 3 {
        return None;
    }
    let nsp = x.len() - 2;
    let op = node.op_type.as_str();
    let kernel: Vec<i64> = match node.attr_ints("kernel_shape").ok().flatten() {
        Some(k) => k,
        None => {
            let w = w.as_ref()?;
            w[2..]
                .iter()
                .map(|d| match d {
                    Dim::Known(n) => Some(*n as i64),
                    _ => None,
                })
                .collect::<Option<_>>()?
        }
    };
    let strides = node
        .attr_ints("strides")
        .ok()
        .flatten()
        .unwrap_or(vec![1; nsp]);
    let dil = node
        .attr_ints("dilations")
        .ok()
        .flatten()
        .unwrap_or(vec![1; nsp]);
    let pads = node
        .attr_ints("pads")
        .ok()
        .flatten()
        .unwrap_or(vec![0; 2 * nsp]);
    let auto_pad = node.get_s("auto_pad", "NOTSET").ok()?;
    let ceil = node.get_i("ceil_mode", 0).ok()? != 0;
    let channels = match op {
        _ if conv_like(op) => w.as_ref()?.first()?.clone(),
        "ConvTranspose" => {
            let g = node.get_i("group", 1).ok()? as usize;
            match w.as_ref()?.get(1)? {
                Dim::Known(n) => Dim::Known(n * g),
                _ => Dim::Unknown,
            }
        }
        _ => x[1].clone(),
    };
    let mut out = vec![x[0].clone(), channels];
    for i in 0..nsp {
        let Dim::Known(n) = x[2 + i] else {
            out.push(Dim::Unknown);
            continue;
        };
        // checked throughout: hostile attributes (a zero stride, pads missing, sizes that
        // overflow) leave the dimension unknown for the kernel to reject
        let o = (|| -> Option<i64> {
            let n = i64::try_from(n).ok()?;
            let (k, s, d) = (*kernel.get(i)?, *strides.get(i)?, *dil.get(i)?);
            if k <= 0 || s <= 0 || d <= 0 {
                return None;
            }
            let (pb, pe) = (*pads.get(i)?, *pads.get(i + nsp)?);
            let ek = (k - 1).checked_mul(d)?.checked_add(1)?;
            Some(if op == "ConvTranspose" {
                if let Some(os) = node.attr_ints("output_shape").ok().flatten() {
                    *os.get((os.len() + i).checked_sub(nsp)?)?
                } else {
                    let op_ = node
                        .attr_ints("output_padding")
                        .ok()
                        .flatten()
                        .unwrap_or(vec![0; nsp]);
                    if auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER" {
                        n.checked_mul(s)?
                    } else {
                        s.checked_mul(n - 1)?
                            .checked_add(*op_.get(i)?)?
                            .checked_add(ek)?
                            .checked_sub(pb)?
                            .checked_sub(pe)?
                    }
                }
            } else {
                match auto_pad.as_str() {
                    "SAME_UPPER" | "SAME_LOWER" => n.checked_add(s - 1)? / s,
                    "VALID" => n.checked_sub(ek)? / s + 1,
                    _ => {
                        let padded = n.checked_add(pb)?;
                        let num = padded.checked_add(pe)?.checked_sub(ek)?;
                        if ceil {
                            let mut o = num.checked_add(s - 1)? / s + 1;
                            if (o - 1).checked_mul(s)? >= padded {
                                o -= 1;
                            }
                            o
                        } else {
                            num / s + 1
                        }
                    }
                }
            })
        })()
        .unwrap_or(-1);
        out.push(if o >= 0 {
            Dim::Known(o as usize)
        } else {
            Dim::Unknown
        });
    }
    Some(out)
}

/// A short human summary of a shape (for reports).
pub fn shape_string(s: &[Dim]) -> String {
    let mut out = String::from("[");
    for (i, d) in s.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&alloc::format!("{d}"));
    }
    out.push(']');
    out
}
