//! The session's worker pool: `threads - 1` helper threads, with the calling thread as the
//! first worker.
//!
//! Why not rayon's pool: a rayon pool of `t` workers leaves the calling thread blocked beside
//! them, so a 2-thread session keeps three threads busy on two cores, and every parallel step
//! pays two cross-thread wake-ups (caller to worker, worker back to caller). Here the caller
//! starts on the work at once and the helpers join as they wake; each worker claims chunks of
//! its own home range of the tasks (the same tasks on the same core from one job to the next),
//! then of the others', so a helper that wakes late only takes what is left, and the caller
//! never waits for more than the chunk a helper is in. After a job, helpers spin for a short
//! while (a model's next parallel step usually follows within microseconds) and then sleep on a
//! condition variable, so an idle session costs no CPU.
//!
//! A job started from inside a job (a parallel GEMM inside a parallel convolution task), or
//! while another thread's job holds the pool (two concurrent runs of one session), runs on its
//! caller's thread: never a deadlock, never a wait on another run.

use std::cell::{Cell, UnsafeCell};
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle helper spins (checking for the next job) before it sleeps, unless
/// `NXRT_SPIN_US` says otherwise. Long enough to bridge the host work between a decode step's
/// products and between steps: at 200 us, helpers fell asleep inside llama_bench_fp32's decode
/// steps and its small products then ran on one thread (2 threads: 6.3-6.8 ms a step against
/// 5.3-5.5 ms at 1 ms; docs/genai.md).
const SPIN: Duration = Duration::from_millis(1);

/// Jobs smaller than this (in simple operations, about 0.1 ms of work on one core) do not
/// wake sleeping helpers.
pub const WAKE_MIN_WORK: usize = 1 << 22;

fn spin_time() -> Duration {
    static T: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *T.get_or_init(|| {
        std::env::var("NXRT_SPIN_US")
            .ok()
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(SPIN, Duration::from_micros)
    })
}

/// A job's closure with its lifetime erased: valid while the job's epoch is open, and while any
/// helper that entered the job (counted in `Shared::active`) is still inside it.
#[derive(Clone, Copy)]
struct Job {
    f: *const (dyn Fn(usize) + Sync + 'static),
    n: usize,
    chunk: usize,
}

struct Shared {
    /// Odd while a job is open; each job takes two steps (open, close).
    epoch: AtomicU64,
    /// The open job; written only by the thread holding `busy`, while no helper is inside a job.
    job: UnsafeCell<Job>,
    /// Per worker: the next unclaimed index of its home range of the open job (each on a
    /// cache line of its own).
    cursors: Vec<Cursor>,
    /// Helpers inside the current job.
    active: AtomicUsize,
    /// A helper's task panicked during the current job.
    panicked: AtomicBool,
    /// Held by the thread that runs a job (one at a time).
    busy: AtomicBool,
    shutdown: AtomicBool,
    sleepers: AtomicUsize,
    lock: Mutex<()>,
    wake: Condvar,
}

// SAFETY: `job` is written only by the thread holding `busy` while `active == 0` and the epoch
// is even (no helper reads it then), and read by helpers only between their `active`
// increment and decrement, after confirming that the epoch is the open one they saw; the
// closure it points to is `Sync`.
unsafe impl Sync for Shared {}
unsafe impl Send for Shared {}

thread_local! {
    /// Set while this thread runs a pool task (helpers always; the caller during its job).
    static IN_JOB: Cell<bool> = const { Cell::new(false) };
}

/// A fixed set of helper threads that run `parallel_for` jobs with the calling thread.
pub struct Pool {
    shared: Arc<Shared>,
    helpers: Vec<JoinHandle<()>>,
    threads: usize,
}

impl Pool {
    /// A pool for `threads` workers in all: `threads - 1` helpers are started.
    pub fn new(threads: usize) -> std::io::Result<Pool> {
        let threads = threads.max(1);
        let noop: &'static (dyn Fn(usize) + Sync) = &|_| {};
        let shared = Arc::new(Shared {
            epoch: AtomicU64::new(0),
            job: UnsafeCell::new(Job {
                f: noop as *const _,
                n: 0,
                chunk: 1,
            }),
            cursors: (0..threads).map(|_| Cursor::default()).collect(),
            active: AtomicUsize::new(0),
            panicked: AtomicBool::new(false),
            busy: AtomicBool::new(false),
            shutdown: AtomicBool::new(false),
            sleepers: AtomicUsize::new(0),
            lock: Mutex::new(()),
            wake: Condvar::new(),
        });
        let mut helpers = Vec::with_capacity(threads - 1);
        for i in 1..threads {
            let sh = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("nxrt-cpu-{i}"))
                .spawn(move || helper(&sh, i));
            match h {
                Ok(h) => helpers.push(h),
                Err(e) => {
                    // stop the ones already started
                    drop(Pool {
                        shared,
                        helpers,
                        threads,
                    });
                    return Err(e);
                }
            }
        }
        Ok(Pool {
            shared,
            helpers,
            threads,
        })
    }

