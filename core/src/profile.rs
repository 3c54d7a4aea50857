//! Profiling gates and the phase profiler.
//!
//! Each costly diagnostic has its own process-wide gate, an atomic checked by production code,
//! so `no_std` holds and a gate that is off costs one relaxed load per run:
//!
//! - the **phase profiler** (spans for load, optimise, plan, input binding, every kernel, every
//!   copy between providers, output read-back);
//! - the **activation memory planner's diagnostics** (re-planning every eager run to report
//!   [`crate::planner::MemoryPlanStats`]).
//!
//! A gate remembers *how* it was switched on: through the API ([`Source::Api`]) or through the
//! environment ([`Source::Env`], set by a target that has an environment, such as the native
//! crate reading `NXRT_EXEC_PHASE_PROFILE` / `NXRT_ACTIVATION_MEMORY_PLAN`). The two paths stay
//! distinguishable, and switching one off leaves the other.
//!
//! Turning the profiler on never turns the planner's diagnostics on: a profiled run must not pay
//! for (and then report) work an unprofiled run does not do. Tests drive these same gates
//! through [`GateGuard`], which serialises them and restores them on drop, also on panic.

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt::Write;
use core::sync::atomic::{AtomicU8, Ordering};

/// Who switched a gate on (bit flags; a gate is on when any bit is set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A programmatic call such as [`enable_exec_phase_profile_for_process`].
    Api = 1,
    /// The process environment, read by the target.
    Env = 2,
}

static PHASE_PROFILE: AtomicU8 = AtomicU8::new(0);
static MEMORY_PLAN_DIAG: AtomicU8 = AtomicU8::new(0);

/// Turns the phase profiler on for every session in this process. Only the profiler: the
/// memory planner's diagnostics keep their own gate.
///
/// Any later step profiler (GPU decode steps, say) gets its own gate beside these two, and
/// switching it on must not switch the planner on either: the planner's diagnostics re-plan
/// every eager run, which is exactly the cost a profiled run must not pay and then report.
pub fn enable_exec_phase_profile_for_process() {
    PHASE_PROFILE.fetch_or(Source::Api as u8, Ordering::Relaxed);
}

/// Clears the API path of the phase-profiler gate (the environment path stays).
pub fn disable_exec_phase_profile_for_process() {
    PHASE_PROFILE.fetch_and(!(Source::Api as u8), Ordering::Relaxed);
}

/// Whether the phase profiler is on for the process (through any path).
#[inline]
pub fn exec_phase_profile_enabled() -> bool {
    cfg!(feature = "profiling") && PHASE_PROFILE.load(Ordering::Relaxed) != 0
}

/// Turns the activation memory planner's diagnostics on: eager runs re-plan to report
/// [`crate::planner::MemoryPlanStats`]. Costly; never switched on by the profiler.
pub fn enable_activation_memory_plan_for_process() {
    MEMORY_PLAN_DIAG.fetch_or(Source::Api as u8, Ordering::Relaxed);
}

/// Clears the API path of the planner-diagnostics gate.
pub fn disable_activation_memory_plan_for_process() {
    MEMORY_PLAN_DIAG.fetch_and(!(Source::Api as u8), Ordering::Relaxed);
}

/// Whether the planner's diagnostics are on (through any path).
#[inline]
pub fn activation_memory_plan_enabled() -> bool {
    cfg!(feature = "profiling") && MEMORY_PLAN_DIAG.load(Ordering::Relaxed) != 0
}

/// The paths that switched each gate on: `(phase profiler, planner diagnostics)`.
pub fn gate_sources() -> (Vec<Source>, Vec<Source>) {
    let decode = |b: u8| {
        [Source::Api, Source::Env]
            .into_iter()
            .filter(|s| b & (*s as u8) != 0)
            .collect()
    };
    (
        decode(PHASE_PROFILE.load(Ordering::Relaxed)),
        decode(MEMORY_PLAN_DIAG.load(Ordering::Relaxed)),
    )
}

/// Applies the environment path. Targets with an environment call this once with what they
/// read: `NXRT_EXEC_PHASE_PROFILE=1` turns on both the profiler and the planner's diagnostics
/// (the memory report reads the planner's numbers through it); `NXRT_ACTIVATION_MEMORY_PLAN=1`
/// turns on the planner's diagnostics only.
pub fn apply_environment(exec_phase_profile: bool, activation_memory_plan: bool) {
    let env = Source::Env as u8;
    let set = |g: &AtomicU8, on: bool| {
        if on {
            g.fetch_or(env, Ordering::Relaxed);
        } else {
            g.fetch_and(!env, Ordering::Relaxed);
        }
    };
    set(&PHASE_PROFILE, exec_phase_profile);
    set(
        &MEMORY_PLAN_DIAG,
        exec_phase_profile || activation_memory_plan,
    );
}

static GATE_LOCK: spin::Mutex<()> = spin::Mutex::new(());

