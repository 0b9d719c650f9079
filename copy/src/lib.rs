//! pier-copy: the one routine pier copies payload bytes with.
//!
//! Every payload byte pier moves in user space is copied a few times: into
//! a socket's send ring, out to a DMA buffer or a peer's receive ring, and
//! out again to the application. Those copies are most of the cost of a
//! bulk transfer, so how they are done is chosen here, once, by
//! measurement, rather than left to whatever `memcpy` the platform links.
//!
//! On x86_64 Linux that is glibc's `memcpy`, which switches from a vector
//! loop to `rep movsb` for copies from a few KiB up to its non-temporal
//! threshold. On Intel CPUs with fast `rep movsb` (ERMSB/FSRM) that is the
//! fastest copy there is; a vector loop of our own ran 10–25 % slower. On
//! AMD EPYC (Zen) CPUs the `rep movsb` path was measured several times
//! slower than glibc's own vector loop for the sizes socket buffers copy.
//! So on AMD and Hygon CPUs with AVX2, copies of at least
//! [`VECTOR_COPY_MIN`] bytes go through an AVX2 loop of 128-byte blocks
//! (what glibc's vector path does), its stores aligned to the
//! destination's cache lines on CPUs where that was measured to pay
//! ([`vector_stores_aligned`]); every other copy, and every copy on other
//! CPUs, goes to `memcpy`. `docs/benchmarks.md` has the measurements.
//!
//! The choice is made on the first large copy, from `cpuid`, and kept for
//! the process. Library users get it without setting anything;
//! [`set_copy_strategy`] exists so benchmarks can compare the two in one
//! run. On bare-metal targets (`x86_64-unknown-none`, the unikernel) the
//! loop runs where the kernel has turned the YMM state on (CR4.OSXSAVE,
//! XCR0), which is the kernel's promise that the state is the running
//! code's: such targets are built without SSE, so nothing else touches
//! those registers, and a kernel whose interrupt handlers copy with this
//! crate, or that switches between threads preemptively, must save them.
//! pier-rt's boot turns the state on; a kernel that does not gets
//! `memcpy`.
//!
//! This is the only crate of the stack's that holds `unsafe` code: the
//! vector loop, and the `cpuid`/`xgetbv` reads that say whether it may
//! run. pier-stack itself forbids `unsafe`.

#![no_std]

use core::sync::atomic::{AtomicU8, Ordering};

/// How bulk copies are done.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyStrategy {
    /// The platform's `memcpy` (`copy_from_slice`), for every size.
    Memcpy,
    /// An AVX2 loop for copies of at least [`VECTOR_COPY_MIN`] bytes,
    /// `memcpy` below that.
    Vector,
}

/// The smallest copy the vector loop takes under [`CopyStrategy::Vector`].
/// Below it glibc's `memcpy` uses vector moves, not `rep movsb`, on every
/// CPU, and its short-copy code beats a loop's setup.
pub const VECTOR_COPY_MIN: usize = 2048;

/// [`set_copy_strategy`] was asked for the vector loop on a CPU or target
/// that cannot run it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VectorCopyUnavailable;

impl core::fmt::Display for VectorCopyUnavailable {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("the vector copy needs x86_64 with AVX2 and a hosted target")
    }
}

const UNDECIDED: u8 = 0;
const MEMCPY: u8 = 1;
/// The vector loop, its stores where the bytes fall.
const VECTOR: u8 = 2;
/// The vector loop, its stores aligned to the destination's cache lines.
const VECTOR_ALIGNED_STORES: u8 = 3;

static STRATEGY: AtomicU8 = AtomicU8::new(UNDECIDED);

/// Copies `src` into `dst`, which must be as long; panics otherwise, as
/// `copy_from_slice` does.
#[inline]
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_bytes: destination and source lengths differ");
    match vector_loop_for(src.len()) {
        Some(stores) => vector::copy(dst, src, stores),
        None => dst.copy_from_slice(src),
    }
}

/// [`copy_bytes`] for memory that must not be borrowed as a slice:
/// another party (a guest, a device) may write it while it is copied, as
/// with guest memory shared with a virtual machine, where a `&[u8]` over
/// it would promise Rust a stability nobody keeps.
///
/// # Safety
/// `src` is valid for reads and `dst` for writes of `len` bytes, and the
/// two ranges do not overlap.
#[inline]
pub unsafe fn copy_raw(dst: *mut u8, src: *const u8, len: usize) {
    match vector_loop_for(len) {
        // SAFETY: the caller's promise, and the vector loop is only
        // chosen where it runs.
        Some(stores) => unsafe { vector::copy_raw(dst, src, len, stores) },
        // SAFETY: the caller's promise.
        None => unsafe { core::ptr::copy_nonoverlapping(src, dst, len) },
    }
}