    /// Workers in all (helpers and the caller).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f(i)` for every `i in 0..n` once, on the calling thread and the helpers. Returns
    /// when all have run. A panic in any task is resumed on the caller once no helper is
    /// inside the job.
    pub fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        self.run_work(n, usize::MAX, f)
    }

    /// [`run`](Self::run) for a job of about `work` simple operations: below [`WAKE_MIN_WORK`]
    /// it only uses helpers that are awake (spinning after a recent job), never paying a
    /// wake-up (a system call, and on a virtual machine an interrupt to another CPU) for less
    /// work than the wake-up costs.
    pub fn run_work(&self, n: usize, work: usize, f: &(dyn Fn(usize) + Sync)) {
        let sh = &*self.shared;
        if n == 0 {
            return;
        }
        let all_asleep = || sh.sleepers.load(SeqCst) >= self.helpers.len();
        if n == 1
            || self.helpers.is_empty()
            || IN_JOB.with(|c| c.get())
            || (work < WAKE_MIN_WORK && all_asleep())
            || sh
                .busy
                .compare_exchange(false, true, SeqCst, SeqCst)
                .is_err()
        {
            return (0..n).for_each(f);
        }
        // chunks small enough that a late helper finds work, large enough to keep the counter
        // cold: about four per worker
        let chunk = n.div_ceil(4 * self.threads).max(1);
        // SAFETY: the lifetime is erased only for as long as the job is open; `Close` below
        // closes it and waits for every helper to leave before `f` goes out of scope (also
        // when a task panics).
        let f_static: &'static (dyn Fn(usize) + Sync) = unsafe { std::mem::transmute(f) };
        // SAFETY: we hold `busy`, the epoch is even and `active == 0` (the previous job's
        // `Close` waited for it), so no helper reads `job` now.
        unsafe {
            *sh.job.get() = Job {
                f: f_static as *const _,
                n,
                chunk,
            };
        }
        for (w, c) in sh.cursors.iter().enumerate() {
            c.0.store(home(n, self.threads, w).start, SeqCst);
        }
        sh.panicked.store(false, SeqCst);
        let open = sh.epoch.fetch_add(1, SeqCst) + 1;
        debug_assert!(!open.is_multiple_of(2));
        if sh.sleepers.load(SeqCst) > 0 {
            let _g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
            sh.wake.notify_all();
        }
        struct Close<'a>(&'a Shared);
        impl Drop for Close<'_> {
            fn drop(&mut self) {
                let sh = self.0;
                sh.epoch.fetch_add(1, SeqCst);
                let mut spins = 0u32;
                while sh.active.load(SeqCst) != 0 {
                    spins += 1;
                    if spins < 1 << 12 {
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
                IN_JOB.with(|c| c.set(false));
                sh.busy.store(false, SeqCst);
            }
        }
        let close = Close(sh);
        IN_JOB.with(|c| c.set(true));
        claim_and_run(sh, f, n, chunk, 0);
        drop(close);
        if sh.panicked.load(SeqCst) {
            resume_unwind(Box::new("a task of a parallel kernel panicked"));
        }
    }
}

