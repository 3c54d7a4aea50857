//! ONNX loading: protobuf bytes to our graph IR. Decodes initializers (typed fields, raw data,
//! external data through a host-supplied source), opset imports, model-local functions (inlined),
//! subgraph attributes and their captured outer values.

use alloc::borrow::ToOwned;
use alloc::boxed::Box;
use alloc::string::{String, ToString};
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;
use hashbrown::{HashMap, HashSet};

use half::{bf16, f16};
use prost::Message;

use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::ir::{AttrValue, Graph, Node, ValueId, ValueInfo};
use crate::proto;
use crate::tensor::{numel, Data, Tensor};
use crate::value::{Dim, MapValue, TypeInfo, Value};

/// Newest opset per domain that nxrt knows.
pub const MAX_OPSETS: &[(&str, i64)] = &[("", 28), ("ai.onnx.ml", 5), ("com.microsoft", 1)];

/// Supplies the bytes of external-data files. Paths reaching this trait have been checked to be
/// relative and free of `..`; implementations must still confine reads to the model's folder.
pub trait ExternalDataSource {
    /// Reads `length` bytes (or to the end when `None`) at `offset` of file `location`.
    fn read(&self, location: &str, offset: u64, length: Option<u64>) -> Result<Vec<u8>>;
    /// The loader is done with these bytes of the model's own buffer (an initializer's raw data,
    /// already copied into its tensor). A target that mapped the file may drop those pages now,
    /// so peak memory holds the weights once, not twice. The default does nothing.
    fn release(&self, _bytes: &[u8]) {}
}

/// A source for models loaded from bytes: any external reference is an error.
pub struct NoExternalData;

impl ExternalDataSource for NoExternalData {
    fn read(&self, location: &str, _: u64, _: Option<u64>) -> Result<Vec<u8>> {
        Err(Error::ExternalData(alloc::format!(
            "model references external file '{location}' but was loaded from bytes without a folder"
        )))
    }
}

/// Rejects absolute paths and `..` components in an external-data location.
pub fn check_external_location(location: &str) -> Result<()> {
    let bad = location.is_empty()
        || location.starts_with('/')
        || location.starts_with('\\')
        || location.contains('\0')
        || location.as_bytes().get(1) == Some(&b':')
        || location.split(['/', '\\']).any(|c| c == "..");
    if bad {
        return Err(Error::ExternalData(alloc::format!(
            "location '{location}' is absolute or escapes the model's folder"
        )));
    }
    Ok(())
}

/// Normalised domain name: ai.onnx is `""`.
pub fn norm_domain(d: &str) -> &str {
    if d == "ai.onnx" {
        ""
    } else {
        d
    }
}

/// A loaded model: metadata plus the main graph.
#[derive(Clone, Debug)]
pub struct Model {
    pub ir_version: i64,
    pub producer: String,
    /// (normalised domain, version)
    pub opsets: Vec<(String, i64)>,
    pub graph: Graph,
    pub metadata: Vec<(String, String)>,
}

impl Model {
    pub fn opset(&self, domain: &str) -> Option<i64> {
        let d = norm_domain(domain);
        self.opsets.iter().find(|(n, _)| n == d).map(|(_, v)| *v)
    }
}

/// Decodes a model from protobuf bytes.
pub fn load_model(bytes: &[u8], ext: &dyn ExternalDataSource) -> Result<Model> {
    let mp = proto::ModelProto::decode(bytes).map_err(|e| Error::Decode(e.to_string()))?;
    model_from_proto(mp, ext)
}

/// The external-data files a model's tensors name (each once, in first-use order): what a
/// host that cannot read a folder (a browser) must fetch before [`load_model`]. Every location
/// is checked as the loader checks it ([`check_external_location`]).
pub fn external_locations(bytes: &[u8]) -> Result<Vec<String>> {
    fn tensor(t: &proto::TensorProto, out: &mut Vec<String>) -> Result<()> {
        if t.data_location == 1 {
            if let Some(e) = t.external_data.iter().find(|e| e.key == "location") {
                check_external_location(&e.value)?;
                if !out.contains(&e.value) {
                    out.push(e.value.clone());
                }
            }
        }
        Ok(())
    }
    fn sparse(t: &proto::SparseTensorProto, out: &mut Vec<String>) -> Result<()> {
        for p in [&t.values, &t.indices].into_iter().flatten() {
            tensor(p, out)?;
        }
        Ok(())
    }
    fn nodes(ns: &[proto::NodeProto], out: &mut Vec<String>) -> Result<()> {
        for n in ns {
            for a in &n.attribute {
                for t in a.t.iter().chain(&a.tensors) {
                    tensor(t, out)?;
                }
                for t in a.sparse_tensor.iter().chain(&a.sparse_tensors) {
                    sparse(t, out)?;
                }
                for g in a.g.iter().map(|g| &**g).chain(&a.graphs) {
                    graph(g, out)?;
                }
            }
        }
        Ok(())
    }
    fn graph(g: &proto::GraphProto, out: &mut Vec<String>) -> Result<()> {
        for t in &g.initializer {
            tensor(t, out)?;
        }
        for t in &g.sparse_initializer {
            sparse(t, out)?;
        }
        nodes(&g.node, out)
    }
    let mp = proto::ModelProto::decode(bytes).map_err(|e| Error::Decode(e.to_string()))?;
    let mut out = Vec::new();
    if let Some(g) = &mp.graph {
        graph(g, &mut out)?;
    }
    for f in &mp.functions {
        nodes(&f.node, &mut out)?;
    }
    Ok(out)
}

/// Decodes a model from a shared buffer (a mapped file, say) without copying its raw weights:
/// each initializer's bytes stay in `bytes` until copied into its tensor, after which the
/// loader calls [`ExternalDataSource::release`] on them.
pub fn load_model_shared(bytes: bytes::Bytes, ext: &dyn ExternalDataSource) -> Result<Model> {
    let mp = proto::ModelProto::decode(bytes).map_err(|e| Error::Decode(e.to_string()))?;
    model_from_proto(mp, ext)
}

