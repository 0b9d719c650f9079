//! Interrupts and idling: the virtio device's interrupt through the
//! IOAPIC, the LAPIC's TSC-deadline timer, and the one system call, which
//! halts the CPU until either fires.
//!
//! Everything that can run in ring 3 does: the LAPIC and IOAPIC are MMIO
//! pages the boot layer maps with the user bit, so ring 3 programs them
//! ([`init`], [`route_device`]) at the same cost ring 0 would pay (each
//! access is a VM exit either way). Ring 0 keeps what the CPU reserves
//! for it:
//!
//! - **The interrupt stubs**, a handful of instructions each: set a bit in
//!   [`PENDING`], write the LAPIC's EOI register (xAPIC MMIO, the cheapest
//!   EOI on nested hosts; x2APIC's `wrmsr` costs three times as much), and
//!   `iretq`. They run on the TSS's RSP0 stack when they interrupt ring 3.
//! - **The halt call**: arm the TSC deadline (`wrmsr`, privileged), then
//!   `sti; hlt` unless an interrupt is already pending, and `iretq`. The
//!   `wrmsr` is skipped while the deadline armed before still lies ahead
//!   and comes no later than the one asked for: on kvm_pvm each ring-0
//!   instruction is emulated and the `wrmsr` is an exit besides, and a
//!   busy guest halts thousands of times a second with its 100 ms cap
//!   ([`halt_until`]) armed already. Waking early is harmless: callers
//!   poll after every wake.
//!   `sti`'s one-instruction shadow closes the race between the pending
//!   check and `hlt`: an interrupt that arrives after the check wakes the
//!   `hlt`. Ring 3 enters it with the `ud2` at `pier_halt_call`, which
//!   the #UD stub (`traps`) recognises by its address; the call returns
//!   past the `ud2`. An exception is the one way from ring 3 to ring 0
//!   that works on every KVM pier runs on: on nested hosts whose KVM runs
//!   guest ring 3 in the host's ring 3 (kvm_pvm), `syscall` reaches its
//!   entry still at privilege 3 (where `sti` faults), and `int 0x80` from
//!   ring 3 raises #UD itself.
//!
//! Ring 3 never spins waiting for an interrupt, and never sleeps while one
//! is pending: the halt call skips `hlt` while `PIER_IRQ_PENDING` is set,
//! and [`halt_until`] clears it after each halt. Which interrupt it was
//! does not matter to the caller, which polls the device after any wake.
//!
//! The 8259 PICs are masked and the LAPIC's LINT0 too, so only the IOAPIC
//! delivers; the device's pin is routed edge-triggered, which serves both
//! pier-vmm (whose irqfd pulses the line on every interrupt) and QEMU
//! (whose virtio-mmio line stays up until the driver acknowledges it: the
//! driver acknowledges after each wake that the device caused).

use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

/// The LAPIC timer's vector.
const TIMER_VECTOR: u8 = 0x20;
/// The virtio device's vector.
const DEVICE_VECTOR: u8 = 0x21;
/// The LAPIC's spurious vector (no EOI for it).
const SPURIOUS_VECTOR: u8 = 0xff;

/// Bits the interrupt stubs set and [`halt_until`] clears.
#[unsafe(no_mangle)]
static PIER_IRQ_PENDING: AtomicU32 = AtomicU32::new(0);
/// The timer fired.
const TIMER: u32 = 1;
/// The virtio device interrupted.
const DEVICE: u32 = 2;

const LAPIC_BASE: usize = 0xfee0_0000;
const LAPIC_TPR: usize = 0x80;
const LAPIC_SVR: usize = 0xf0;
const LAPIC_LVT_TIMER: usize = 0x320;
const LAPIC_LVT_LINT0: usize = 0x350;
/// LVT mode bits 17–18 = 0b10: TSC-deadline.
const LVT_TSC_DEADLINE: u32 = 0b10 << 17;
const LVT_MASKED: u32 = 1 << 16;
/// SVR bit 8: the APIC is software-enabled.
const SVR_ENABLE: u32 = 1 << 8;

const IOAPIC_BASE: usize = 0xfec0_0000;
const IOAPIC_REGSEL: usize = 0x00;
const IOAPIC_WINDOW: usize = 0x10;
const IOAPIC_REDIRECTION: u32 = 0x10;
/// The IOAPIC's pins on the PC platform.
const IOAPIC_PINS: u32 = 24;

global_asm!(
    r#"
    .section .text.pier_irq, "ax"
    .global pier_irq_timer
    .global pier_irq_device
    .global pier_irq_spurious
    .global pier_halt_entry
    .global pier_halt_call
pier_irq_timer:
    lock or dword ptr [rip + {pending}], {timer}
    jmp 1f
pier_irq_device:
    lock or dword ptr [rip + {pending}], {device}
1:  push rax
    mov eax, {eoi}
    mov dword ptr [rax], 0
    pop rax
    iretq
pier_irq_spurious:
    iretq

    /* Ring 3's side: rdi holds the TSC deadline, 0 to leave the timer as
       it is. */
pier_halt_call:
    ud2
    ret

    /* From the #UD stub, with the CPU's frame on the TSS's RSP0 stack and
       IF clear (an interrupt gate). */
pier_halt_entry:
    test rdi, rdi
    jz 2f
    mov eax, edi
    mov rdx, rdi
    shr rdx, 32
    mov ecx, 0x6e0          /* IA32_TSC_DEADLINE */
    wrmsr
2:  cmp dword ptr [rip + {pending}], 0
    jne 3f
    sti
    hlt
    cli
3:  add qword ptr [rsp], 2  /* return past the ud2 */
    iretq
    "#,
    pending = sym PIER_IRQ_PENDING,
    timer = const TIMER,
    device = const DEVICE,
    eoi = const LAPIC_BASE + 0xb0,
);

