//! Checks declared element-type lists against what the kernels actually run: each case builds
//! one node through the registry and runs it on small all-ones inputs with the type-deciding
//! input set to every element type in turn. Every declared type must run; a type that runs but
//! is not declared must be on [`NARROWER`] with the reason.

use alloc::boxed::Box;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;

use crate::dtype::DataType;
use crate::ir::{AttrValue, Node};
use crate::kernels::cpu_registry;
use crate::provider::{KernelCx, Lookup, ReferenceCpu};
use crate::tensor::Tensor;
use crate::value::Value;

/// Ops whose list deliberately leaves out types the code would also run, and why.
const NARROWER: &[(&str, &str)] = &[
    (
        "Dropout",
        "inference mode passes any tensor through; ONNX and the training path take floats only",
    ),
    (
        "ConstantOfShape",
        "the shape is read through to_i64_vec, which would also truncate floats and bools",
    ),
];

/// Ops whose list deliberately includes types that fail in the cases here, and why.
const WIDER: &[(&str, &str)] = &[
    (
        "RandomUniformLike",
        "with a dtype attribute any input type works; without one (as here) only floats do, \
         checked by the kernel at run",
    ),
    (
        "OneHotEncoder",
        "strings need cats_strings, numbers cats_int64s; the case here gives cats_int64s",
    ),
];

fn node(op: &str, domain: &str, opset: i64, attrs: &[(&str, AttrValue)], outs: usize) -> Node {
    Node {
        name: "n".to_string(),
        op_type: op.to_string(),
        domain: domain.to_string(),
        opset,
        inputs: Vec::new(),
        outputs: (0..outs).map(Some).collect(),
        attrs: attrs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect(),
        implicit_inputs: Vec::new(),
    }
}

/// Runs `n` through the registry (input types not given, so no load-time check).
fn run(n: &Node, inputs: &[Option<Tensor>]) -> crate::Result<Vec<Value>> {
    let reg = cpu_registry();
    let Lookup::Found(def) = reg.lookup(n, &[]) else {
        panic!("no kernel for {} opset {}", n.op_type, n.opset);
    };
    let k = (def.build)(n)?;
    let vals: Vec<Option<Value>> = inputs
        .iter()
        .map(|t| t.clone().map(Value::Tensor))
        .collect();
    let refs: Vec<Option<&Value>> = vals.iter().map(|v| v.as_ref()).collect();
    k.compute(&KernelCx::new(&ReferenceCpu), &refs)
}

/// A tensor of ones of element type `dt` (made by Cast; zeros for complex, which it cannot make).
fn ones(dt: DataType, shape: &[usize]) -> Tensor {
    if matches!(dt, DataType::Complex64 | DataType::Complex128) {
        return Tensor::zeros(dt, shape).unwrap();
    }
    let n: usize = shape.iter().product();
    let x = Tensor::from_vec(shape, vec![1f32; n]).unwrap();
    let cast = node(
        "Cast",
        "",
        21,
        &[("to", AttrValue::Int(dt.code() as i64))],
        1,
    );
    match run(&cast, &[Some(x)]).unwrap().remove(0) {
        Value::Tensor(t) => t,
        _ => unreachable!(),
    }
}

fn i64s(shape: &[usize], v: &[i64]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}

fn f32s(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_vec(shape, v.to_vec()).unwrap()
}

type Inputs = Box<dyn Fn(DataType) -> Vec<Option<Tensor>>>;

