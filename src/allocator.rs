//! The process's allocator: mimalloc, with the bytes of live allocations counted (exported as
//! `meshpilot_heap_allocated_bytes`), returning freed pages to the OS at once, on small pages.

use std::alloc::{GlobalAlloc, Layout};
use std::os::raw::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};

use libmimalloc_sys::mi_option_set;

static ALLOCATED: AtomicUsize = AtomicUsize::new(0);

/// A global allocator that counts the bytes live allocations hold, then asks `A`.
pub struct Counting<A>(pub A);

// SAFETY: every call is passed on to `A` unchanged; only a counter is updated besides.
unsafe impl<A: GlobalAlloc> GlobalAlloc for Counting<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is `A::alloc`'s.
        let p = unsafe { self.0.alloc(layout) };
        if !p.is_null() {
            ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as for `alloc`.
        let p = unsafe { self.0.alloc_zeroed(layout) };
        if !p.is_null() {
            ALLOCATED.fetch_add(layout.size(), Ordering::Relaxed);
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
            ALLOCATED.fetch_add(new_size, Ordering::Relaxed);
        }
        p
    }
}

/// Bytes held by live allocations, when [`Counting`] is the global allocator.
pub fn allocated_bytes() -> Option<usize> {
    // A running process always holds something: zero means nothing counts (not installed).
    let bytes = ALLOCATED.load(Ordering::Relaxed);
    (bytes > 0).then_some(bytes)
}

/// mimalloc's index of its `purge_delay` option (`mi_option_e` in mimalloc.h; not exported by
/// the bindings). The test below checks it against that option's default.
const MI_OPTION_PURGE_DELAY: c_int = 15;

/// Makes mimalloc return freed pages to the OS as soon as they are free. By default it waits
/// 1 s (10 s for arenas), and only on later allocator activity: a control plane idles between
/// pushes, and kept 3.5 KB of RSS per pod after the watch burst of 10,000 pods this way
/// (`benches/kube_source.rs`; 1.1 KB with this set).
pub fn purge_freed_pages_at_once() {
    // SAFETY: setting an option is a plain store in mimalloc's option table.
    unsafe { mi_option_set(MI_OPTION_PURGE_DELAY, 0) }
}

/// Keeps the kernel from backing the heap with transparent huge pages. mimalloc asks for them
/// on its arenas (`MADV_HUGEPAGE`), and with freed pages returned at once, touching a purged
/// range again faulted in and zeroed a whole 2 MiB page: `clear_page_erms` was 28% of the
/// server's CPU in a 1,000-proxy initial push, and 1% without huge pages.
pub fn no_transparent_huge_pages() {
    // The flag is the process's and read at fault time, so it covers mappings made before too.
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_THP_DISABLE takes plain integers and touches no memory of ours.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_purge_delay_index_names_mimallocs_purge_delay() {
        // SAFETY: reading an option is a plain load from mimalloc's option table.
        let default = unsafe { libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) };
        assert_eq!(default, 1000, "purge_delay's default in mimalloc v3 is 1000 ms");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn huge_pages_are_off_for_the_process() {
        no_transparent_huge_pages();
        // SAFETY: PR_GET_THP_DISABLE only reads the process's flag.
        assert_eq!(unsafe { libc::prctl(libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) }, 1);
    }
}