/// Builds the IR from a decoded `ModelProto`.
pub fn model_from_proto(mp: proto::ModelProto, ext: &dyn ExternalDataSource) -> Result<Model> {
    let gp = mp
        .graph
        .ok_or_else(|| Error::InvalidModel("model has no graph".into()))?;
    let opsets = opset_table(&mp.opset_import)?;
    let functions: HashMap<(String, String), proto::FunctionProto> = mp
        .functions
        .into_iter()
        .map(|f| ((norm_domain(&f.domain).to_owned(), f.name.clone()), f))
        .collect();
    let cx = LoadCx {
        ext,
        functions: &functions,
        fresh: core::cell::Cell::new(0),
    };
    let graph = cx.build_graph(gp, &opsets, None)?;
    Ok(Model {
        ir_version: mp.ir_version,
        producer: [mp.producer_name, mp.producer_version]
            .join(" ")
            .trim()
            .to_owned(),
        opsets,
        graph,
        metadata: mp
            .metadata_props
            .into_iter()
            .map(|e| (e.key, e.value))
            .collect(),
    })
}

fn opset_table(imports: &[proto::OperatorSetIdProto]) -> Result<Vec<(String, i64)>> {
    let mut out: Vec<(String, i64)> = Vec::new();
    for o in imports {
        let d = norm_domain(&o.domain).to_owned();
        if let Some((_, max)) = MAX_OPSETS.iter().find(|(n, _)| *n == d) {
            if o.version > *max {
                return Err(Error::OpsetTooNew {
                    domain: d,
                    version: o.version,
                    max: *max,
                });
            }
        }
        if o.version < 1 {
            return Err(Error::InvalidModel(alloc::format!(
                "opset import of domain '{}' has version {}",
                o.domain,
                o.version
            )));
        }
        out.retain(|(n, _)| *n != d);
        out.push((d, o.version));
    }
    if !out.iter().any(|(d, _)| d.is_empty()) {
        // IR < 3 models have no opset imports: ONNX treats them as opset 1.
        out.push((String::new(), 1));
    }
    Ok(out)
}

struct LoadCx<'a> {
    ext: &'a dyn ExternalDataSource,
    functions: &'a HashMap<(String, String), proto::FunctionProto>,
    fresh: core::cell::Cell<usize>,
}

/// Scope of names visible while building a (sub)graph.
struct Scope<'p> {
    names: HashMap<String, ValueId>,
    parent: Option<&'p Scope<'p>>,
}

impl Scope<'_> {
    fn visible(&self, name: &str) -> bool {
        self.names.contains_key(name) || self.parent.is_some_and(|p| p.visible(name))
    }
}

struct GraphBuilder {
    values: Vec<ValueInfo>,
    names: HashMap<String, ValueId>,
    captures: Vec<(String, ValueId)>,
}

impl GraphBuilder {
    fn add(&mut self, name: &str, ty: TypeInfo) -> ValueId {
        let id = self.values.len();
        self.values.push(ValueInfo {
            name: name.to_owned(),
            ty,
        });
        self.names.insert(name.to_owned(), id);
        id
    }
}

