//! The session: partitions a loaded graph across providers, compiles a kernel per node, and
//! runs it (async-capable). Control flow (If, Loop, Scan) runs here, over nested plans.

use alloc::boxed::Box;
use alloc::string::{String, ToString};
use alloc::sync::Arc;
use alloc::vec;
use alloc::vec::Vec;

use crate::arena::{arena_dtype, HostArena, StepMem};
use crate::dtype::DataType;
use crate::error::{Error, Result};
use crate::governor::{Account, Holder, Lease, MemorySnapshot, Tier};
use crate::infer;
use crate::ir::{Graph, Node, ValueId};
use crate::loader::Model;
use crate::mechanism::{Binding, HostMechanism, MechanismReport, SystemHeap};
use crate::optimize;
use crate::planner::{self, Activation, InPlace, MemoryPlan, MemoryPlanStats, PlanRequest, Region};
use crate::profile::{self, Clock, Phase, PhaseProfile, RawSpan};
use crate::provider::{BoxFuture, ExecutionProvider, InputPlacement, Kernel, KernelCx, Support};
use crate::tensor::{Location, Tensor};
use crate::value::{Dim, TypeInfo, Value};
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

/// How much graph optimisation to apply at load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum OptLevel {
    /// Run the graph as written.
    None,
    /// Fold constants (including the shape arithmetic exporters emit) and drop dead nodes.
    Basic,
    /// Everything in `Basic` plus the CPU fusions of [`crate::fuse`] (Conv + BatchNormalization
    /// folding, Conv + residual Add + activation into one `FusedConv`, GELU, LayerNorm...),
    /// applied when every provider of the session computes on the host (a device provider
    /// fuses its own way). Tensors keep the layout the model gives them (as ONNX Runtime's
    /// "extended" level).
    Extended,
    /// Everything in `Extended` plus the layout rewrite: convolution chains run in the blocked
    /// channel layout (`fuse::block_convolutions`), on the host only as well.
    #[default]
    All,
}

/// How a session executes its graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum ExecMode {
    /// Node by node: each output is allocated as its kernel makes it and freed after its last
    /// reader.
    Eager,
    /// From a plan compiled once per set of input shapes (the first run with new shapes records
    /// every activation's size, the planner places them in one arena per provider with views and
    /// in-place results sharing memory) and re-used while the shapes stay the same.
    #[default]
    Planned,
}

/// Options of one run.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// Outputs (by name) returned where their kernel left them: a device tensor stays on its
    /// device (not read back), to be fed to a later run as it is (a decoder's KV cache). The
    /// other outputs are read back to the host.
    pub keep_on_device: Vec<String>,
    /// Pre-allocated host tensors for graph outputs, by name (I/O binding): the kernel that
    /// makes such an output writes it into the tensor's storage (no allocation), when that
    /// storage is on the host, contiguous, not shared with another tensor and of the output's
    /// type and element count; otherwise the output is made as usual. Pass the previous run's
    /// outputs back here to run again without allocating them.
    pub outputs: Vec<(String, Tensor)>,
}

/// Output storage bound for one run ([`RunOptions::outputs`]), by graph value: a kernel takes
/// its output's through [`KernelCx`].
pub(crate) struct BoundOutputs {
    slots: Vec<(ValueId, spin::Mutex<Option<Tensor>>)>,
}

impl BoundOutputs {
    /// The bound storage of value `id`, taken (each slot is taken at most once).
    pub(crate) fn take(&self, id: ValueId) -> Option<Tensor> {
        self.slots
            .iter()
            .find(|(v, _)| *v == id)
            .and_then(|(_, t)| t.lock().take())
    }

    fn binds(&self, id: ValueId) -> bool {
        self.slots.iter().any(|(v, _)| *v == id)
    }
}

/// Options that shape a session.
#[derive(Clone, Debug, Default)]
pub struct SessionOptions {
    pub optimization: OptLevel,
    pub mode: ExecMode,
    /// Phase-profile this session whatever the process gate says.
    pub phase_profile: bool,
    /// The target's monotonic clock in nanoseconds (profiling reads 0 without one).
    pub clock: Option<Clock>,
    /// Keep kernels from packing constant weights at load (`Kernel::prepare`): less memory
    /// (packed copies sit next to the initializers), slower Conv/MatMul/Gemm.
    pub disable_prepacking: bool,
    /// This session's host memory budget in bytes (`None`: only the process's, see
    /// [`crate::governor`]). Its weights, arenas and heap outputs are leased from it; over it,
    /// loading or a run fails with [`Error::OutOfMemory`] and the session stays usable.
    pub memory_limit: Option<usize>,
    /// A pool shared with other sessions ([`crate::governor::MemoryPool`]): its limit binds
    /// them together, and initializers identical to one a live session of the pool holds are
    /// held once.
    pub pool: Option<Arc<crate::governor::MemoryPool>>,
    /// Arena shrinking: a memory plan's arena larger than this many bytes is given back at the
    /// end of each run that used it (the plan stays; its next run allocates the arena again),
    /// so a run with unusually large inputs does not leave its memory held. `None` (default):
    /// every plan keeps its arena until `release_cached`.
    pub keep_arena_limit: Option<usize>,
    /// Where the activation arenas come from (see [`crate::mechanism`]): `None` is the system
    /// heap; a [`crate::mechanism::BlockCache`] (a pool's, `MemoryPool::arena_cache`) keeps
    /// released arenas for the next session or run that needs one of their size class.
    /// [`Session::select_host_mechanism`] changes it later.
    pub host_mechanism: Option<Arc<dyn HostMechanism>>,
    /// How block-quantized weights are multiplied, and how much the dense copies the
    /// session's kernels keep may hold (see [`crate::weight_cache`]).
    pub weight_cache: crate::weight_cache::WeightCacheOptions,
}

/// A public description of a graph input or output.
#[derive(Clone, Debug)]
pub struct IoInfo {
    pub name: String,
    pub ty: TypeInfo,
}

/// One node that no provider could take.
#[derive(Clone, Debug)]
pub struct Unsupported {
    pub node: String,
    pub op: String,
    pub domain: String,
    pub opset: i64,
    pub reason: String,
}

/// Where each node runs and how many copies the partition needs.
#[derive(Clone, Debug, Default)]
pub struct PartitionReport {
    /// (provider name, node count), including nodes inside subgraphs.
    pub nodes_per_provider: Vec<(String, usize)>,
    /// Explicit copies between locations.
    pub copies: usize,
    pub unsupported: Vec<Unsupported>,
    /// (node name, op type, provider name) of every kernel node, subgraphs included, in
    /// compile order.
    pub assignments: Vec<(String, String, String)>,
    /// Every copy the partition inserts, in the order they run (graph outputs read back last).
    pub copy_list: Vec<CopyInfo>,
    /// Nodes that run on a later provider than the first, with each earlier provider's reason.
    pub fallbacks: Vec<Fallback>,
    /// (provider name, what it runs on) for each provider that describes itself (a device
    /// provider's adapter, features and limits).
    pub devices: Vec<(String, String)>,
    /// Bytes the kernels hold in weights packed at load (`Kernel::prepare`), subgraphs
    /// included.
    pub prepacked_bytes: usize,
}

/// A node a preferred provider declined.
#[derive(Clone, Debug)]
pub struct Fallback {
    pub node: String,
    pub op: String,
    /// The provider that runs it.
    pub to: String,
    /// (provider, reason) for each provider that declined it first.
    pub declined: Vec<(String, String)>,
}

/// One copy between memory locations, inserted by the partitioner.
#[derive(Clone, Debug)]
pub struct CopyInfo {
    /// The value copied.
    pub value: String,
    /// Provider names it moves between.
    pub from: String,
    pub to: String,
    /// The node that reads it there (empty: a graph output read back after the run).
    pub node: String,
    /// An initializer moved to a device: uploaded on the first run and kept, not every run.
    pub once: bool,
}

enum StepKind {
    Kernel {
        provider: usize,
        kernel: Box<dyn Kernel>,
    },
    If {
        then_branch: Box<Plan>,
        else_branch: Box<Plan>,
    },
    Loop {
        body: Box<Plan>,
    },
    Scan {
        body: Box<Plan>,
    },
    SequenceMap {
        body: Box<Plan>,
    },
    /// A node no provider supports (only in analysis plans, never run).
    Missing,
}

struct Step {
    node: usize,
    kind: StepKind,
    /// Op types whose kernel may write output 0 over a dying input (see `IN_PLACE_OPS`).
    in_place_ok: bool,
    /// Values (by id) this step may drop after it runs: their last reader.
    frees: Vec<ValueId>,
    /// Inputs to move to the step's provider first: (value, target provider).
    copies: Vec<(ValueId, usize)>,
    /// Per entry of `copies`: the value is an initializer, so its device copy is made once and
    /// kept (weights are uploaded on the first run, not every run).
    copy_const: Vec<bool>,
    /// A host kernel whose outputs follow from the input shapes and constants alone
    /// ([`crate::shapefold`]): a memory plan keeps them from its recording run.
    fold: bool,
}

/// A compiled graph: one step per node, value lifetimes, constants.
struct Plan {
    graph: Arc<Graph>,
    steps: Vec<Step>,
    /// Per value: the last step that reads it (`None`: a graph output, or never read).
    last_use: Vec<Option<usize>>,
    /// Per value: whether it is a graph output.
    is_output: Vec<bool>,
    /// For subgraphs: (local id, id in the enclosing graph) of each captured value.
    captures: Vec<(ValueId, ValueId)>,
    /// This graph's memory plans (planned mode): the top level's, or a subgraph's, which
    /// If branches run from as the top level does.
    cache: PlanCache,
}

/// The memory plans of one graph, per recent set of input shapes.
#[derive(Default)]
struct PlanCache {
    plans: spin::Mutex<Vec<Arc<RunPlan>>>,
    /// Planned runs in a row whose shapes had no plan.
    misses: AtomicU32,
    /// Runs of this graph (subgraphs count their own).
    runs: AtomicU64,
}

impl Plan {
    /// Drops this graph's memory plans and those of its subgraphs (with their arenas).
    fn clear_plans(&self) {
        self.cache.plans.lock().clear();
        for st in &self.steps {
            match &st.kind {
                StepKind::If {
                    then_branch,
                    else_branch,
                } => {
                    then_branch.clear_plans();
                    else_branch.clear_plans();
                }
                StepKind::Loop { body }
                | StepKind::Scan { body }
                | StepKind::SequenceMap { body } => body.clear_plans(),
                _ => {}
            }
        }
    }
}

/// Ops whose kernels implement [`KernelCx::output_in_place`] for output 0.
const IN_PLACE_OPS: &[&str] = &["Relu", "Sigmoid", "Add", "Sub", "Mul", "Div"];

/// Plans kept per session (one per recent set of input shapes).
const PLAN_CACHE: usize = 4;

/// A plan keeps a shape-determined step's outputs when they hold at most this many bytes...
const FOLD_STEP_BYTES: usize = 64 << 10;
/// ...and while all it keeps stays within this many.
const FOLD_PLAN_BYTES: usize = 1 << 20;

