//! Sequence and optional kernels: SequenceEmpty/Construct/At/Insert/Erase/Length,
//! ConcatFromSequence, SplitToSequence, and Optional/OptionalHasElement/OptionalGetElement.

use alloc::boxed::Box;
use alloc::vec;
use alloc::vec::Vec;

use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::ir::{AttrValue, Node};
use crate::kernels::shape::{self, concat};
use crate::kernels::types::{ALL, INDEX, UNPACKED};
use crate::kernels::{def, norm_axis, opt_tensor_in, out1, tensor_in, LATEST};
use crate::provider::{Kernel, KernelCx, KernelDef};
use crate::tensor::Tensor;
use crate::value::{TypeInfo, Value};
use crate::{bail, unsupported};

pub(crate) const KERNELS: &[KernelDef] = &[
    // SequenceEmpty, SequenceLength and ConcatFromSequence have no tensor input to declare
    // (types::UNDECLARED); the others' input 0 is a sequence, so a later input is declared
    def("SequenceEmpty", 11, LATEST, build_sequence_empty),
    def("SequenceConstruct", 11, LATEST, build_sequence_construct).types(ALL),
    def("SequenceAt", 11, LATEST, build_sequence_at).types_at(1, INDEX),
    // the kernel checks that the tensor's type is the sequence's
    def("SequenceInsert", 11, LATEST, build_sequence_insert).types_at(1, ALL),
    def("SequenceErase", 11, LATEST, build_sequence_erase).types_at(1, INDEX),
    def("SequenceLength", 11, LATEST, build_sequence_length),
    def("ConcatFromSequence", 11, LATEST, build_concat_from_sequence),
    def("SplitToSequence", 11, LATEST, build_split_to_sequence).types(UNPACKED),
    // these also take sequences and optionals, which have no tensor type at load
    def("Optional", 15, LATEST, build_optional).types(ALL),
    def("OptionalHasElement", 15, LATEST, build_optional_has_element).types(ALL),
    def("OptionalGetElement", 15, LATEST, build_optional_get_element).types(ALL),
];

fn kernel<F>(f: F) -> Result<Box<dyn Kernel>>
where
    F: Fn(&KernelCx<'_>, &[Option<&Value>]) -> Result<Vec<Value>> + Send + Sync + 'static,
{
    Ok(Box::new(f))
}

/// The element type of a sequence holding tensors of `dt` (shapes may differ per item).
fn tensor_type(dt: DataType) -> TypeInfo {
    TypeInfo::Tensor {
        dtype: Some(dt),
        shape: None,
    }
}

/// Input `i` as a sequence: its element type and items.
fn seq_in<'a>(inputs: &[Option<&'a Value>], i: usize) -> Result<(&'a TypeInfo, &'a [Value])> {
    match inputs.get(i).copied().flatten() {
        Some(Value::Sequence { elem, items }) => Ok((elem, items)),
        Some(v) => bail!("input {i} should be a sequence, is a {}", v.kind_name()),
        None => bail!("required input {i} is missing"),
    }
}

/// A scalar (or one-element) integer position input.
fn position(t: &Tensor) -> Result<i64> {
    if !matches!(t.dtype(), DataType::Int32 | DataType::Int64) {
        bail!("position must be int32 or int64, is {}", t.dtype());
    }
    if t.len() != 1 {
        bail!("position must be a scalar, has shape {:?}", t.shape());
    }
    Ok(t.to_i64_vec()?[0])
}

/// Resolves `pos` against a length `n`, allowing `-n..=n-1` (or `-n..=n` when `end_ok`).
fn resolve(pos: i64, n: usize, end_ok: bool) -> Result<usize> {
    let n = n as i64;
    let hi = if end_ok { n } else { n - 1 };
    if pos < -n || pos > hi {
        bail!("position {pos} is out of range for a sequence of length {n}");
    }
    Ok(if pos < 0 { pos + n } else { pos } as usize)
}