/// How the vector loop places its stores (see `vector::copy_avx2`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stores {
    /// Where the bytes fall, across cache lines when the destination is
    /// not aligned.
    Unaligned,
    /// From the destination's first cache-line boundary on, aligned.
    Aligned,
}

/// Whether a copy of `len` bytes takes the vector loop, and with which
/// stores; `None` is `memcpy`.
#[inline]
fn vector_loop_for(len: usize) -> Option<Stores> {
    if len < VECTOR_COPY_MIN {
        return None;
    }
    let mut state = STRATEGY.load(Ordering::Relaxed);
    if state == UNDECIDED {
        decide();
        state = STRATEGY.load(Ordering::Relaxed);
    }
    match state {
        VECTOR => Some(Stores::Unaligned),
        VECTOR_ALIGNED_STORES => Some(Stores::Aligned),
        _ => None,
    }
}

/// The strategy in force: the one [`set_copy_strategy`] chose, or else the
/// one this CPU was measured to do best with.
#[inline]
pub fn copy_strategy() -> CopyStrategy {
    match STRATEGY.load(Ordering::Relaxed) {
        MEMCPY => CopyStrategy::Memcpy,
        VECTOR | VECTOR_ALIGNED_STORES => CopyStrategy::Vector,
        _ => decide(),
    }
}

/// Whether the vector loop, where it runs, aligns its stores to the
/// destination's cache lines on this CPU: it does on CPUs without
/// AVX-512, where stores across two lines were measured to cost, and not
/// on those with it (AMD's from Zen 4 on), where they were not and lining
/// up the stores instead of the loads cost more. For benchmarks to report
/// which loop they measured.
pub fn vector_stores_aligned() -> bool {
    vector::stores_want_alignment()
}

/// Whether the vector loop can run here at all: x86_64 with AVX2, and the
/// YMM state turned on by the kernel (CPUID.OSXSAVE and XCR0). A
/// bare-metal kernel checks with it that its boot turned that state on,
/// since a kernel that does not leaves every copy to `memcpy`.
pub fn vector_copy_available() -> bool {
    vector::available()
}

#[cold]
fn decide() -> CopyStrategy {
    let chosen = if vector::available() && vector::vendor_prefers_it() {
        CopyStrategy::Vector
    } else {
        CopyStrategy::Memcpy
    };
    STRATEGY.store(encode(chosen), Ordering::Relaxed);
    chosen
}

/// Overrides the CPU's choice for the whole process, so that a benchmark
/// can measure both strategies in one run.
pub fn set_copy_strategy(strategy: CopyStrategy) -> Result<(), VectorCopyUnavailable> {
    if strategy == CopyStrategy::Vector && !vector::available() {
        return Err(VectorCopyUnavailable);
    }
    STRATEGY.store(encode(strategy), Ordering::Relaxed);
    Ok(())
}

fn encode(strategy: CopyStrategy) -> u8 {
    match strategy {
        CopyStrategy::Memcpy => MEMCPY,
        CopyStrategy::Vector if vector::stores_want_alignment() => VECTOR_ALIGNED_STORES,
        CopyStrategy::Vector => VECTOR,
    }
}