/// A memory plan for one set of input shapes, with the arena it runs from.
struct RunPlan {
    sig: Vec<Option<Vec<usize>>>,
    mem: MemoryPlan,
    /// Per step, per node output: its planned region and element type.
    step_outs: Vec<Vec<Option<(Region, DataType)>>>,
    /// Per step: the outputs of a shape-determined step, kept from the recording run (runs
    /// of this plan take them instead of running the step), as (value, contents), only those
    /// that a step which still runs reads.
    folded: Vec<Option<Vec<(ValueId, Value)>>>,
    arena: spin::Mutex<Option<Arc<HostArena>>>,
}

/// What a recording run observes for the planner.
struct Recording {
    req: PlanRequest,
    dtypes: Vec<Option<DataType>>,
    heap_values: usize,
    heap_bytes: usize,
    /// (step, outputs) of the shape-determined steps the plan keeps.
    folded: Vec<(usize, Vec<Value>)>,
    folded_bytes: usize,
}

/// Per-run context of the top-level graph (subgraphs run with the default).
#[derive(Default)]
struct RunCx<'r> {
    arena: Option<(&'r Arc<HostArena>, &'r RunPlan)>,
    rec: Option<&'r mut Recording>,
    spans: Option<&'r mut Vec<RawSpan>>,
    /// Output storage the caller bound (top-level graph only).
    bound: Option<&'r BoundOutputs>,
}

/// What the phase profiler has kept for a session.
#[derive(Default)]
struct ProfileLog {
    /// (run number, span); run 0 holds load-time spans.
    spans: Vec<(u32, RawSpan)>,
    runs: u32,
    /// Per phase of the runs: (total ns, calls).
    phases: Vec<(Phase, u64, u64)>,
    /// Load-time phases: (total ns, calls).
    load_phases: Vec<(Phase, u64, u64)>,
    /// Per top-level node: (calls, total ns).
    nodes: Vec<(u64, u64)>,
}

impl ProfileLog {
    fn add(&mut self, run: u32, sp: RawSpan) {
        let phases = if run == 0 {
            &mut self.load_phases
        } else {
            &mut self.phases
        };
        match phases.iter_mut().find(|p| p.0 == sp.phase) {
            Some(p) => {
                p.1 += sp.dur_ns;
                p.2 += 1;
            }
            None => phases.push((sp.phase, sp.dur_ns, 1)),
        }
        if sp.phase == Phase::Kernel {
            let i = sp.what as usize;
            if i >= self.nodes.len() {
                self.nodes.resize(i + 1, (0, 0));
            }
            self.nodes[i].0 += 1;
            self.nodes[i].1 += sp.dur_ns;
        }
        if self.spans.len() < profile::MAX_SPANS {
            self.spans.push((run, sp));
        }
    }
}

/// A loaded, compiled model ready to run.
pub struct Session {
    model_meta: ModelMeta,
    providers: Vec<Arc<dyn ExecutionProvider>>,
    plan: Plan,
    /// Per graph input (in order): where the steps reading it run (a step that is not a
    /// kernel counts as the host), so a device feed is placed without a walk over the plan.
    feed_readers: Vec<Vec<Location>>,
    report: PartitionReport,
    mode: ExecMode,
    phase_profile: bool,
    keep_arena_limit: Option<usize>,
    /// The host mechanism arenas are allocated from (its first entry the system heap).
    host: Binding<dyn HostMechanism>,
    clock: Clock,
    /// Initializers already uploaded to a device provider: (plan address, value, provider).
    const_uploads: spin::Mutex<alloc::collections::BTreeMap<(usize, ValueId, usize), Tensor>>,
    runs: AtomicU64,
    plans_built: AtomicUsize,
    last_stats: spin::Mutex<Option<MemoryPlanStats>>,
    log: spin::Mutex<ProfileLog>,
    /// The session's memory account (see [`crate::governor`]).
    account: Arc<Account>,
    /// Dense copies of block-quantized weights its kernels keep (a reclaimer of its account
    /// and of its pool's).
    weight_cache: Arc<crate::weight_cache::WeightCache>,
    /// The lease on the kernels' prepacked weights.
    _prepacked: Lease,
    /// Leases on the initializers of subgraphs (If/Loop/Scan bodies), held for the session.
    _subgraph_weights: Vec<Lease>,
}

/// Model metadata kept after load.
#[derive(Clone, Debug)]
pub struct ModelMeta {
    pub ir_version: i64,
    pub producer: String,
    pub opsets: Vec<(String, i64)>,
}

impl Session {
    /// Compiles `model` for `providers` (in preference order; the last should be a CPU
    /// provider that takes whatever the others cannot).
    pub fn new(
        model: Model,
        providers: Vec<Arc<dyn ExecutionProvider>>,
        opts: &SessionOptions,
    ) -> Result<Session> {
        let (s, report) = Self::build(model, providers, opts)?;
        if let Some(u) = report.unsupported.first() {
            return Err(Error::Unsupported {
                ctx: crate::error::NodeContext {
                    node: u.node.clone(),
                    op: u.op.clone(),
                    domain: u.domain.clone(),
                    opset: u.opset,
                },
                detail: u.reason.clone(),
            });
        }
        Ok(s)
    }

    /// Partitions without failing on unsupported nodes (for `inspect`).
    pub fn analyze(
        model: Model,
        providers: Vec<Arc<dyn ExecutionProvider>>,
        opts: &SessionOptions,
    ) -> Result<PartitionReport> {
        Ok(Self::build(model, providers, opts)?.1)
    }

    fn build(
        mut model: Model,
        providers: Vec<Arc<dyn ExecutionProvider>>,
        opts: &SessionOptions,
    ) -> Result<(Session, PartitionReport)> {
        if providers.is_empty() {
            return Err(Error::Provider(
                "a session needs at least one provider".into(),
            ));
        }
        let clock = opts.clock.unwrap_or(profile::no_clock);
        let profiling = opts.phase_profile || profile::exec_phase_profile_enabled();
        let t0 = clock();
        infer::infer_graph(&mut model.graph, &[])?;
        if opts.optimization != OptLevel::None {
            let cpu = providers
                .iter()
                .find(|p| p.location() == Location::Host)
                .cloned();
            let host_only = providers.iter().all(|p| p.location() == Location::Host);
            if host_only && matches!(opts.optimization, OptLevel::Extended | OptLevel::All) {
                // QDQ patterns onto the integer kernels, before folding turns the weights'
                // DequantizeLinear into float constants
                crate::fuse::quant::qdq_ops(&mut model.graph)?;
                crate::fuse::quant::integer_to_float(&mut model.graph)?;
            }
            if let Some(cpu) = cpu {
                if opts.weight_cache.policy == crate::weight_cache::BlockWeights::Expanded {
                    optimize::fold_constants_expanding_blocks(&mut model.graph, &*cpu)?;
                } else {
                    optimize::fold_constants(&mut model.graph, &*cpu)?;
                }
                // block-quantized weights of MatMuls onto the block-quantized kernels (every
                // provider has them)
                crate::fuse::quant::block_matmuls(&mut model.graph)?;
                infer::infer_graph(&mut model.graph, &[])?;
            }
            if matches!(opts.optimization, OptLevel::Extended | OptLevel::All)
                && providers.iter().all(|p| p.location() == Location::Host)
            {
                crate::fuse::fuse_graph(&mut model.graph)?;
                if opts.optimization == OptLevel::All {
                    crate::fuse::block_convolutions(&mut model.graph)?;
                }
            }
        }
        let mut report = PartitionReport::default();
        for p in &providers {
            let d = p.describe();
            if !d.is_empty() {
                report.devices.push((p.name().to_string(), d));
            }
        }
        let name = if model.graph.name.is_empty() {
            "session"
        } else {
            model.graph.name.as_str()
        };
        let account = match &opts.pool {
            Some(p) => Account::with_parent(name, opts.memory_limit, p.account()),
            None => Account::new(name, opts.memory_limit),
        };
        lease_weights(&account, opts.pool.as_deref(), &mut model.graph)?;
        let subgraph_weights = lease_subgraph_weights(&account, &model.graph)?;
        for p in &providers {
            p.bind_account(&account);
        }
        let graph = Arc::new(model.graph);
        let t1 = clock();
        let prepack = !opts.disable_prepacking;
        let plan = compile(&graph, &providers, &mut report, None, prepack)?;
        // the kernels' packed copies of constant weights sit next to the initializers
        let prepacked = Lease::take(
            Some(&account),
            Tier::Host,
            Holder::Weights,
            report.prepacked_bytes,
            &|| "the prepacked weights".into(),
        )?;
        let feed_readers = feed_readers(&plan, &providers);
        let weight_cache = Arc::new(crate::weight_cache::WeightCache::new(
            opts.weight_cache.policy,
            opts.weight_cache.limit,
        ));
        {
            let weak = Arc::downgrade(&weight_cache);
            account.add_reclaimer(weak.clone());
            if let Some(parent) = account.parent() {
                parent.add_reclaimer(weak.clone());
            }
            crate::governor::add_process_reclaimer(weak);
        }
        let host = Binding::new(SystemHeap::shared());
        if let Some(m) = &opts.host_mechanism {
            host.select(m.clone())?;
        }
        let t2 = clock();
        let mut log = ProfileLog::default();
        if profiling {
            let span = |phase, a: u64, b: u64| RawSpan {
                phase,
                what: u32::MAX,
                start_ns: a,
                dur_ns: b.saturating_sub(a),
            };
            log.add(0, span(Phase::Optimise, t0, t1));
            log.add(0, span(Phase::Plan, t1, t2));
        }
        let meta = ModelMeta {
            ir_version: model.ir_version,
            producer: model.producer,
            opsets: model.opsets,
        };
        Ok((
            Session {
                model_meta: meta,
                providers,
                plan,
                feed_readers,
                report: report.clone(),
                mode: opts.mode,
                phase_profile: opts.phase_profile,
                keep_arena_limit: opts.keep_arena_limit,
                host,
                clock,
                const_uploads: spin::Mutex::new(alloc::collections::BTreeMap::new()),
                runs: AtomicU64::new(0),
                plans_built: AtomicUsize::new(0),
                last_stats: spin::Mutex::new(None),
                log: spin::Mutex::new(log),
                account,
                weight_cache,
                _prepacked: prepacked,
                _subgraph_weights: subgraph_weights,
            },
            report,
        ))
    }

    pub fn meta(&self) -> &ModelMeta {
        &self.model_meta
    }

    pub fn graph(&self) -> &Graph {
        &self.plan.graph
    }

    /// The inputs a caller feeds, with declared (symbolic) types.
    pub fn inputs(&self) -> Vec<IoInfo> {
        let g = &self.plan.graph;
        g.inputs
            .iter()
            .map(|&id| IoInfo {
                name: g.values[id].name.clone(),
                ty: g.values[id].ty.clone(),
            })
            .collect()
    }

    /// The outputs, with declared or inferred types.
    pub fn outputs(&self) -> Vec<IoInfo> {
        let g = &self.plan.graph;
        g.outputs
            .iter()
            .map(|&id| IoInfo {
                name: g.values[id].name.clone(),
                ty: g.values[id].ty.clone(),
            })
            .collect()
    }

