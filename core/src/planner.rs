//! The activation memory planner.
//!
//! Input: for one set of input shapes, every activation's byte size and lifetime (the step that
//! defines it and the last step that reads it), which outputs are views of an input (Reshape,
//! Identity, ...) and which element-wise steps may write over an input that dies there. Output:
//! an offset for each activation in one arena, such that values whose lifetimes overlap never
//! share bytes, views and in-place results share their input's bytes, and the arena is as small
//! as a greedy best-fit placement (largest first) makes it.
//!
//! Values the planner does not place (graph outputs, values of unknown or data-dependent size,
//! strings and packed types, results of control flow) stay on the heap; the stats count them.

use alloc::vec;
use alloc::vec::Vec;

use crate::ir::ValueId;

/// Arena offsets are multiples of this many bytes (a cache line; enough for every SIMD load).
pub const ALIGN: usize = 64;

/// One activation the planner may place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Activation {
    pub bytes: usize,
    /// Step that writes it.
    pub def: usize,
    /// Last step that reads it (`def` when nothing reads it).
    pub last: usize,
}

/// What the planner is asked to place.
#[derive(Clone, Debug, Default)]
pub struct PlanRequest {
    /// Per value id: `Some` for activations the arena may hold.
    pub values: Vec<Option<Activation>>,
    /// `(view, base)`: `view` is a full-size view of `base` (same bytes) made at `view`'s def.
    pub views: Vec<(ValueId, ValueId)>,
    /// `(step, output, input index, input value, other inputs)`: the step may write `output`
    /// over `input` when `input` dies at that step.
    pub in_place: Vec<InPlace>,
}

/// An in-place candidate.
#[derive(Clone, Debug)]
pub struct InPlace {
    pub step: usize,
    pub output: ValueId,
    /// Which of the node's inputs it overwrites.
    pub input_index: usize,
    pub input: ValueId,
    /// Every value the node reads (an in-place write must not alias another operand).
    pub operands: Vec<ValueId>,
}

/// A placed region: `bytes` at `offset` in the arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    pub offset: usize,
    pub bytes: usize,
}

/// Figures a plan reports (what `activation_memory_plan_stats` returns).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MemoryPlanStats {
    /// The arena's size: the planned peak of activation memory.
    pub arena_bytes: usize,
    /// Sum of the sizes of every planned activation (what running without reuse would need).
    pub activation_bytes: usize,
    /// The most activation bytes alive at one step: a lower bound for any placement.
    pub live_peak_bytes: usize,
    /// `activation_bytes / arena_bytes`.
    pub reuse_ratio: f64,
    /// Activations placed in the arena.
    pub planned_values: usize,
    /// Of those, views sharing their base's bytes.
    pub views: usize,
    /// Of those, results written over a dying input.
    pub in_place: usize,
    /// Tensor activations left on the heap (graph outputs, unknown sizes, strings, control flow).
    pub heap_values: usize,
    pub heap_bytes: usize,
    /// Steps whose outputs follow from the input shapes alone (shape arithmetic), kept by the
    /// plan from its recording run: runs of the plan skip them.
    pub folded_steps: usize,
    /// The bytes those kept outputs hold (outside the arena).
    pub folded_bytes: usize,
}

/// The result: a region per value and the in-place decisions per step.
#[derive(Clone, Debug, Default)]
pub struct MemoryPlan {
    pub regions: Vec<Option<Region>>,
    /// Per step: the input index whose bytes output 0 reuses.
    pub in_place: Vec<Option<usize>>,
    pub stats: MemoryPlanStats,
}

struct Sets {
    parent: Vec<usize>,
}

impl Sets {
    fn find(&mut self, mut x: usize) -> usize {
        while self.parent[x] != x {
            self.parent[x] = self.parent[self.parent[x]];
            x = self.parent[x];
        }
        x
    }
}

fn align(n: usize) -> usize {
    n.div_ceil(ALIGN).saturating_mul(ALIGN)
}