impl LoadCx<'_> {
    fn build_graph(
        &self,
        gp: proto::GraphProto,
        opsets: &[(String, i64)],
        parent: Option<&Scope<'_>>,
    ) -> Result<Graph> {
        let mut b = GraphBuilder {
            values: Vec::new(),
            names: HashMap::new(),
            captures: Vec::new(),
        };
        let mut declared: HashMap<String, TypeInfo> = HashMap::new();
        for vi in gp.value_info.iter().chain(gp.output.iter()) {
            if let Some(t) = &vi.r#type {
                declared.insert(vi.name.clone(), type_from_proto(t)?);
            }
        }
        // Initializers.
        let mut initializers = Vec::new();
        for tp in gp.initializer {
            let name = tp.name.clone();
            if name.is_empty() {
                return Err(Error::InvalidModel("initializer without a name".into()));
            }
            let t = tensor_from_proto(&tp, self.ext)
                .map_err(|e| prefix_err(e, &alloc::format!("initializer '{name}'")))?;
            if !tp.raw_data.is_empty() {
                self.ext.release(&tp.raw_data);
            }
            let id = b.add(&name, Value::Tensor(t.clone()).type_info());
            initializers.push((id, Value::Tensor(t)));
        }
        for sp in gp.sparse_initializer {
            let t = sparse_to_dense(&sp, self.ext)?;
            let name = sp
                .values
                .as_ref()
                .map(|v| v.name.clone())
                .unwrap_or_default();
            let id = b.add(&name, Value::Tensor(t.clone()).type_info());
            initializers.push((id, Value::Tensor(t)));
        }
        // Inputs (an input that also has an initializer keeps the initializer as its default
        // and is not a required feed).
        let mut inputs = Vec::new();
        for vi in &gp.input {
            let ty = match &vi.r#type {
                Some(t) => type_from_proto(t)?,
                None => TypeInfo::Unknown,
            };
            if let Some(&id) = b.names.get(&vi.name) {
                if initializers.iter().any(|(i, _)| *i == id) {
                    continue;
                }
            }
            let id = b.add(&vi.name, ty);
            inputs.push(id);
        }
        // Expand model-local functions, then build nodes.
        let mut protos = Vec::with_capacity(gp.node.len());
        for np in gp.node {
            self.expand(np, opsets, &mut protos, 0)?;
        }
        // Every name produced in this graph.
        let mut produced: HashSet<String> = HashSet::new();
        for (np, _) in &protos {
            for o in &np.output {
                if !o.is_empty() {
                    produced.insert(o.clone());
                }
            }
        }
        let scope_names = b.names.clone();
        let mut nodes = Vec::with_capacity(protos.len());
        for (np, node_opsets) in protos {
            let domain = norm_domain(&np.domain).to_owned();
            let opset = node_opsets
                .iter()
                .find(|(d, _)| *d == domain)
                .map(|(_, v)| *v)
                .ok_or_else(|| {
                    Error::Unsupported {
                        ctx: crate::error::NodeContext {
                            node: np.name.clone(),
                            op: np.op_type.clone(),
                            domain: domain.clone(),
                            opset: 0,
                        },
                        detail: alloc::format!(
                            "domain '{}' is not imported by the model (and no model-local function '{}' exists)",
                            if domain.is_empty() { "ai.onnx" } else { &domain },
                            np.op_type
                        ),
                    }
                })?;
            // Subgraph attributes see this graph's names (all of them, as ONNX resolves by name).
            let mut sub_scope_names = scope_names.clone();
            for p in &produced {
                sub_scope_names.entry(p.clone()).or_insert(usize::MAX);
            }
            let sub_scope = Scope {
                names: sub_scope_names,
                parent,
            };
            let mut attrs = Vec::with_capacity(np.attribute.len());
            let mut implicit: Vec<String> = Vec::new();
            for a in np.attribute {
                let name = a.name.clone();
                let v = self.attr_value(a, &node_opsets, &sub_scope, &mut implicit)?;
                attrs.push((name, v));
            }
            let name = if np.name.is_empty() {
                // unnamed nodes are named after their first output, so errors can point at them
                alloc::format!(
                    "{}->{}",
                    np.op_type,
                    np.output
                        .iter()
                        .find(|o| !o.is_empty())
                        .map_or("", |o| o.as_str())
                )
            } else {
                np.name
            };
            let mut node = Node {
                name,
                op_type: np.op_type,
                domain,
                opset,
                inputs: Vec::with_capacity(np.input.len()),
                outputs: Vec::with_capacity(np.output.len()),
                attrs,
                implicit_inputs: Vec::new(),
            };
            for i in &np.input {
                if i.is_empty() {
                    node.inputs.push(None);
                } else {
                    node.inputs
                        .push(Some(self.resolve(&mut b, i, &produced, parent)?));
                }
            }
            for i in &implicit {
                let id = self.resolve(&mut b, i, &produced, parent)?;
                if !node.implicit_inputs.contains(&id) {
                    node.implicit_inputs.push(id);
                }
            }
            for o in &np.output {
                if o.is_empty() {
                    node.outputs.push(None);
                    continue;
                }
                let id = match b.names.get(o) {
                    Some(&id) => id, // created earlier as a forward reference
                    None => b.add(o, declared.get(o).cloned().unwrap_or(TypeInfo::Unknown)),
                };
                node.outputs.push(Some(id));
            }
            nodes.push(node);
        }
        let mut outputs = Vec::new();
        for vi in &gp.output {
            let id = self.resolve(&mut b, &vi.name, &produced, parent)?;
            if let Some(t) = &vi.r#type {
                if matches!(b.values[id].ty, TypeInfo::Unknown) {
                    b.values[id].ty = type_from_proto(t)?;
                }
            }
            outputs.push(id);
        }
        for (name, ty) in declared {
            if let Some(&id) = b.names.get(&name) {
                if matches!(b.values[id].ty, TypeInfo::Unknown) {
                    b.values[id].ty = ty;
                }
            }
        }
        let nodes = topo_sort(nodes, &b.values)?;
        Ok(Graph {
            name: gp.name,
            values: b.values,
            nodes,
            inputs,
            outputs,
            initializers,
            captures: b.captures,
        })
    }

    /// Looks a name up in this graph, else registers it as captured from an outer scope.
    fn resolve(
        &self,
        b: &mut GraphBuilder,
        name: &str,
        produced: &HashSet<String>,
        parent: Option<&Scope<'_>>,
    ) -> Result<ValueId> {
        if let Some(&id) = b.names.get(name) {
            return Ok(id);
        }
        if produced.contains(name) {
            // produced by a later node (the model is not sorted): forward reference
            return Ok(b.add(name, TypeInfo::Unknown));
        }
        if parent.is_some_and(|p| p.visible(name)) {
            let id = b.add(name, TypeInfo::Unknown);
            b.captures.push((name.to_owned(), id));
            return Ok(id);
        }
        Err(Error::InvalidModel(alloc::format!(
            "value '{name}' is used but never defined"
        )))
    }

    fn attr_value(
        &self,
        a: proto::AttributeProto,
        opsets: &[(String, i64)],
        scope: &Scope<'_>,
        implicit: &mut Vec<String>,
    ) -> Result<AttrValue> {
        use proto::attr_type as at;
        if !a.ref_attr_name.is_empty() {
            return Err(Error::InvalidModel(alloc::format!(
                "attribute '{}' refers to '{}' outside a function",
                a.name,
                a.ref_attr_name
            )));
        }
        let mut sub = |g: proto::GraphProto| -> Result<Arc<Graph>> {
            let g = self.build_graph(g, opsets, Some(scope))?;
            for (n, _) in &g.captures {
                if !implicit.contains(n) {
                    implicit.push(n.clone());
                }
            }
            Ok(Arc::new(g))
        };
        Ok(match a.r#type {
            at::FLOAT => AttrValue::Float(a.f),
            at::INT => AttrValue::Int(a.i),
            at::STRING => AttrValue::String(a.s),
            at::TENSOR => AttrValue::Tensor(tensor_from_proto(
                a.t.as_ref()
                    .ok_or_else(|| Error::InvalidModel("tensor attribute without tensor".into()))?,
                self.ext,
            )?),
            at::GRAPH => AttrValue::Graph(sub(*a
                .g
                .ok_or_else(|| Error::InvalidModel("graph attribute without graph".into()))?)?),
            at::FLOATS => AttrValue::Floats(a.floats),
            at::INTS => AttrValue::Ints(a.ints),
            at::STRINGS => AttrValue::Strings(a.strings),
            at::TENSORS => AttrValue::Tensors(
                a.tensors
                    .iter()
                    .map(|t| tensor_from_proto(t, self.ext))
                    .collect::<Result<_>>()?,
            ),
            at::GRAPHS => {
                AttrValue::Graphs(a.graphs.into_iter().map(&mut sub).collect::<Result<_>>()?)
            }
            at::SPARSE_TENSOR => AttrValue::Tensor(sparse_to_dense(
                a.sparse_tensor
                    .as_ref()
                    .ok_or_else(|| Error::InvalidModel("sparse attribute without tensor".into()))?,
                self.ext,
            )?),
            at::TYPE_PROTO => {
                AttrValue::Type(type_from_proto(a.tp.as_ref().ok_or_else(|| {
                    Error::InvalidModel("type attribute without type".into())
                })?)?)
            }
            at::TYPE_PROTOS => AttrValue::Types(
                a.type_protos
                    .iter()
                    .map(type_from_proto)
                    .collect::<Result<_>>()?,
            ),
            // IR < 0.0.2 had no type field: infer it from what is set.
            at::UNDEFINED => {
                if !a.ints.is_empty() {
                    AttrValue::Ints(a.ints)
                } else if !a.floats.is_empty() {
                    AttrValue::Floats(a.floats)
                } else if !a.strings.is_empty() {
                    AttrValue::Strings(a.strings)
                } else if !a.s.is_empty() {
                    AttrValue::String(a.s)
                } else if a.f != 0.0 {
                    AttrValue::Float(a.f)
                } else {
                    AttrValue::Int(a.i)
                }
            }
            other => {
                return Err(Error::InvalidModel(alloc::format!(
                    "attribute '{}' has unknown type {other}",
                    a.name
                )))
            }
        })
    }

    /// Inlines calls to model-local functions (recursively), renaming their internal values.
    fn expand(
        &self,
        np: proto::NodeProto,
        opsets: &[(String, i64)],
        out: &mut Vec<(proto::NodeProto, Vec<(String, i64)>)>,
        depth: usize,
    ) -> Result<()> {
        let key = (norm_domain(&np.domain).to_owned(), np.op_type.clone());
        let Some(f) = self.functions.get(&key) else {
            out.push((np, opsets.to_vec()));
            return Ok(());
        };
        if depth > 32 {
            return Err(Error::InvalidModel(alloc::format!(
                "function '{}' expands recursively",
                f.name
            )));
        }
        let fopsets = if f.opset_import.is_empty() {
            opsets.to_vec()
        } else {
            opset_table(&f.opset_import)?
        };
        let n = self.fresh.get();
        self.fresh.set(n + 1);
        let prefix = alloc::format!("{}__fn{}__", np.name, n);
        let mut rename: HashMap<String, String> = HashMap::new();
        for (i, formal) in f.input.iter().enumerate() {
            rename.insert(formal.clone(), np.input.get(i).cloned().unwrap_or_default());
        }
        for (i, formal) in f.output.iter().enumerate() {
            rename.insert(
                formal.clone(),
                np.output.get(i).cloned().unwrap_or_default(),
            );
        }
        // Attribute values: the call's, else the function's defaults.
        let mut attrs: HashMap<String, proto::AttributeProto> = HashMap::new();
        for a in &f.attribute_proto {
            attrs.insert(a.name.clone(), a.clone());
        }
        for a in &np.attribute {
            attrs.insert(a.name.clone(), a.clone());
        }
        for inner in &f.node {
            let mut m = inner.clone();
            let map = |s: &String, rename: &HashMap<String, String>| -> String {
                if s.is_empty() {
                    return String::new();
                }
                rename
                    .get(s)
                    .cloned()
                    .unwrap_or_else(|| alloc::format!("{prefix}{s}"))
            };
            m.input = m.input.iter().map(|s| map(s, &rename)).collect();
            m.output = m.output.iter().map(|s| map(s, &rename)).collect();
            m.name = alloc::format!("{prefix}{}", m.name);
            let mut new_attrs = Vec::with_capacity(m.attribute.len());
            for a in m.attribute {
                if a.ref_attr_name.is_empty() {
                    new_attrs.push(a);
                } else if let Some(v) = attrs.get(&a.ref_attr_name) {
                    let mut v = v.clone();
                    v.name = a.name.clone();
                    new_attrs.push(v);
                } // else: the attribute is absent in the caller, so it is omitted
            }
            m.attribute = new_attrs;
            self.expand(m, &fopsets, out, depth + 1)?;
        }
        Ok(())
    }
}