/// A worker's claim counter, alone on its cache line.
#[derive(Default)]
#[repr(align(64))]
struct Cursor(AtomicUsize);

/// Worker `w`'s home range of a job of `n` tasks over `t` workers: contiguous, in order
/// (worker 0, the caller, first).
fn home(n: usize, t: usize, w: usize) -> std::ops::Range<usize> {
    n * w / t..n * (w + 1) / t
}

/// Runs chunks of worker `w`'s home range, then steals what is left of the others' (a late
/// helper's range is taken chunk by chunk by the workers that are there). Home ranges keep
/// the same tasks on the same worker from one job to the next, so a layer's tile of outputs
/// tends to be written on the core that wrote the previous layer's tile at the same positions
/// (one shared counter handed tiles to whichever core came first). Measured effect: small
/// (mobilenet at 2 threads about 0.97x); it did not cure the slow 2-thread splits of small
/// convolutions, whose cause is still open.
fn claim_and_run(sh: &Shared, f: &(dyn Fn(usize) + Sync), n: usize, chunk: usize, w: usize) {
    let t = sh.cursors.len();
    for k in 0..t {
        let v = (w + k) % t;
        let end = home(n, t, v).end;
        loop {
            let s = sh.cursors[v].0.fetch_add(chunk, SeqCst);
            if s >= end {
                break;
            }
            for i in s..(s + chunk).min(end) {
                f(i);
            }
        }
    }
}

fn helper(sh: &Shared, w: usize) {
    IN_JOB.with(|c| c.set(true));
    let mut seen = 0u64;
    loop {
        let Some(e) = wait_for_job(sh, seen) else {
            return;
        };
        seen = e;
        sh.active.fetch_add(1, SeqCst);
        if sh.epoch.load(SeqCst) == e {
            // SAFETY: the epoch is still the open one we saw and we are counted in `active`,
            // so the caller has not closed the job and the closure is alive until we leave.
            let job = unsafe { *sh.job.get() };
            let f = unsafe { &*job.f };
            let run = || claim_and_run(sh, f, job.n, job.chunk, w);
            if catch_unwind(AssertUnwindSafe(run)).is_err() {
                // stop the others claiming more of this job; the caller re-raises
                for c in &sh.cursors {
                    c.0.store(usize::MAX / 2, SeqCst);
                }
                sh.panicked.store(true, SeqCst);
            }
        }
        sh.active.fetch_sub(1, SeqCst);
    }
}