/// Checks that a tensor may join a sequence of element type `elem`.
fn check_elem(elem: &TypeInfo, t: &Tensor) -> Result<()> {
    match elem {
        TypeInfo::Tensor { dtype: Some(d), .. } if *d != t.dtype() => bail!(
            "a {} tensor cannot join a sequence of {d} tensors",
            t.dtype()
        ),
        TypeInfo::Tensor { .. } | TypeInfo::Unknown => Ok(()),
        other => bail!("sequences of {other} are not supported by this op"),
    }
}

fn build_sequence_empty(node: &Node) -> Result<Box<dyn Kernel>> {
    let code = node.get_i("dtype", DataType::Float.code() as i64)?;
    let dt = i32::try_from(code)
        .ok()
        .and_then(DataType::from_code)
        .ok_or_else(|| Error::Other(alloc::format!("SequenceEmpty: unknown dtype {code}")))?;
    kernel(move |_cx, _inputs| {
        Ok(vec![Value::Sequence {
            elem: tensor_type(dt),
            items: Vec::new(),
        }])
    })
}

fn build_sequence_construct(_node: &Node) -> Result<Box<dyn Kernel>> {
    kernel(|_cx, inputs| {
        if inputs.is_empty() {
            bail!("SequenceConstruct needs at least one input");
        }
        let ts: Vec<&Tensor> = (0..inputs.len())
            .map(|i| tensor_in(inputs, i))
            .collect::<Result<_>>()?;
        let dt = ts[0].dtype();
        if ts.iter().any(|t| t.dtype() != dt) {
            bail!("SequenceConstruct inputs differ in element type");
        }
        Ok(vec![Value::Sequence {
            elem: tensor_type(dt),
            items: ts.into_iter().map(|t| Value::Tensor(t.clone())).collect(),
        }])
    })
}

fn build_sequence_at(_node: &Node) -> Result<Box<dyn Kernel>> {
    kernel(|_cx, inputs| {
        let (_, items) = seq_in(inputs, 0)?;
        let p = resolve(position(tensor_in(inputs, 1)?)?, items.len(), false)?;
        Ok(vec![items[p].clone()])
    })
}

fn build_sequence_insert(_node: &Node) -> Result<Box<dyn Kernel>> {
    kernel(|_cx, inputs| {
        let (elem, items) = seq_in(inputs, 0)?;
        let t = tensor_in(inputs, 1)?;
        check_elem(elem, t)?;
        let p = match opt_tensor_in(inputs, 2)? {
            Some(pt) => resolve(position(pt)?, items.len(), true)?,
            None => items.len(),
        };
        let mut items = items.to_vec();
        items.insert(p, Value::Tensor(t.clone()));
        let elem = match elem {
            TypeInfo::Unknown => tensor_type(t.dtype()),
            e => e.clone(),
        };
        Ok(vec![Value::Sequence { elem, items }])
    })
}

fn build_sequence_erase(_node: &Node) -> Result<Box<dyn Kernel>> {
    kernel(|_cx, inputs| {
        let (elem, items) = seq_in(inputs, 0)?;
        if items.is_empty() {
            bail!("SequenceErase on an empty sequence");
        }
        let p = match opt_tensor_in(inputs, 1)? {
            Some(pt) => resolve(position(pt)?, items.len(), false)?,
            None => items.len() - 1,
        };
        let mut items = items.to_vec();
        items.remove(p);
        Ok(vec![Value::Sequence {
            elem: elem.clone(),
            items,
        }])
    })
}

fn build_sequence_length(_node: &Node) -> Result<Box<dyn Kernel>> {
    kernel(|_cx, inputs| {
        let (_, items) = seq_in(inputs, 0)?;
        out1(Tensor::scalar(items.len() as i64))
    })
}

