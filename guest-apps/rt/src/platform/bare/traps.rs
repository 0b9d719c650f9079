//! CPU exceptions: an IDT whose 32 exception gates lead to one ring-0
//! report (the exception, where, and the error code on the console), then
//! an exit with the code a Linux shell reports for a process killed by the
//! matching signal ([`exit_code`]: 139 for a page fault or general
//! protection fault, as SIGSEGV; 132 for an invalid opcode, as SIGILL).
//!
//! The stubs are `global_asm!` (stable Rust has no `extern
//! "x86-interrupt"`): each pushes an error code where the CPU does not,
//! then its vector, and jumps to the common stub, which calls
//! [`pier_rt_exception`] with the frame. Nothing returns: a fault in a
//! unikernel ends it. A trap from ring 3 lands on the TSS's RSP0 stack.
//! The one exception that is not a fault is the halt call's `ud2`, which
//! the #UD stub recognises by its address and hands to `irq`.
//!
//! The boot option `pier.test=triple-fault` is honoured here: the report
//! is skipped, the IDT emptied and the fault repeated, so that the CPU
//! escalates to a triple fault, which the hypervisor must report.

use core::arch::{asm, global_asm};
use core::sync::atomic::{AtomicBool, Ordering};

/// Set by ring 3 for `pier.test=triple-fault` (memory is shared between
/// the rings in this one-address-space machine).
pub(crate) static TRIPLE_FAULT_TEST: AtomicBool = AtomicBool::new(false);

const KERNEL_CODE: u16 = 0x08;

global_asm!(
    r#"
    .macro PIER_STUB vector, has_error
    .p2align 4
pier_trap_\vector:
    .if \has_error == 0
    push $0
    .endif
    push $\vector
    jmp pier_trap_common
    .endm

    .section .text.pier_traps, "ax"
    PIER_STUB 0, 0
    PIER_STUB 1, 0
    PIER_STUB 2, 0
    PIER_STUB 3, 0
    PIER_STUB 4, 0
    PIER_STUB 5, 0
    PIER_STUB 7, 0
    PIER_STUB 8, 1
    PIER_STUB 9, 0
    PIER_STUB 10, 1
    PIER_STUB 11, 1
    PIER_STUB 12, 1
    PIER_STUB 13, 1
    PIER_STUB 14, 1
    PIER_STUB 15, 0
    PIER_STUB 16, 0
    PIER_STUB 17, 1
    PIER_STUB 18, 0
    PIER_STUB 19, 0
    PIER_STUB 20, 0
    PIER_STUB 21, 1
    PIER_STUB 22, 0
    PIER_STUB 23, 0
    PIER_STUB 24, 0
    PIER_STUB 25, 0
    PIER_STUB 26, 0
    PIER_STUB 27, 0
    PIER_STUB 28, 0
    PIER_STUB 29, 1
    PIER_STUB 30, 1
    PIER_STUB 31, 0

    /* #UD: the halt call's `ud2` (see `irq`) goes to the halt entry;
       any other is a fault. */
    .p2align 4
pier_trap_6:
    push %rax
    lea pier_halt_call(%rip), %rax
    cmp %rax, 8(%rsp)
    pop %rax
    je pier_halt_entry
    push $0
    push $6
    jmp pier_trap_common

pier_trap_common:
    mov %rsp, %rdi          /* the frame: vector, error, rip, cs, rflags, rsp, ss */
    and $-16, %rsp          /* the ABI's alignment for the call */
    call pier_rt_exception
1:  jmp 1b

    .section .data.pier_trap_table, "aw"
    .p2align 3
    .global pier_trap_table
pier_trap_table:
    .irp v, 0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31
    .quad pier_trap_\v
    .endr
    "#,
    options(att_syntax)
);

unsafe extern "C" {
    static pier_trap_table: [u64; 32];
}

/// One IDT gate: 64-bit interrupt gate, present, DPL 0, kernel code.
#[derive(Clone, Copy)]
#[repr(C)]
struct Gate {
    offset_low: u16,
    selector: u16,
    ist: u8,
    type_attr: u8,
    offset_mid: u16,
    offset_high: u32,
    _zero: u32,
}

const EMPTY_GATE: Gate = Gate {
    offset_low: 0,
    selector: 0,
    ist: 0,
    type_attr: 0,
    offset_mid: 0,
    offset_high: 0,
    _zero: 0,
};

/// All 256 vectors: the 32 exceptions, then the interrupts `irq` uses;
/// the rest stay empty, so a stray vector is a #GP and gets reported.
#[repr(C, align(16))]
struct Idt([Gate; 256]);

static mut IDT: Idt = Idt([EMPTY_GATE; 256]);

/// An interrupt gate: present, DPL 0, the 64-bit interrupt gate type
/// (which clears IF on entry).
const fn gate(handler: u64) -> Gate {
    Gate {
        offset_low: handler as u16,
        selector: KERNEL_CODE,
        ist: 0,
        type_attr: 0x8e,
        offset_mid: (handler >> 16) as u16,
        offset_high: (handler >> 32) as u32,
        _zero: 0,
    }
}