#[cfg(target_arch = "x86_64")]
mod vector {
    use super::Stores;
    use core::arch::x86_64::{__cpuid, __cpuid_count, _xgetbv};
    #[cfg(not(target_os = "none"))]
    use core::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm256_storeu_si256};

    /// Whether the CPU has AVX2 and the OS saves the YMM registers
    /// (CPUID.1:ECX.OSXSAVE and AVX, XCR0 bits 1 and 2, CPUID.7:EBX.AVX2).
    pub(crate) fn available() -> bool {
        let leaf1 = __cpuid(1);
        let osxsave_and_avx = (1 << 27) | (1 << 28);
        if leaf1.ecx & osxsave_and_avx != osxsave_and_avx {
            return false;
        }
        if __cpuid(0).eax < 7 {
            return false;
        }
        // SAFETY: OSXSAVE is set, so XGETBV is enabled and reads XCR0.
        let xcr0 = unsafe { read_xcr0() };
        xcr0 & 0b110 == 0b110 && __cpuid_count(7, 0).ebx & (1 << 5) != 0
    }

    /// # Safety
    /// The CPU must report OSXSAVE.
    #[target_feature(enable = "xsave")]
    unsafe fn read_xcr0() -> u64 {
        // SAFETY: the caller checked OSXSAVE; XCR0 always exists then.
        unsafe { _xgetbv(0) }
    }

    /// AMD's and Hygon's CPUs: their `rep movsb` is the slow path.
    pub(crate) fn vendor_prefers_it() -> bool {
        let leaf0 = __cpuid(0);
        let mut name = [0u8; 12];
        name[0..4].copy_from_slice(&leaf0.ebx.to_le_bytes());
        name[4..8].copy_from_slice(&leaf0.edx.to_le_bytes());
        name[8..12].copy_from_slice(&leaf0.ecx.to_le_bytes());
        matches!(&name, b"AuthenticAMD" | b"HygonGenuine")
    }

    /// Whether this CPU is one where the loop's stores pay for being
    /// aligned: those without AVX-512 (CPUID.7:EBX.AVX512F). Measured on
    /// two AMD EPYC hosts, the two kinds disagree. On one without AVX-512,
    /// a 64 KiB copy to a destination 16 bytes past a cache line ran at
    /// 35–42 GB/s with stores where the bytes fall and 46–49 with aligned
    /// ones, and the stack's loopback moved 10–25 % more. On one with it
    /// (AMD's cores have it from the Zen 4 generation on), stores across
    /// lines cost nothing measurable and aligning them, which moves the
    /// misalignment to the loads, made a 256 KiB copy test 5–20 % slower.
    /// Intel CPUs take `memcpy`, whichever this says.
    pub(crate) fn stores_want_alignment() -> bool {
        __cpuid(0).eax < 7 || __cpuid_count(7, 0).ebx & (1 << 16) == 0
    }

    /// The vector loop. Callers have checked [`available`] (through the
    /// strategy) and that the slices are the same length, at least 32.
    pub(crate) fn copy(dst: &mut [u8], src: &[u8], stores: Stores) {
        debug_assert!(dst.len() == src.len() && src.len() >= 32);
        // SAFETY: both pointers are valid for `len` bytes and the borrows
        // keep the slices from overlapping.
        unsafe { copy_raw(dst.as_mut_ptr(), src.as_ptr(), src.len(), stores) }
    }

    /// # Safety
    /// As [`crate::copy_raw`], with `len >= 32`, and [`available`] has
    /// said AVX2 runs here (the strategy is `Vector` only then).
    pub(crate) unsafe fn copy_raw(dst: *mut u8, src: *const u8, len: usize, stores: Stores) {
        // SAFETY: the caller's promise.
        unsafe { copy_avx2(dst, src, len, stores == Stores::Aligned) }
    }

    /// 128 bytes a turn in four unaligned 32-byte loads and stores, then
    /// 32 at a time, then the last 32 bytes once more, overlapping what is
    /// already copied, so no byte-sized tail is left.
    ///
    /// With `align_stores`, the first 64 bytes go as two moves first, and
    /// the turns start at the destination's first 64-byte boundary after
    /// them, so no store straddles two cache lines (as glibc's vector
    /// `memcpy` does). Only one side can be lined up, and which side's
    /// misalignment costs more depends on the CPU
    /// ([`stores_want_alignment`]).
    ///
    /// # Safety
    /// AVX2 must be available; `dst` and `src` are valid for `len >= 32`
    /// bytes and do not overlap.
    #[target_feature(enable = "avx2")]
    unsafe fn copy_avx2(dst: *mut u8, src: *const u8, len: usize, align_stores: bool) {
        /// The cache line the stores are aligned to.
        const LINE: usize = 64;
        // SAFETY: every access is within `len` bytes of both pointers.
        unsafe {
            let mut at = 0;
            if align_stores && len >= LINE {
                move32(dst, src);
                move32(dst.add(32), src.add(32));
                // 1 to 64: the bytes before it are copied.
                at = LINE - (dst as usize & (LINE - 1));
            }
            while at + 128 <= len {
                move128(dst.add(at), src.add(at));
                at += 128;
            }
            while at + 32 <= len {
                move32(dst.add(at), src.add(at));
                at += 32;
            }
            if at < len {
                let last = len - 32;
                move32(dst.add(last), src.add(last));
            }
        }
    }

    /// Copies 32 bytes through a YMM register.
    ///
    /// # Safety
    /// As [`copy_avx2`], for 32 bytes.
    #[cfg(not(target_os = "none"))]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn move32(dst: *mut u8, src: *const u8) {
        // SAFETY: the caller's promise.
        unsafe {
            let a = _mm256_loadu_si256(src.cast::<__m256i>());
            _mm256_storeu_si256(dst.cast::<__m256i>(), a);
        }
    }

    /// Copies 128 bytes: four loads, then four stores.
    ///
    /// # Safety
    /// As [`copy_avx2`], for 128 bytes.
    #[cfg(not(target_os = "none"))]
    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn move128(dst: *mut u8, src: *const u8) {
        // SAFETY: the caller's promise.
        unsafe {
            let a = _mm256_loadu_si256(src.cast::<__m256i>());
            let b = _mm256_loadu_si256(src.add(32).cast::<__m256i>());
            let c = _mm256_loadu_si256(src.add(64).cast::<__m256i>());
            let d = _mm256_loadu_si256(src.add(96).cast::<__m256i>());
            _mm256_storeu_si256(dst.cast::<__m256i>(), a);
            _mm256_storeu_si256(dst.add(32).cast::<__m256i>(), b);
            _mm256_storeu_si256(dst.add(64).cast::<__m256i>(), c);
            _mm256_storeu_si256(dst.add(96).cast::<__m256i>(), d);
        }
    }

    // Bare-metal targets (`x86_64-unknown-none`) are built soft-float, so
    // the compiler keeps no value in a vector register and lowers the AVX
    // intrinsics to general-purpose moves, target feature or not. The two
    // moves are written out instead, the YMM registers they use declared
    // as clobbered; the kernel has turned the YMM state on (`available`
    // checks XCR0) and owns saving it.

    /// Copies 32 bytes through a YMM register.
    ///
    /// # Safety
    /// As [`copy_avx2`], for 32 bytes.
    #[cfg(target_os = "none")]
    #[inline]
    unsafe fn move32(dst: *mut u8, src: *const u8) {
        // SAFETY: the caller's promise.
        unsafe {
            core::arch::asm!(
                "vmovdqu ymm0, [{src}]",
                "vmovdqu [{dst}], ymm0",
                src = in(reg) src,
                dst = in(reg) dst,
                out("ymm0") _,
                options(nostack, preserves_flags)
            );
        }
    }

    /// Copies 128 bytes: four loads, then four stores.
    ///
    /// # Safety
    /// As [`copy_avx2`], for 128 bytes.
    #[cfg(target_os = "none")]
    #[inline]
    unsafe fn move128(dst: *mut u8, src: *const u8) {
        // SAFETY: the caller's promise.
        unsafe {
            core::arch::asm!(
                "vmovdqu ymm0, [{src}]",
                "vmovdqu ymm1, [{src} + 32]",
                "vmovdqu ymm2, [{src} + 64]",
                "vmovdqu ymm3, [{src} + 96]",
                "vmovdqu [{dst}], ymm0",
                "vmovdqu [{dst} + 32], ymm1",
                "vmovdqu [{dst} + 64], ymm2",
                "vmovdqu [{dst} + 96], ymm3",
                src = in(reg) src,
                dst = in(reg) dst,
                out("ymm0") _,
                out("ymm1") _,
                out("ymm2") _,
                out("ymm3") _,
                options(nostack, preserves_flags)
            );
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod vector {
    pub(crate) fn available() -> bool {
        false
    }

    pub(crate) fn vendor_prefers_it() -> bool {
        false
    }

    pub(crate) fn stores_want_alignment() -> bool {
        false
    }

    pub(crate) fn copy(dst: &mut [u8], src: &[u8], _: super::Stores) {
        dst.copy_from_slice(src);
    }

    /// # Safety
    /// As [`crate::copy_raw`].
    pub(crate) unsafe fn copy_raw(dst: *mut u8, src: *const u8, len: usize, _: super::Stores) {
        // SAFETY: the caller's promise.
        unsafe { core::ptr::copy_nonoverlapping(src, dst, len) }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::format;
    use std::vec;
    use std::vec::Vec;

    /// The strategy is process-wide; tests that set it take turns.
    static STRATEGY_CHANGE: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn pattern(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// `dst` holds `src` at `at` and zeroes everywhere else.
    fn assert_copied_exactly(dst: &[u8], at: usize, src: &[u8], case: &str) {
        assert_eq!(&dst[at..at + src.len()], src, "{case}");
        assert!(dst[..at].iter().all(|&b| b == 0), "wrote before the destination: {case}");
        let after = &dst[at + src.len()..];
        assert!(after.iter().all(|&b| b == 0), "wrote past the destination: {case}");
    }

    /// Both ways the loop can place its stores, whichever this CPU uses.
    const BOTH_STORES: [Stores; 2] = [Stores::Unaligned, Stores::Aligned];

    /// Every length from the vector loop's smallest through a few 128-byte
    /// turns, then sizes around the turn and tail boundaries, at several
    /// misalignments, with either kind of store: the bytes match and
    /// nothing around them is written.
    #[test]
    fn vector_copy_matches_the_source_at_every_length_and_alignment() {
        assert!(vector::available(), "this test needs a CPU with AVX2");
        let source = pattern(70_000);
        let lengths = (32..=512).chain([2047, 2048, 2049, 4095, 4096, 4100, 65_536, 65_536 + 37]);
        for stores in BOTH_STORES {
            for len in lengths.clone() {
                for skew in [0, 1, 13, 44] {
                    let mut dst = vec![0u8; len + 2 * skew + 1];
                    let src = &source[skew..skew + len];
                    vector::copy(&mut dst[skew..skew + len], src, stores);
                    let case = format!("{stores:?} len {len} skew {skew}");
                    assert_copied_exactly(&dst, skew, src, &case);
                }
            }
        }
    }

    /// Every offset of the destination within a 64-byte cache line (the
    /// aligned stores start at the next line boundary), against sources at
    /// other offsets, at lengths around the loop's turns and its
    /// overlapping tail, with either kind of store: exactly the bytes
    /// asked for are written.
    #[test]
    fn vector_copy_is_exact_at_every_destination_offset_within_a_line() {
        assert!(vector::available(), "this test needs a CPU with AVX2");
        let source = pattern(5000);
        for stores in BOTH_STORES {
            for len in [32, 33, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 2048, 4096 + 17] {
                for dst_offset in 0..64 {
                    for src_offset in [0, 7, 44] {
                        let mut dst = vec![0u8; len + 128];
                        let at = dst.as_ptr().align_offset(64) + dst_offset;
                        let src = &source[src_offset..src_offset + len];
                        vector::copy(&mut dst[at..at + len], src, stores);
                        let case = format!(
                            "{stores:?} len {len} dst offset {dst_offset} src offset {src_offset}"
                        );
                        assert_copied_exactly(&dst, at, src, &case);
                    }
                }
            }
        }
    }

    #[test]
    fn raw_copy_matches_the_source_under_both_strategies() {
        let _turn = STRATEGY_CHANGE.lock().unwrap_or_else(|e| e.into_inner());
        let source = pattern(70_000);
        for strategy in [CopyStrategy::Memcpy, CopyStrategy::Vector] {
            set_copy_strategy(strategy).expect("this test needs a CPU with AVX2");
            for len in [0, 31, VECTOR_COPY_MIN, 65_536 + 3] {
                let mut dst = vec![0u8; len + 1];
                // SAFETY: both buffers hold `len` bytes and are distinct.
                unsafe { copy_raw(dst.as_mut_ptr(), source[5..].as_ptr(), len) };
                assert_eq!(&dst[..len], &source[5..5 + len], "{strategy:?} len {len}");
                assert_eq!(dst[len], 0, "wrote past the destination");
            }
        }
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn copy_bytes_refuses_slices_of_different_lengths() {
        copy_bytes(&mut [0u8; 4096], &[1u8; 4095]);
    }

    #[test]
    fn copy_bytes_copies_under_both_strategies() {
        let _turn = STRATEGY_CHANGE.lock().unwrap_or_else(|e| e.into_inner());
        let source = pattern(70_000);
        for strategy in [CopyStrategy::Memcpy, CopyStrategy::Vector] {
            set_copy_strategy(strategy).expect("this test needs a CPU with AVX2");
            assert_eq!(copy_strategy(), strategy);
            for len in [10, VECTOR_COPY_MIN - 1, VECTOR_COPY_MIN, 65_536 + 5] {
                let mut dst = vec![0u8; len];
                copy_bytes(&mut dst, &source[3..3 + len]);
                assert_eq!(dst, &source[3..3 + len], "{strategy:?} len {len}");
            }
        }
    }
}