    /// Reads a value back to the host: a device tensor (an output a run kept on the device
    /// with [`RunOptions::keep_on_device`]) through the provider that made it; a host value is
    /// returned as it is.
    pub fn download<'a>(&'a self, v: Value) -> BoxFuture<'a, Result<Value>> {
        self.to_host(v)
    }

    /// Frees what the session caches between runs: its dense weight copies, its memory plans
    /// with their arenas, and each provider's pooled buffers. The session stays usable; the
    /// next run allocates again.
    pub fn release_cached(&self) {
        use crate::governor::Reclaim;
        self.weight_cache.release_cached();
        self.plan.clear_plans();
        self.const_uploads.lock().clear();
        for p in &self.providers {
            p.release_cached();
        }
    }

    /// Selects the host mechanism later arenas come from (see [`crate::mechanism`]): arenas
    /// plans already hold keep theirs and go back to it when freed. A dead mechanism is
    /// refused; one that dies while selected is replaced by the one selected before it.
    pub fn select_host_mechanism(&self, m: Arc<dyn HostMechanism>) -> Result<()> {
        self.host.select(m)
    }

    /// The dense weight cache's figures (see [`crate::weight_cache`]).
    pub fn weight_cache(&self) -> crate::weight_cache::WeightCacheStats {
        self.weight_cache.stats()
    }

    /// The mechanism each tier allocates from now: the host's (arenas) and each device
    /// provider's (its buffer pool), with what they keep and the dead ones dropped.
    pub fn mechanisms(&self) -> Vec<MechanismReport> {
        let devices = self.providers.iter().filter_map(|p| p.mechanism());
        core::iter::once(self.host.report())
            .chain(devices.map(|m| MechanismReport::of(&*m)))
            .collect()
    }

    /// A new activation arena of `bytes` from the selected host mechanism, leased (its block
    /// size) from the session first.
    fn new_arena(&self, bytes: usize, graph: &str) -> Result<Arc<HostArena>> {
        let m = self.host.current();
        let lease = Lease::take(
            Some(&self.account),
            Tier::Host,
            Holder::Arena,
            m.block_size(bytes),
            &|| alloc::format!("the activation arena of '{graph}'"),
        )?;
        HostArena::from_mechanism(m, bytes, Some(lease))
    }

    /// What this session holds, tier by tier and holder by holder, with peaks and its limit
    /// (`nxrt run --memory-report` prints it).
    pub fn memory_snapshot(&self) -> MemorySnapshot {
        self.account.snapshot()
    }

    /// The session's memory account (its budgets; see [`crate::governor`]).
    pub fn memory_account(&self) -> &Arc<Account> {
        &self.account
    }

    pub fn partition(&self) -> &PartitionReport {
        &self.report
    }

    pub fn providers(&self) -> &[Arc<dyn ExecutionProvider>] {
        &self.providers
    }

    /// Checks feeds against the declared inputs: names, kinds, element types, ranks and fixed dims.
    fn bind_inputs(&self, feeds: Vec<(String, Value)>) -> Result<Vec<Option<Value>>> {
        let g = &self.plan.graph;
        let mut env: Vec<Option<Value>> = vec![None; g.values.len()];
        for (id, v) in &g.initializers {
            env[*id] = Some(v.clone());
        }
        for (name, v) in feeds {
            let Some(&id) = g.inputs.iter().find(|&&i| g.values[i].name == name) else {
                let known: Vec<&str> = g
                    .inputs
                    .iter()
                    .map(|&i| g.values[i].name.as_str())
                    .collect();
                return Err(Error::Input(alloc::format!(
                    "the model has no input named '{name}' (inputs: {known:?})"
                )));
            };
            check_feed(&name, &g.values[id].ty, &v)?;
            if env[id].is_some() && g.initializers.iter().all(|(i, _)| *i != id) {
                return Err(Error::Input(alloc::format!("input '{name}' is fed twice")));
            }
            env[id] = Some(v);
        }
        for &id in &g.inputs {
            if env[id].is_none() {
                // an optional-typed input may be omitted
                if let TypeInfo::Optional(elem) = &g.values[id].ty {
                    env[id] = Some(Value::Optional {
                        elem: (**elem).clone(),
                        value: None,
                    });
                    continue;
                }
                return Err(Error::Input(alloc::format!(
                    "input '{}' was not given",
                    g.values[id].name
                )));
            }
        }
        Ok(env)
    }

    /// Whether this session records a phase profile now (its option or the process gate).
    #[inline]
    pub fn profiling(&self) -> bool {
        cfg!(feature = "profiling") && (self.phase_profile || profile::exec_phase_profile_enabled())
    }

    /// The execution mode chosen at load.
    pub fn mode(&self) -> ExecMode {
        self.mode
    }

    /// The clock profiling reads.
    pub fn clock(&self) -> Clock {
        self.clock
    }

    /// Adds a load-time span measured by the target (reading and decoding the file happen
    /// before core sees the model). Kept only while profiling is on.
    pub fn record_phase(&self, phase: Phase, start_ns: u64, dur_ns: u64) {
        if self.profiling() {
            self.log.lock().add(
                0,
                RawSpan {
                    phase,
                    what: u32::MAX,
                    start_ns,
                    dur_ns,
                },
            );
        }
    }

    /// The phase profile so far (`None` when nothing was profiled).
    pub fn phase_profile(&self) -> Option<PhaseProfile> {
        let log = self.log.lock();
        if log.spans.is_empty() && log.runs == 0 {
            return None;
        }
        let g = &self.plan.graph;
        let op_name = |n: &Node| {
            if n.domain.is_empty() {
                n.op_type.clone()
            } else {
                alloc::format!("{}:{}", n.domain, n.op_type)
            }
        };
        let spans = log
            .spans
            .iter()
            .map(|(run, sp)| {
                let (name, op) = match sp.phase {
                    Phase::Kernel => g
                        .nodes
                        .get(sp.what as usize)
                        .map(|n| (n.name.clone(), op_name(n)))
                        .unwrap_or_default(),
                    Phase::Copy => (
                        g.values
                            .get(sp.what as usize)
                            .map(|v| v.name.clone())
                            .unwrap_or_default(),
                        String::new(),
                    ),
                    _ => (String::new(), String::new()),
                };
                profile::Span {
                    phase: sp.phase,
                    name,
                    op,
                    start_ns: sp.start_ns,
                    dur_ns: sp.dur_ns,
                    run: *run,
                }
            })
            .collect();
        let mut by_node: Vec<profile::NodeStat> = log
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, s)| s.0 > 0)
            .map(|(i, s)| profile::NodeStat {
                node: g.nodes[i].name.clone(),
                op: op_name(&g.nodes[i]),
                calls: s.0,
                total_ns: s.1,
            })
            .collect();
        let mut by_op: Vec<profile::OpStat> = Vec::new();
        for n in &by_node {
            match by_op.iter_mut().find(|o| o.op == n.op) {
                Some(o) => {
                    o.calls += n.calls;
                    o.total_ns += n.total_ns;
                }
                None => by_op.push(profile::OpStat {
                    op: n.op.clone(),
                    calls: n.calls,
                    total_ns: n.total_ns,
                }),
            }
        }
        by_op.sort_by_key(|o| core::cmp::Reverse(o.total_ns));
        by_node.sort_by_key(|n| core::cmp::Reverse(n.total_ns));
        let order = [
            Phase::Load,
            Phase::Optimise,
            Phase::Plan,
            Phase::Bind,
            Phase::Kernel,
            Phase::Copy,
            Phase::Readback,
            Phase::Run,
        ];
        let pick = |v: &[(Phase, u64, u64)]| -> Vec<(Phase, u64, u64)> {
            order
                .iter()
                .filter_map(|p| v.iter().find(|q| q.0 == *p).copied())
                .collect()
        };
        Some(PhaseProfile {
            spans,
            runs: log.runs,
            phase_ns: pick(&log.phases),
            load_ns: pick(&log.load_phases),
            by_op,
            by_node,
        })
    }

    /// Forgets every profiled span and aggregate (load-time spans included).
    pub fn reset_phase_profile(&self) {
        *self.log.lock() = ProfileLog::default();
    }

    /// The figures of the most recent memory plan: the one a planned run built for new input
    /// shapes, or the one an eager run re-planned while the planner's diagnostics are on.
    pub fn activation_memory_plan_stats(&self) -> Option<MemoryPlanStats> {
        *self.last_stats.lock()
    }

    /// How many memory plans this session has built (planned-mode misses plus eager re-plans).
    pub fn memory_plans_built(&self) -> usize {
        self.plans_built.load(Ordering::Relaxed)
    }

    /// Runs the model: feeds by name, outputs in graph order (read back to the host).
    pub fn run_async<'a>(
        &'a self,
        feeds: Vec<(String, Value)>,
    ) -> BoxFuture<'a, Result<Vec<(String, Value)>>> {
        self.run_async_with(feeds, RunOptions::default())
    }

    /// [`Session::run_async`] with options. A feed may be a device tensor (an output kept on
    /// the device by an earlier run): it stays there when every node reading it runs on that
    /// device, and is copied (reported in the phase profile) otherwise.
    pub fn run_async_with<'a>(
        &'a self,
        feeds: Vec<(String, Value)>,
        opts: RunOptions,
    ) -> BoxFuture<'a, Result<Vec<(String, Value)>>> {
        Box::pin(async move {
            let profiling = self.profiling();
            let clock = self.clock;
            let mut spans: Vec<RawSpan> = Vec::new();
            let t_run = if profiling { clock() } else { 0 };
            let mut env = self.bind_inputs(feeds)?;
            if profiling {
                spans.push(span_since(clock, Phase::Bind, u32::MAX, t_run));
            }
            self.place_device_feeds(&mut env, if profiling { Some(&mut spans) } else { None })
                .await?;
            let bound = self.bind_outputs(opts.outputs)?;
            let bound = bound.as_ref();
            let run_no = self.runs.fetch_add(1, Ordering::Relaxed) + 1;
            let outs = match self.mode {
                ExecMode::Planned => {
                    self.run_planned_graph(
                        &self.plan,
                        env,
                        if profiling { Some(&mut spans) } else { None },
                        run_no,
                        true,
                        bound,
                    )
                    .await?
                }
                ExecMode::Eager => {
                    if profile::activation_memory_plan_enabled() {
                        // the planner's diagnostics: re-plan this run to report its figures
                        let mut rec = Recording::new(self.plan.graph.values.len());
                        let cx = RunCx {
                            rec: Some(&mut rec),
                            spans: if profiling { Some(&mut spans) } else { None },
                            bound,
                            ..Default::default()
                        };
                        let outs = self.run_plan(&self.plan, env, cx).await?;
                        let t = if profiling { clock() } else { 0 };
                        let rp = self.build_run_plan(&self.plan, Vec::new(), rec, true);
                        if profiling {
                            spans.push(span_since(clock, Phase::Plan, u32::MAX, t));
                        }
                        *self.last_stats.lock() = Some(rp.mem.stats);
                        outs
                    } else {
                        let cx = RunCx {
                            spans: if profiling { Some(&mut spans) } else { None },
                            bound,
                            ..Default::default()
                        };
                        self.run_plan(&self.plan, env, cx).await?
                    }
                }
            };
            let g = &self.plan.graph;
            let t_rb = if profiling { clock() } else { 0 };
            let mut named = Vec::with_capacity(outs.len());
            for (v, &id) in outs.into_iter().zip(&g.outputs) {
                let name = &g.values[id].name;
                let v = if opts.keep_on_device.iter().any(|k| k == name) {
                    v
                } else {
                    self.to_host(v).await?
                };
                named.push((name.clone(), v));
            }
            if profiling {
                spans.push(span_since(clock, Phase::Readback, u32::MAX, t_rb));
                spans.push(span_since(clock, Phase::Run, u32::MAX, t_run));
                let mut log = self.log.lock();
                log.runs += 1;
                let run = run_no.min(u32::MAX as u64) as u32;
                for sp in spans {
                    log.add(run, sp);
                }
            }
            Ok(named)
        })
    }

    /// A planned run of `plan` (the top level, or a subgraph: an If branch): re-uses its
    /// memory plan for these input shapes (graph inputs and captured values), or records this
    /// run to build one. Only the top level's plans count in `memory_plans_built` and
    /// `activation_memory_plan_stats`.
    fn run_planned_graph<'a>(
        &'a self,
        plan: &'a Plan,
        env: Vec<Option<Value>>,
        spans: Option<&'a mut Vec<RawSpan>>,
        run_no: u64,
        top: bool,
        bound: Option<&'a BoundOutputs>,
    ) -> BoxFuture<'a, Result<Vec<Value>>> {
        Box::pin(async move {
            let g = &*plan.graph;
            let shape = |i: usize| match &env[i] {
                Some(Value::Tensor(t)) => Some(t.shape().to_vec()),
                _ => None,
            };
            let sig: Vec<Option<Vec<usize>>> = g
                .inputs
                .iter()
                .map(|&i| shape(i))
                .chain(plan.captures.iter().map(|&(local, _)| shape(local)))
                .collect();
            let cache = &plan.cache;
            let hit = {
                let plans = cache.plans.lock();
                plans.iter().find(|p| p.sig == sig).cloned()
            };
            if let Some(rp) = hit {
                cache.misses.store(0, Ordering::Relaxed);
                let taken = rp.arena.lock().take();
                let arena = match taken {
                    Some(a) if Arc::strong_count(&a) == 1 => a,
                    _ => self.new_arena(rp.mem.stats.arena_bytes, &plan.graph.name)?,
                };
                let cx = RunCx {
                    arena: Some((&arena, &rp)),
                    spans,
                    bound,
                    ..Default::default()
                };
                let outs = self.run_plan(plan, env, cx).await?;
                if self
                    .keep_arena_limit
                    .is_none_or(|k| rp.mem.stats.arena_bytes <= k)
                {
                    *rp.arena.lock() = Some(arena);
                }
                return Ok(outs);
            }
            // Shapes change every run (a decoder's growing cache, say): after a few misses in
            // a row, plan only every 16th run instead of paying to record each one.
            let misses = cache.misses.fetch_add(1, Ordering::Relaxed);
            if misses >= 3 && !run_no.is_multiple_of(16) {
                let cx = RunCx {
                    spans,
                    bound,
                    ..Default::default()
                };
                return self.run_plan(plan, env, cx).await;
            }
            let mut rec = Recording::new(g.values.len());
            let mut spans = spans;
            let outs = {
                let cx = RunCx {
                    rec: Some(&mut rec),
                    spans: spans.as_deref_mut(),
                    bound,
                    ..Default::default()
                };
                self.run_plan(plan, env, cx).await?
            };
            let t = self.clock_if(spans.is_some());
            let rp = self.build_run_plan(plan, sig, rec, top);
            if let Some(sp) = spans {
                sp.push(span_since(self.clock, Phase::Plan, u32::MAX, t));
            }
            if top {
                *self.last_stats.lock() = Some(rp.mem.stats);
            }
            let mut plans = cache.plans.lock();
            if plans.len() >= PLAN_CACHE {
                plans.remove(0);
            }
            plans.push(Arc::new(rp));
            Ok(outs)
        })
    }

    fn clock_if(&self, on: bool) -> u64 {
        if on {
            (self.clock)()
        } else {
            0
        }
    }

    /// Turns a recording into a memory plan (the arena is allocated at its first use).
    fn build_run_plan(
        &self,
        plan: &Plan,
        sig: Vec<Option<Vec<usize>>>,
        mut rec: Recording,
        top: bool,
    ) -> RunPlan {
        if top {
            self.plans_built.fetch_add(1, Ordering::Relaxed);
        }
        for (v, a) in rec.req.values.iter_mut().enumerate() {
            if let Some(a) = a {
                a.last = plan.last_use[v].unwrap_or(a.def).max(a.def);
            }
        }
        let mut mem = planner::plan(&rec.req, plan.steps.len());
        mem.stats.heap_values = rec.heap_values;
        mem.stats.heap_bytes = rec.heap_bytes;
        mem.stats.folded_steps = rec.folded.len();
        mem.stats.folded_bytes = rec.folded_bytes;
        // a kept value only needs a place in a run's values when a step that still runs
        // reads it (the rest feed other kept steps only)
        let g = &*plan.graph;
        let mut kept = vec![false; plan.steps.len()];
        for (si, _) in &rec.folded {
            kept[*si] = true;
        }
        let mut read_by_running = vec![false; g.values.len()];
        for (si, st) in plan.steps.iter().enumerate() {
            if kept[si] {
                continue;
            }
            let node = &g.nodes[st.node];
            for &id in node.inputs.iter().flatten().chain(&node.implicit_inputs) {
                read_by_running[id] = true;
            }
        }
        let mut folded = vec![None; plan.steps.len()];
        for (si, outs) in rec.folded {
            let node = &g.nodes[plan.steps[si].node];
            let needed = node
                .outputs
                .iter()
                .zip(outs)
                .filter_map(|(slot, v)| slot.filter(|&id| read_by_running[id]).map(|id| (id, v)))
                .collect();
            folded[si] = Some(needed);
        }
        let step_outs = plan
            .steps
            .iter()
            .map(|st| {
                g.nodes[st.node]
                    .outputs
                    .iter()
                    .map(|o| o.and_then(|id| Some((mem.regions[id]?, rec.dtypes[id]?))))
                    .collect()
            })
            .collect();
        RunPlan {
            sig,
            mem,
            step_outs,
            folded,
            arena: spin::Mutex::new(None),
        }
    }

    /// Graph inputs fed as device tensors: kept where they are when every step reading them
    /// runs on that device, otherwise read back to the host (the partition's copies then move
    /// them as they move any host feed).
    async fn place_device_feeds(
        &self,
        env: &mut [Option<Value>],
        mut spans: Option<&mut Vec<RawSpan>>,
    ) -> Result<()> {
        let g = &*self.plan.graph;
        for (k, &id) in g.inputs.iter().enumerate() {
            let loc = match &env[id] {
                Some(Value::Tensor(t)) if t.location() != Location::Host => t.location(),
                _ => continue,
            };
            if self.feed_readers[k].iter().any(|&l| l != loc) {
                let t0 = self.clock_if(spans.is_some());
                let v = env[id].take().expect("checked");
                env[id] = Some(self.to_host(v).await?);
                if let Some(sp) = spans.as_deref_mut() {
                    sp.push(span_since(self.clock, Phase::Copy, id as u32, t0));
                }
            }
        }
        Ok(())
    }

    /// The graph value of output `name`, which a caller binds storage to: an
    /// [`Error::Input`] naming the model's outputs when it has none of that name.
    pub fn bound_output_id(&self, name: &str) -> Result<ValueId> {
        let g = &self.plan.graph;
        g.outputs
            .iter()
            .copied()
            .find(|&id| g.values[id].name == name)
            .ok_or_else(|| {
                let names: Vec<&str> = g
                    .outputs
                    .iter()
                    .map(|&id| g.values[id].name.as_str())
                    .collect();
                Error::Input(alloc::format!(
                    "'{name}' is bound as an output but is not one of the model's (outputs: {})",
                    names.join(", ")
                ))
            })
    }

    /// The output storage a run was given ([`RunOptions::outputs`]), by graph output.
    fn bind_outputs(&self, outputs: Vec<(String, Tensor)>) -> Result<Option<BoundOutputs>> {
        if outputs.is_empty() {
            return Ok(None);
        }
        let mut slots: Vec<(ValueId, spin::Mutex<Option<Tensor>>)> = Vec::new();
        for (name, t) in outputs {
            let id = self.bound_output_id(&name)?;
            if slots.iter().any(|(v, _)| *v == id) {
                return Err(Error::Input(alloc::format!(
                    "output '{name}' is bound twice"
                )));
            }
            slots.push((id, spin::Mutex::new(Some(t))));
        }
        Ok(Some(BoundOutputs { slots }))
    }

    fn to_host<'a>(&'a self, v: Value) -> BoxFuture<'a, Result<Value>> {
        Box::pin(async move {
            Ok(match v {
                Value::Tensor(t) => match t.location() {
                    Location::Host => Value::Tensor(t),
                    Location::Device(p) => {
                        let prov = self.providers.get(p as usize).ok_or_else(|| {
                            Error::Provider("tensor of an unknown provider".into())
                        })?;
                        Value::Tensor(prov.download(&t).await?)
                    }
                },
                other => other,
            })
        })
    }

    fn run_plan<'a>(
        &'a self,
        plan: &'a Plan,
        mut env: Vec<Option<Value>>,
        mut rc: RunCx<'a>,
    ) -> BoxFuture<'a, Result<Vec<Value>>> {
        Box::pin(async move {
            let g = &*plan.graph;
            let clock = self.clock;
            for (si, step) in plan.steps.iter().enumerate() {
                let node = &g.nodes[step.node];
                for (ci, &(vid, p)) in step.copies.iter().enumerate() {
                    if let Some(Value::Tensor(t)) = &env[vid] {
                        let prov = &self.providers[p];
                        if t.location() == prov.location() {
                            // a device feed already where this step reads it
                            continue;
                        }
                        let t0 = if rc.spans.is_some() { clock() } else { 0 };
                        let moved = if prov.location() == Location::Host {
                            self.to_host(Value::Tensor(t.clone())).await?
                        } else if step.copy_const.get(ci).copied().unwrap_or(false) {
                            let key = (plan as *const Plan as usize, vid, p);
                            let cached = self.const_uploads.lock().get(&key).cloned();
                            match cached {
                                Some(d) => Value::Tensor(d),
                                None => {
                                    let d = prov.upload(t)?;
                                    self.const_uploads.lock().insert(key, d.clone());
                                    Value::Tensor(d)
                                }
                            }
                        } else {
                            Value::Tensor(prov.upload(t)?)
                        };
                        env[vid] = Some(moved);
                        if let Some(sp) = rc.spans.as_deref_mut() {
                            sp.push(span_since(clock, Phase::Copy, vid as u32, t0));
                        }
                    }
                }
                // a shape-determined step this plan has kept: its outputs, not its kernel
                if let Some(kept) = rc.arena.and_then(|(_, rp)| rp.folded[si].as_ref()) {
                    for (id, v) in kept {
                        env[*id] = Some(v.clone());
                    }
                    for &f in &step.frees {
                        env[f] = None;
                    }
                    continue;
                }
                let t0 = if rc.spans.is_some() { clock() } else { 0 };
                // a kernel that can write over inputs at their last reader gets them by value
                // (eager runs: a planned or recording run keeps every value where it is)
                let reusing = match &step.kind {
                    StepKind::Kernel { provider, kernel }
                        if !kernel.reusable_inputs().is_empty()
                            && rc.arena.is_none()
                            && rc.rec.is_none() =>
                    {
                        Some((*provider, kernel))
                    }
                    _ => None,
                };
                let mut outs = if let Some((provider, kernel)) = reusing {
                    let reuse = kernel.reusable_inputs();
                    let mut owned = Vec::with_capacity(node.inputs.len());
                    for (k, i) in node.inputs.iter().enumerate() {
                        let Some(id) = *i else {
                            owned.push(None);
                            continue;
                        };
                        let once = node.inputs.iter().filter(|x| **x == Some(id)).count() == 1;
                        let v = if reuse.contains(&k) && once && step.frees.contains(&id) {
                            env[id].take()
                        } else {
                            env[id].clone()
                        };
                        if v.is_none() {
                            return Err(Error::node(
                                &node.ctx(),
                                alloc::format!("input '{}' has no value", g.values[id].name),
                            ));
                        }
                        owned.push(v);
                    }
                    let bound = step_bound(rc.bound, node);
                    let cx = KernelCx {
                        cpu: self.providers[provider].cpu_backend(),
                        mem: None,
                        account: Some(&self.account),
                        bound: bound.as_ref(),
                        weights: Some(&self.weight_cache),
                    };
                    kernel
                        .compute_owned(&cx, owned)
                        .map_err(|e| e.in_node(&node.ctx()))?
                } else {
                    let inputs: Vec<Option<&Value>> = node
                        .inputs
                        .iter()
                        .map(|i| i.and_then(|id| env[id].as_ref()))
                        .collect();
                    for (k, i) in node.inputs.iter().enumerate() {
                        if let Some(id) = i {
                            if inputs[k].is_none() {
                                return Err(Error::node(
                                    &node.ctx(),
                                    alloc::format!("input '{}' has no value", g.values[*id].name),
                                ));
                            }
                        }
                    }
                    match &step.kind {
                        StepKind::Kernel { provider, kernel } => {
                            let mem = rc.arena.map(|(arena, rp)| StepMem {
                                arena,
                                outs: &rp.step_outs[si],
                                in_place: rp.mem.in_place[si],
                                taken: AtomicU64::new(0),
                            });
                            let bound = step_bound(rc.bound, node);
                            let cx = KernelCx {
                                cpu: self.providers[*provider].cpu_backend(),
                                mem,
                                account: Some(&self.account),
                                bound: bound.as_ref(),
                                weights: Some(&self.weight_cache),
                            };
                            kernel
                                .compute(&cx, &inputs)
                                .map_err(|e| e.in_node(&node.ctx()))?
                        }
                        StepKind::If {
                            then_branch,
                            else_branch,
                        } => {
                            let cond = crate::kernels::tensor_in(&inputs, 0)
                                .and_then(|t| {
                                    let t = t.to_i64_vec()?;
                                    t.first()
                                        .copied()
                                        .ok_or_else(|| Error::Other("If condition is empty".into()))
                                })
                                .map_err(|e| e.in_node(&node.ctx()))?;
                            let branch = if cond != 0 { then_branch } else { else_branch };
                            let sub_env = self.capture_env(branch, node, &env, &[])?;
                            if self.mode == ExecMode::Planned {
                                // a branch runs planned from its own arena, as the top level
                                let n = branch.cache.runs.fetch_add(1, Ordering::Relaxed) + 1;
                                self.run_planned_graph(branch, sub_env, None, n, false, None)
                                    .await?
                            } else {
                                self.run_plan(branch, sub_env, RunCx::default()).await?
                            }
                        }
                        StepKind::Loop { body } => {
                            let inputs: Vec<Option<Value>> =
                                inputs.iter().map(|v| v.cloned()).collect();
                            self.run_loop(body, node, &env, inputs).await?
                        }
                        StepKind::Scan { body } => {
                            let inputs: Vec<Option<Value>> =
                                inputs.iter().map(|v| v.cloned()).collect();
                            self.run_scan(body, node, &env, inputs).await?
                        }
                        StepKind::SequenceMap { body } => {
                            let inputs: Vec<Option<Value>> =
                                inputs.iter().map(|v| v.cloned()).collect();
                            self.run_sequence_map(body, node, &env, inputs).await?
                        }
                        StepKind::Missing => {
                            return Err(Error::unsupported(&node.ctx(), "no provider runs it"))
                        }
                    }
                };
                if let Some(sp) = rc.spans.as_deref_mut() {
                    sp.push(span_since(clock, Phase::Kernel, step.node as u32, t0));
                }
                if outs.len()
                    < node
                        .outputs
                        .iter()
                        .rposition(|o| o.is_some())
                        .map_or(0, |p| p + 1)
                {
                    return Err(Error::node(
                        &node.ctx(),
                        alloc::format!(
                            "kernel produced {} outputs, the node uses {}",
                            outs.len(),
                            node.outputs.len()
                        ),
                    ));
                }
                if let Some((arena, rp)) = rc.arena {
                    // outputs in the arena must sit exactly where the plan put them
                    for (k, v) in outs.iter_mut().enumerate() {
                        let planned = rp.step_outs[si].get(k).copied().flatten().map(|p| p.0);
                        settle(v, arena, planned)?;
                    }
                }
                if let Some(rec) = rc.rec.as_deref_mut() {
                    if !(step.fold && rec.keep_folded(plan, si, &outs)) {
                        rec.observe(plan, si, step, &env, &outs, &self.providers);
                    }
                }
                for (slot, mut v) in node.outputs.iter().zip(outs) {
                    if let Some(id) = slot {
                        // heap memory a kernel made without a lease is leased now
                        lease_value(&self.account, &mut v, &|| {
                            alloc::format!("an output of {}", node.ctx())
                        })?;
                        env[*id] = Some(v);
                    }
                }
                for &f in &step.frees {
                    env[f] = None;
                }
            }
            let mut outs = Vec::with_capacity(g.outputs.len());
            for &id in &g.outputs {
                let mut v = env[id].clone().ok_or_else(|| {
                    Error::InvalidModel(alloc::format!(
                        "graph output '{}' was never computed",
                        g.values[id].name
                    ))
                })?;
                if let Some((arena, _)) = rc.arena {
                    settle(&mut v, arena, None)?;
                    // what left the arena is on the heap now
                    lease_value(&self.account, &mut v, &|| {
                        alloc::format!("graph output '{}'", g.values[id].name)
                    })?;
                }
                outs.push(v);
            }
            Ok(outs)
        })
    }

    /// The environment of a subgraph: its constants, its captured outer values and `inputs`
    /// bound to its declared inputs.
    fn capture_env(
        &self,
        plan: &Plan,
        node: &Node,
        outer: &[Option<Value>],
        inputs: &[Value],
    ) -> Result<Vec<Option<Value>>> {
        let _ = node;
        let g = &*plan.graph;
        let mut env: Vec<Option<Value>> = vec![None; g.values.len()];
        for (id, v) in &g.initializers {
            env[*id] = Some(v.clone());
        }
        for &(local, outer_id) in &plan.captures {
            env[local] = Some(outer.get(outer_id).cloned().flatten().ok_or_else(|| {
                Error::node(
                    &node.ctx(),
                    alloc::format!("captured value '{}' has no value", g.values[local].name),
                )
            })?);
        }
        for (k, v) in inputs.iter().enumerate() {
            if let Some(&id) = g.inputs.get(k) {
                env[id] = Some(v.clone());
            }
        }
        Ok(env)
    }

    async fn run_loop(
        &self,
        body: &Plan,
        node: &Node,
        outer: &[Option<Value>],
        inputs: Vec<Option<Value>>,
    ) -> Result<Vec<Value>> {
        let ctx = node.ctx();
        let max_trip = match inputs.first().cloned().flatten() {
            Some(v) => Some(
                v.as_tensor()?
                    .to_i64_vec()?
                    .first()
                    .copied()
                    .ok_or_else(|| Error::node(&ctx, "empty trip count"))?,
            ),
            None => None,
        };
        let mut cond = match inputs.get(1).cloned().flatten() {
            Some(v) => v.as_tensor()?.to_i64_vec()?.first().copied().unwrap_or(0) != 0,
            None => true,
        };
        let mut carried: Vec<Value> = inputs
            .iter()
            .skip(2)
            .map(|v| {
                v.clone()
                    .ok_or_else(|| Error::node(&ctx, "missing loop-carried value"))
            })
            .collect::<Result<_>>()?;
        let n_carried = carried.len();
        let n_scan = node.outputs.len().saturating_sub(n_carried);
        let mut scans: Vec<Vec<Value>> = vec![Vec::new(); n_scan];
        let mut i: i64 = 0;
        while cond && max_trip.is_none_or(|m| i < m) {
            let mut body_in = Vec::with_capacity(2 + n_carried);
            body_in.push(Value::Tensor(Tensor::scalar(i)));
            body_in.push(Value::Tensor(Tensor::scalar(cond)));
            body_in.extend(carried.iter().cloned());
            let env = self.capture_env(body, node, outer, &body_in)?;
            let outs = self.run_plan(body, env, RunCx::default()).await?;
            if outs.len() != 1 + n_carried + n_scan {
                return Err(Error::node(
                    &ctx,
                    "loop body returns the wrong number of values",
                ));
            }
            let mut it = outs.into_iter();
            let c = it.next().unwrap();
            cond = c.as_tensor()?.to_i64_vec()?.first().copied().unwrap_or(0) != 0;
            for slot in carried.iter_mut() {
                *slot = it.next().unwrap();
            }
            for s in scans.iter_mut() {
                s.push(it.next().unwrap());
            }
            i += 1;
            if i > (1 << 40) {
                return Err(Error::node(&ctx, "loop does not terminate"));
            }
        }
        let mut outs = carried;
        for s in scans {
            outs.push(stack_scan(s, &ctx)?);
        }
        Ok(outs)
    }

    async fn run_scan(
        &self,
        body: &Plan,
        node: &Node,
        outer: &[Option<Value>],
        inputs: Vec<Option<Value>>,
    ) -> Result<Vec<Value>> {
        let ctx = node.ctx();
        let g = &*body.graph;
        let num_scan_inputs = node.get_i("num_scan_inputs", 0)? as usize;
        if node.opset < 9 {
            return self.run_scan8(body, node, outer, inputs).await;
        }
        let inputs: Vec<Value> = inputs.into_iter().flatten().collect();
        let n_state = inputs.len().saturating_sub(num_scan_inputs);
        let n_scan_out = g.outputs.len().saturating_sub(n_state);
        let in_axes = node.attr_ints("scan_input_axes")?.unwrap_or_default();
        let in_dirs = node.attr_ints("scan_input_directions")?.unwrap_or_default();
        let out_axes = node.attr_ints("scan_output_axes")?.unwrap_or_default();
        let out_dirs = node
            .attr_ints("scan_output_directions")?
            .unwrap_or_default();
        let mut state: Vec<Value> = inputs[..n_state].to_vec();
        let scan_ins: Vec<Tensor> = inputs[n_state..]
            .iter()
            .enumerate()
            .map(|(k, v)| {
                let t = v.as_tensor()?;
                let ax = crate::kernels::norm_axis(*in_axes.get(k).unwrap_or(&0), t.rank())?;
                let mut perm: Vec<usize> = (0..t.rank()).collect();
                perm.remove(ax);
                perm.insert(0, ax);
                t.permute(&perm)
            })
            .collect::<Result<_>>()?;
        let len = scan_ins.first().map_or(0, |t| t.shape()[0]);
        if scan_ins.iter().any(|t| t.shape()[0] != len) {
            return Err(Error::node(&ctx, "scan inputs differ in length"));
        }
        let mut outs: Vec<Vec<Value>> = vec![Vec::new(); n_scan_out];
        for step in 0..len {
            let mut body_in = state.clone();
            for (k, t) in scan_ins.iter().enumerate() {
                let rev = in_dirs.get(k).copied().unwrap_or(0) == 1;
                let idx = if rev { len - 1 - step } else { step };
                let s = t.slice_axis(0, idx, 1, 1)?;
                let shape = s.shape()[1..].to_vec();
                body_in.push(Value::Tensor(s.reshape(&shape)?));
            }
            let env = self.capture_env(body, node, outer, &body_in)?;
            let res = self.run_plan(body, env, RunCx::default()).await?;
            let mut it = res.into_iter();
            for s in state.iter_mut() {
                *s = it
                    .next()
                    .ok_or_else(|| Error::node(&ctx, "scan body output missing"))?;
            }
            for o in outs.iter_mut() {
                o.push(
                    it.next()
                        .ok_or_else(|| Error::node(&ctx, "scan body output missing"))?,
                );
            }
        }
        let mut result = state;
        for (k, mut o) in outs.into_iter().enumerate() {
            if out_dirs.get(k).copied().unwrap_or(0) == 1 {
                o.reverse();
            }
            let stacked = stack_scan(o, &ctx)?.into_tensor()?;
            let ax = *out_axes.get(k).unwrap_or(&0);
            let r = stacked.rank();
            let ax = crate::kernels::norm_axis(ax, r)?;
            let mut perm: Vec<usize> = (1..r).collect();
            perm.insert(ax, 0);
            result.push(Value::Tensor(stacked.permute(&perm)?.contiguous()?));
        }
        Ok(result)
    }

    /// Scan-8: every input has a leading batch axis; scan inputs are `[batch, seq, ...]`, and
    /// the optional first input `sequence_lens` gives each batch entry's sequence length
    /// (scan outputs are zero-padded past it).
    async fn run_scan8(
        &self,
        body: &Plan,
        node: &Node,
        outer: &[Option<Value>],
        mut inputs: Vec<Option<Value>>,
    ) -> Result<Vec<Value>> {
        let ctx = node.ctx();
        let g = &*body.graph;
        let num_scan_inputs = node.get_i("num_scan_inputs", 0)? as usize;
        if inputs.is_empty() {
            return Err(Error::node(&ctx, "Scan-8 needs its sequence_lens slot"));
        }
        let seq_lens = inputs.remove(0);
        let tensors: Vec<Tensor> = inputs
            .into_iter()
            .map(|v| match v {
                Some(v) => Ok(v.into_tensor()?),
                None => Err(Error::node(
                    &ctx,
                    "Scan-8 inputs other than sequence_lens are required",
                )),
            })
            .collect::<Result<_>>()?;
        if num_scan_inputs == 0 || num_scan_inputs > tensors.len() {
            return Err(Error::node(
                &ctx,
                alloc::format!(
                    "num_scan_inputs {num_scan_inputs} does not fit {} inputs",
                    tensors.len()
                ),
            ));
        }
        let n_state = tensors.len() - num_scan_inputs;
        if g.outputs.len() < n_state {
            return Err(Error::node(&ctx, "scan body has fewer outputs than states"));
        }
        let n_scan_out = g.outputs.len() - n_state;
        let dirs = node.attr_ints("directions")?.unwrap_or_default();
        if tensors.iter().any(|t| t.rank() == 0) || tensors[n_state..].iter().any(|t| t.rank() < 2)
        {
            return Err(Error::node(
                &ctx,
                "Scan-8 states need a batch axis and scan inputs [batch, sequence, ...]",
            ));
        }
        let batch = tensors[0].shape()[0];
        let max_len = tensors[n_state].shape()[1];
        if tensors.iter().any(|t| t.shape()[0] != batch)
            || tensors[n_state..].iter().any(|t| t.shape()[1] != max_len)
        {
            return Err(Error::node(
                &ctx,
                "Scan-8 inputs differ in batch size or sequence length",
            ));
        }
        let lens: Vec<usize> = match seq_lens {
            None => vec![max_len; batch],
            Some(v) => {
                let l = v.as_tensor()?.to_i64_vec()?;
                if l.len() != batch || l.iter().any(|&n| n < 0 || n as usize > max_len) {
                    return Err(Error::node(
                        &ctx,
                        alloc::format!(
                            "sequence_lens {l:?} do not fit batch {batch} of length {max_len}"
                        ),
                    ));
                }
                l.into_iter().map(|n| n as usize).collect()
            }
        };
        // one row of a batched tensor, without its batch axis
        let row = |t: &Tensor, b: usize| -> Result<Tensor> {
            let s = t.slice_axis(0, b, 1, 1)?;
            let shape = s.shape()[1..].to_vec();
            s.reshape(&shape)?.contiguous()
        };
        let mut final_states: Vec<Vec<Value>> = vec![Vec::new(); n_state];
        let mut scan_outs: Vec<Vec<Value>> = vec![Vec::new(); n_scan_out];
        for (b, &len) in lens.iter().enumerate() {
            let mut state: Vec<Value> = tensors[..n_state]
                .iter()
                .map(|t| Ok(Value::Tensor(row(t, b)?)))
                .collect::<Result<_>>()?;
            let seqs: Vec<Tensor> = tensors[n_state..]
                .iter()
                .map(|t| row(t, b))
                .collect::<Result<_>>()?;
            let mut outs: Vec<Vec<Value>> = vec![Vec::new(); n_scan_out];
            for step in 0..len {
                let mut body_in = state.clone();
                for (k, t) in seqs.iter().enumerate() {
                    let rev = dirs.get(k).copied().unwrap_or(0) == 1;
                    let idx = if rev { len - 1 - step } else { step };
                    body_in.push(Value::Tensor(row(t, idx)?));
                }
                let env = self.capture_env(body, node, outer, &body_in)?;
                let res = self.run_plan(body, env, RunCx::default()).await?;
                let mut it = res.into_iter();
                for s in state.iter_mut() {
                    *s = it
                        .next()
                        .ok_or_else(|| Error::node(&ctx, "scan body output missing"))?;
                }
                for o in outs.iter_mut() {
                    o.push(
                        it.next()
                            .ok_or_else(|| Error::node(&ctx, "scan body output missing"))?,
                    );
                }
            }
            for (f, s) in final_states.iter_mut().zip(state) {
                f.push(s);
            }
            for (k, mut o) in outs.into_iter().enumerate() {
                if len < max_len {
                    let Some(first) = o.first() else {
                        return Err(Error::unsupported(
                            &ctx,
                            "Scan-8 with an empty sequence in the batch",
                        ));
                    };
                    let t = first.as_tensor()?;
                    let pad = Tensor::zeros(t.dtype(), t.shape())?;
                    o.resize(max_len, Value::Tensor(pad));
                }
                scan_outs[k].push(stack_scan(o, &ctx)?);
            }
        }
        let mut result = Vec::with_capacity(g.outputs.len());
        for f in final_states {
            result.push(stack_scan(f, &ctx)?);
        }
        for o in scan_outs {
            result.push(stack_scan(o, &ctx)?);
        }
        Ok(result)
    }
}