fn prefix_err(e: Error, what: &str) -> Error {
    match e {
        Error::ExternalData(d) => Error::ExternalData(alloc::format!("{what}: {d}")),
        Error::InvalidModel(d) => Error::InvalidModel(alloc::format!("{what}: {d}")),
        Error::Shape(d) => Error::InvalidModel(alloc::format!("{what}: {d}")),
        e => e,
    }
}

/// Kahn's algorithm over value dependencies; errors on cycles.
fn topo_sort(nodes: Vec<Node>, values: &[ValueInfo]) -> Result<Vec<Node>> {
    let n = nodes.len();
    let mut producer = vec![usize::MAX; values.len()];
    for (i, node) in nodes.iter().enumerate() {
        for o in node.outputs.iter().flatten() {
            producer[*o] = i;
        }
    }
    let mut indeg = vec![0usize; n];
    let mut users: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, node) in nodes.iter().enumerate() {
        for v in node
            .inputs
            .iter()
            .flatten()
            .chain(node.implicit_inputs.iter())
        {
            let p = producer[*v];
            if p != usize::MAX && p != i {
                indeg[i] += 1;
                users[p].push(i);
            }
        }
    }
    if indeg.iter().all(|&d| d == 0) || is_sorted(&nodes, &producer) {
        return Ok(nodes);
    }
    let mut order = Vec::with_capacity(n);
    let mut ready: alloc::collections::VecDeque<usize> =
        (0..n).filter(|&i| indeg[i] == 0).collect();
    while let Some(i) = ready.pop_front() {
        order.push(i);
        for &u in &users[i] {
            indeg[u] -= 1;
            if indeg[u] == 0 {
                ready.push_back(u);
            }
        }
    }
    if order.len() != n {
        return Err(Error::InvalidModel("the graph has a cycle".into()));
    }
    let mut slots: Vec<Option<Node>> = nodes.into_iter().map(Some).collect();
    Ok(order
        .into_iter()
        .map(|i| slots[i].take().unwrap())
        .collect())
}

fn is_sorted(nodes: &[Node], producer: &[usize]) -> bool {
    nodes.iter().enumerate().all(|(i, node)| {
        node.inputs
            .iter()
            .flatten()
            .chain(node.implicit_inputs.iter())
            .all(|v| producer[*v] == usize::MAX || producer[*v] < i)
    })
}