/// Places every activation of `req` in one arena. `steps` is the number of steps.
pub fn plan(req: &PlanRequest, steps: usize) -> MemoryPlan {
    let n = req.values.len();
    let mut sets = Sets {
        parent: (0..n).collect(),
    };
    // per set root: [start, end] and bytes
    let mut span: Vec<(usize, usize)> = req
        .values
        .iter()
        .map(|v| v.map_or((0, 0), |a| (a.def, a.last.max(a.def))))
        .collect();
    let ok = |v: ValueId| req.values.get(v).copied().flatten();
    let mut views = 0usize;
    for &(view, base) in &req.views {
        let (Some(a), Some(b)) = (ok(view), ok(base)) else {
            continue;
        };
        if a.bytes != b.bytes {
            continue;
        }
        let (rv, rb) = (sets.find(view), sets.find(base));
        if rv == rb {
            continue;
        }
        sets.parent[rv] = rb;
        span[rb] = (span[rb].0.min(span[rv].0), span[rb].1.max(span[rv].1));
        views += 1;
    }
    let mut in_place = vec![None; steps];
    let mut n_in_place = 0usize;
    let mut cands: Vec<&InPlace> = req.in_place.iter().collect();
    cands.sort_by_key(|c| c.step);
    for c in cands {
        let (Some(o), Some(i)) = (ok(c.output), ok(c.input)) else {
            continue;
        };
        if o.bytes != i.bytes || c.step >= steps || in_place[c.step].is_some() {
            continue;
        }
        let (ro, ri) = (sets.find(c.output), sets.find(c.input));
        if ro == ri || span[ri].1 != c.step || span[ro].0 != c.step {
            continue;
        }
        // the node must not read the overwritten bytes through another operand
        let mut shared = false;
        for (k, &v) in c.operands.iter().enumerate() {
            if k != c.input_index && ok(v).is_some() && sets.find(v) == ri {
                shared = true;
            }
        }
        if shared {
            continue;
        }
        sets.parent[ro] = ri;
        span[ri] = (span[ri].0, span[ro].1);
        in_place[c.step] = Some(c.input_index);
        n_in_place += 1;
    }
    // one block per set
    struct Block {
        root: usize,
        bytes: usize,
        start: usize,
        end: usize,
        offset: usize,
    }
    let mut blocks: Vec<Block> = Vec::new();
    let mut activation_bytes = 0usize;
    let mut planned = 0usize;
    for v in 0..n {
        let Some(a) = ok(v) else { continue };
        activation_bytes = activation_bytes.saturating_add(a.bytes);
        planned += 1;
        if sets.find(v) == v {
            blocks.push(Block {
                root: v,
                bytes: align(a.bytes.max(1)),
                start: span[v].0,
                end: span[v].1,
                offset: 0,
            });
        }
    }
    // live peak (lower bound) from the sets' lifetimes
    let mut delta = vec![0isize; steps + 2];
    for b in &blocks {
        delta[b.start.min(steps)] += b.bytes as isize;
        delta[(b.end + 1).min(steps + 1)] -= b.bytes as isize;
    }
    let (mut live, mut live_peak) = (0isize, 0isize);
    for d in &delta {
        live += d;
        live_peak = live_peak.max(live);
    }
    // greedy: largest first, then earliest; each goes into the smallest gap among the blocks
    // already placed whose lifetimes overlap its own, or above them all
    let mut order: Vec<usize> = (0..blocks.len()).collect();
    order.sort_by(|&x, &y| {
        blocks[y]
            .bytes
            .cmp(&blocks[x].bytes)
            .then(blocks[x].start.cmp(&blocks[y].start))
    });
    let mut placed: Vec<usize> = Vec::with_capacity(blocks.len());
    let mut arena = 0usize;
    let mut busy: Vec<(usize, usize)> = Vec::new();
    for &bi in &order {
        let (s, e, size) = (blocks[bi].start, blocks[bi].end, blocks[bi].bytes);
        busy.clear();
        for &pj in &placed {
            let p = &blocks[pj];
            if p.start <= e && s <= p.end {
                busy.push((p.offset, p.offset + p.bytes));
            }
        }
        busy.sort_unstable();
        let mut best: Option<(usize, usize)> = None; // (gap size, offset)
        let mut cursor = 0usize;
        for &(lo, hi) in &busy {
            if lo > cursor {
                let gap = lo - cursor;
                if gap >= size && best.is_none_or(|(g, _)| gap < g) {
                    best = Some((gap, cursor));
                }
            }
            cursor = cursor.max(hi);
        }
        let off = best.map_or(cursor, |(_, o)| o);
        blocks[bi].offset = off;
        arena = arena.max(off + size);
        placed.push(bi);
    }
    let mut root_region: Vec<Option<Region>> = vec![None; n];
    for b in &blocks {
        root_region[b.root] = Some(Region {
            offset: b.offset,
            bytes: 0,
        });
    }
    let mut regions = vec![None; n];
    for v in 0..n {
        if let Some(a) = ok(v) {
            let r = sets.find(v);
            if let Some(rr) = root_region[r] {
                regions[v] = Some(Region {
                    offset: rr.offset,
                    bytes: a.bytes,
                });
            }
        }
    }
    MemoryPlan {
        regions,
        in_place,
        stats: MemoryPlanStats {
            arena_bytes: arena,
            activation_bytes,
            live_peak_bytes: live_peak.max(0) as usize,
            reuse_ratio: if arena == 0 {
                1.0
            } else {
                activation_bytes as f64 / arena as f64
            },
            planned_values: planned,
            views,
            in_place: n_in_place,
            heap_values: 0,
            heap_bytes: 0,
            folded_steps: 0,
            folded_bytes: 0,
        },
    }
}

