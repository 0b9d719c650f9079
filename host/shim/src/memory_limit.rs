//! A component's memory limit: the most linear memory its instances may
//! hold together, as a container's memory limit bounds a process.
//!
//! wasmtime asks the store's [`ResourceLimiter`] before any linear memory
//! is made or grows. [`MemoryLimit`] adds every growth of every memory of
//! the component (a component has one per core instance that defines one)
//! and refuses the one that would pass the limit. A refusal is a trap, not
//! a `memory.grow` that returns -1: a program whose allocator cannot grow
//! aborts anyway, and a limit that ends the component the same way each
//! time is what a container's OOM kill does. The trap carries
//! [`OutOfMemory`], which [`crate::host`] turns into exit code
//! [`OUT_OF_MEMORY_EXIT_CODE`] (137, 128 + SIGKILL, what a shell and
//! containerd report for a process the kernel's OOM killer ended).
//!
//! What it does not count: the host's own memory for the component (its
//! sockets' buffers, which the socket limit bounds; wasmtime's tables and
//! code).

use wasmtime::ResourceLimiter;

/// The exit code of a component that grew past its memory limit.
pub const OUT_OF_MEMORY_EXIT_CODE: i32 = 137;

/// Why a component ended: its linear memory would have grown past its
/// limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfMemory {
    /// The limit, in bytes.
    pub limit: u64,
    /// What the component held when it asked, in bytes.
    pub held: u64,
    /// What it asked for on top, in bytes.
    pub asked: u64,
}

impl std::fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "out of memory: the component holds {} bytes of linear memory and asked for {} more, \
             past its limit of {} bytes",
            self.held, self.asked, self.limit
        )
    }
}

impl std::error::Error for OutOfMemory {}

/// The store's limiter: the limit and what the component holds.
#[derive(Debug)]
pub(crate) struct MemoryLimit {
    limit: Option<u64>,
    held: u64,
    /// The growth last allowed, taken back if wasmtime then fails it.
    last_allowed: u64,
}

impl MemoryLimit {
    pub(crate) fn new(limit: Option<u64>) -> Self {
        Self { limit, held: 0, last_allowed: 0 }
    }
}

impl ResourceLimiter for MemoryLimit {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let asked = desired.saturating_sub(current) as u64;
        if let Some(limit) = self.limit
            && self.held.saturating_add(asked) > limit
        {
            return Err(OutOfMemory { limit, held: self.held, asked }.into());
        }
        self.held += asked;
        self.last_allowed = asked;
        Ok(true)
    }

    fn memory_grow_failed(&mut self, _error: wasmtime::Error) -> wasmtime::Result<()> {
        self.held -= self.last_allowed;
        self.last_allowed = 0;
        Ok(())
    }

    /// Tables are not what a memory limit is about; wasmtime's own bounds
    /// hold.
    fn table_growing(
        &mut self,
        _current: usize,
        _desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: usize = 64 << 10;

    #[test]
    fn growth_across_memories_is_added_up_and_the_one_past_the_limit_traps() {
        let mut limit = MemoryLimit::new(Some(3 * PAGE as u64));
        assert!(limit.memory_growing(0, PAGE, None).unwrap(), "one memory's first page");
        assert!(limit.memory_growing(0, PAGE, None).unwrap(), "another memory's");
        assert!(limit.memory_growing(PAGE, 2 * PAGE, None).unwrap(), "the third page in all");
        let err = limit.memory_growing(2 * PAGE, 3 * PAGE, None).unwrap_err();
        let oom = err.downcast_ref::<OutOfMemory>().expect("the trap says why");
        assert_eq!(
            *oom,
            OutOfMemory { limit: 3 * PAGE as u64, held: 3 * PAGE as u64, asked: PAGE as u64 }
        );
    }

    #[test]
    fn a_growth_wasmtime_failed_is_not_counted() {
        let mut limit = MemoryLimit::new(Some(2 * PAGE as u64));
        assert!(limit.memory_growing(0, 2 * PAGE, None).unwrap());
        limit.memory_grow_failed(wasmtime::format_err!("no memory")).unwrap();
        assert!(limit.memory_growing(0, 2 * PAGE, None).unwrap(), "the failed pages came back");
    }

    #[test]
    fn without_a_limit_nothing_is_refused() {
        let mut limit = MemoryLimit::new(None);
        assert!(limit.memory_growing(0, 1 << 40, None).unwrap());
    }
}