/// Decodes a `TypeProto`.
pub fn type_from_proto(t: &proto::TypeProto) -> Result<TypeInfo> {
    use proto::type_proto::Value as V;
    Ok(match &t.value {
        Some(V::TensorType(tt)) | Some(V::SparseTensorType(tt)) => TypeInfo::Tensor {
            dtype: DataType::from_code(tt.elem_type),
            shape: tt.shape.as_ref().map(|s| {
                s.dim
                    .iter()
                    .map(|d| match &d.value {
                        Some(proto::tensor_shape_proto::dimension::Value::DimValue(v))
                            if *v >= 0 =>
                        {
                            Dim::Known(*v as usize)
                        }
                        Some(proto::tensor_shape_proto::dimension::Value::DimParam(p)) => {
                            Dim::Sym(p.clone())
                        }
                        _ => Dim::Unknown,
                    })
                    .collect()
            }),
        },
        Some(V::SequenceType(s)) => TypeInfo::Sequence(Box::new(match &s.elem_type {
            Some(e) => type_from_proto(e)?,
            None => TypeInfo::Unknown,
        })),
        Some(V::MapType(m)) => TypeInfo::Map {
            key: DataType::from_code(m.key_type)
                .ok_or_else(|| Error::InvalidModel("map with unknown key type".into()))?,
            value: Box::new(match &m.value_type {
                Some(e) => type_from_proto(e)?,
                None => TypeInfo::Unknown,
            }),
        },
        Some(V::OptionalType(o)) => TypeInfo::Optional(Box::new(match &o.elem_type {
            Some(e) => type_from_proto(e)?,
            None => TypeInfo::Unknown,
        })),
        Some(V::OpaqueType(_)) | None => TypeInfo::Unknown,
    })
}

/// Decodes a `TensorProto`, reading external data through `ext`.
pub fn tensor_from_proto(tp: &proto::TensorProto, ext: &dyn ExternalDataSource) -> Result<Tensor> {
    let dt = DataType::from_code(tp.data_type).ok_or_else(|| {
        Error::InvalidModel(alloc::format!(
            "tensor '{}' has unknown element type {}",
            tp.name,
            tp.data_type
        ))
    })?;
    let mut shape = Vec::with_capacity(tp.dims.len());
    for &d in &tp.dims {
        if d < 0 {
            return Err(Error::InvalidModel(alloc::format!(
                "tensor '{}' has negative dim {d}",
                tp.name
            )));
        }
        shape.push(usize::try_from(d).map_err(|_| Error::Shape("dim too large".into()))?);
    }
    let n = numel(&shape)?;
    let nbytes = dt
        .storage_bytes(n)
        .ok_or_else(|| Error::Shape(alloc::format!("tensor '{}' is too large", tp.name)))?;
    if tp.data_location == 1 {
        let mut location = None;
        let (mut offset, mut length) = (0u64, None::<u64>);
        for e in &tp.external_data {
            match e.key.as_str() {
                "location" => location = Some(e.value.clone()),
                "offset" => {
                    offset = e.value.parse().map_err(|_| {
                        Error::ExternalData(alloc::format!("bad offset '{}'", e.value))
                    })?
                }
                "length" => {
                    length = Some(e.value.parse().map_err(|_| {
                        Error::ExternalData(alloc::format!("bad length '{}'", e.value))
                    })?)
                }
                _ => {}
            }
        }
        let location = location.ok_or_else(|| {
            Error::ExternalData(alloc::format!("tensor '{}' has no location", tp.name))
        })?;
        check_external_location(&location)?;
        if dt == DataType::String {
            return Err(Error::ExternalData(
                "string tensors cannot be external".into(),
            ));
        }
        if let Some(l) = length {
            if l != nbytes as u64 {
                return Err(Error::ExternalData(alloc::format!(
                    "tensor '{}' declares length {l} but its shape needs {nbytes} bytes",
                    tp.name
                )));
            }
        }
        let bytes = ext.read(&location, offset, Some(nbytes as u64))?;
        if bytes.len() != nbytes {
            return Err(Error::ExternalData(alloc::format!(
                "tensor '{}': file '{location}' holds {} bytes at offset {offset}, need {nbytes}",
                tp.name,
                bytes.len()
            )));
        }
        return tensor_from_le_bytes(dt, shape, &bytes);
    }
    if !tp.raw_data.is_empty() || (n == 0 && dt != DataType::String) {
        if tp.raw_data.len() != nbytes {
            return Err(Error::InvalidModel(alloc::format!(
                "tensor '{}' ({dt} {shape:?}) has {} raw bytes, needs {nbytes}",
                tp.name,
                tp.raw_data.len()
            )));
        }
        return tensor_from_le_bytes(dt, shape, &tp.raw_data);
    }
    let mismatch = |have: usize| {
        Error::InvalidModel(alloc::format!(
            "tensor '{}' ({dt} {shape:?}) has {have} values, needs {n}",
            tp.name
        ))
    };
    macro_rules! check {
        ($v:expr, $want:expr) => {
            if $v.len() != $want {
                return Err(mismatch($v.len()));
            }
        };
    }
    let data = match dt {
        DataType::Float => {
            check!(tp.float_data, n);
            Data::F32(tp.float_data.clone())
        }
        DataType::Double => {
            check!(tp.double_data, n);
            Data::F64(tp.double_data.clone())
        }
        DataType::Int64 => {
            check!(tp.int64_data, n);
            Data::I64(tp.int64_data.clone())
        }
        DataType::Uint64 => {
            check!(tp.uint64_data, n);
            Data::U64(tp.uint64_data.clone())
        }
        DataType::Uint32 => {
            check!(tp.uint64_data, n);
            Data::U32(tp.uint64_data.iter().map(|&x| x as u32).collect())
        }
        DataType::Int32 => {
            check!(tp.int32_data, n);
            Data::I32(tp.int32_data.clone())
        }
        DataType::Int16 => {
            check!(tp.int32_data, n);
            Data::I16(tp.int32_data.iter().map(|&x| x as i16).collect())
        }
        DataType::Int8 => {
            check!(tp.int32_data, n);
            Data::I8(tp.int32_data.iter().map(|&x| x as i8).collect())
        }
        DataType::Uint16 => {
            check!(tp.int32_data, n);
            Data::U16(tp.int32_data.iter().map(|&x| x as u16).collect())
        }
        DataType::Uint8 => {
            check!(tp.int32_data, n);
            Data::U8(tp.int32_data.iter().map(|&x| x as u8).collect())
        }
        DataType::Bool => {
            check!(tp.int32_data, n);
            Data::Bool(tp.int32_data.iter().map(|&x| x != 0).collect())
        }
        DataType::Float16 => {
            check!(tp.int32_data, n);
            Data::F16(
                tp.int32_data
                    .iter()
                    .map(|&x| f16::from_bits(x as u16))
                    .collect(),
            )
        }
        DataType::Bfloat16 => {
            check!(tp.int32_data, n);
            Data::BF16(
                tp.int32_data
                    .iter()
                    .map(|&x| bf16::from_bits(x as u16))
                    .collect(),
            )
        }
        DataType::String => {
            check!(tp.string_data, n);
            Data::Str(
                tp.string_data
                    .iter()
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect(),
            )
        }
        DataType::Complex64 => {
            check!(tp.float_data, 2 * n);
            Data::Raw(tp.float_data.iter().flat_map(|f| f.to_le_bytes()).collect())
        }
        DataType::Complex128 => {
            check!(tp.double_data, 2 * n);
            Data::Raw(
                tp.double_data
                    .iter()
                    .flat_map(|f| f.to_le_bytes())
                    .collect(),
            )
        }
        d if d.is_float8() => {
            check!(tp.int32_data, n);
            Data::Raw(tp.int32_data.iter().map(|&x| x as u8).collect())
        }
        d => {
            // packed sub-byte types: each int32 holds one packed byte
            check!(tp.int32_data, nbytes);
            let _ = d;
            Data::Raw(tp.int32_data.iter().map(|&x| x as u8).collect())
        }
    };
    Tensor::from_data(dt, shape, data)
}

