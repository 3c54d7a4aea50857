//! Which nodes compute values that follow from the graph's input *shapes* alone.
//!
//! A planned run keeps one memory plan per set of input shapes (see `session`). Exported
//! transformers spend hundreds of small nodes per run on shape arithmetic (`Shape`, `Gather`,
//! `Unsqueeze`, `Concat`, `ConstantOfShape`, `Range`, `Where` over index masks...) whose
//! results depend only on the shapes of the inputs and on constants; load-time folding cannot
//! remove them when a dimension is symbolic. For a given set of input shapes their results are
//! fixed, so a plan computes them once (its recording run) and later runs of the same shapes
//! take the kept values instead of running those nodes.
//!
//! The analysis is conservative. A value is *shape-determined* (its contents are a function of
//! the input shapes and the constants) when it is a non-overridable initializer, the output of
//! `Shape`/`Size` of a value whose shape is input-shape-determined, or the output of a
//! deterministic node whose inputs are all shape-determined. A value's *shape* is
//! input-shape-determined when it is a graph input or captured value, a shape-determined
//! value, or the output of an op whose output shape follows from its inputs' shapes (and
//! attributes) alone, or from input 0's shape and the contents of its other inputs when those
//! are shape-determined. Every other op (data-dependent shapes such as `NonZero`, control
//! flow, ops this table does not know) ends both properties.

use alloc::vec;
use alloc::vec::Vec;

use crate::ir::{Graph, ValueId};
use crate::optimize::NOT_FOLDABLE;

/// Default-domain ops whose output shapes follow from their inputs' shapes and attributes.
const SHAPE_FROM_SHAPES: &[&str] = &[
    "Abs",
    "Acos",
    "Acosh",
    "Add",
    "And",
    "ArgMax",
    "ArgMin",
    "Asin",
    "Asinh",
    "Atan",
    "Atanh",
    "BitShift",
    "BitwiseAnd",
    "BitwiseNot",
    "BitwiseOr",
    "BitwiseXor",
    "Cast",
    "CastLike",
    "Ceil",
    "Celu",
    "Clip",
    "Concat",
    "Cos",
    "Cosh",
    "CumSum",
    "Div",
    "Einsum",
    "Elu",
    "Equal",
    "Erf",
    "Exp",
    "Flatten",
    "Floor",
    "Gather",
    "GatherElements",
    "Gelu",
    "Gemm",
    "Greater",
    "GreaterOrEqual",
    "HardSigmoid",
    "HardSwish",
    "Hardmax",
    "Identity",
    "IsInf",
    "IsNaN",
    "LayerNormalization",
    "LeakyRelu",
    "Less",
    "LessOrEqual",
    "Log",
    "LogSoftmax",
    "MatMul",
    "Max",
    "Mean",
    "Min",
    "Mish",
    "Mod",
    "Mul",
    "Neg",
    "Not",
    "Or",
    "PRelu",
    "Pow",
    "Reciprocal",
    "Relu",
    "Round",
    "Selu",
    "Shrink",
    "Sigmoid",
    "Sign",
    "Sin",
    "Sinh",
    "Softmax",
    "Softplus",
    "Softsign",
    "Sqrt",
    "Sub",
    "Sum",
    "Tan",
    "Tanh",
    "ThresholdedRelu",
    "Transpose",
    "Trilu",
    "Where",
    "Xor",
];

/// Default-domain ops whose output shapes follow from input 0's shape, their attributes and
/// the contents of their other inputs (axes, target shapes, pads, repeats, starts...).
const SHAPE_FROM_PARAMS: &[&str] = &[
    "Expand",
    "OneHot",
    "Pad",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "ReduceMax",
    "ReduceMean",
    "ReduceMin",
    "ReduceProd",
    "ReduceSum",
    "ReduceSumSquare",
    "Reshape",
    "Resize",
    "Slice",
    "Split",
    "Squeeze",
    "Tile",
    "TopK",
    "Unsqueeze",
    "Upsample",
];

