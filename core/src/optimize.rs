//! Graph optimisation at load: constant folding (including the Shape -> Gather -> Concat ->
//! Reshape arithmetic exporters emit, once shapes are known) and dead-node removal.

use alloc::collections::BTreeMap;
use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;

use crate::error::Result;
use crate::ir::{AttrValue, Graph};
use crate::provider::{ExecutionProvider, KernelCx};
use crate::session::input_types;
use crate::tensor::Tensor;
use crate::value::{Dim, Value};

/// Ops whose outputs are not a pure function of their inputs (random ops; Dropout, random in
/// training mode) or that run subgraphs: never folded, at load or per plan (`shapefold`).
pub(crate) const NOT_FOLDABLE: &[&str] = &[
    "RandomNormal",
    "RandomUniform",
    "RandomNormalLike",
    "RandomUniformLike",
    "Multinomial",
    "Bernoulli",
    "Dropout",
    "If",
    "Loop",
    "Scan",
    "SequenceMap",
];

/// Folded outputs may grow to at most this many bytes beyond twice their inputs (so folding
/// never turns a tiny `ConstantOfShape` into a huge initializer).
const FOLD_GROWTH_LIMIT: usize = 1 << 20;

/// Folds every node whose inputs are all constant, using the host provider's kernels, and
/// `Shape`/`Size` of values whose shapes inference fully knows. Removes nodes nothing reads.
///
/// Subgraphs (If branches, Loop and Scan bodies) are folded too, after their parent: a value a
/// subgraph captures from its parent that is constant there (an initializer, or folded) is a
/// constant of the subgraph, so what a branch computes from its parent's weights (silero_vad
/// slices and concatenates its LSTM's weights inside a nested If) is folded once at load, not
/// copied on every run, and the kernels reading it see initializers they can prepack.
pub fn fold_constants(g: &mut Graph, cpu: &dyn ExecutionProvider) -> Result<usize> {
    fold_scoped(g, cpu, None, false)
}

/// [`fold_constants`], with blocked DequantizeLinear of constant weights folded whatever their
/// growth: the pre-expanded arm of block-quantized weights
/// ([`crate::weight_cache::BlockWeights::Expanded`]), dense float initializers made at load.
pub fn fold_constants_expanding_blocks(
    g: &mut Graph,
    cpu: &dyn ExecutionProvider,
) -> Result<usize> {
    fold_scoped(g, cpu, None, true)
}

/// [`fold_constants`] of `g`, whose parent's constants (by name) are `parent`.
fn fold_scoped(
    g: &mut Graph,
    cpu: &dyn ExecutionProvider,
    parent: Option<&BTreeMap<String, Value>>,
    expand_blocks: bool,
) -> Result<usize> {
    if let Some(outer) = parent {
        // a captured constant becomes one of this graph's own
        let mut kept = Vec::with_capacity(g.captures.len());
        for (name, local) in core::mem::take(&mut g.captures) {
            match outer.get(&name) {
                Some(v) => {
                    g.values[local].ty = v.type_info();
                    g.initializers.push((local, v.clone()));
                }
                None => kept.push((name, local)),
            }
        }
        g.captures = kept;
    }
    let mut count = fold_graph(g, cpu, expand_blocks)?;
    let has_subgraphs = g.nodes.iter().any(|n| {
        n.attrs
            .iter()
            .any(|(_, a)| matches!(a, AttrValue::Graph(_) | AttrValue::Graphs(_)))
    });
    if !has_subgraphs {
        return Ok(count);
    }
    let consts: BTreeMap<String, Value> = g
        .initializers
        .iter()
        .map(|(id, v)| (g.values[*id].name.clone(), v.clone()))
        .collect();
    for node in g.nodes.iter_mut() {
        for (_, a) in node.attrs.iter_mut() {
            match a {
                AttrValue::Graph(sub) => {
                    count += fold_scoped(Arc::make_mut(sub), cpu, Some(&consts), expand_blocks)?;
                }
                AttrValue::Graphs(subs) => {
                    for sub in subs.iter_mut() {
                        count +=
                            fold_scoped(Arc::make_mut(sub), cpu, Some(&consts), expand_blocks)?;
                    }
                }
                _ => {}
            }
        }
    }
    Ok(count)
}

