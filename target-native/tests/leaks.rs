//! Leak check: a counting global allocator around whole session lifecycles (load, planned and
//! eager runs, outputs dropped, `release_cached`, drop). After one warm-up cycle (statics that
//! initialise once), a second identical cycle must free every byte it allocated, and the
//! governor's process budget must be back where it started (every lease returned).
//!
//! One test per binary: the allocator counts every thread's allocations.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};

use nxrt::governor::{process_budget, Tier};
use nxrt::{ExecMode, Session, Tensor};

struct Counting;

static NET: AtomicIsize = AtomicIsize::new(0);

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        NET.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        NET.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        NET.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        NET.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn cycle(model: &[u8]) {
    for mode in [ExecMode::Planned, ExecMode::Eager] {
        let s = Session::builder().mode(mode).load_bytes(model).unwrap();
        let x = Tensor::from_vec(
            &[1, 1, 16, 16],
            (0..256).map(|i| i as f32 / 256.0).collect(),
        )
        .unwrap();
        for _ in 0..4 {
            let out = s.run([("image", x.clone())]).unwrap();
            assert_eq!(out.len(), 1);
        }
        // an output kept past the session's release
        let kept = s.run([("image", x)]).unwrap();
        s.release_cached();
        drop(s);
        drop(kept);
    }
}

#[test]
fn session_lifecycles_free_every_byte_and_return_every_lease() {
    let model = nxrt::embedded::tiny_cnn();
    let name = Session::builder().load_bytes(&model).unwrap().inputs()[0]
        .name
        .clone();
    assert_eq!(name, "image", "the embedded model's input");
    cycle(&model);
    let (net0, leased0) = (
        NET.load(Ordering::SeqCst),
        process_budget(Tier::Host).in_use(),
    );
    cycle(&model);
    let (net1, leased1) = (
        NET.load(Ordering::SeqCst),
        process_budget(Tier::Host).in_use(),
    );
    assert_eq!(
        leased1, leased0,
        "every lease returned to the process budget"
    );
    assert_eq!(
        net1 - net0,
        0,
        "bytes still allocated after a whole session lifecycle"
    );
}
