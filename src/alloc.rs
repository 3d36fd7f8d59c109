//! The global allocator inside Redis: every allocation goes through Redis'
//! own allocator (so `INFO memory`, `maxmemory` and `MEMORY USAGE` see it).
//!
//! Unlike `redis_module::alloc::RedisAlloc`, zeroed allocations go to
//! `RedisModule_Calloc` — fresh pages from the OS are already zero, so a
//! gigabyte filter costs neither a memset nor resident memory until its bits
//! are set — and growth goes to `RedisModule_Realloc`, which can extend in
//! place.
//!
//! Alignment: Redis' allocator (jemalloc or libc) returns blocks aligned to at
//! least `GUARANTEED_ALIGN`. For larger alignments, `alloc` rounds the size
//! up to a multiple of the alignment, as the crate's allocator does: jemalloc
//! aligns blocks of such sizes to their size class. `realloc` cannot promise
//! even that, so above `GUARANTEED_ALIGN` it allocates, copies and frees.

use std::alloc::{GlobalAlloc, Layout};
use std::os::raw::c_void;

use redis_module::raw;

use crate::stats::{MODULE_ALLOCATED, MODULE_BYTES};

fn counted(ptr: *mut u8, size: usize) -> *mut u8 {
    if !ptr.is_null() {
        MODULE_BYTES.add(size as i64);
        MODULE_ALLOCATED.add(size as u64);
    }
    ptr
}

/// The alignment every malloc-family block has on 64-bit targets.
const GUARANTEED_ALIGN: usize = 2 * std::mem::size_of::<usize>();

#[derive(Clone, Copy, Debug, Default)]
pub struct RedisAllocator;

/// The size Redis is asked for: `layout.size()` rounded up to the alignment.
fn rounded(layout: Layout) -> usize {
    (layout.size() + layout.align() - 1) & !(layout.align() - 1)
}

/// Redis' allocator is missing only if the module runs outside Redis: nothing
/// can go on then, and panicking would allocate.
fn missing() -> ! {
    std::process::abort()
}

unsafe impl GlobalAlloc for RedisAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        match raw::RedisModule_Alloc {
            Some(alloc) => counted(alloc(rounded(layout)).cast(), layout.size()),
            None => missing(),
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match raw::RedisModule_Calloc {
            Some(calloc) => counted(calloc(1, rounded(layout)).cast(), layout.size()),
            None => missing(),
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        MODULE_BYTES.add(-(layout.size() as i64));
        match raw::RedisModule_Free {
            Some(free) => free(ptr.cast::<c_void>()),
            None => missing(),
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.align() > GUARANTEED_ALIGN {
            // Same as the default `realloc`, with this allocator's `alloc`.
            let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
                return std::ptr::null_mut();
            };
            let new = self.alloc(new_layout);
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            return new;
        }
        let Ok(new_layout) = Layout::from_size_align(new_size, layout.align()) else {
            return std::ptr::null_mut();
        };
        match raw::RedisModule_Realloc {
            Some(realloc) => {
                let new = realloc(ptr.cast::<c_void>(), rounded(new_layout)).cast::<u8>();
                if !new.is_null() {
                    MODULE_BYTES.add(new_size as i64 - layout.size() as i64);
                    MODULE_ALLOCATED.add(new_size.saturating_sub(layout.size()) as u64);
                }
                new
            }
            None => missing(),
        }
    }
}
