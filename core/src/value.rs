//! Runtime values (tensors, sequences, maps, optionals) and their static type descriptions.

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::tensor::Tensor;

/// One dimension of a declared or inferred shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Dim {
    Known(usize),
    Sym(String),
    Unknown,
}

impl fmt::Display for Dim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Dim::Known(n) => write!(f, "{n}"),
            Dim::Sym(s) => f.write_str(s),
            Dim::Unknown => f.write_str("?"),
        }
    }
}

/// The static type of a value, as declared in the model or inferred.
#[derive(Clone, Debug, PartialEq)]
pub enum TypeInfo {
    Tensor {
        dtype: Option<DataType>,
        /// `None` when the rank is unknown.
        shape: Option<Vec<Dim>>,
    },
    Sequence(Box<TypeInfo>),
    Map {
        key: DataType,
        value: Box<TypeInfo>,
    },
    Optional(Box<TypeInfo>),
    Unknown,
}

impl TypeInfo {
    pub fn tensor(dtype: DataType, shape: Vec<Dim>) -> TypeInfo {
        TypeInfo::Tensor {
            dtype: Some(dtype),
            shape: Some(shape),
        }
    }
    pub fn tensor_dtype(&self) -> Option<DataType> {
        match self {
            TypeInfo::Tensor { dtype, .. } => *dtype,
            _ => None,
        }
    }
    pub fn tensor_shape(&self) -> Option<&[Dim]> {
        match self {
            TypeInfo::Tensor { shape, .. } => shape.as_deref(),
            _ => None,
        }
    }
}

impl fmt::Display for TypeInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TypeInfo::Tensor { dtype, shape } => {
                match dtype {
                    Some(d) => write!(f, "{d}")?,
                    None => f.write_str("?")?,
                }
                match shape {
                    Some(s) => {
                        f.write_str("[")?;
                        for (i, d) in s.iter().enumerate() {
                            if i > 0 {
                                f.write_str(",")?;
                            }
                            write!(f, "{d}")?;
                        }
                        f.write_str("]")
                    }
                    None => f.write_str("[...]"),
                }
            }
            TypeInfo::Sequence(e) => write!(f, "seq({e})"),
            TypeInfo::Map { key, value } => write!(f, "map({key},{value})"),
            TypeInfo::Optional(e) => write!(f, "optional({e})"),
            TypeInfo::Unknown => f.write_str("?"),
        }
    }
}

/// A map value (ai.onnx.ml): keys as a 1-D tensor (int64 or string), one value per key.
#[derive(Clone, Debug)]
pub struct MapValue {
    pub keys: Tensor,
    pub values: Vec<Value>,
}

/// A runtime value.
#[derive(Clone, Debug)]
pub enum Value {
    Tensor(Tensor),
    /// A sequence; `elem` is its element type (needed for empty sequences).
    Sequence {
        elem: TypeInfo,
        items: Vec<Value>,
    },
    Map(MapValue),
    /// An optional: `None` is an empty optional of type `elem`.
    Optional {
        elem: TypeInfo,
        value: Option<Box<Value>>,
    },
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Self {
        Value::Tensor(t)
    }
}

impl Value {
    /// Calls `f` on every tensor inside (sequence items, map keys and values, an optional's
    /// content), stopping at the first error.
    pub fn try_for_each_tensor_mut(
        &mut self,
        f: &mut dyn FnMut(&mut Tensor) -> crate::error::Result<()>,
    ) -> crate::error::Result<()> {
        match self {
            Value::Tensor(t) => f(t),
            Value::Sequence { items, .. } => items
                .iter_mut()
                .try_for_each(|v| v.try_for_each_tensor_mut(f)),
            Value::Map(m) => {
                f(&mut m.keys)?;
                m.values
                    .iter_mut()
                    .try_for_each(|v| v.try_for_each_tensor_mut(f))
            }
            Value::Optional { value, .. } => match value {
                Some(b) => b.try_for_each_tensor_mut(f),
                None => Ok(()),
            },
        }
    }

    pub fn as_tensor(&self) -> Result<&Tensor> {
        match self {
            Value::Tensor(t) => Ok(t),
            other => Err(Error::Other(alloc::format!(
                "expected a tensor, got {}",
                other.kind_name()
            ))),
        }
    }
    pub fn into_tensor(self) -> Result<Tensor> {
        match self {
            Value::Tensor(t) => Ok(t),
            other => Err(Error::Other(alloc::format!(
                "expected a tensor, got {}",
                other.kind_name()
            ))),
        }
    }
    pub fn kind_name(&self) -> &'static str {
        match self {
            Value::Tensor(_) => "tensor",
            Value::Sequence { .. } => "sequence",
            Value::Map(_) => "map",
            Value::Optional { .. } => "optional",
        }
    }
    /// The value's type as [`TypeInfo`] (concrete shape for tensors).
    pub fn type_info(&self) -> TypeInfo {
        match self {
            Value::Tensor(t) => TypeInfo::tensor(
                t.dtype(),
                t.shape().iter().map(|&d| Dim::Known(d)).collect(),
            ),
            Value::Sequence { elem, .. } => TypeInfo::Sequence(Box::new(elem.clone())),
            Value::Map(m) => TypeInfo::Map {
                key: m.keys.dtype(),
                value: Box::new(
                    m.values
                        .first()
                        .map(|v| v.type_info())
                        .unwrap_or(TypeInfo::Unknown),
                ),
            },
            Value::Optional { elem, .. } => TypeInfo::Optional(Box::new(elem.clone())),
        }
    }
    /// Bytes held (tensors only count their elements).
    pub fn byte_size(&self) -> usize {
        match self {
            Value::Tensor(t) => t.byte_size(),
            Value::Sequence { items, .. } => items.iter().map(|v| v.byte_size()).sum(),
            Value::Map(m) => {
                m.keys.byte_size() + m.values.iter().map(|v| v.byte_size()).sum::<usize>()
            }
            Value::Optional { value, .. } => value.as_ref().map_or(0, |v| v.byte_size()),
        }
    }
}

/// Name of a value kind, for error messages.
pub fn describe(v: &Value) -> String {
    match v {
        Value::Tensor(t) => alloc::format!("{} tensor {:?}", t.dtype(), t.shape()),
        other => String::from(other.kind_name()),
    }
}