/// Per node of `g`: whether its outputs are shape-determined (see the module docs).
/// `runs_kernel(node)` says whether a node runs as one kernel (control flow never folds);
/// `shape_inputs` are values whose shapes are known from the plan's key but whose contents are
/// not (the graph inputs are added here, the captured values of a subgraph are the caller's).
pub fn shape_determined_nodes(
    g: &Graph,
    runs_kernel: impl Fn(usize) -> bool,
    shape_inputs: &[ValueId],
) -> Vec<bool> {
    let n = g.values.len();
    let mut val = vec![false; n];
    let mut shp = vec![false; n];
    for (id, _) in &g.initializers {
        val[*id] = true;
        shp[*id] = true;
    }
    // an initializer that is also a graph input may be overridden by a feed
    for &id in g.inputs.iter().chain(shape_inputs) {
        val[id] = false;
        shp[id] = true;
    }
    let mut out = vec![false; g.nodes.len()];
    for (ni, node) in g.nodes.iter().enumerate() {
        if !runs_kernel(ni) || !node.implicit_inputs.is_empty() {
            continue;
        }
        let std = node.domain.is_empty();
        let op = node.op_type.as_str();
        let ins: Vec<ValueId> = node.inputs.iter().flatten().copied().collect();
        let is_val = if NOT_FOLDABLE.contains(&op) {
            false
        } else if std && (op == "Shape" || op == "Size") {
            ins.first().is_some_and(|&i| shp[i])
        } else {
            ins.iter().all(|&i| val[i])
        };
        let is_shp = is_val
            || (std
                && ins.iter().all(|&i| shp[i])
                && (SHAPE_FROM_SHAPES.contains(&op)
                    || (SHAPE_FROM_PARAMS.contains(&op)
                        && node.inputs.iter().skip(1).flatten().all(|&i| val[i]))));
        for &o in node.outputs.iter().flatten() {
            val[o] = is_val;
            shp[o] = is_shp;
        }
        out[ni] = is_val && !node.outputs.is_empty();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Node, ValueInfo};
    use crate::tensor::Tensor;
    use crate::value::{TypeInfo, Value};
    use alloc::string::{String, ToString};

    fn graph(nodes: &[(&str, &[&str], &[&str])], inputs: &[&str], inits: &[&str]) -> Graph {
        let mut names: Vec<String> = Vec::new();
        let id = |s: &str, names: &mut Vec<String>| match names.iter().position(|x| x == s) {
            Some(p) => p,
            None => {
                names.push(s.to_string());
                names.len() - 1
            }
        };
        let mut g = Graph::default();
        for &i in inputs {
            let v = id(i, &mut names);
            g.inputs.push(v);
        }
        for &i in inits {
            let v = id(i, &mut names);
            g.initializers.push((
                v,
                Value::Tensor(Tensor::from_vec(&[1], vec![1i64]).unwrap()),
            ));
        }
        for (op, ins, outs) in nodes {
            let inputs = ins.iter().map(|s| Some(id(s, &mut names))).collect();
            let outputs = outs.iter().map(|s| Some(id(s, &mut names))).collect();
            g.nodes.push(Node {
                name: String::new(),
                op_type: op.to_string(),
                domain: String::new(),
                opset: 17,
                inputs,
                outputs,
                attrs: Vec::new(),
                implicit_inputs: Vec::new(),
            });
        }
        g.values = names
            .into_iter()
            .map(|name| ValueInfo {
                name,
                ty: TypeInfo::Unknown,
            })
            .collect();
        g
    }

    #[test]
    fn shape_arithmetic_folds_and_data_does_not() {
        // x -> Shape -> Gather(i0) -> Unsqueeze(ax) -> Concat(c) -> Reshape(x, .) -> Relu
        let g = graph(
            &[
                ("Shape", &["x"], &["s"]),
                ("Gather", &["s", "i0"], &["d"]),
                ("Unsqueeze", &["d", "ax"], &["u"]),
                ("Concat", &["u", "c"], &["shape"]),
                ("Reshape", &["x", "shape"], &["y"]),
                ("Relu", &["y"], &["z"]),
                ("Shape", &["z"], &["zs"]),
                ("Add", &["x", "c"], &["xa"]),
            ],
            &["x"],
            &["i0", "ax", "c"],
        );
        let f = shape_determined_nodes(&g, |_| true, &[]);
        assert_eq!(f, [true, true, true, true, false, false, true, false]);
    }

    #[test]
    fn data_dependent_shapes_end_the_chain() {
        let g = graph(
            &[
                ("NonZero", &["x"], &["nz"]),
                ("Shape", &["nz"], &["s"]),
                ("Reshape", &["x", "p"], &["r"]),
                ("Shape", &["r"], &["rs"]),
                ("RandomNormalLike", &["c"], &["rn"]),
                ("Shape", &["x"], &["xs"]),
            ],
            &["x", "p"],
            &["c"],
        );
        // Reshape's target shape is an input's contents: its output shape is unknown
        let f = shape_determined_nodes(&g, |_| true, &[]);
        assert_eq!(f, [false, false, false, false, false, true]);
        // a node that does not run as one kernel (control flow) never folds
        let f = shape_determined_nodes(&g, |ni| ni != 5, &[]);
        assert!(!f[5]);
    }

    #[test]
    fn overridable_initializers_are_not_constants() {
        // "c" is an initializer and a graph input: a feed may replace its contents
        let g = graph(
            &[("Add", &["c", "c"], &["a"]), ("Shape", &["c"], &["s"])],
            &["c"],
            &["c"],
        );
        assert_eq!(shape_determined_nodes(&g, |_| true, &[]), [false, true]);
    }
}