impl Session {
    /// SequenceMap: runs the body once per item of the sequence inputs (tensor inputs are
    /// passed whole to every run) and collects each body output into an output sequence.
    async fn run_sequence_map(
        &self,
        body: &Plan,
        node: &Node,
        outer: &[Option<Value>],
        inputs: Vec<Option<Value>>,
    ) -> Result<Vec<Value>> {
        let ctx = node.ctx();
        let g = &*body.graph;
        let inputs: Vec<Value> = inputs
            .into_iter()
            .map(|v| v.ok_or_else(|| Error::node(&ctx, "SequenceMap inputs may not be omitted")))
            .collect::<Result<_>>()?;
        let len = match inputs.first() {
            Some(Value::Sequence { items, .. }) => items.len(),
            _ => return Err(Error::node(&ctx, "SequenceMap input 0 must be a sequence")),
        };
        for v in &inputs {
            match v {
                Value::Sequence { items, .. } if items.len() != len => {
                    return Err(Error::node(
                        &ctx,
                        alloc::format!(
                            "SequenceMap sequence inputs differ in length ({} and {len})",
                            items.len()
                        ),
                    ))
                }
                Value::Sequence { .. } | Value::Tensor(_) => {}
                other => {
                    return Err(Error::node(
                        &ctx,
                        alloc::format!("SequenceMap input is a {}", other.kind_name()),
                    ))
                }
            }
        }
        if g.inputs.len() != inputs.len() {
            return Err(Error::node(
                &ctx,
                alloc::format!(
                    "SequenceMap body takes {} inputs, the node has {}",
                    g.inputs.len(),
                    inputs.len()
                ),
            ));
        }
        let n_out = g.outputs.len();
        let mut outs: Vec<Vec<Value>> = vec![Vec::with_capacity(len); n_out];
        for i in 0..len {
            let body_in: Vec<Value> = inputs
                .iter()
                .map(|v| match v {
                    Value::Sequence { items, .. } => items[i].clone(),
                    other => other.clone(),
                })
                .collect();
            let env = self.capture_env(body, node, outer, &body_in)?;
            let res = self.run_plan(body, env, RunCx::default()).await?;
            if res.len() != n_out {
                return Err(Error::node(
                    &ctx,
                    "SequenceMap body returns the wrong number of values",
                ));
            }
            for (o, v) in outs.iter_mut().zip(res) {
                o.push(v);
            }
        }
        Ok(outs
            .into_iter()
            .zip(&g.outputs)
            .map(|(items, &id)| {
                let elem = match items.first() {
                    Some(Value::Tensor(t)) => TypeInfo::Tensor {
                        dtype: Some(t.dtype()),
                        shape: None,
                    },
                    Some(v) => v.type_info(),
                    None => g.values[id].ty.clone(),
                };
                Value::Sequence { elem, items }
            })
            .collect())
    }
}