/// Waits for an open epoch other than `seen`: spins for [`SPIN`], then sleeps. `None` on
/// shutdown.
fn wait_for_job(sh: &Shared, seen: u64) -> Option<u64> {
    let ready = |e: u64| e != seen && !e.is_multiple_of(2);
    let t0 = Instant::now();
    let mut spins = 0u32;
    loop {
        if sh.shutdown.load(SeqCst) {
            return None;
        }
        let e = sh.epoch.load(SeqCst);
        if ready(e) {
            return Some(e);
        }
        spins = spins.wrapping_add(1);
        if spins.is_multiple_of(64) && t0.elapsed() > spin_time() {
            break;
        }
        std::hint::spin_loop();
    }
    let mut g = sh.lock.lock().unwrap_or_else(|e| e.into_inner());
    sh.sleepers.fetch_add(1, SeqCst);
    let out = loop {
        if sh.shutdown.load(SeqCst) {
            break None;
        }
        let e = sh.epoch.load(SeqCst);
        if ready(e) {
            break Some(e);
        }
        g = sh.wake.wait(g).unwrap_or_else(|e| e.into_inner());
    };
    sh.sleepers.fetch_sub(1, SeqCst);
    out
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, SeqCst);
        {
            let _g = self.shared.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for h in self.helpers.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_index_runs_once_on_every_size() {
        for threads in [1, 2, 3, 5] {
            let pool = Pool::new(threads).unwrap();
            for n in [0usize, 1, 2, 3, 7, 64, 1000] {
                let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
                // several jobs back to back: helpers must pick up each new epoch
                for _ in 0..50 {
                    pool.run(n, &|i| {
                        hits[i].fetch_add(1, SeqCst);
                    });
                }
                for (i, h) in hits.iter().enumerate() {
                    assert_eq!(h.load(SeqCst), 50, "threads {threads} n {n} index {i}");
                }
            }
        }
    }

    #[test]
    fn helpers_take_part_and_wake_from_sleep() {
        let pool = Pool::new(2).unwrap();
        let main = std::thread::current().id();
        for round in 0..3 {
            if round > 0 {
                // long enough for the helper to stop spinning and sleep
                std::thread::sleep(SPIN * 20);
            }
            let other = AtomicUsize::new(0);
            pool.run(64, &|_| {
                if std::thread::current().id() != main {
                    other.fetch_add(1, SeqCst);
                }
                std::thread::sleep(Duration::from_millis(1));
            });
            assert!(
                other.load(SeqCst) > 0,
                "round {round}: the helper ran nothing"
            );
        }
    }

    #[test]
    fn a_small_job_does_not_wake_a_sleeping_helper() {
        let pool = Pool::new(2).unwrap();
        let main = std::thread::current().id();
        let on_helper = |work: usize| {
            // wait until the helper has stopped spinning and sleeps (polled, not a fixed
            // sleep: on a loaded machine it may take a while to get there)
            let t0 = Instant::now();
            while pool.shared.sleepers.load(SeqCst) < 1 {
                assert!(
                    t0.elapsed() < Duration::from_secs(10),
                    "the helper never slept"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            let other = AtomicUsize::new(0);
            pool.run_work(64, work, &|_| {
                if std::thread::current().id() != main {
                    other.fetch_add(1, SeqCst);
                }
                std::thread::sleep(Duration::from_millis(1));
            });
            other.load(SeqCst)
        };
        assert_eq!(
            on_helper(WAKE_MIN_WORK - 1),
            0,
            "a small job ran on the helper"
        );
        assert!(
            on_helper(WAKE_MIN_WORK) > 0,
            "a large job left the helper asleep"
        );
    }

    #[test]
    fn nested_and_concurrent_jobs_run_without_deadlock() {
        let pool = Arc::new(Pool::new(3).unwrap());
        let total = AtomicUsize::new(0);
        pool.run(8, &|_| {
            // a job inside a job runs on its caller's thread
            pool.run(10, &|_| {
                total.fetch_add(1, SeqCst);
            });
        });
        assert_eq!(total.load(SeqCst), 80);
        // two threads using one pool at once
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let p = pool.clone();
                std::thread::spawn(move || {
                    let s = AtomicUsize::new(0);
                    for _ in 0..200 {
                        p.run(16, &|i| {
                            s.fetch_add(i, SeqCst);
                        });
                    }
                    s.load(SeqCst)
                })
            })
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), 200 * (0..16).sum::<usize>());
        }
    }

    #[test]
    fn a_panicking_task_reaches_the_caller_and_the_pool_goes_on() {
        let pool = Pool::new(2).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(100, &|i| {
                if i == 57 {
                    panic!("task 57");
                }
            })
        }));
        assert!(r.is_err());
        let n = AtomicUsize::new(0);
        pool.run(100, &|_| {
            n.fetch_add(1, SeqCst);
        });
        assert_eq!(n.load(SeqCst), 100);
    }
}
