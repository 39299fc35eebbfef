//! Heap accounting: the bytes the process's live allocations hold, exported as
//! `meshpilot_heap_allocated_bytes` (istiod's counterpart is `go_memstats_heap_alloc_bytes`).
//! Its gap to the resident set is what the allocator keeps but nothing uses.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::IntGauge;

use super::metrics::{gauge_value, invalid_name};

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// A global allocator that counts the bytes live allocations hold, then asks `A`.
pub struct Counting<A>(pub A);

// SAFETY: every call is passed on to `A` unchanged; only a counter is updated besides.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `A::alloc`'s.
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            added(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            added(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as for `alloc`.
        unsafe { self.0.dealloc(ptr, layout) };
        ALLOCATED.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { self.0.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            ALLOCATED.fetch_sub(layout.size(), Ordering::Relaxed);
            added(new_size);
        }
        p
    }
}

fn added(size: usize) {
    ALLOCATED.fetch_add(size, Ordering::Relaxed);
    if !INSTALLED.load(Ordering::Relaxed) {
        INSTALLED.store(true, Ordering::Relaxed);
    }
}

/// Bytes held by live allocations, when [`Counting`] is the global allocator.
pub fn allocated_bytes() -> Option<usize> {
    INSTALLED.load(Ordering::Relaxed).then(|| ALLOCATED.load(Ordering::Relaxed))
}

/// `meshpilot_heap_allocated_bytes`, read at each scrape; absent where nothing counts.
#[derive(Clone, Debug)]
pub struct HeapCollector {
    gauge: IntGauge,
}

impl HeapCollector {
    /// The collector (register it once per registry).
    pub fn new() -> HeapCollector {
        const NAME: &str = "meshpilot_heap_allocated_bytes";
        let help = "Bytes held by live heap allocations (the resident set less what the allocator keeps unused).";
        HeapCollector { gauge: IntGauge::new(NAME, help).unwrap_or_else(|_| invalid_name(NAME)) }
    }
}

impl Default for HeapCollector {
    fn default() -> Self {
        HeapCollector::new()
    }
}

impl Collector for HeapCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.gauge.desc()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        match allocated_bytes() {
            Some(bytes) => {
                self.gauge.set(gauge_value(bytes));
                self.gauge.collect()
            }
            None => Vec::new(),
        }
    }
}