struct Case {
    op: &'static str,
    domain: &'static str,
    opset: i64,
    attrs: Vec<(&'static str, AttrValue)>,
    outs: usize,
    inputs: Inputs,
}

fn case(op: &'static str, opset: i64, inputs: Inputs) -> Case {
    Case {
        op,
        domain: "",
        opset,
        attrs: Vec::new(),
        outs: 1,
        inputs,
    }
}

impl Case {
    fn attr(mut self, k: &'static str, v: AttrValue) -> Case {
        self.attrs.push((k, v));
        self
    }
    fn outs(mut self, n: usize) -> Case {
        self.outs = n;
        self
    }
    fn domain(mut self, d: &'static str) -> Case {
        self.domain = d;
        self
    }
}

/// One input of type `dt` and shape `[2, 2]`.
fn x1() -> Inputs {
    Box::new(|dt| vec![Some(ones(dt, &[2, 2]))])
}

/// Two inputs of type `dt` and shape `[2, 2]`.
fn x2() -> Inputs {
    Box::new(|dt| vec![Some(ones(dt, &[2, 2])), Some(ones(dt, &[2, 2]))])
}

/// One input of type `dt` and shape `[1, 1, 2, 2]` (NCHW).
fn img() -> Inputs {
    Box::new(|dt| vec![Some(ones(dt, &[1, 1, 2, 2]))])
}

fn s(v: &str) -> AttrValue {
    AttrValue::String(v.as_bytes().to_vec())
}

fn ints(v: &[i64]) -> AttrValue {
    AttrValue::Ints(v.to_vec())
}

fn cases() -> Vec<Case> {
    let mut c = Vec::new();
    for op in [
        "Abs",
        "Neg",
        "Sign",
        "Exp",
        "Log",
        "Sqrt",
        "Reciprocal",
        "Sin",
        "Cos",
        "Tan",
        "Asin",
        "Acos",
        "Atan",
        "Sinh",
        "Cosh",
        "Asinh",
        "Acosh",
        "Atanh",
        "Tanh",
        "Sigmoid",
        "Erf",
        "Floor",
        "Ceil",
        "Round",
        "IsNaN",
        "IsInf",
        "Relu",
        "LeakyRelu",
        "HardSigmoid",
        "HardSwish",
        "Swish",
        "Elu",
        "Selu",
        "Celu",
        "Softplus",
        "Softsign",
        "ThresholdedRelu",
        "Gelu",
        "Mish",
        "Shrink",
        "BitwiseNot",
        "Not",
        "Identity",
        "Shape",
        "Size",
        "Flatten",
        "Squeeze",
        "Transpose",
        "NonZero",
        "Unique",
        "Trilu",
        "EyeLike",
        "Dropout",
        "Softmax",
        "LogSoftmax",
        "Hardmax",
        "LpNormalization",
        "ReduceSum",
        "ReduceMean",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceSumSquare",
        "ReduceL1",
        "ReduceL2",
        "ReduceLogSum",
        "ReduceLogSumExp",
        "ArgMax",
        "ArgMin",
        "Det",
        "DynamicQuantizeLinear",
        "Bernoulli",
        "RandomUniformLike",
        "SequenceConstruct",
        "Optional",
        "OptionalHasElement",
        "OptionalGetElement",
    ] {
        c.push(case(op, 24, x1()));
    }
    // along axis 1, so that the pieces are not contiguous slices of the input
    c.push(case("SplitToSequence", 24, x1()).attr("axis", AttrValue::Int(1)));
    c.push(case("Clip", 6, x1()));
    c.push(case("Clip", 13, x1()));
    c.push(case("Cast", 21, x1()).attr("to", AttrValue::Int(1)));
    for op in [
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Mod",
        "BitwiseAnd",
        "BitwiseOr",
        "BitwiseXor",
        "And",
        "Or",
        "Xor",
        "Equal",
        "Less",
        "LessOrEqual",
        "Greater",
        "GreaterOrEqual",
        "Max",
        "Min",
        "Sum",
        "Mean",
        "PRelu",
        "MatMul",
        "Gemm",
        "MatMulInteger",
    ] {
        c.push(case(op, 24, x2()));
    }
    c.push(case("BitShift", 24, x2()).attr("direction", s("LEFT")));
    c.push(case("Concat", 24, x2()).attr("axis", AttrValue::Int(0)));
    c.push(case("Einsum", 24, x2()).attr("equation", s("ij,jk->ik")));
    c.push(case(
        "Where",
        24,
        Box::new(|dt| {
            let c = Tensor::from_vec(&[2, 2], vec![true, false, true, false]).unwrap();
            vec![Some(c), Some(ones(dt, &[2, 2])), Some(ones(dt, &[2, 2]))]
        }),
    ));
    c.push(case(
        "CastLike",
        24,
        Box::new(|dt| vec![Some(ones(dt, &[2, 2])), Some(f32s(&[1], &[0.0]))]),
    ));
    // data movement: each case takes a path that copies elements (no early return)
    let with = |extra: Vec<Tensor>| -> Inputs {
        Box::new(move |dt| {
            let mut v = vec![Some(ones(dt, &[2, 2]))];
            v.extend(extra.iter().cloned().map(Some));
            v
        })
    };
    c.push(case("Unsqueeze", 24, with(vec![i64s(&[1], &[0])])));
    c.push(case("Reshape", 24, with(vec![i64s(&[1], &[4])])));
    c.push(
        case("Split", 24, x1())
            .attr("num_outputs", AttrValue::Int(2))
            .outs(2),
    );
    c.push(case(
        "Slice",
        24,
        with(vec![i64s(&[1], &[1]), i64s(&[1], &[2]), i64s(&[1], &[0])]),
    ));
    c.push(case("Gather", 24, with(vec![i64s(&[1], &[1])])));
    c.push(case(
        "GatherElements",
        24,
        with(vec![i64s(&[2, 2], &[0; 4])]),
    ));
    c.push(case("GatherND", 24, with(vec![i64s(&[1, 1], &[1])])));
    c.push(case(
        "ScatterElements",
        24,
        Box::new(|dt| {
            vec![
                Some(ones(dt, &[2, 2])),
                Some(i64s(&[2, 2], &[0; 4])),
                Some(ones(dt, &[2, 2])),
            ]
        }),
    ));
    c.push(case(
        "ScatterND",
        24,
        Box::new(|dt| {
            vec![
                Some(ones(dt, &[2, 2])),
                Some(i64s(&[1, 1], &[1])),
                Some(ones(dt, &[1, 2])),
            ]
        }),
    ));
    c.push(case("Expand", 24, with(vec![i64s(&[3], &[2, 2, 2])])));
    c.push(case("Tile", 24, with(vec![i64s(&[2], &[2, 1])])));
    c.push(case("Pad", 2, x1()).attr("pads", ints(&[1, 0, 0, 0])));
    c.push(case("Pad", 24, with(vec![i64s(&[4], &[1, 0, 0, 0])])));
    c.push(case(
        "Compress",
        24,
        with(vec![Tensor::from_vec(&[2], vec![true, false]).unwrap()]),
    ));
    c.push(case("ReverseSequence", 24, with(vec![i64s(&[2], &[1, 2])])));
    c.push(case("TopK", 24, with(vec![i64s(&[1], &[1])])).outs(2));
    c.push(case("CumSum", 24, with(vec![i64s(&[], &[0])])));
    c.push(case("CumProd", 26, with(vec![i64s(&[], &[0])])));
    c.push(case("CenterCropPad", 24, with(vec![i64s(&[2], &[3, 1])])));
    c.push(case(
        "Range",
        24,
        Box::new(|dt| {
            vec![
                Some(ones(dt, &[])),
                Some(ones(dt, &[])),
                Some(ones(dt, &[])),
            ]
        }),
    ));
    c.push(case(
        "OneHot",
        24,
        Box::new(|dt| {
            vec![
                Some(i64s(&[2], &[0, 1])),
                Some(i64s(&[], &[3])),
                Some(ones(dt, &[2])),
            ]
        }),
    ));
    c.push(
        case(
            "DepthToSpace",
            24,
            Box::new(|dt| vec![Some(ones(dt, &[1, 8, 2, 2]))]),
        )
        .attr("blocksize", AttrValue::Int(2)),
    );
    c.push(
        case(
            "SpaceToDepth",
            24,
            Box::new(|dt| vec![Some(ones(dt, &[1, 2, 4, 4]))]),
        )
        .attr("blocksize", AttrValue::Int(2)),
    );
    // normalisation, pooling, convolution
    c.push(case("MeanVarianceNormalization", 24, img()));
    c.push(case("LRN", 24, img()).attr("size", AttrValue::Int(1)));
    c.push(case(
        "InstanceNormalization",
        24,
        Box::new(|dt| {
            vec![
                Some(ones(dt, &[1, 1, 2, 2])),
                Some(ones(dt, &[1])),
                Some(ones(dt, &[1])),
            ]
        }),
    ));
    c.push(case(
        "BatchNormalization",
        24,
        Box::new(|dt| {
            let mut v = vec![Some(ones(dt, &[1, 1, 2, 2]))];
            v.extend((0..4).map(|_| Some(ones(dt, &[1]))));
            v
        }),
    ));
    for op in ["LayerNormalization", "RMSNormalization"] {
        c.push(case(
            op,
            24,
            Box::new(|dt| vec![Some(ones(dt, &[2, 2])), Some(ones(dt, &[2]))]),
        ));
    }
    c.push(
        case(
            "Resize",
            24,
            Box::new(|dt| {
                vec![
                    Some(ones(dt, &[1, 1, 2, 2])),
                    None,
                    Some(f32s(&[4], &[1.0, 1.0, 2.0, 2.0])),
                ]
            }),
        )
        .attr("mode", s("nearest")),
    );
    c.push(case(
        "Upsample",
        9,
        Box::new(|dt| {
            vec![
                Some(ones(dt, &[1, 1, 2, 2])),
                Some(f32s(&[4], &[1.0, 1.0, 2.0, 2.0])),
            ]
        }),
    ));
    for op in ["MaxPool", "AveragePool", "LpPool"] {
        c.push(case(op, 24, img()).attr("kernel_shape", ints(&[1, 1])));
    }
    for op in ["GlobalAveragePool", "GlobalMaxPool", "GlobalLpPool"] {
        c.push(case(op, 24, img()));
    }
    for op in ["Conv", "ConvTranspose", "ConvInteger"] {
        c.push(case(
            op,
            24,
            Box::new(|dt| vec![Some(ones(dt, &[1, 1, 2, 2])), Some(ones(dt, &[1, 1, 1, 1]))]),
        ));
    }
    c.push(
        case(
            "MaxUnpool",
            24,
            Box::new(|dt| {
                vec![
                    Some(ones(dt, &[1, 1, 2, 2])),
                    Some(i64s(&[1, 1, 2, 2], &[0, 1, 2, 3])),
                ]
            }),
        )
        .attr("kernel_shape", ints(&[1, 1])),
    );
    // quantization, signal, losses, attention
    for op in ["QuantizeLinear", "DequantizeLinear"] {
        c.push(case(
            op,
            24,
            Box::new(|dt| vec![Some(ones(dt, &[2, 2])), Some(f32s(&[], &[1.0]))]),
        ));
    }
    c.push(case(
        "HannWindow",
        24,
        Box::new(|dt| vec![Some(ones(dt, &[]))]),
    ));
    c.push(case(
        "DFT",
        24,
        Box::new(|dt| vec![Some(ones(dt, &[1, 2, 1]))]),
    ));
    for op in ["NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss"] {
        c.push(case(
            op,
            24,
            Box::new(|dt| vec![Some(ones(dt, &[2, 2])), Some(i64s(&[2], &[0, 1]))]),
        ));
    }
    c.push(case(
        "TensorScatter",
        24,
        Box::new(|dt| vec![Some(ones(dt, &[1, 2, 2])), Some(ones(dt, &[1, 1, 2]))]),
    ));
    c.push(case(
        "ConstantOfShape",
        24,
        Box::new(|dt| vec![Some(ones(dt, &[1]))]),
    ));
    // ai.onnx.ml and text
    const ML: &str = "ai.onnx.ml";
    c.push(
        case("Normalizer", 1, x1())
            .domain(ML)
            .attr("norm", s("MAX")),
    );
    c.push(case("Scaler", 1, x1()).domain(ML));
    c.push(case("Binarizer", 1, x1()).domain(ML));
    c.push(
        case("Imputer", 1, x1())
            .domain(ML)
            .attr("imputed_value_floats", AttrValue::Floats(vec![0.0]))
            .attr("imputed_value_int64s", ints(&[0])),
    );
    c.push(case("ArrayFeatureExtractor", 1, with(vec![i64s(&[1], &[0])])).domain(ML));
    c.push(
        case("FeatureVectorizer", 1, x1())
            .domain(ML)
            .attr("inputdimensions", ints(&[2])),
    );
    c.push(
        case("OneHotEncoder", 1, x1())
            .domain(ML)
            .attr("cats_int64s", ints(&[1])),
    );
    c.push(
        case("ZipMap", 1, Box::new(|dt| vec![Some(ones(dt, &[1, 2]))]))
            .domain(ML)
            .attr("classlabels_int64s", ints(&[0, 1])),
    );
    c.push(case(
        "StringNormalizer",
        24,
        Box::new(|dt| vec![Some(ones(dt, &[1, 2]))]),
    ));
    c.push(case("StringSplit", 24, x1()));
    c.push(case("StringConcat", 24, x2()));
    c.push(case("RegexFullMatch", 24, x1()).attr("pattern", s("1")));
    c
}

#[test]
fn declared_types_are_the_types_the_kernels_run() {
    let reg = cpu_registry();
    let mut problems = Vec::new();
    let mut excused: Vec<&str> = Vec::new();
    for c in cases() {
        let attrs: Vec<(&str, AttrValue)> = c.attrs.iter().map(|(k, v)| (*k, v.clone())).collect();
        let n = node(c.op, c.domain, c.opset, &attrs, c.outs);
        let Lookup::Found(def) = reg.lookup(&n, &[]) else {
            panic!("no kernel for {} opset {}", c.op, c.opset);
        };
        let mut ran_undeclared = Vec::new();
        for &dt in DataType::ALL.iter() {
            let ran = run(&n, &(c.inputs)(dt)).is_ok();
            let declared = def.types.contains(&dt);
            if declared && !ran {
                if WIDER.iter().any(|(o, _)| *o == c.op) {
                    excused.push(c.op);
                } else {
                    let err = run(&n, &(c.inputs)(dt)).err().unwrap();
                    problems.push(alloc::format!(
                        "{} opset {} declares {dt} but fails on it: {err}",
                        c.op,
                        c.opset
                    ));
                }
            } else if ran && !declared {
                ran_undeclared.push(dt.name());
            }
        }
        if ran_undeclared.is_empty() {
            continue;
        }
        if NARROWER.iter().any(|(o, _)| *o == c.op) {
            excused.push(c.op);
        } else {
            problems.push(alloc::format!(
                "{} opset {} runs but does not declare {}",
                c.op,
                c.opset,
                ran_undeclared.join(", ")
            ));
        }
    }
    for (op, _) in NARROWER.iter().chain(WIDER) {
        if !excused.contains(op) {
            problems.push(alloc::format!("{op} is excused but needs no excuse"));
        }
    }
    let report: String = problems.join("\n");
    assert!(problems.is_empty(), "{report}");
}