fn build_concat_from_sequence(node: &Node) -> Result<Box<dyn Kernel>> {
    let Some(axis) = node.attr_i("axis")? else {
        bail!("ConcatFromSequence needs an 'axis' attribute");
    };
    let new_axis = match node.get_i("new_axis", 0)? {
        0 => false,
        1 => true,
        v => bail!("ConcatFromSequence new_axis must be 0 or 1, is {v}"),
    };
    kernel(move |_cx, inputs| {
        let (_, items) = seq_in(inputs, 0)?;
        if items.is_empty() {
            bail!("ConcatFromSequence of an empty sequence");
        }
        let ts: Vec<&Tensor> = items.iter().map(|v| v.as_tensor()).collect::<Result<_>>()?;
        if !new_axis {
            return out1(concat(None, &ts, axis)?);
        }
        // stack: insert a unit dim at `axis` (range -r-1..=r) in every item, then concatenate
        let r = ts[0].rank();
        let a = norm_axis(axis, r + 1)?;
        let mut expanded = Vec::with_capacity(ts.len());
        for t in &ts {
            if t.rank() != r {
                bail!("ConcatFromSequence items differ in rank");
            }
            let mut s = t.shape().to_vec();
            s.insert(a, 1);
            expanded.push(t.contiguous()?.reshape(&s)?);
        }
        let refs: Vec<&Tensor> = expanded.iter().collect();
        out1(concat(None, &refs, a as i64)?)
    })
}

fn build_split_to_sequence(node: &Node) -> Result<Box<dyn Kernel>> {
    let axis = node.get_i("axis", 0)?;
    let keepdims = match node.get_i("keepdims", 1)? {
        0 => false,
        1 => true,
        v => bail!("SplitToSequence keepdims must be 0 or 1, is {v}"),
    };
    kernel(move |_cx, inputs| {
        let x = tensor_in(inputs, 0)?;
        if x.rank() == 0 {
            bail!("SplitToSequence input must have rank >= 1");
        }
        let a = norm_axis(axis, x.rank())?;
        let dim = x.shape()[a];
        let split = opt_tensor_in(inputs, 1)?;
        // (sizes, squeeze the split axis)
        let (sizes, squeeze): (Vec<usize>, bool) = match split {
            None => (vec![1; dim], !keepdims),
            Some(s) => {
                if !matches!(s.dtype(), DataType::Int32 | DataType::Int64) {
                    bail!("SplitToSequence split must be int32 or int64");
                }
                let v = s.to_i64_vec()?;
                if s.rank() == 0 {
                    let k = v[0];
                    if k <= 0 {
                        bail!("SplitToSequence split size {k} must be positive");
                    }
                    let k = k as usize;
                    let mut sizes = vec![k; dim / k];
                    if dim % k != 0 {
                        sizes.push(dim % k);
                    }
                    (sizes, false)
                } else if s.rank() == 1 {
                    if v.iter().any(|&k| k < 0) {
                        bail!("SplitToSequence split sizes {v:?} must be non-negative");
                    }
                    if v.iter().sum::<i64>() != dim as i64 {
                        bail!("SplitToSequence split sizes {v:?} do not sum to the dim {dim}");
                    }
                    (v.iter().map(|&k| k as usize).collect(), false)
                } else {
                    bail!("SplitToSequence split must be a scalar or 1-D");
                }
            }
        };
        // Split's copy, which handles float8 and complex items along any axis (a strided view
        // of their raw storage cannot be made contiguous)
        let mut items = shape::split(x, a, &sizes)?;
        if squeeze {
            for item in &mut items {
                let part = item.as_tensor()?;
                let mut s = part.shape().to_vec();
                s.remove(a);
                *item = Value::Tensor(part.reshape(&s)?);
            }
        }
        Ok(vec![Value::Sequence {
            elem: tensor_type(x.dtype()),
            items,
        }])
    })
}

fn build_optional(node: &Node) -> Result<Box<dyn Kernel>> {
    let declared = match node.attr("type") {
        None => None,
        Some(AttrValue::Type(t)) => Some(t.clone()),
        Some(v) => bail!("Optional 'type' should be a type, is {}", v.kind()),
    };
    kernel(move |_cx, inputs| match inputs.first().copied().flatten() {
        Some(v @ (Value::Tensor(_) | Value::Sequence { .. })) => Ok(vec![Value::Optional {
            elem: v.type_info(),
            value: Some(Box::new(v.clone())),
        }]),
        Some(v) => unsupported!("Optional of a {} is not supported", v.kind_name()),
        None => match &declared {
            Some(t) => Ok(vec![Value::Optional {
                elem: t.clone(),
                value: None,
            }]),
            None => bail!("Optional without an input needs a 'type' attribute"),
        },
    })
}

