//! Model conversions on the ONNX protobuf.
//!
//! [`to_float16`] turns a float32 model into its float16 form, as exporters' "fp16" options do:
//! float32 initializers, graph inputs, outputs and value_info, Constant values and Casts to
//! float become float16, in the main graph and in every subgraph. Resize's roi and scales stay
//! float32, as ONNX requires. Other float32-only operands (a ConstantOfShape value meant for a
//! float32 output, a dtype attribute) are not rewritten: such a model fails to load with an
//! error naming the node, never a wrong answer. Weights stored as external data are an error.

use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;

use prost::Message;

use crate::proto::{type_proto, GraphProto, ModelProto, TensorProto};
use crate::{Error, Result};

const FLOAT: i32 = 1;
const FLOAT16: i32 = 10;

/// The float16 form of `model` (ONNX protobuf bytes in, bytes out).
pub fn to_float16(model: &[u8]) -> Result<Vec<u8>> {
    let mut m = ModelProto::decode(model).map_err(|e| Error::Decode(e.to_string()))?;
    let g = m
        .graph
        .as_mut()
        .ok_or_else(|| Error::InvalidModel("the model has no graph".into()))?;
    halve_graph(g)?;
    Ok(m.encode_to_vec())
}

fn halve_graph(g: &mut GraphProto) -> Result<()> {
    // Resize's roi (input 1) and scales (input 2) are float32 whatever X is
    let mut keep: Vec<String> = Vec::new();
    for n in &g.node {
        if n.op_type == "Resize" {
            keep.extend(
                n.input
                    .iter()
                    .skip(1)
                    .take(2)
                    .filter(|s| !s.is_empty())
                    .cloned(),
            );
        }
    }
    for t in &mut g.initializer {
        if !keep.contains(&t.name) {
            halve_tensor(t)?;
        }
    }
    for n in &mut g.node {
        let keep_out = n.output.iter().any(|o| keep.contains(o));
        for a in &mut n.attribute {
            if n.op_type == "Cast" && a.name == "to" && a.i == FLOAT as i64 {
                a.i = FLOAT16 as i64;
            }
            if n.op_type == "Constant" && !keep_out {
                if let Some(t) = a.t.as_mut() {
                    halve_tensor(t)?;
                }
            }
            if let Some(sub) = a.g.as_mut() {
                halve_graph(sub)?;
            }
            for sub in &mut a.graphs {
                halve_graph(sub)?;
            }
        }
    }
    for vi in g
        .input
        .iter_mut()
        .chain(g.output.iter_mut())
        .chain(g.value_info.iter_mut())
    {
        if keep.contains(&vi.name) {
            continue;
        }
        if let Some(type_proto::Value::TensorType(t)) =
            vi.r#type.as_mut().and_then(|t| t.value.as_mut())
        {
            if t.elem_type == FLOAT {
                t.elem_type = FLOAT16;
            }
        }
    }
    Ok(())
}

/// A float32 tensor's values as float16 (other types unchanged).
fn halve_tensor(t: &mut TensorProto) -> Result<()> {
    if t.data_type != FLOAT {
        return Ok(());
    }
    if t.data_location == 1 || !t.external_data.is_empty() {
        return Err(Error::ExternalData(format!(
            "tensor '{}' is stored outside the model: converting it to float16 is not supported",
            t.name
        )));
    }
    let vals: Vec<f32> = if !t.float_data.is_empty() {
        core::mem::take(&mut t.float_data)
    } else {
        if !t.raw_data.len().is_multiple_of(4) {
            return Err(Error::InvalidModel(format!(
                "tensor '{}': {} raw bytes are not whole float32 values",
                t.name,
                t.raw_data.len()
            )));
        }
        t.raw_data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let bytes: Vec<u8> = vals
        .iter()
        .flat_map(|v| half::f16::from_f32(*v).to_bits().to_le_bytes())
        .collect();
    t.raw_data = bytes.into();
    t.data_type = FLOAT16;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{loader, DataType};

    #[test]
    fn the_embedded_model_converts_to_float16_and_loads() {
        let m = to_float16(&crate::embedded::tiny_cnn()).unwrap();
        let model = loader::load_model(&m, &loader::NoExternalData).unwrap();
        let g = &model.graph;
        let ty = |i: usize| g.values[i].ty.to_string();
        assert!(
            ty(g.inputs[0]).starts_with("float16"),
            "{}",
            ty(g.inputs[0])
        );
        assert!(
            ty(g.outputs[0]).starts_with("float16"),
            "{}",
            ty(g.outputs[0])
        );
        let dts: Vec<DataType> = g
            .initializers
            .iter()
            .filter_map(|(_, v)| v.as_tensor().ok().map(|t| t.dtype()))
            .collect();
        assert!(dts.contains(&DataType::Float16), "{dts:?}");
        assert!(!dts.contains(&DataType::Float), "{dts:?}");
    }

    #[test]
    fn bad_bytes_are_errors() {
        assert!(to_float16(&[0xff, 0x01]).is_err());
    }
}