/// Checks a plan: regions of values whose lifetimes overlap never share bytes unless the plan
/// made one a view or an in-place result of the other. Returns the first clash.
pub fn find_clash(req: &PlanRequest, plan: &MemoryPlan) -> Option<(ValueId, ValueId)> {
    let n = req.values.len();
    // values that may legitimately share: same set per the plan's own unions
    let mut share: Vec<(ValueId, ValueId)> = req.views.clone();
    for c in &req.in_place {
        if plan.in_place.get(c.step).copied().flatten() == Some(c.input_index) {
            share.push((c.output, c.input));
        }
    }
    let mut sets = Sets {
        parent: (0..n).collect(),
    };
    for (a, b) in share {
        if a < n && b < n {
            let (ra, rb) = (sets.find(a), sets.find(b));
            sets.parent[ra] = rb;
        }
    }
    for a in 0..n {
        let (Some(va), Some(ra)) = (req.values[a], plan.regions[a]) else {
            continue;
        };
        for b in a + 1..n {
            let (Some(vb), Some(rb)) = (req.values[b], plan.regions[b]) else {
                continue;
            };
            let live = va.def <= vb.last.max(vb.def) && vb.def <= va.last.max(va.def);
            let bytes = ra.offset < rb.offset + rb.bytes && rb.offset < ra.offset + ra.bytes;
            if live && bytes && sets.find(a) != sets.find(b) {
                return Some((a, b));
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn act(bytes: usize, def: usize, last: usize) -> Option<Activation> {
        Some(Activation { bytes, def, last })
    }

    #[test]
    fn a_chain_reuses_two_buffers() {
        // v0 -> v1 -> v2 -> v3 -> v4, each read only by the next step
        let req = PlanRequest {
            values: (0..5).map(|i| act(1000, i, i + 1)).collect(),
            ..Default::default()
        };
        let p = plan(&req, 6);
        assert_eq!(find_clash(&req, &p), None);
        assert_eq!(p.stats.arena_bytes, 2 * align(1000));
        assert_eq!(p.stats.activation_bytes, 5000);
        assert!(p.stats.reuse_ratio > 2.0);
        assert_eq!(p.stats.live_peak_bytes, 2 * align(1000));
    }

    #[test]
    fn overlapping_lifetimes_never_share() {
        // a fan-out: v0 read at steps 1..=5, the others short-lived
        let mut values = vec![act(4096, 0, 5)];
        for i in 1..6 {
            values.push(act(64 * i, i, i + 1));
        }
        let req = PlanRequest {
            values,
            ..Default::default()
        };
        let p = plan(&req, 8);
        assert_eq!(find_clash(&req, &p), None);
        let r0 = p.regions[0].unwrap();
        for v in 1..6 {
            let r = p.regions[v].unwrap();
            assert!(r.offset >= r0.offset + r0.bytes || r.offset + r.bytes <= r0.offset);
        }
    }

    #[test]
    fn views_and_in_place_share_their_input() {
        // v0 (step 0) -> view v1 (step 1) -> relu in place v2 (step 2) -> v3 (step 3)
        let req = PlanRequest {
            values: vec![
                act(256, 0, 1),
                act(256, 1, 2),
                act(256, 2, 3),
                act(256, 3, 4),
            ],
            views: vec![(1, 0)],
            in_place: vec![InPlace {
                step: 2,
                output: 2,
                input_index: 0,
                input: 1,
                operands: vec![1],
            }],
        };
        let p = plan(&req, 5);
        assert_eq!(find_clash(&req, &p), None);
        assert_eq!(p.regions[0].unwrap().offset, p.regions[1].unwrap().offset);
        assert_eq!(p.regions[1].unwrap().offset, p.regions[2].unwrap().offset);
        assert_eq!(p.in_place[2], Some(0));
        assert_eq!(p.stats.views, 1);
        assert_eq!(p.stats.in_place, 1);
        assert_eq!(p.stats.arena_bytes, 2 * 256);
    }

    #[test]
    fn in_place_is_refused_when_the_input_lives_on() {
        // v1 = relu(v0) at step 1, but v0 is read again at step 2
        let req = PlanRequest {
            values: vec![act(256, 0, 2), act(256, 1, 2)],
            views: vec![],
            in_place: vec![InPlace {
                step: 1,
                output: 1,
                input_index: 0,
                input: 0,
                operands: vec![0],
            }],
        };
        let p = plan(&req, 3);
        assert_eq!(p.in_place[1], None);
        assert_eq!(find_clash(&req, &p), None);
        assert_ne!(p.regions[0].unwrap().offset, p.regions[1].unwrap().offset);
    }

    #[test]
    fn in_place_is_refused_when_another_operand_reads_the_same_bytes() {
        // v1 = v0 + v0 at step 1
        let req = PlanRequest {
            values: vec![act(256, 0, 1), act(256, 1, 2)],
            views: vec![],
            in_place: vec![InPlace {
                step: 1,
                output: 1,
                input_index: 0,
                input: 0,
                operands: vec![0, 0],
            }],
        };
        let p = plan(&req, 3);
        assert_eq!(p.in_place[1], None);
    }

    #[test]
    fn random_graphs_have_no_clashes_and_respect_the_lower_bound() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = |m: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m as u64) as usize
        };
        for _ in 0..200 {
            let steps = 2 + rnd(40);
            let values: Vec<Option<Activation>> = (0..steps)
                .map(|d| {
                    if rnd(5) == 0 {
                        None
                    } else {
                        let last = d + rnd(steps - d);
                        act(1 + rnd(5000), d, last)
                    }
                })
                .collect();
            let req = PlanRequest {
                values,
                ..Default::default()
            };
            let p = plan(&req, steps);
            assert_eq!(find_clash(&req, &p), None);
            assert!(p.stats.arena_bytes >= p.stats.live_peak_bytes);
        }
    }
}