/// Exclusive access to the process gates for a test or a tool: holds a global lock and
/// restores both gates to what they were when dropped (also when unwinding from a panic).
pub struct GateGuard {
    saved: (u8, u8),
    _lock: spin::MutexGuard<'static, ()>,
}

impl GateGuard {
    /// Waits for the gates and takes them. The gates keep their current values until set.
    pub fn acquire() -> GateGuard {
        let lock = GATE_LOCK.lock();
        GateGuard {
            saved: (
                PHASE_PROFILE.load(Ordering::Relaxed),
                MEMORY_PLAN_DIAG.load(Ordering::Relaxed),
            ),
            _lock: lock,
        }
    }

    /// Clears both gates on every path.
    pub fn clear(&self) {
        PHASE_PROFILE.store(0, Ordering::Relaxed);
        MEMORY_PLAN_DIAG.store(0, Ordering::Relaxed);
    }
}

impl Drop for GateGuard {
    fn drop(&mut self) {
        PHASE_PROFILE.store(self.saved.0, Ordering::Relaxed);
        MEMORY_PLAN_DIAG.store(self.saved.1, Ordering::Relaxed);
    }
}

/// A monotonic clock in nanoseconds, supplied by the target (core has none).
pub type Clock = fn() -> u64;

/// A clock that always reads 0 (targets without one).
pub fn no_clock() -> u64 {
    0
}

/// What a span measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Reading and decoding the model file.
    Load,
    /// Shape inference and graph optimisation.
    Optimise,
    /// Partitioning and compiling kernels at load, or building an activation memory plan.
    Plan,
    /// Checking and binding the feeds.
    Bind,
    /// One node's kernel (or a control-flow node with its subgraphs).
    Kernel,
    /// An explicit copy between providers.
    Copy,
    /// Reading outputs back to the host.
    Readback,
    /// A whole `run`, end to end.
    Run,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Phase::Load => "load",
            Phase::Optimise => "optimise",
            Phase::Plan => "plan",
            Phase::Bind => "bind",
            Phase::Kernel => "kernel",
            Phase::Copy => "copy",
            Phase::Readback => "readback",
            Phase::Run => "run",
        }
    }
}

/// One measured interval.
#[derive(Clone, Debug)]
pub struct Span {
    pub phase: Phase,
    /// Node name for kernels, value name for copies, empty otherwise.
    pub name: String,
    /// Op type for kernels (`domain:op` outside ai.onnx), provider for copies.
    pub op: String,
    pub start_ns: u64,
    pub dur_ns: u64,
    /// Which run this span belongs to (0 for load-time spans, then 1, 2, ...).
    pub run: u32,
}

/// Raw spans as the executor records them: names are resolved only when a report is built,
/// so recording costs two clock reads and a push per span.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawSpan {
    pub phase: Phase,
    /// Node index (kernels) or value id (copies), `u32::MAX` when none.
    pub what: u32,
    pub start_ns: u64,
    pub dur_ns: u64,
}

/// Spans kept per session at most (older runs are folded into the aggregates only).
pub(crate) const MAX_SPANS: usize = 200_000;

/// Per-op aggregate in a [`PhaseProfile`].
#[derive(Clone, Debug, Default)]
pub struct OpStat {
    pub op: String,
    pub calls: u64,
    pub total_ns: u64,
}

/// Per-node aggregate in a [`PhaseProfile`].
#[derive(Clone, Debug, Default)]
pub struct NodeStat {
    pub node: String,
    pub op: String,
    pub calls: u64,
    pub total_ns: u64,
}

/// A session's phase profile: load-time spans, the spans of recorded runs (capped) and
/// aggregates over every profiled run.
#[derive(Clone, Debug, Default)]
pub struct PhaseProfile {
    pub spans: Vec<Span>,
    /// Profiled runs so far.
    pub runs: u32,
    /// Per phase of the profiled runs: (phase, total ns, calls).
    pub phase_ns: Vec<(Phase, u64, u64)>,
    /// Load-time phases: reading the file, optimising, partitioning and compiling kernels.
    pub load_ns: Vec<(Phase, u64, u64)>,
    pub by_op: Vec<OpStat>,
    pub by_node: Vec<NodeStat>,
}

fn us(ns: u64) -> f64 {
    ns as f64 / 1e3
}

impl PhaseProfile {
    /// Total of one phase, in nanoseconds.
    pub fn phase_total_ns(&self, p: Phase) -> u64 {
        self.phase_ns
            .iter()
            .find(|(q, _, _)| *q == p)
            .map_or(0, |x| x.1)
    }