/// [`fold_constants`] of one graph (not its subgraphs).
fn fold_graph(g: &mut Graph, cpu: &dyn ExecutionProvider, expand_blocks: bool) -> Result<usize> {
    let mut consts: Vec<Option<Value>> = vec![None; g.values.len()];
    for (id, v) in &g.initializers {
        consts[*id] = Some(v.clone());
    }
    let is_input: Vec<bool> = {
        let mut b = vec![false; g.values.len()];
        for &i in &g.inputs {
            b[i] = true;
        }
        for (_, i) in &g.captures {
            b[*i] = true;
        }
        b
    };
    let mut folded = vec![false; g.nodes.len()];
    let mut count = 0;
    for (ni, node) in g.nodes.iter().enumerate() {
        if !node.domain.is_empty() && node.domain != "ai.onnx.ml"
            || NOT_FOLDABLE.contains(&node.op_type.as_str())
            || !node.implicit_inputs.is_empty()
            || node.outputs.iter().flatten().any(|o| is_input[*o])
        {
            continue;
        }
        // Shape/Size of a fully known shape.
        if (node.op_type == "Shape" || node.op_type == "Size") && node.domain.is_empty() {
            if let Some(Some(id)) = node.inputs.first() {
                if let Some(shape) = g.values[*id].ty.tensor_shape() {
                    let known: Option<Vec<usize>> = shape
                        .iter()
                        .map(|d| match d {
                            Dim::Known(n) => Some(*n),
                            _ => None,
                        })
                        .collect();
                    if let (Some(dims), Some(Some(out))) = (known, node.outputs.first()) {
                        let v = if node.op_type == "Size" {
                            Tensor::scalar(dims.iter().product::<usize>() as i64)
                        } else {
                            let r = dims.len() as i64;
                            let clamp =
                                |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
                            let start = clamp(node.get_i("start", 0)?);
                            let end = clamp(node.attr_i("end")?.unwrap_or(r));
                            let d: Vec<i64> = dims[start..end.max(start)]
                                .iter()
                                .map(|&x| x as i64)
                                .collect();
                            Tensor::from_vec(&[d.len()], d)?
                        };
                        consts[*out] = Some(Value::Tensor(v));
                        folded[ni] = true;
                        count += 1;
                        continue;
                    }
                }
            }
        }
        let all_const = node
            .inputs
            .iter()
            .all(|i| i.is_none_or(|id| consts[id].is_some()));
        if !all_const {
            continue;
        }
        let tys = input_types(g, node);
        let Ok(kernel) = cpu.create_kernel(node, &tys) else {
            continue; // unsupported here: the session will report it
        };
        let inputs: Vec<Option<&Value>> = node
            .inputs
            .iter()
            .map(|i| i.and_then(|id| consts[id].as_ref()))
            .collect();
        let in_bytes: usize = inputs.iter().flatten().map(|v| v.byte_size()).sum();
        let cx = KernelCx::new(cpu.cpu_backend());
        let Ok(outs) = kernel.compute(&cx, &inputs) else {
            continue; // errors surface at run time, with context
        };
        let out_bytes: usize = outs.iter().map(|v| v.byte_size()).sum();
        let expanding = expand_blocks
            && node.op_type == "DequantizeLinear"
            && node.get_i("block_size", 0).unwrap_or(0) > 0;
        if out_bytes > 2 * in_bytes + FOLD_GROWTH_LIMIT && !expanding {
            continue;
        }
        for (slot, v) in node.outputs.iter().zip(outs) {
            if let Some(id) = slot {
                consts[*id] = Some(v);
            }
        }
        folded[ni] = true;
        count += 1;
    }
    if count == 0 {
        return Ok(0);
    }
    // Which values are still read (by remaining nodes, subgraphs, or as graph outputs)?
    let mut live = vec![false; g.values.len()];
    for &o in &g.outputs {
        live[o] = true;
    }
    let mut keep = vec![true; g.nodes.len()];
    for ni in (0..g.nodes.len()).rev() {
        let node = &g.nodes[ni];
        let used = node.outputs.iter().flatten().any(|o| live[*o]);
        if folded[ni] || !used {
            keep[ni] = false;
            continue;
        }
        for i in node
            .inputs
            .iter()
            .flatten()
            .chain(node.implicit_inputs.iter())
        {
            live[*i] = true;
        }
    }
    let mut nodes = Vec::with_capacity(g.nodes.len());
    for (ni, n) in core::mem::take(&mut g.nodes).into_iter().enumerate() {
        if keep[ni] {
            nodes.push(n);
        }
    }
    g.nodes = nodes;
    let mut inits = Vec::new();
    for (id, c) in consts.into_iter().enumerate() {
        if let Some(v) = c {
            if live[id] {
                if let Value::Tensor(t) = &v {
                    g.values[id].ty = Value::Tensor(t.clone()).type_info();
                }
                inits.push((id, v));
            }
        }
    }
    g.initializers = inits;
    Ok(count)
}