/// Stacks per-iteration tensors along a new leading axis.
fn stack_scan(items: Vec<Value>, ctx: &crate::error::NodeContext) -> Result<Value> {
    if items.is_empty() {
        return Ok(Value::Tensor(Tensor::zeros(DataType::Float, &[0])?));
    }
    let ts: Vec<&Tensor> = items.iter().map(|v| v.as_tensor()).collect::<Result<_>>()?;
    let shape0 = ts[0].shape().to_vec();
    if ts
        .iter()
        .any(|t| t.shape() != shape0.as_slice() || t.dtype() != ts[0].dtype())
    {
        return Err(Error::node(
            ctx,
            "scan outputs differ in shape across iterations",
        ));
    }
    let mut shape = vec![ts.len()];
    shape.extend_from_slice(&shape0);
    let dt = ts[0].dtype();
    let v = crate::dispatch_any!(dt, T => {
        let mut all: Vec<T> = Vec::new();
        for t in &ts { all.extend_from_slice(&t.as_slice::<T>()?); }
        Tensor::from_vec(&shape, all)?
    }, else return Err(Error::unsupported(ctx, alloc::format!("scan outputs of type {dt}"))));
    Ok(Value::Tensor(v))
}

fn check_feed(name: &str, declared: &TypeInfo, v: &Value) -> Result<()> {
    match (declared, v) {
        (TypeInfo::Tensor { dtype, shape }, Value::Tensor(t)) => {
            if let Some(dt) = dtype {
                if *dt != t.dtype() {
                    return Err(Error::Input(alloc::format!(
                        "input '{name}' expects {dt}, got {}",
                        t.dtype()
                    )));
                }
            }
            if let Some(shape) = shape {
                if shape.len() != t.rank() {
                    return Err(Error::Input(alloc::format!(
                        "input '{name}' expects rank {} ({}), got shape {:?}",
                        shape.len(),
                        declared,
                        t.shape()
                    )));
                }
                for (d, &n) in shape.iter().zip(t.shape()) {
                    if let Dim::Known(k) = d {
                        if *k != n {
                            return Err(Error::Input(alloc::format!(
                                "input '{name}' expects shape {declared}, got {:?}",
                                t.shape()
                            )));
                        }
                    }
                }
            }
            Ok(())
        }
        (TypeInfo::Tensor { .. }, other) => Err(Error::Input(alloc::format!(
            "input '{name}' expects a tensor, got a {}",
            other.kind_name()
        ))),
        (TypeInfo::Sequence(_), Value::Sequence { .. })
        | (TypeInfo::Map { .. }, Value::Map(_))
        | (TypeInfo::Optional(_), _)
        | (TypeInfo::Unknown, _) => Ok(()),
        (d, other) => Err(Error::Input(alloc::format!(
            "input '{name}' expects {d}, got a {}",
            other.kind_name()
        ))),
    }
}