/// Loads the IDT, its gates still empty: all ring 0 does with it at boot.
/// Filling the gates is a loop of some 450 instructions, which ring 0
/// would run through KVM's emulator on a nested host (half a millisecond
/// of boot or more) and ring 3 runs natively, so [`fill`] does it there.
/// Until then a fault finds no gate and becomes a triple fault, which the
/// hypervisor reports with the registers, as before the IDT was loaded.
///
/// # Safety
///
/// Ring 0, once, at boot.
pub(super) unsafe fn load() {
    // SAFETY: ring 0 (contract); the IDT is a static of the right size.
    unsafe { load_idt(&raw const IDT as u64, (size_of::<Idt>() - 1) as u16) }
}

/// Fills the IDT's exception gates and `interrupts`' gates (vector,
/// handler). Ring 3, first thing: the IDT is memory the boot layer maps
/// for ring 3 like all RAM, and the CPU reads a gate only when it
/// delivers through it.
///
/// # Safety
///
/// Once, before anything can fault or interrupt (the LAPIC and IOAPIC are
/// programmed later, by `irq::init`); the handlers must be interrupt entry
/// points that end in `iretq`.
pub(super) unsafe fn fill(interrupts: &[(u8, u64)]) {
    // SAFETY: one CPU, before anything else runs (contract): nothing else
    // touches the IDT.
    unsafe {
        let idt = &raw mut IDT;
        for (slot, &handler) in (*idt).0.iter_mut().zip(pier_trap_table.iter()) {
            *slot = gate(handler);
        }
        for &(vector, handler) in interrupts {
            (*idt).0[usize::from(vector)] = gate(handler);
        }
    }
}

/// # Safety
///
/// Ring 0; `base`/`limit` describe a valid IDT, or limit 0.
unsafe fn load_idt(base: u64, limit: u16) {
    let mut pointer = [0u16; 5];
    pointer[0] = limit;
    pointer[1] = base as u16;
    pointer[2] = (base >> 16) as u16;
    pointer[3] = (base >> 32) as u16;
    pointer[4] = (base >> 48) as u16;
    // SAFETY: ring 0 (contract); the pointer is a valid IDTR image.
    unsafe { asm!("lidt [{0}]", in(reg) &pointer, options(readonly, nostack, preserves_flags)) };
}

/// What the stubs and the CPU pushed.
#[repr(C)]
struct Frame {
    vector: u64,
    error: u64,
    rip: u64,
    cs: u64,
    rflags: u64,
    rsp: u64,
    ss: u64,
}

const NAMES: [&str; 32] = [
    "divide error (#DE)",
    "debug (#DB)",
    "NMI",
    "breakpoint (#BP)",
    "overflow (#OF)",
    "bound range (#BR)",
    "invalid opcode (#UD)",
    "device not available (#NM)",
    "double fault (#DF)",
    "coprocessor segment overrun",
    "invalid TSS (#TS)",
    "segment not present (#NP)",
    "stack fault (#SS)",
    "general protection (#GP)",
    "page fault (#PF)",
    "reserved",
    "x87 floating point (#MF)",
    "alignment check (#AC)",
    "machine check (#MC)",
    "SIMD floating point (#XM)",
    "virtualisation (#VE)",
    "control protection (#CP)",
    "reserved",
    "reserved",
    "reserved",
    "reserved",
    "reserved",
    "reserved",
    "hypervisor injection (#HV)",
    "VMM communication (#VC)",
    "security (#SX)",
    "reserved",
];

/// The one exception handler: ring 0, on the RSP0 stack, never returns.
#[unsafe(no_mangle)]
extern "C" fn pier_rt_exception(frame: &Frame) -> ! {
    if TRIPLE_FAULT_TEST.load(Ordering::Relaxed) {
        // SAFETY: ring 0; an empty IDT turns the next fault into a triple
        // fault, which is the point.
        unsafe {
            load_idt(0, 0);
            asm!("ud2", options(noreturn, nomem, nostack));
        }
    }
    let cr2: u64;
    // SAFETY: reading CR2 in ring 0 has no side effects.
    unsafe { asm!("mov {0}, cr2", out(reg) cr2, options(nomem, nostack, preserves_flags)) };
    let name = NAMES.get(frame.vector as usize).copied().unwrap_or("unknown");
    crate::eprintln!(
        "pier-rt: CPU exception {} ({name}) in ring {} at rip={:#x}, error code {:#x}, \
         rsp={:#x}, rflags={:#x}, cr2={cr2:#x}",
        frame.vector,
        frame.cs & 3,
        frame.rip,
        frame.error,
        frame.rsp,
        frame.rflags,
    );
    super::exit::exit(exit_code(frame.vector))
}

/// 128 + the signal Linux sends a process for the same fault.
fn exit_code(vector: u64) -> i32 {
    const SIGILL: i32 = 4;
    const SIGTRAP: i32 = 5;
    const SIGABRT: i32 = 6;
    const SIGBUS: i32 = 7;
    const SIGFPE: i32 = 8;
    const SIGSEGV: i32 = 11;
    128 + match vector {
        0 | 16 | 19 => SIGFPE,
        1 | 3 => SIGTRAP,
        6 => SIGILL,
        10..=14 => SIGSEGV,
        17 => SIGBUS,
        _ => SIGABRT,
    }
}
