//! Graph IR: nodes over numbered values, attributes decoded from the protobuf, subgraphs as
//! nested graphs that capture outer values explicitly. The executor runs only this IR.

use alloc::string::String;
use alloc::sync::Arc;
use alloc::vec::Vec;

use crate::error::{Error, NodeContext, Result};
use crate::tensor::Tensor;
use crate::value::{TypeInfo, Value};

/// Index of a value in its graph's value table.
pub type ValueId = usize;

/// A decoded attribute value.
#[derive(Clone, Debug)]
pub enum AttrValue {
    Float(f32),
    Int(i64),
    String(Vec<u8>),
    Tensor(Tensor),
    Graph(Arc<Graph>),
    Floats(Vec<f32>),
    Ints(Vec<i64>),
    Strings(Vec<Vec<u8>>),
    Tensors(Vec<Tensor>),
    Graphs(Vec<Arc<Graph>>),
    Type(TypeInfo),
    Types(Vec<TypeInfo>),
}

impl AttrValue {
    pub fn kind(&self) -> &'static str {
        match self {
            AttrValue::Float(_) => "float",
            AttrValue::Int(_) => "int",
            AttrValue::String(_) => "string",
            AttrValue::Tensor(_) => "tensor",
            AttrValue::Graph(_) => "graph",
            AttrValue::Floats(_) => "floats",
            AttrValue::Ints(_) => "ints",
            AttrValue::Strings(_) => "strings",
            AttrValue::Tensors(_) => "tensors",
            AttrValue::Graphs(_) => "graphs",
            AttrValue::Type(_) => "type",
            AttrValue::Types(_) => "types",
        }
    }
}

/// A value slot in a graph.
#[derive(Clone, Debug)]
pub struct ValueInfo {
    pub name: String,
    /// Declared (from the model) or inferred type.
    pub ty: TypeInfo,
}

/// One operator application.
#[derive(Clone, Debug)]
pub struct Node {
    pub name: String,
    pub op_type: String,
    /// Normalised domain: `""` for ai.onnx.
    pub domain: String,
    /// The opset version of `domain` this node was imported under.
    pub opset: i64,
    /// `None` for omitted optional inputs.
    pub inputs: Vec<Option<ValueId>>,
    pub outputs: Vec<Option<ValueId>>,
    pub attrs: Vec<(String, AttrValue)>,
    /// Outer values that this node's subgraphs read (If/Loop/Scan bodies).
    pub implicit_inputs: Vec<ValueId>,
}

impl Node {
    pub fn ctx(&self) -> NodeContext {
        NodeContext {
            node: self.name.clone(),
            op: self.op_type.clone(),
            domain: self.domain.clone(),
            opset: self.opset,
        }
    }