/// Element types of a node's inputs as far as inference knows them.
pub fn input_types(g: &Graph, node: &Node) -> Vec<Option<DataType>> {
    node.inputs
        .iter()
        .map(|i| i.and_then(|id| g.values[id].ty.tensor_dtype()))
        .collect()
}

/// Per graph input of `plan`: the distinct locations of the steps that read it (explicitly or
/// as a subgraph capture); a step that is not a kernel runs on the host.
fn feed_readers(plan: &Plan, providers: &[Arc<dyn ExecutionProvider>]) -> Vec<Vec<Location>> {
    let g = &*plan.graph;
    let mut out: Vec<Vec<Location>> = vec![Vec::new(); g.inputs.len()];
    for st in &plan.steps {
        let node = &g.nodes[st.node];
        let loc = match &st.kind {
            StepKind::Kernel { provider, .. } => providers[*provider].location(),
            _ => Location::Host,
        };
        for &id in node.inputs.iter().flatten().chain(&node.implicit_inputs) {
            if let Some(k) = g.inputs.iter().position(|&i| i == id) {
                if !out[k].contains(&loc) {
                    out[k].push(loc);
                }
            }
        }
    }
    out
}

fn compile(
    graph: &Arc<Graph>,
    providers: &[Arc<dyn ExecutionProvider>],
    report: &mut PartitionReport,
    parent: Option<&Graph>,
    prepack: bool,
) -> Result<Plan> {
    let g = &**graph;
    let mut captures = Vec::with_capacity(g.captures.len());
    for (name, local) in &g.captures {
        let outer = parent.and_then(|p| p.find_value(name)).ok_or_else(|| {
            Error::InvalidModel(alloc::format!("subgraph captures unknown value '{name}'"))
        })?;
        captures.push((*local, outer));
    }
    // Location of each value as the plan runs (graph inputs and constants start on the host).
    let mut loc: Vec<Option<usize>> = vec![None; g.values.len()];
    let host = providers
        .iter()
        .position(|p| p.location() == Location::Host)
        .unwrap_or(0);
    let mut steps = Vec::with_capacity(g.nodes.len());
    let mut is_init = vec![false; g.values.len()];
    let mut init_at: Vec<Option<usize>> = vec![None; g.values.len()];
    for (k, (id, _)) in g.initializers.iter().enumerate() {
        is_init[*id] = true;
        init_at[*id] = Some(k);
    }
    for (ni, node) in g.nodes.iter().enumerate() {
        let tys = input_types(g, node);
        let kind = match (node.domain.as_str(), node.op_type.as_str()) {
            ("", "If") => {
                let then_g = node
                    .attr_g("then_branch")?
                    .ok_or_else(|| Error::node(&node.ctx(), "If without then_branch"))?;
                let else_g = node
                    .attr_g("else_branch")?
                    .ok_or_else(|| Error::node(&node.ctx(), "If without else_branch"))?;
                count(report, "cpu", 1);
                StepKind::If {
                    then_branch: Box::new(compile(then_g, providers, report, Some(g), prepack)?),
                    else_branch: Box::new(compile(else_g, providers, report, Some(g), prepack)?),
                }
            }
            ("", "Loop") => {
                let body = node
                    .attr_g("body")?
                    .ok_or_else(|| Error::node(&node.ctx(), "Loop without body"))?;
                count(report, "cpu", 1);
                StepKind::Loop {
                    body: Box::new(compile(body, providers, report, Some(g), prepack)?),
                }
            }
            ("", "Scan") => {
                let body = node
                    .attr_g("body")?
                    .ok_or_else(|| Error::node(&node.ctx(), "Scan without body"))?;
                count(report, "cpu", 1);
                StepKind::Scan {
                    body: Box::new(compile(body, providers, report, Some(g), prepack)?),
                }
            }
            ("", "SequenceMap") => {
                let body = node
                    .attr_g("body")?
                    .ok_or_else(|| Error::node(&node.ctx(), "SequenceMap without body"))?;
                count(report, "cpu", 1);
                StepKind::SequenceMap {
                    body: Box::new(compile(body, providers, report, Some(g), prepack)?),
                }
            }
            _ => {
                let mut chosen = None;
                let mut reason = String::new();
                let mut declined = Vec::new();
                for (pi, p) in providers.iter().enumerate() {
                    match p.supports(node, &tys) {
                        Support::Yes => {
                            chosen = Some(pi);
                            break;
                        }
                        Support::No(r) => {
                            declined.push((p.name().to_string(), r.clone()));
                            reason = r;
                        }
                    }
                }
                match chosen {
                    Some(pi) => match providers[pi].create_kernel(node, &tys) {
                        Ok(mut kernel) => {
                            let consts: Vec<Option<&Tensor>> = node
                                .inputs
                                .iter()
                                .map(|i| match i.and_then(|id| init_at[id]) {
                                    Some(k) => match &g.initializers[k].1 {
                                        Value::Tensor(t) => Some(t),
                                        _ => None,
                                    },
                                    None => None,
                                })
                                .collect();
                            if prepack {
                                report.prepacked_bytes += kernel.prepare(&consts);
                            }
                            count(report, providers[pi].name(), 1);
                            if !declined.is_empty() {
                                report.fallbacks.push(Fallback {
                                    node: node.name.clone(),
                                    op: node.op_type.clone(),
                                    to: providers[pi].name().to_string(),
                                    declined,
                                });
                            }
                            StepKind::Kernel {
                                provider: pi,
                                kernel,
                            }
                        }
                        Err(e) => {
                            let reason = match e {
                                Error::Unsupported { detail, .. } => detail,
                                Error::Node { detail, .. } => detail,
                                e => e.to_string(),
                            };
                            report.unsupported.push(unsupported(node, reason));
                            StepKind::Missing
                        }
                    },
                    None => {
                        report.unsupported.push(unsupported(node, reason));
                        StepKind::Missing
                    }
                }
            }
        };
        // Copies: a kernel step reads from its provider's location.
        let target = match &kind {
            StepKind::Kernel { provider, .. } => *provider,
            _ => host,
        };
        let mut copies = Vec::new();
        let mut copy_const = Vec::new();
        let wanted = node
            .inputs
            .iter()
            .enumerate()
            .filter_map(|(k, i)| Some((Some(k), (*i)?)))
            .chain(node.implicit_inputs.iter().map(|&id| (None, id)));
        for (k, id) in wanted {
            let want = match (&kind, k) {
                (StepKind::Kernel { provider, .. }, Some(k)) => {
                    match providers[*provider].input_placement(node, k) {
                        InputPlacement::Provider => target,
                        InputPlacement::Host => host,
                        InputPlacement::Any => continue,
                    }
                }
                _ => target,
            };
            let at = loc[id].unwrap_or(host);
            if providers[at].location() != providers[want].location() {
                copies.push((id, want));
                copy_const.push(is_init[id]);
                report.copies += 1;
                report.copy_list.push(CopyInfo {
                    value: g.values[id].name.clone(),
                    from: providers[at].name().to_string(),
                    to: providers[want].name().to_string(),
                    node: node.name.clone(),
                    once: is_init[id] && providers[want].location() != Location::Host,
                });
                loc[id] = Some(want);
            }
        }
        if let StepKind::Kernel { provider, .. } = &kind {
            report.assignments.push((
                node.name.clone(),
                node.op_type.clone(),
                providers[*provider].name().to_string(),
            ));
        }
        for o in node.outputs.iter().flatten() {
            loc[*o] = Some(target);
        }
        let in_place_ok = node.domain.is_empty() && IN_PLACE_OPS.contains(&node.op_type.as_str());
        steps.push(Step {
            node: ni,
            kind,
            in_place_ok,
            frees: Vec::new(),
            copies,
            copy_const,
            fold: false,
        });
    }
    let on_host = |si: usize| match &steps[si].kind {
        StepKind::Kernel { provider, .. } => providers[*provider].location() == Location::Host,
        _ => false,
    };
    let captured: Vec<ValueId> = captures.iter().map(|&(local, _)| local).collect();
    let fold = crate::shapefold::shape_determined_nodes(g, on_host, &captured);
    for (st, f) in steps.iter_mut().zip(fold) {
        st.fold = f;
    }
    // Graph outputs go back to the host at the end (counted as copies when on a device).
    for &o in &g.outputs {
        if let Some(p) = loc[o] {
            if providers[p].location() != Location::Host {
                report.copies += 1;
                report.copy_list.push(CopyInfo {
                    value: g.values[o].name.clone(),
                    from: providers[p].name().to_string(),
                    to: providers[host].name().to_string(),
                    node: String::new(),
                    once: false,
                });
            }
        }
    }
    // Value lifetimes: free each value after its last reader (never graph outputs).
    let mut last: Vec<Option<usize>> = vec![None; g.values.len()];
    for (si, node) in g.nodes.iter().enumerate() {
        for id in node
            .inputs
            .iter()
            .flatten()
            .chain(node.implicit_inputs.iter())
        {
            last[*id] = Some(si);
        }
    }
    let mut is_output = vec![false; g.values.len()];
    for &o in &g.outputs {
        last[o] = None;
        is_output[o] = true;
    }
    // outputs nobody reads die where they are made
    for (si, node) in g.nodes.iter().enumerate() {
        for o in node.outputs.iter().flatten() {
            if last[*o].is_none() && !is_output[*o] {
                last[*o] = Some(si);
            }
        }
    }
    for (id, l) in last.iter().enumerate() {
        if let Some(si) = l {
            steps[*si].frees.push(id);
        }
    }
    Ok(Plan {
        graph: graph.clone(),
        steps,
        last_use: last,
        is_output,
        captures,
        cache: PlanCache::default(),
    })
}