unsafe extern "C" {
    fn pier_irq_timer();
    fn pier_irq_device();
    fn pier_irq_spurious();
    fn pier_halt_call();
}

/// The interrupt gates for `traps::fill`: (vector, entry).
pub(super) fn gates() -> [(u8, u64); 3] {
    [
        (TIMER_VECTOR, pier_irq_timer as *const () as u64),
        (DEVICE_VECTOR, pier_irq_device as *const () as u64),
        (SPURIOUS_VECTOR, pier_irq_spurious as *const () as u64),
    ]
}

/// Ring 0 at boot: masks both 8259 PICs, so that only the IOAPIC
/// delivers (their I/O ports stay closed to ring 3).
///
/// # Safety
///
/// Ring 0, once, before ring 3 runs.
pub(super) unsafe fn install_ring0() {
    // SAFETY: ring 0 (contract); writing the PICs' mask registers has no
    // effect on memory.
    unsafe {
        asm!(
            "mov al, 0xff",
            "out 0x21, al",
            "out 0xa1, al",
            out("al") _,
            options(nomem, nostack, preserves_flags)
        );
    }
}

fn lapic_write(register: usize, value: u32) {
    // SAFETY: the LAPIC page is mapped (uncached, user) by the boot layer;
    // a register write has no effect on memory.
    unsafe { ((LAPIC_BASE + register) as *mut u32).write_volatile(value) }
}

fn ioapic_write(register: u32, value: u32) {
    // SAFETY: as for the LAPIC: the IOAPIC's page is mapped for ring 3.
    unsafe {
        ((IOAPIC_BASE + IOAPIC_REGSEL) as *mut u32).write_volatile(register);
        ((IOAPIC_BASE + IOAPIC_WINDOW) as *mut u32).write_volatile(value);
    }
}

/// Ring 3, before the app: software-enables the LAPIC, puts its timer in
/// TSC-deadline mode and masks LINT0 (where the masked PICs would deliver).
pub(crate) fn init() {
    lapic_write(LAPIC_TPR, 0);
    lapic_write(LAPIC_SVR, SVR_ENABLE | u32::from(SPURIOUS_VECTOR));
    lapic_write(LAPIC_LVT_LINT0, LVT_MASKED);
    lapic_write(LAPIC_LVT_TIMER, LVT_TSC_DEADLINE | u32::from(TIMER_VECTOR));
}

/// Routes IOAPIC pin `pin` to the device vector on this CPU: fixed
/// delivery, physical destination APIC 0, active high, edge-triggered.
/// Returns false for a pin the IOAPIC does not have.
pub(crate) fn route_device(pin: u32) -> bool {
    if pin >= IOAPIC_PINS {
        return false;
    }
    ioapic_write(IOAPIC_REDIRECTION + 2 * pin + 1, 0);
    ioapic_write(IOAPIC_REDIRECTION + 2 * pin, u32::from(DEVICE_VECTOR));
    true
}

/// The TSC deadline last written to the timer (0 before the first): the
/// timer fires at it unless it has passed. Ring 3 only.
static ARMED_DEADLINE: AtomicU64 = AtomicU64::new(0);

/// What the halt call writes to the timer so that it fires at `wanted` or
/// earlier: 0 (write nothing) while the armed deadline is still ahead and
/// no later than `wanted`, else `wanted` itself (at least 1: TSC 0 is long
/// past, and 0 means "write nothing" to the entry stub).
fn deadline_to_write(armed: u64, now: u64, wanted: u64) -> u64 {
    if armed > now && armed <= wanted { 0 } else { wanted.max(1) }
}

/// Halts until an interrupt (the device's, or the timer at TSC value
/// `deadline_tsc` or earlier if given), unless one is pending already;
/// then clears the pending bits, so the next halt waits for a new
/// interrupt.
pub(crate) fn halt_until(deadline_tsc: Option<u64>) {
    let deadline = match deadline_tsc {
        Some(wanted) => {
            let armed = ARMED_DEADLINE.load(Ordering::Relaxed);
            let write = deadline_to_write(armed, super::clock::rdtsc(), wanted);
            if write != 0 {
                ARMED_DEADLINE.store(write, Ordering::Relaxed);
            }
            write
        }
        None => 0,
    };
    // SAFETY: `pier_halt_call` returns normally with every register but
    // these intact (its ring-0 half runs on the ring-0 stack).
    unsafe {
        asm!(
            "call {halt}",
            halt = sym pier_halt_call,
            in("rdi") deadline,
            out("rcx") _,
            out("rax") _,
            out("rdx") _,
        )
    };
    PIER_IRQ_PENDING.store(0, Ordering::Release);
}