/// Builds a tensor from little-endian raw bytes (length already checked).
pub fn tensor_from_le_bytes(dt: DataType, shape: Vec<usize>, b: &[u8]) -> Result<Tensor> {
    macro_rules! le {
        ($t:ty, $n:expr, $var:ident) => {
            Data::$var(
                b.chunks_exact($n)
                    .map(|c| <$t>::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            )
        };
    }
    let data = match dt {
        DataType::Float => le!(f32, 4, F32),
        DataType::Double => le!(f64, 8, F64),
        DataType::Int64 => le!(i64, 8, I64),
        DataType::Uint64 => le!(u64, 8, U64),
        DataType::Int32 => le!(i32, 4, I32),
        DataType::Uint32 => le!(u32, 4, U32),
        DataType::Int16 => le!(i16, 2, I16),
        DataType::Uint16 => le!(u16, 2, U16),
        DataType::Int8 => Data::I8(b.iter().map(|&x| x as i8).collect()),
        DataType::Uint8 => Data::U8(b.to_vec()),
        DataType::Bool => Data::Bool(b.iter().map(|&x| x != 0).collect()),
        DataType::Float16 => Data::F16(
            b.chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]))
                .collect(),
        ),
        DataType::Bfloat16 => Data::BF16(
            b.chunks_exact(2)
                .map(|c| bf16::from_le_bytes([c[0], c[1]]))
                .collect(),
        ),
        DataType::String => {
            return Err(Error::InvalidModel(
                "string tensors cannot use raw_data".into(),
            ))
        }
        _ => Data::Raw(b.to_vec()),
    };
    Tensor::from_data(dt, shape, data)
}

/// Little-endian bytes of a host tensor (the `raw_data` encoding).
pub fn tensor_to_le_bytes(t: &Tensor) -> Result<Vec<u8>> {
    let t = t.contiguous()?;
    let d = t
        .host_data()
        .ok_or_else(|| Error::Provider("tensor is not on the host".into()))?;
    macro_rules! le {
        ($v:expr) => {
            $v.iter().flat_map(|x| x.to_le_bytes()).collect()
        };
    }
    let n = t.len();
    Ok(match d {
        Data::F32(v) => le!(v[..n]),
        Data::F64(v) => le!(v[..n]),
        Data::F16(v) => le!(v[..n]),
        Data::BF16(v) => le!(v[..n]),
        Data::I8(v) => le!(v[..n]),
        Data::I16(v) => le!(v[..n]),
        Data::I32(v) => le!(v[..n]),
        Data::I64(v) => le!(v[..n]),
        Data::U8(v) => v[..n].to_vec(),
        Data::U16(v) => le!(v[..n]),
        Data::U32(v) => le!(v[..n]),
        Data::U64(v) => le!(v[..n]),
        Data::Bool(v) => v[..n].iter().map(|&x| x as u8).collect(),
        Data::Raw(v) => v.clone(),
        Data::Str(_) => return Err(Error::Other("string tensors have no raw bytes".into())),
    })
}

fn sparse_to_dense(sp: &proto::SparseTensorProto, ext: &dyn ExternalDataSource) -> Result<Tensor> {
    let values = tensor_from_proto(
        sp.values
            .as_ref()
            .ok_or_else(|| Error::InvalidModel("sparse tensor without values".into()))?,
        ext,
    )?;
    let indices = tensor_from_proto(
        sp.indices
            .as_ref()
            .ok_or_else(|| Error::InvalidModel("sparse tensor without indices".into()))?,
        ext,
    )?;
    let shape: Vec<usize> = sp
        .dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| Error::InvalidModel("negative dim".into())))
        .collect::<Result<_>>()?;
    let total = numel(&shape)?;
    let nnz = values.len();
    let idx = indices.to_i64_vec()?;
    let rank = shape.len();
    let strides = crate::tensor::contiguous_strides(&shape);
    let flat: Vec<usize> = if indices.rank() == 1 {
        idx.iter().map(|&i| i as usize).collect()
    } else {
        (0..nnz)
            .map(|k| {
                (0..rank)
                    .map(|j| idx[k * rank + j] as usize * strides[j] as usize)
                    .sum()
            })
            .collect()
    };
    if flat.len() != nnz || flat.iter().any(|&i| i >= total) {
        return Err(Error::InvalidModel(
            "sparse tensor index out of range".into(),
        ));
    }
    let dense = Tensor::zeros(values.dtype(), &shape)?;
    let mut data = dense.host_data().unwrap().clone();
    let vals = values.to_f32_vec().ok();
    match (&mut data, vals) {
        (Data::F32(d), Some(v)) => {
            for (k, &i) in flat.iter().enumerate() {
                d[i] = v[k];
            }
        }
        (Data::I64(d), _) => {
            let v = values.to_i64_vec()?;
            for (k, &i) in flat.iter().enumerate() {
                d[i] = v[k];
            }
        }
        _ => {
            return Err(Error::Unsupported {
                ctx: Default::default(),
                detail: alloc::format!("sparse {} tensors", values.dtype()),
            })
        }
    }
    Tensor::from_data(values.dtype(), shape, data)
}