fn count(report: &mut PartitionReport, name: &str, n: usize) {
    match report
        .nodes_per_provider
        .iter_mut()
        .find(|(p, _)| p == name)
    {
        Some((_, c)) => *c += n,
        None => report.nodes_per_provider.push((name.to_string(), n)),
    }
}

fn unsupported(node: &Node, reason: String) -> Unsupported {
    Unsupported {
        node: node.name.clone(),
        op: node.op_type.clone(),
        domain: if node.domain.is_empty() {
            "ai.onnx".into()
        } else {
            node.domain.clone()
        },
        opset: node.opset,
        reason,
    }
}

/// A span from `t0` to now.
#[inline]
fn span_since(clock: Clock, phase: Phase, what: u32, t0: u64) -> RawSpan {
    RawSpan {
        phase,
        what,
        start_ns: t0,
        dur_ns: clock().saturating_sub(t0),
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // what depends on the session (a KV pool's pages) must have gone before it
        self.account.close();
    }
}

/// Leases the heap storage in `v` (each tensor inside a sequence, map or optional too) that no
/// lease covers yet from `account`. Storage under [`crate::governor::SMALL`] bytes is left
/// unleased, so values of many scalars (a classifier's maps) cost one walk and nothing more.
fn lease_value(account: &Arc<Account>, v: &mut Value, what: &dyn Fn() -> String) -> Result<()> {
    let mut one = |t: &mut Tensor| t.lease_unleased(Some(account), Holder::Outputs, what);
    match v {
        Value::Tensor(t) => one(t),
        _ => v.try_for_each_tensor_mut(&mut one),
    }
}

