//! Typed errors. Every error that comes from a node names the node, op, domain and opset.

use alloc::string::{String, ToString};
use core::fmt;

/// Where in a graph an error arose.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct NodeContext {
    pub node: String,
    pub op: String,
    pub domain: String,
    pub opset: i64,
}

impl fmt::Display for NodeContext {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let domain = if self.domain.is_empty() {
            "ai.onnx"
        } else {
            &self.domain
        };
        write!(
            f,
            "node '{}' (op {} of domain {}, opset {})",
            self.node, self.op, domain, self.opset
        )
    }
}

/// Every failure nxrt reports.
#[derive(Clone, Debug, PartialEq)]
pub enum Error {
    /// The bytes are not a valid ONNX protobuf message.
    Decode(String),
    /// The model is structurally invalid (dangling names, cycles, bad attributes, ...).
    InvalidModel(String),
    /// An external-data reference is missing, escapes the model folder or is out of range.
    ExternalData(String),
    /// An op, domain, opset, attribute, dtype or shape that nxrt does not support.
    Unsupported { ctx: NodeContext, detail: String },
    /// A model imports an opset newer than nxrt knows.
    OpsetTooNew {
        domain: String,
        version: i64,
        max: i64,
    },
    /// A node failed while loading or running (shape mismatch, bad input value, ...).
    Node { ctx: NodeContext, detail: String },
    /// A feed that does not match the model's inputs (unknown name, wrong dtype or rank, ...).
    Input(String),
    /// A shape whose element count overflows, or a size beyond the configured limit.
    Shape(String),
    /// An I/O error from the host (file missing, unreadable, ...).
    Io(String),
    /// A provider error (device lost, out of memory, ...).
    Provider(String),
    /// A provider's device went away (a lost WebGPU device, a reset GPU): the call that saw
    /// it fails, and so does every later one on that provider; a new session (on a new
    /// device) works, and dropping the old one frees what it held.
    DeviceLost {
        /// The provider (`webgpu`, `cuda`).
        provider: String,
        /// Why, as the platform said it.
        reason: String,
    },
    /// A tokenizer file that cannot be read or used, or ids it cannot decode.
    Tokenizer(String),
    /// A lease over a memory budget, or an allocation the system refused (see
    /// [`crate::governor`]): raised before anything is written; the session stays usable.
    OutOfMemory {
        /// Whose budget refused: `host memory of the process`, `host memory of session 'x'`...
        tier: String,
        /// Bytes asked for.
        requested: u64,
        /// Bytes already leased under that budget.
        in_use: u64,
        /// The budget's limit (`u64::MAX`: none).
        limit: u64,
        /// What asked (a node's output, the weights, a memory plan's arena...).
        holder: String,
    },
    /// Anything else, with a message.
    Other(String),
}

impl Error {
    pub fn node(ctx: &NodeContext, detail: impl ToString) -> Self {
        Error::Node {
            ctx: ctx.clone(),
            detail: detail.to_string(),
        }
    }

    pub fn unsupported(ctx: &NodeContext, detail: impl ToString) -> Self {
        Error::Unsupported {
            ctx: ctx.clone(),
            detail: detail.to_string(),
        }
    }

    /// Attaches node context to a context-free error raised inside a kernel.
    pub fn in_node(self, ctx: &NodeContext) -> Self {
        match self {
            Error::Other(d) | Error::Shape(d) => Error::Node {
                ctx: ctx.clone(),
                detail: d,
            },
            Error::Unsupported { ctx: c, detail } if c.op.is_empty() => Error::Unsupported {
                ctx: ctx.clone(),
                detail,
            },
            Error::OutOfMemory {
                tier,
                requested,
                in_use,
                limit,
                holder,
            } if holder == crate::governor::KERNEL => Error::OutOfMemory {
                tier,
                requested,
                in_use,
                limit,
                holder: alloc::format!("an output of {ctx}"),
            },
            e => e,
        }
    }

    /// A short, stable name of the variant (for scripts and tests).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Decode(_) => "decode",
            Error::InvalidModel(_) => "invalid_model",
            Error::ExternalData(_) => "external_data",
            Error::Unsupported { .. } => "unsupported",
            Error::OpsetTooNew { .. } => "opset_too_new",
            Error::Node { .. } => "node",
            Error::Input(_) => "input",
            Error::Shape(_) => "shape",
            Error::Io(_) => "io",
            Error::Provider(_) => "provider",
            Error::DeviceLost { .. } => "device_lost",
            Error::Tokenizer(_) => "tokenizer",
            Error::OutOfMemory { .. } => "out_of_memory",
            Error::Other(_) => "other",
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Decode(d) => write!(f, "cannot decode model: {d}"),
            Error::InvalidModel(d) => write!(f, "invalid model: {d}"),
            Error::ExternalData(d) => write!(f, "external data: {d}"),
            Error::Unsupported { ctx, detail } => write!(f, "unsupported: {ctx}: {detail}"),
            Error::OpsetTooNew {
                domain,
                version,
                max,
            } => write!(
                f,
                "unsupported: opset {version} of domain {} is newer than the newest supported ({max})",
                if domain.is_empty() { "ai.onnx" } else { domain }
            ),
            Error::Node { ctx, detail } => write!(f, "{ctx}: {detail}"),
            Error::Input(d) => write!(f, "bad input: {d}"),
            Error::Shape(d) => write!(f, "bad shape: {d}"),
            Error::Io(d) => write!(f, "i/o: {d}"),
            Error::Provider(d) => write!(f, "provider: {d}"),
            Error::DeviceLost { provider, reason } => write!(
                f,
                "device lost: the {provider} device was lost ({reason}); create a new session"
            ),
            Error::Tokenizer(d) => write!(f, "tokenizer: {d}"),
            Error::OutOfMemory {
                tier,
                requested,
                in_use,
                limit,
                holder,
            } => {
                write!(f, "out of memory: {holder} asked for {requested} bytes of {tier}")?;
                if *limit == u64::MAX {
                    write!(f, " ({in_use} bytes leased)")
                } else {
                    write!(
                        f,
                        ", which has {in_use} of its {limit}-byte limit in use ({} bytes free)",
                        limit.saturating_sub(*in_use)
                    )
                }
            }
            Error::Other(d) => f.write_str(d),
        }
    }
}

impl core::error::Error for Error {}

pub type Result<T, E = Error> = core::result::Result<T, E>;

/// Shorthand for a context-free error inside kernels (the executor adds node context).
#[macro_export]
macro_rules! bail {
    ($($t:tt)*) => { return Err($crate::error::Error::Other(alloc::format!($($t)*))) };
}

/// Shorthand for an unsupported-feature error inside kernels.
#[macro_export]
macro_rules! unsupported {
    ($($t:tt)*) => { return Err($crate::error::Error::Unsupported { ctx: Default::default(), detail: alloc::format!($($t)*) }) };
}
