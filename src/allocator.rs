//! The process's memory allocator settings (docs/design.md §4.3).
//!
//! A compaction reads and writes hundreds of column chunks, and the parquet crate opens a zstd
//! compression and a decompression context for each one, blocks of a few hundred KiB that live
//! as long as the chunk. glibc's defaults hand such blocks back to the kernel when they are
//! freed (an unmapped block, or the heap's trimmed top), so the next chunk's contexts fault the
//! same pages in again and zero them: about 7 % of a full rewrite's CPU (docs/benchmarks.md,
//! 2026-12-06). [`keep_freed_memory`] has glibc keep freed memory for reuse instead.
//!
//! This module holds lakecdc's only `unsafe` code (docs/security.md): one call to glibc's
//! `mallopt` per setting, which takes two integers and touches no memory of the caller's.

/// Blocks below this size come from the heap, not from `mmap`: every zstd context (glibc's
/// default, 128 KiB, rises only as blocks are freed); larger buffers are still unmapped when
/// freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const MMAP_THRESHOLD: i32 = 4 << 20;

/// The heap's free top is given back to the kernel only beyond this size (glibc's default:
/// 128 KiB, or twice the mmap threshold once that has risen).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const TRIM_THRESHOLD: i32 = 64 << 20;

/// Has glibc keep freed memory for reuse (see the module's doc); true when every setting took.
/// Elsewhere than glibc on Linux it does nothing and returns false. Peak memory grows by the
/// freed blocks kept, a few tens of MiB in a compaction (docs/benchmarks.md).
pub fn keep_freed_memory() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        [
            (libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD),
            (libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD),
        ]
        .into_iter()
        // Each setting is made even when one before it was refused.
        .fold(true, |all, (param, value)| mallopt(param, value) && all)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}

/// glibc's `mallopt(param, value)`: true when glibc took the setting.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn mallopt(param: libc::c_int, value: libc::c_int) -> bool {
    // SAFETY: mallopt only changes the allocator's parameters; it reads no pointer and may be
    // called at any time, from any thread (glibc takes its own lock).
    unsafe { libc::mallopt(param, value) == 1 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn glibc_takes_both_settings_and_refuses_a_bad_one() {
        // The check is real: glibc refuses a fast-bin limit above its maximum (160 bytes).
        assert!(!mallopt(libc::M_MXFAST, 1 << 20));
        assert!(keep_freed_memory());
    }
}