/// Leases the host storage of `g`'s initializers (once per storage shared by several) from
/// `account` as its weights; in a `pool`, shares each with the pool's other sessions instead
/// (the pool holds one copy of each distinct storage and its lease).
fn lease_weights(
    account: &Arc<Account>,
    pool: Option<&crate::governor::MemoryPool>,
    g: &mut Graph,
) -> Result<()> {
    type Held = (Arc<crate::tensor::Data>, Arc<Lease>);
    let mut seen: alloc::collections::BTreeMap<usize, Held> = Default::default();
    for (id, v) in &mut g.initializers {
        let name = &g.values[*id].name;
        v.try_for_each_tensor_mut(&mut |t| {
            if !t.needs_lease() {
                return Ok(());
            }
            let Some(data) = t.host_storage() else {
                return Ok(());
            };
            let addr = Arc::as_ptr(data) as usize;
            let (d, l) = match seen.get(&addr) {
                Some(h) => h.clone(),
                None => {
                    let what = || alloc::format!("initializer '{name}'");
                    let h = match pool {
                        Some(p) => p.share(data.clone(), &what)?,
                        None => {
                            let l = Lease::take(
                                Some(account),
                                Tier::Host,
                                Holder::Weights,
                                t.storage_bytes(),
                                &what,
                            )?;
                            (data.clone(), Arc::new(l))
                        }
                    };
                    seen.insert(addr, h.clone());
                    h
                }
            };
            t.set_host_storage(d, l);
            Ok(())
        })?;
    }
    Ok(())
}

/// Leases the host storage of the initializers of `g`'s subgraphs, at every depth (once per
/// storage), from `account` as weights; the session holds the leases (subgraphs are shared,
/// immutable graphs, so the lease cannot ride in their tensors).
fn lease_subgraph_weights(account: &Arc<Account>, g: &Graph) -> Result<Vec<Lease>> {
    let mut seen = alloc::collections::BTreeSet::new();
    let mut leases = Vec::new();
    let mut err = None;
    g.walk_nodes(&mut |n, _| {
        for (_, sg) in n.subgraphs() {
            for (id, v) in &sg.initializers {
                let Value::Tensor(t) = v else { continue };
                if err.is_some() || t.lease().is_some() {
                    continue;
                }
                let Some(d) = t.host_storage() else { continue };
                if !seen.insert(Arc::as_ptr(d) as usize) {
                    continue;
                }
                let name = &sg.values[*id].name;
                match Lease::take(
                    Some(account),
                    Tier::Host,
                    Holder::Weights,
                    t.storage_bytes(),
                    &|| alloc::format!("initializer '{name}' of a subgraph"),
                ) {
                    Ok(l) => leases.push(l),
                    Err(e) => err = Some(e),
                }
            }
        }
    });
    match err {
        Some(e) => Err(e),
        None => Ok(leases),
    }
}

/// Leaves `v` as is when it is on the heap or exactly at `planned` in `arena`; otherwise copies
/// every arena tensor in it out to the heap (a kernel returned some other view of the arena,
/// or the value must outlive the run).
fn settle(v: &mut Value, arena: &Arc<HostArena>, planned: Option<Region>) -> Result<()> {
    match v {
        Value::Tensor(t) => {
            if let Some(r) = t.arena_region() {
                let ok = planned.is_some_and(|p| r.is(arena, p)) && t.is_whole_storage();
                if !ok {
                    *t = t.detach_arena()?;
                }
            }
            Ok(())
        }
        Value::Sequence { items, .. } => {
            for it in items {
                settle(it, arena, None)?;
            }
            Ok(())
        }
        Value::Map(m) => {
            if m.keys.arena_region().is_some() {
                m.keys = m.keys.detach_arena()?;
            }
            for it in &mut m.values {
                settle(it, arena, None)?;
            }
            Ok(())
        }
        Value::Optional { value, .. } => match value {
            Some(b) => settle(b, arena, None),
            None => Ok(()),
        },
    }
}

impl Recording {
    fn new(values: usize) -> Recording {
        Recording {
            req: PlanRequest {
                values: vec![None; values],
                views: Vec::new(),
                in_place: Vec::new(),
            },
            dtypes: vec![None; values],
            heap_values: 0,
            heap_bytes: 0,
            folded: Vec::new(),
            folded_bytes: 0,
        }
    }

    /// Keeps a shape-determined step's outputs for the plan when they are small host tensors
    /// (never graph outputs, which the caller owns) and the plan's budget allows; the planner
    /// then leaves them out of the arena.
    fn keep_folded(&mut self, plan: &Plan, si: usize, outs: &[Value]) -> bool {
        let node = &plan.graph.nodes[plan.steps[si].node];
        let mut bytes = 0usize;
        for (slot, v) in node.outputs.iter().zip(outs) {
            let Value::Tensor(t) = v else { return false };
            if t.location() != Location::Host || slot.is_some_and(|id| plan.is_output[id]) {
                return false;
            }
            bytes += t.byte_size();
        }
        if outs.len() != node.outputs.len()
            || bytes > FOLD_STEP_BYTES
            || self.folded_bytes + bytes > FOLD_PLAN_BYTES
        {
            return false;
        }
        self.folded_bytes += bytes;
        self.folded.push((si, outs.to_vec()));
        true
    }

    /// Notes the sizes of a step's outputs, which of them view an input, and whether output 0
    /// could overwrite an input.
    fn observe(
        &mut self,
        plan: &Plan,
        si: usize,
        step: &Step,
        env: &[Option<Value>],
        outs: &[Value],
        providers: &[Arc<dyn ExecutionProvider>],
    ) {
        let g = &*plan.graph;
        let node = &g.nodes[step.node];
        let on_host = match &step.kind {
            StepKind::Kernel { provider, .. } => providers[*provider].location() == Location::Host,
            _ => false,
        };
        for (k, (slot, v)) in node.outputs.iter().zip(outs).enumerate() {
            let Some(id) = *slot else { continue };
            let Value::Tensor(t) = v else {
                self.heap_values += 1;
                self.heap_bytes += v.byte_size();
                continue;
            };
            let plannable = on_host
                && !plan.is_output[id]
                && arena_dtype(t.dtype())
                && t.is_whole_storage()
                && !t.is_empty();
            if !plannable {
                self.heap_values += 1;
                self.heap_bytes += t.byte_size();
                continue;
            }
            // a view of an unplanned value (a constant, a kept shape value) holds no bytes of
            // its own: nothing to place
            let views_unplanned = node.inputs.iter().flatten().any(|&iid| {
                self.req.values[iid].is_none()
                    && matches!(&env[iid], Some(Value::Tensor(ti)) if ti.shares_storage(t))
            });
            if views_unplanned {
                continue;
            }
            let bytes = t.byte_size();
            self.dtypes[id] = Some(t.dtype());
            self.req.values[id] = Some(Activation {
                bytes,
                def: si,
                last: si,
            });
            let operands: Vec<usize> = node.inputs.iter().flatten().copied().collect();
            for (j, inp) in node.inputs.iter().enumerate() {
                let Some(iid) = *inp else { continue };
                let Some(Value::Tensor(ti)) = &env[iid] else {
                    continue;
                };
                if ti.shares_storage(t) && ti.is_whole_storage() && ti.byte_size() == bytes {
                    self.req.views.push((id, iid));
                } else if k == 0
                    && j < 2
                    && step.in_place_ok
                    && ti.dtype() == t.dtype()
                    && ti.byte_size() == bytes
                    && ti.shape() == t.shape()
                {
                    self.req.in_place.push(InPlace {
                        step: si,
                        output: id,
                        input_index: j,
                        input: iid,
                        operands: operands.clone(),
                    });
                }
            }
        }
    }
}

/// Per output of `node`, the storage the caller bound to it (`None`: nothing bound here, the
/// common case, which allocates nothing).
fn step_bound(
    bound: Option<&BoundOutputs>,
    node: &Node,
) -> Option<spin::Mutex<Vec<Option<Tensor>>>> {
    let b = bound?;
    if !node.outputs.iter().flatten().any(|&id| b.binds(id)) {
        return None;
    }
    Some(spin::Mutex::new(
        node.outputs
            .iter()
            .map(|o| o.and_then(|id| b.take(id)))
            .collect(),
    ))
}