    pub fn attr(&self, name: &str) -> Option<&AttrValue> {
        self.attrs.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    fn bad_attr(&self, name: &str, want: &str, got: &AttrValue) -> Error {
        Error::node(
            &self.ctx(),
            alloc::format!("attribute '{name}' should be {want}, is {}", got.kind()),
        )
    }

    pub fn attr_i(&self, name: &str) -> Result<Option<i64>> {
        match self.attr(name) {
            None => Ok(None),
            Some(AttrValue::Int(i)) => Ok(Some(*i)),
            Some(v) => Err(self.bad_attr(name, "an int", v)),
        }
    }
    pub fn get_i(&self, name: &str, default: i64) -> Result<i64> {
        Ok(self.attr_i(name)?.unwrap_or(default))
    }
    pub fn attr_f(&self, name: &str) -> Result<Option<f32>> {
        match self.attr(name) {
            None => Ok(None),
            Some(AttrValue::Float(f)) => Ok(Some(*f)),
            Some(AttrValue::Int(i)) => Ok(Some(*i as f32)),
            Some(v) => Err(self.bad_attr(name, "a float", v)),
        }
    }
    pub fn get_f(&self, name: &str, default: f32) -> Result<f32> {
        Ok(self.attr_f(name)?.unwrap_or(default))
    }
    pub fn attr_s(&self, name: &str) -> Result<Option<String>> {
        match self.attr(name) {
            None => Ok(None),
            Some(AttrValue::String(s)) => Ok(Some(String::from_utf8_lossy(s).into_owned())),
            Some(v) => Err(self.bad_attr(name, "a string", v)),
        }
    }
    pub fn get_s(&self, name: &str, default: &str) -> Result<String> {
        Ok(self.attr_s(name)?.unwrap_or_else(|| String::from(default)))
    }
    pub fn attr_ints(&self, name: &str) -> Result<Option<Vec<i64>>> {
        match self.attr(name) {
            None => Ok(None),
            Some(AttrValue::Ints(v)) => Ok(Some(v.clone())),
            Some(AttrValue::Int(i)) => Ok(Some(alloc::vec![*i])),
            Some(v) => Err(self.bad_attr(name, "ints", v)),
        }
    }
    pub fn attr_floats(&self, name: &str) -> Result<Option<Vec<f32>>> {
        match self.attr(name) {
            None => Ok(None),
            Some(AttrValue::Floats(v)) => Ok(Some(v.clone())),
            Some(AttrValue::Float(f)) => Ok(Some(alloc::vec![*f])),
            Some(v) => Err(self.bad_attr(name, "floats", v)),
        }
    }
    pub fn attr_strings(&self, name: &str) -> Result<Option<Vec<String>>> {
        match self.attr(name) {
            None => Ok(None),
            Some(AttrValue::Strings(v)) => Ok(Some(
                v.iter()
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect(),
            )),
            Some(v) => Err(self.bad_attr(name, "strings", v)),
        }
    }
    pub fn attr_t(&self, name: &str) -> Result<Option<&Tensor>> {
        match self.attr(name) {
            None => Ok(None),
            Some(AttrValue::Tensor(t)) => Ok(Some(t)),
            Some(v) => Err(self.bad_attr(name, "a tensor", v)),
        }
    }
    pub fn attr_g(&self, name: &str) -> Result<Option<&Arc<Graph>>> {
        match self.attr(name) {
            None => Ok(None),
            Some(AttrValue::Graph(g)) => Ok(Some(g)),
            Some(v) => Err(self.bad_attr(name, "a graph", v)),
        }
    }
    /// All subgraphs this node carries, with their attribute names.
    pub fn subgraphs(&self) -> impl Iterator<Item = (&str, &Arc<Graph>)> {
        self.attrs.iter().flat_map(|(n, v)| {
            let v: Vec<&Arc<Graph>> = match v {
                AttrValue::Graph(g) => alloc::vec![g],
                AttrValue::Graphs(gs) => gs.iter().collect(),
                _ => Vec::new(),
            };
            v.into_iter().map(move |g| (n.as_str(), g))
        })
    }
    /// Number of present inputs.
    pub fn input_count(&self) -> usize {
        self.inputs.iter().filter(|i| i.is_some()).count()
    }
}

/// A graph: the value table, the nodes in topological order, the inputs/outputs, the
/// initializers, and the outer values it captures (for subgraphs).
#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub name: String,
    pub values: Vec<ValueInfo>,
    /// Topologically sorted.
    pub nodes: Vec<Node>,
    /// Inputs a caller must (or may) feed, in declaration order (initializers excluded).
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// Constant values (initializers, folded constants).
    pub initializers: Vec<(ValueId, Value)>,
    /// For subgraphs: (outer name, local id) of each value read from an enclosing graph.
    pub captures: Vec<(String, ValueId)>,
}

impl Graph {
    pub fn value_name(&self, id: ValueId) -> &str {
        &self.values[id].name
    }
    pub fn find_value(&self, name: &str) -> Option<ValueId> {
        self.values.iter().position(|v| v.name == name)
    }
    /// Bytes held by the initializers.
    pub fn initializer_bytes(&self) -> usize {
        self.initializers.iter().map(|(_, v)| v.byte_size()).sum()
    }
    /// Visits this graph's nodes and, recursively, those of its subgraphs.
    pub fn walk_nodes<'a>(&'a self, f: &mut dyn FnMut(&'a Node, usize)) {
        self.walk_inner(f, 0)
    }
    fn walk_inner<'a>(&'a self, f: &mut dyn FnMut(&'a Node, usize), depth: usize) {
        for n in &self.nodes {
            f(n, depth);
            for (_, g) in n.subgraphs() {
                g.walk_inner(f, depth + 1);
            }
        }
    }
}