/// Decodes a standalone value proto (`TensorProto`, `SequenceProto`, `MapProto`,
/// `OptionalProto`), as the node tests store their inputs and outputs.
pub fn value_from_tensor_proto(tp: &proto::TensorProto) -> Result<Value> {
    Ok(Value::Tensor(tensor_from_proto(tp, &NoExternalData)?))
}

pub fn value_from_sequence_proto(sp: &proto::SequenceProto) -> Result<Value> {
    use proto::seq_elem as se;
    let mut items = Vec::new();
    match sp.elem_type {
        se::TENSOR => {
            for t in &sp.tensor_values {
                items.push(value_from_tensor_proto(t)?);
            }
        }
        se::SEQUENCE => {
            for s in &sp.sequence_values {
                items.push(value_from_sequence_proto(s)?);
            }
        }
        se::MAP => {
            for m in &sp.map_values {
                items.push(value_from_map_proto(m)?);
            }
        }
        se::OPTIONAL => {
            for o in &sp.optional_values {
                items.push(value_from_optional_proto(o)?);
            }
        }
        _ => {}
    }
    let elem = items
        .first()
        .map(|v| v.type_info())
        .unwrap_or(TypeInfo::Unknown);
    let elem = match elem {
        TypeInfo::Tensor { dtype, .. } => TypeInfo::Tensor { dtype, shape: None },
        e => e,
    };
    Ok(Value::Sequence { elem, items })
}

pub fn value_from_map_proto(mp: &proto::MapProto) -> Result<Value> {
    let kt = DataType::from_code(mp.key_type)
        .ok_or_else(|| Error::InvalidModel("map with unknown key type".into()))?;
    let keys = if kt == DataType::String {
        let v: Vec<String> = mp
            .string_keys
            .iter()
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect();
        Tensor::from_vec(&[v.len()], v)?
    } else {
        Tensor::from_vec(&[mp.keys.len()], mp.keys.clone())?
    };
    let values = match &mp.values {
        Some(s) => match value_from_sequence_proto(s)? {
            Value::Sequence { items, .. } => items,
            _ => Vec::new(),
        },
        None => Vec::new(),
    };
    Ok(Value::Map(MapValue { keys, values }))
}

pub fn value_from_optional_proto(op: &proto::OptionalProto) -> Result<Value> {
    use proto::seq_elem as se;
    let value = match op.elem_type {
        se::TENSOR => op.tensor_value.as_ref().map(value_from_tensor_proto),
        se::SEQUENCE => op.sequence_value.as_deref().map(value_from_sequence_proto),
        se::MAP => op.map_value.as_deref().map(value_from_map_proto),
        se::OPTIONAL => op.optional_value.as_deref().map(value_from_optional_proto),
        _ => None,
    }
    .transpose()?;
    let elem = value
        .as_ref()
        .map(|v| v.type_info())
        .unwrap_or(TypeInfo::Unknown);
    Ok(Value::Optional {
        elem,
        value: value.map(Box::new),
    })
}

/// Encodes a host tensor as a `TensorProto` (raw data; strings in `string_data`).
pub fn tensor_to_proto(name: &str, t: &Tensor) -> Result<proto::TensorProto> {
    let mut tp = proto::TensorProto {
        name: name.to_owned(),
        data_type: t.dtype().code(),
        dims: t.shape().iter().map(|&d| d as i64).collect(),
        ..Default::default()
    };
    if t.dtype() == DataType::String {
        tp.string_data = t
            .as_slice::<String>()?
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect();
    } else {
        tp.raw_data = tensor_to_le_bytes(t)?.into();
    }
    Ok(tp)
}

/// Encodes any value as the proto the node tests use for it; returns the encoded bytes.
pub fn value_to_proto_bytes(name: &str, v: &Value) -> Result<Vec<u8>> {
    Ok(match v {
        Value::Tensor(t) => tensor_to_proto(name, t)?.encode_to_vec(),
        Value::Sequence { .. } => sequence_to_proto(name, v)?.encode_to_vec(),
        Value::Map(_) => map_to_proto(name, v)?.encode_to_vec(),
        Value::Optional { .. } => optional_to_proto(name, v)?.encode_to_vec(),
    })
}

fn sequence_to_proto(name: &str, v: &Value) -> Result<proto::SequenceProto> {
    use proto::seq_elem as se;
    let Value::Sequence { elem, items } = v else {
        return Err(Error::Other("not a sequence".into()));
    };
    let mut sp = proto::SequenceProto {
        name: name.to_owned(),
        ..Default::default()
    };
    sp.elem_type = match elem {
        TypeInfo::Tensor { .. } => se::TENSOR,
        TypeInfo::Sequence(_) => se::SEQUENCE,
        TypeInfo::Map { .. } => se::MAP,
        TypeInfo::Optional(_) => se::OPTIONAL,
        TypeInfo::Unknown => items.first().map_or(se::TENSOR, |i| match i {
            Value::Tensor(_) => se::TENSOR,
            Value::Sequence { .. } => se::SEQUENCE,
            Value::Map(_) => se::MAP,
            Value::Optional { .. } => se::OPTIONAL,
        }),
    };
    for it in items {
        match it {
            Value::Tensor(t) => sp.tensor_values.push(tensor_to_proto("", t)?),
            Value::Sequence { .. } => sp.sequence_values.push(sequence_to_proto("", it)?),
            Value::Map(_) => sp.map_values.push(map_to_proto("", it)?),
            Value::Optional { .. } => sp.optional_values.push(optional_to_proto("", it)?),
        }
    }
    Ok(sp)
}