fn build_optional_has_element(_node: &Node) -> Result<Box<dyn Kernel>> {
    kernel(move |_cx, inputs| {
        let has = match inputs.first().copied().flatten() {
            None => false,
            Some(Value::Optional { value, .. }) => value.is_some(),
            // opset 18 takes plain values; earlier opsets see them where a graph passes a
            // present value into an optional slot (a Loop carrying an optional)
            Some(Value::Tensor(_) | Value::Sequence { .. }) => true,
            Some(v) => bail!("OptionalHasElement input is a {}", v.kind_name()),
        };
        out1(Tensor::scalar(has))
    })
}

fn build_optional_get_element(_node: &Node) -> Result<Box<dyn Kernel>> {
    kernel(move |_cx, inputs| match inputs.first().copied().flatten() {
        Some(Value::Optional { value: Some(v), .. }) => Ok(vec![(**v).clone()]),
        Some(Value::Optional { value: None, .. }) => {
            bail!("OptionalGetElement of an empty optional")
        }
        Some(v @ (Value::Tensor(_) | Value::Sequence { .. })) => Ok(vec![v.clone()]),
        Some(v) => bail!("OptionalGetElement input is a {}", v.kind_name()),
        None => bail!("OptionalGetElement input is missing"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::AttrValue;
    use alloc::string::String;

    fn node(op: &str, opset: i64, attrs: Vec<(&str, AttrValue)>) -> Node {
        Node {
            name: String::new(),
            op_type: op.into(),
            domain: String::new(),
            opset,
            inputs: vec![],
            outputs: vec![],
            attrs: attrs.into_iter().map(|(k, v)| (k.into(), v)).collect(),
            implicit_inputs: vec![],
        }
    }

    fn run(
        op: &str,
        opset: i64,
        attrs: Vec<(&str, AttrValue)>,
        inputs: &[Option<&Value>],
    ) -> Result<Vec<Value>> {
        let n = node(op, opset, attrs);
        let def = KERNELS.iter().find(|d| d.op == op).unwrap();
        let k = (def.build)(&n)?;
        let cpu = crate::provider::ReferenceCpu;
        k.compute(&KernelCx::new(&cpu), inputs)
    }

    fn vec_f(shape: &[usize], v: &[f32]) -> Value {
        Value::Tensor(Tensor::from_vec(shape, v.to_vec()).unwrap())
    }

    fn items(v: &Value) -> Vec<(Vec<usize>, Vec<f32>)> {
        let Value::Sequence { items, .. } = v else {
            panic!("not a sequence")
        };
        items
            .iter()
            .map(|t| {
                let t = t.as_tensor().unwrap();
                (t.shape().to_vec(), t.to_f32_vec().unwrap())
            })
            .collect()
    }

    #[test]
    fn insert_at_and_erase() {
        let a = vec_f(&[1], &[1.0]);
        let b = vec_f(&[2], &[2.0, 3.0]);
        let s = run("SequenceConstruct", 11, vec![], &[Some(&a), Some(&b)]).unwrap();
        let c = vec_f(&[1], &[9.0]);
        let pos = Value::Tensor(Tensor::scalar(-2i64));
        // inserting at -2 of a length-2 sequence puts c first
        let s2 = run(
            "SequenceInsert",
            11,
            vec![],
            &[Some(&s[0]), Some(&c), Some(&pos)],
        )
        .unwrap();
        assert_eq!(
            items(&s2[0]),
            vec![
                (vec![1], vec![9.0]),
                (vec![1], vec![1.0]),
                (vec![2], vec![2.0, 3.0])
            ]
        );
        let last = Value::Tensor(Tensor::scalar(-1i32));
        let at = run("SequenceAt", 11, vec![], &[Some(&s2[0]), Some(&last)]).unwrap();
        assert_eq!(
            at[0].as_tensor().unwrap().to_f32_vec().unwrap(),
            vec![2.0, 3.0]
        );
        let er = run("SequenceErase", 11, vec![], &[Some(&s2[0])]).unwrap();
        assert_eq!(items(&er[0]).len(), 2);
        let len = run("SequenceLength", 11, vec![], &[Some(&er[0])]).unwrap();
        assert_eq!(len[0].as_tensor().unwrap().to_i64_vec().unwrap(), vec![2]);
        // out of range positions are errors, not panics
        let far = Value::Tensor(Tensor::scalar(5i64));
        assert!(run("SequenceAt", 11, vec![], &[Some(&s2[0]), Some(&far)]).is_err());
        // element types must agree
        let i = Value::Tensor(Tensor::scalar(1i64));
        assert!(run("SequenceInsert", 11, vec![], &[Some(&s[0]), Some(&i)]).is_err());
    }

    #[test]
    fn split_to_sequence_sizes() {
        let x = vec_f(&[5], &[0.0, 1.0, 2.0, 3.0, 4.0]);
        // scalar split 2 over a dim of 5: [2, 2, 1]
        let k = Value::Tensor(Tensor::scalar(2i64));
        let s = run("SplitToSequence", 11, vec![], &[Some(&x), Some(&k)]).unwrap();
        assert_eq!(
            items(&s[0]),
            vec![
                (vec![2], vec![0.0, 1.0]),
                (vec![2], vec![2.0, 3.0]),
                (vec![1], vec![4.0])
            ]
        );
        // no split, keepdims=0: five scalars
        let s = run(
            "SplitToSequence",
            11,
            vec![("keepdims", AttrValue::Int(0))],
            &[Some(&x)],
        )
        .unwrap();
        assert_eq!(items(&s[0])[3], (vec![], vec![3.0]));
        let bad = Value::Tensor(Tensor::from_vec(&[2], vec![1i64, 1]).unwrap());
        assert!(run("SplitToSequence", 11, vec![], &[Some(&x), Some(&bad)]).is_err());
    }

    #[test]
    fn concat_from_sequence_stack() {
        let a = vec_f(&[2], &[1.0, 2.0]);
        let b = vec_f(&[2], &[3.0, 4.0]);
        let s = run("SequenceConstruct", 11, vec![], &[Some(&a), Some(&b)]).unwrap();
        let y = run(
            "ConcatFromSequence",
            11,
            vec![
                ("axis", AttrValue::Int(-1)),
                ("new_axis", AttrValue::Int(1)),
            ],
            &[Some(&s[0])],
        )
        .unwrap();
        let t = y[0].as_tensor().unwrap();
        // stacking along the new last axis pairs the items elementwise
        assert_eq!(t.shape(), &[2, 2]);
        assert_eq!(t.to_f32_vec().unwrap(), vec![1.0, 3.0, 2.0, 4.0]);
    }

    #[test]
    fn optionals() {
        let x = vec_f(&[1], &[5.0]);
        let o = run("Optional", 15, vec![], &[Some(&x)]).unwrap();
        let h = run("OptionalHasElement", 18, vec![], &[Some(&o[0])]).unwrap();
        assert_eq!(h[0].as_tensor().unwrap().to_i64_vec().unwrap(), vec![1]);
        let g = run("OptionalGetElement", 18, vec![], &[Some(&o[0])]).unwrap();
        assert_eq!(g[0].as_tensor().unwrap().to_f32_vec().unwrap(), vec![5.0]);
        let h = run("OptionalHasElement", 18, vec![], &[None]).unwrap();
        assert_eq!(h[0].as_tensor().unwrap().to_i64_vec().unwrap(), vec![0]);
        let empty = Value::Optional {
            elem: tensor_type(DataType::Float),
            value: None,
        };
        assert!(run("OptionalGetElement", 18, vec![], &[Some(&empty)]).is_err());
        assert!(run("Optional", 15, vec![], &[None]).is_err());
    }
}