    /// A human-readable table: phases, then ops, then the slowest nodes.
    pub fn table(&self, top_nodes: usize) -> String {
        let mut s = String::new();
        let run_ns = self.phase_total_ns(Phase::Run).max(1);
        let runs = self.runs.max(1) as f64;
        if !self.load_ns.is_empty() {
            let parts: Vec<String> = self
                .load_ns
                .iter()
                .map(|(p, ns, _)| {
                    let what = if *p == Phase::Plan {
                        "plan (partition, kernels)"
                    } else {
                        p.name()
                    };
                    format!("{what} {:.1} us", us(*ns))
                })
                .collect();
            let _ = writeln!(s, "load time: {}", parts.join(", "));
        }
        let _ = writeln!(
            s,
            "phase profile: {} profiled run(s); per-run figures are means",
            self.runs
        );
        let _ = writeln!(
            s,
            "{:<10} {:>8} {:>12} {:>12} {:>8}",
            "phase", "calls", "total us", "us/run", "% run"
        );
        for (p, ns, calls) in &self.phase_ns {
            let _ = writeln!(
                s,
                "{:<10} {:>8} {:>12.1} {:>12.1} {:>8.1}",
                p.name(),
                calls,
                us(*ns),
                us(*ns) / runs,
                100.0 * *ns as f64 / run_ns as f64
            );
        }
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "{:<28} {:>8} {:>12} {:>10} {:>8}",
            "op", "calls", "total us", "mean us", "% run"
        );
        for o in &self.by_op {
            let _ = writeln!(
                s,
                "{:<28} {:>8} {:>12.1} {:>10.2} {:>8.1}",
                o.op,
                o.calls,
                us(o.total_ns),
                us(o.total_ns) / o.calls.max(1) as f64,
                100.0 * o.total_ns as f64 / run_ns as f64
            );
        }
        if top_nodes > 0 && !self.by_node.is_empty() {
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "{:<40} {:<20} {:>8} {:>10} {:>8}",
                "node (slowest first)", "op", "calls", "mean us", "% run"
            );
            for n in self.by_node.iter().take(top_nodes) {
                let _ = writeln!(
                    s,
                    "{:<40} {:<20} {:>8} {:>10.2} {:>8.1}",
                    n.node,
                    n.op,
                    n.calls,
                    us(n.total_ns) / n.calls.max(1) as f64,
                    100.0 * n.total_ns as f64 / run_ns as f64
                );
            }
        }
        s
    }

    /// The spans as Chrome trace-event JSON (open in Perfetto or chrome://tracing).
    pub fn chrome_trace(&self) -> String {
        let mut s = String::from("{\"displayTimeUnit\":\"ns\",\"traceEvents\":[\n");
        let mut first = true;
        for sp in &self.spans {
            if !first {
                s.push_str(",\n");
            }
            first = false;
            let name = if sp.name.is_empty() {
                String::from(sp.phase.name())
            } else {
                sp.name.clone()
            };
            let _ = write!(
                s,
                "{{\"name\":{},\"cat\":\"{}\",\"ph\":\"X\",\"ts\":{:.3},\"dur\":{:.3},\"pid\":1,\"tid\":1,\"args\":{{\"op\":{},\"run\":{}}}}}",
                json_str(&name),
                sp.phase.name(),
                us(sp.start_ns),
                us(sp.dur_ns),
                json_str(&sp.op),
                sp.run
            );
        }
        s.push_str("\n]}\n");
        s
    }
}

/// A JSON string literal.
pub fn json_str(v: &str) -> String {
    let mut s = String::with_capacity(v.len() + 2);
    s.push('"');
    for c in v.chars() {
        match c {
            '"' => s.push_str("\\\""),
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            '\t' => s.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(s, "\\u{:04x}", c as u32);
            }
            c => s.push(c),
        }
    }
    s.push('"');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_path_and_api_path_are_separate() {
        let g = GateGuard::acquire();
        g.clear();
        apply_environment(true, false);
        assert!(exec_phase_profile_enabled());
        assert!(
            activation_memory_plan_enabled(),
            "the env profile switch feeds the memory report"
        );
        assert_eq!(gate_sources().0, [Source::Env]);
        enable_exec_phase_profile_for_process();
        assert_eq!(gate_sources().0, [Source::Api, Source::Env]);
        apply_environment(false, false);
        assert!(
            exec_phase_profile_enabled(),
            "the API path survives the env path going off"
        );
        assert!(!activation_memory_plan_enabled());
        disable_exec_phase_profile_for_process();
        assert!(!exec_phase_profile_enabled());
    }

    #[test]
    fn profiler_api_does_not_enable_planner_diagnostics() {
        let g = GateGuard::acquire();
        g.clear();
        enable_exec_phase_profile_for_process();
        assert!(exec_phase_profile_enabled());
        assert!(!activation_memory_plan_enabled());
        enable_activation_memory_plan_for_process();
        disable_exec_phase_profile_for_process();
        assert!(activation_memory_plan_enabled());
        assert!(!exec_phase_profile_enabled());
    }

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(json_str("a\"b\\c\n\u{1}"), "\"a\\\"b\\\\c\\n\\u0001\"");
    }
}