fn map_to_proto(name: &str, v: &Value) -> Result<proto::MapProto> {
    let Value::Map(m) = v else {
        return Err(Error::Other("not a map".into()));
    };
    let mut mp = proto::MapProto {
        name: name.to_owned(),
        key_type: m.keys.dtype().code(),
        ..Default::default()
    };
    if m.keys.dtype() == DataType::String {
        mp.string_keys = m
            .keys
            .as_slice::<String>()?
            .iter()
            .map(|s| s.as_bytes().to_vec())
            .collect();
    } else {
        mp.keys = m.keys.to_i64_vec()?;
    }
    let elem = m
        .values
        .first()
        .map(|x| x.type_info())
        .unwrap_or(TypeInfo::Unknown);
    mp.values = Some(sequence_to_proto(
        "",
        &Value::Sequence {
            elem,
            items: m.values.clone(),
        },
    )?);
    Ok(mp)
}

fn optional_to_proto(name: &str, v: &Value) -> Result<proto::OptionalProto> {
    use proto::seq_elem as se;
    let Value::Optional { elem, value } = v else {
        return Err(Error::Other("not an optional".into()));
    };
    let mut op = proto::OptionalProto {
        name: name.to_owned(),
        ..Default::default()
    };
    op.elem_type = match elem {
        TypeInfo::Tensor { .. } => se::TENSOR,
        TypeInfo::Sequence(_) => se::SEQUENCE,
        TypeInfo::Map { .. } => se::MAP,
        TypeInfo::Optional(_) => se::OPTIONAL,
        TypeInfo::Unknown => se::UNDEFINED,
    };
    if let Some(x) = value {
        match &**x {
            Value::Tensor(t) => {
                op.elem_type = se::TENSOR;
                op.tensor_value = Some(tensor_to_proto("", t)?)
            }
            Value::Sequence { .. } => {
                op.elem_type = se::SEQUENCE;
                op.sequence_value = Some(Box::new(sequence_to_proto("", x)?))
            }
            Value::Map(_) => {
                op.elem_type = se::MAP;
                op.map_value = Some(Box::new(map_to_proto("", x)?))
            }
            Value::Optional { .. } => {
                op.elem_type = se::OPTIONAL;
                op.optional_value = Some(Box::new(optional_to_proto("", x)?))
            }
        }
    }
    Ok(op)
}

/// Decodes a value proto of unknown kind: tries TensorProto, SequenceProto, MapProto and
/// OptionalProto in the order the declared type suggests.
pub fn value_from_proto_bytes(bytes: &[u8], hint: &TypeInfo) -> Result<Value> {
    let dec = |e: prost::DecodeError| Error::Decode(e.to_string());
    match hint {
        TypeInfo::Sequence(_) => {
            value_from_sequence_proto(&proto::SequenceProto::decode(bytes).map_err(dec)?)
        }
        TypeInfo::Map { .. } => value_from_map_proto(&proto::MapProto::decode(bytes).map_err(dec)?),
        TypeInfo::Optional(_) => {
            value_from_optional_proto(&proto::OptionalProto::decode(bytes).map_err(dec)?)
        }
        _ => value_from_tensor_proto(&proto::TensorProto::decode(bytes).map_err(dec)?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_locations_are_confined() {
        assert!(check_external_location("weights.bin").is_ok());
        assert!(check_external_location("sub/weights.bin").is_ok());
        assert!(check_external_location("../weights.bin").is_err());
        assert!(check_external_location("a/../../b").is_err());
        assert!(check_external_location("/etc/passwd").is_err());
        assert!(check_external_location("C:\\x").is_err());
        assert!(check_external_location("").is_err());
    }

    #[test]
    fn external_locations_lists_every_file_once() {
        let ext = |loc: &str| proto::TensorProto {
            dims: alloc::vec![1],
            data_type: 1,
            data_location: 1,
            external_data: alloc::vec![proto::StringStringEntryProto {
                key: "location".into(),
                value: loc.into(),
            }],
            ..Default::default()
        };
        let inner = proto::GraphProto {
            initializer: alloc::vec![ext("c.bin")],
            ..Default::default()
        };
        let node = proto::NodeProto {
            attribute: alloc::vec![
                proto::AttributeProto {
                    t: Some(ext("b.bin")),
                    ..Default::default()
                },
                proto::AttributeProto {
                    g: Some(Box::new(inner)),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let mut mp = proto::ModelProto {
            graph: Some(proto::GraphProto {
                initializer: alloc::vec![ext("a.bin"), ext("a.bin")],
                node: alloc::vec![node],
                ..Default::default()
            }),
            ..Default::default()
        };
        let got = external_locations(&mp.encode_to_vec()).unwrap();
        assert_eq!(got, ["a.bin", "b.bin", "c.bin"]);
        mp.graph.as_mut().unwrap().initializer[1] = ext("../secret");
        assert!(matches!(
            external_locations(&mp.encode_to_vec()),
            Err(Error::ExternalData(_))
        ));
        assert!(external_locations(b"\xff\xff\xff").is_err());
    }

    #[test]
    fn raw_length_mismatch_is_an_error() {
        let tp = proto::TensorProto {
            dims: alloc::vec![4],
            data_type: 1,
            raw_data: alloc::vec![0u8; 8].into(),
            ..Default::default()
        };
        assert!(matches!(
            tensor_from_proto(&tp, &NoExternalData),
            Err(Error::InvalidModel(_))
        ));
    }

    #[test]
    fn huge_dims_do_not_allocate() {
        let tp = proto::TensorProto {
            dims: alloc::vec![1 << 40, 1 << 40],
            data_type: 1,
            ..Default::default()
        };
        assert!(tensor_from_proto(&tp, &NoExternalData).is_err());
    }
}
