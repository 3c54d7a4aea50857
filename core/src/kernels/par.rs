//! Splitting a kernel's output between the backend's threads: shared by every kernel family
//! (convolutions, GEMM batches, attention), so none of them imports another for it.

use crate::provider::CpuBackend;

/// A raw pointer that may be shared with the tasks of [`par_chunks_mut`].
pub(crate) struct SyncPtr<T>(pub(crate) *mut T);
// SAFETY: the pointer is only turned into disjoint `&mut [T]` chunks, one per task index, so
// sharing it between threads is sound whenever `T` may be sent between them.
unsafe impl<T: Send> Sync for SyncPtr<T> {}
impl<T> SyncPtr<T> {
    #[inline]
    pub(crate) fn get(&self) -> *mut T {
        self.0
    }
}

/// Calls `f(i, chunk_i)` for the consecutive `chunk`-sized pieces of `data` (the last may be
/// shorter), in parallel where the backend has threads and the job is worth it: `cost` is the
/// work per element of `data` (simple operations), for the backend's minimum grain.
pub(crate) fn par_chunks_mut<T: Send>(
    cpu: &dyn CpuBackend,
    data: &mut [T],
    chunk: usize,
    cost: usize,
    f: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    if chunk == 0 || data.is_empty() {
        return;
    }
    let len = data.len();
    let n = len.div_ceil(chunk);
    if n == 1 || cpu.threads() <= 1 {
        for (i, c) in data.chunks_mut(chunk).enumerate() {
            f(i, c);
        }
        return;
    }
    let base = SyncPtr(data.as_mut_ptr());
    cpu.parallel_for_work(n, len.saturating_mul(cost.max(1)), &|i| {
        let start = i * chunk;
        if start >= len {
            return;
        }
        let end = (start + chunk).min(len);
        // SAFETY: `parallel_for` runs each index once; the ranges [start, end) of different
        // indices are disjoint and inside `data`, which stays mutably borrowed (and so
        // unaliased) until `parallel_for` returns.
        let s = unsafe { core::slice::from_raw_parts_mut(base.get().add(start), end - start) };
        f(i, s);
    });
}

/// The chunk length for splitting `len` elements into pieces of about `target` (a multiple
/// of `align`), as a whole number of pieces per thread: the pool gives each thread a
/// contiguous share, so an elementwise pass over a layer's output splits it where a
/// row-split GEMM before it did, and each core reads what it wrote (on two cores a pass
/// whose halves sit in the other core's cache ran 1.3x slower than on one).
pub(crate) fn even_chunk(cpu: &dyn CpuBackend, len: usize, target: usize, align: usize) -> usize {
    let (t, align) = (cpu.threads().max(1), align.max(1));
    let pieces = t * len.div_ceil(t * target.max(1)).max(1);
    len.div_ceil(pieces).div_ceil(align) * align
}
