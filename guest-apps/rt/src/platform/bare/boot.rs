//! Boot: from the PVH entry (32-bit protected mode, paging off) to Rust in
//! ring 3, through as few ring-0 instructions as possible.
//!
//! On nested KVM hosts like pier's development machine, guest ring-0 code
//! does not run natively: KVM's instruction emulator runs it, each
//! instruction costing about half a microsecond, while ring-3 code runs at
//! full speed. So ring 0 only switches modes and tables here; everything
//! else, the app included, runs in ring 3. The steps:
//!
//! 1. `pier_pvh_start` (32-bit, named by the PVH note): load the GDT,
//!    enable PAE, point CR3 at the static page tables, set EFER.LME, turn
//!    paging on, and far-jump into 64-bit code.
//! 2. `pier_start64`: flat data segments, the kernel stack, then
//!    [`pier_rt_kernel_main`] with the `hvm_start_info` address.
//! 3. [`pier_rt_kernel_main`] (ring 0 Rust): loads the IDT, whose gates
//!    ring 3 fills (`traps`); the TSS (whose RSP0 is the stack ring-3
//!    traps will land on, and an I/O permission bitmap that opens the
//!    console and exit ports to ring 3, so they need no system call);
//!    masks the PICs (`irq`); turns the AVX register state on where the
//!    CPU has it (`enable_vector_state`), then `iretq` into ring 3 at
//!    `pier_rt_user_entry`. IOPL stays 0: nested hosts that run guest
//!    ring 3 in the host's ring 3 (kvm_pvm) ignore IOPL, but honour the
//!    bitmap.
//!
//! The page tables are data in the image, not built at run time: 4 GiB
//! identity-mapped with 2 MiB pages, every page present, writable and
//! user-accessible, the top GiB (the MMIO windows: virtio-mmio slots,
//! IOAPIC, LAPIC) uncached. Filling 2048 entries in ring 0 would cost
//! milliseconds here; as data they cost 24 KiB of image, in a 2 MiB page
//! of their own (`link.ld` says why).
//!
//! Until ring 3 has filled the IDT's gates, a fault becomes a triple
//! fault, which the hypervisor reports with the registers; after, `traps`
//! reports it.
//!
//! `.bss` (the stacks included) is not cleared: every PVH loader (pier-vmm,
//! QEMU) hands over zeroed memory past each segment's file contents.

use core::arch::{asm, global_asm};

/// GDT selectors (see `pier_gdt` below). The user selectors carry RPL 3.
const KERNEL_DATA: u64 = 0x10;
const USER_DATA: u64 = 0x18 | 3;
const USER_CODE: u64 = 0x20 | 3;
const TSS_SELECTOR: u16 = 0x28;
/// RFLAGS for ring 3: IOPL 0 (ports only through the TSS bitmap),
/// interrupts on (IF; nothing can interrupt until ring 3 programs the
/// LAPIC and IOAPIC, see `irq`), and the always-one bit 1.
const USER_RFLAGS: u64 = 0x202;

global_asm!(
    r#"
    /* The PVH entry note: name "Xen", type 18 (XEN_ELFNOTE_PHYS32_ENTRY),
       an 8-byte descriptor (QEMU reads a size_t; linux-loader the low 32
       bits) holding the 32-bit entry address. */
    .section .note.Xen, "a", @note
    .p2align 2
    .long 4
    .long 8
    .long 18
    .asciz "Xen"
    .p2align 2
    .quad pier_pvh_start
    .p2align 2

    .section .text.pier_pvh_start, "ax"
    .code32
    .global pier_pvh_start
pier_pvh_start:
    cli
    cld
    mov %ebx, %esi                 /* hvm_start_info, kept for Rust */
    lgdt pier_gdt_ptr
    mov %cr4, %eax
    or $0x20, %eax                 /* CR4.PAE */
    mov %eax, %cr4
    mov $pier_pml4, %eax
    mov %eax, %cr3
    mov $0xc0000080, %ecx          /* EFER */
    rdmsr
    or $0x100, %eax                /* EFER.LME */
    wrmsr
    mov %cr0, %eax
    or $0x80000001, %eax           /* CR0.PG | CR0.PE */
    mov %eax, %cr0
    ljmpl $0x08, $pier_start64

    .code64
pier_start64:
    mov ${kernel_data}, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    mov %eax, %fs
    mov %eax, %gs
    mov $pier_kernel_stack_top, %rsp
    mov %esi, %edi
    call pier_rt_kernel_main
1:  hlt
    jmp 1b

    .section .data.pier_gdt, "aw"
    .p2align 4
    .global pier_gdt
pier_gdt:
    .quad 0                        /* 0x00 null */
    .quad 0x00af9a000000ffff       /* 0x08 kernel code, 64-bit */
    .quad 0x00cf92000000ffff       /* 0x10 kernel data */
    .quad 0x00cff2000000ffff       /* 0x18 user data (DPL 3) */
    .quad 0x00affa000000ffff       /* 0x20 user code, 64-bit (DPL 3) */
    .quad 0, 0                     /* 0x28 TSS, filled in by pier_rt_kernel_main */
pier_gdt_end:
    .p2align 3
pier_gdt_ptr:
    .word pier_gdt_end - pier_gdt - 1
    .quad pier_gdt

    .section .data.pier_page_tables, "aw"
    .p2align 12
pier_pml4:
    .quad pier_pdpt + 0x7          /* present, writable, user */
    .fill 511, 8, 0
pier_pdpt:
    .quad pier_pd + 0x7
    .quad pier_pd + 0x1007
    .quad pier_pd + 0x2007
    .quad pier_pd + 0x3007
    .fill 508, 8, 0
pier_pd:
    /* 0-3 GiB: RAM. 2 MiB pages: present, writable, user, PS. */
    .set pier_page, 0
    .rept 1536
    .quad (pier_page << 21) | 0x87
    .set pier_page, pier_page + 1
    .endr
    /* 3-4 GiB: MMIO. Also PWT | PCD: uncached. */
    .rept 512
    .quad (pier_page << 21) | 0x9f
    .set pier_page, pier_page + 1
    .endr

    .section .bss.pier_stacks, "aw", @nobits
    .p2align 12
    .global pier_kernel_stack_top
    .global pier_user_stack_top
pier_kernel_stack:
    .skip {kernel_stack}
pier_kernel_stack_top:
pier_user_stack:
    .skip {user_stack}
pier_user_stack_top:
    "#,
    kernel_data = const KERNEL_DATA,
    kernel_stack = const KERNEL_STACK,
    user_stack = const USER_STACK,
    options(att_syntax)
);

/// The ring-0 stack: boot, and every trap from ring 3 (TSS.RSP0).
const KERNEL_STACK: usize = 16 << 10;
/// The app's stack.
const USER_STACK: usize = 512 << 10;

unsafe extern "C" {
    static mut pier_gdt: [u64; 7];
    static pier_kernel_stack_top: u8;
    static pier_user_stack_top: u8;
}

/// The 64-bit task-state segment: RSP0 (the stack the CPU switches to
/// when ring 3 traps into ring 0) and the I/O permission bitmap that lets
/// ring 3 use the console and exit ports.
#[repr(C, packed(4))]
struct Tss {
    _reserved0: u32,
    rsp: [u64; 3],
    _reserved1: u64,
    ist: [u64; 7],
    _reserved2: u64,
    _reserved3: u16,
    iomap_base: u16,
    /// One bit per port, clear = allowed, plus the all-ones byte the CPU
    /// requires after the last one.
    iomap: [u8; 8192 + 1],
}

/// Ports ring 3 may use: COM1 and the exit port (a 32-bit write, so four
/// ports wide: the CPU checks a bit per byte accessed).
const USER_PORTS: [core::ops::RangeInclusive<u16>; 2] = [0x3f8..=0x3ff, 0xf4..=0xf7];

const fn io_bitmap() -> [u8; 8192 + 1] {
    let mut map = [0xff; 8192 + 1];
    let mut r = 0;
    while r < USER_PORTS.len() {
        let mut port = *USER_PORTS[r].start();
        while port <= *USER_PORTS[r].end() {
            map[port as usize / 8] &= !(1 << (port % 8));
            port += 1;
        }
        r += 1;
    }
    map
}

static mut TSS: Tss = Tss {
    _reserved0: 0,
    rsp: [0; 3],
    _reserved1: 0,
    ist: [0; 7],
    _reserved2: 0,
    _reserved3: 0,
    iomap_base: core::mem::offset_of!(Tss, iomap) as u16,
    iomap: io_bitmap(),
};

/// CR4.OSFXSR: the CPU may execute SSE instructions (FXSAVE state).
const CR4_OSFXSR: u64 = 1 << 9;
/// CR4.OSXMMEXCPT: SIMD floating-point exceptions raise #XM, not #UD.
const CR4_OSXMMEXCPT: u64 = 1 << 10;
/// CR4.OSXSAVE: XGETBV/XSETBV work, and CPUID reports OSXSAVE.
const CR4_OSXSAVE: u64 = 1 << 18;
/// CR0.MP and CR0.EM: with MP set and EM clear, vector instructions run
/// instead of raising #NM/#UD.
const CR0_MP: u64 = 1 << 1;
const CR0_EM: u64 = 1 << 2;
/// XCR0: the x87, SSE (XMM) and AVX (upper YMM) state components.
const XCR0_X87_SSE_AVX: u64 = 0b111;

/// Turns on the AVX register state, where the CPU has XSAVE and AVX, so
/// that `pier-copy`'s AVX2 loop copies the stack's and the driver's
/// payloads (it checks CPUID.OSXSAVE and XCR0 itself and otherwise takes
/// `memcpy`, a string move on this target). In a guest on an AMD EPYC
/// host the loop copied 4 KiB 1.27x and 64 KiB 1.18x as fast as the
/// string move, and copies are much of a guest's work in a bulk echo.
///
/// Nothing saves the vector registers, and nothing needs to: the image is
/// built without SSE (`x86_64-unknown-none`), so the only code that
/// touches them is that loop, and it never runs inside an interrupt stub
/// (a few instructions that set a bit and write the EOI, `irq`) or a trap
/// handler. Ring 3 owns them alone, as a single-threaded process would.
/// Nine ring-0 instructions besides the CPUID check, each emulated on
/// nested hosts (about a microsecond each, `docs/unikernel.md`).
///
/// # Safety
/// Ring 0, before ring 3 starts.
unsafe fn enable_vector_state() {
    const XSAVE_AND_AVX: u32 = (1 << 26) | (1 << 28);
    if core::arch::x86_64::__cpuid(1).ecx & XSAVE_AND_AVX != XSAVE_AND_AVX {
        return;
    }
    // SAFETY: ring 0; the CPU has XSAVE and AVX, so CR4.OSXSAVE may be set
    // and XCR0 may hold the x87, SSE and AVX components (x87 is required).
    unsafe {
        asm!(
            "mov {tmp}, cr0",
            "and {tmp}, {not_em}",
            "or {tmp}, {mp}",
            "mov cr0, {tmp}",
            "mov {tmp}, cr4",
            "or {tmp}, {cr4_bits}",
            "mov cr4, {tmp}",
            "xor ecx, ecx",
            "xsetbv",
            tmp = out(reg) _,
            not_em = in(reg) !CR0_EM,
            mp = in(reg) CR0_MP,
            cr4_bits = in(reg) CR4_OSFXSR | CR4_OSXMMEXCPT | CR4_OSXSAVE,
            in("eax") XCR0_X87_SSE_AVX as u32,
            in("edx") 0u32,
            out("ecx") _,
            options(nostack)
        );
    }
}

/// Ring 0's Rust at boot: IDT, TSS, then into ring 3. Kept to a few
/// dozen instructions, since each one is emulated on nested hosts.
#[unsafe(no_mangle)]
extern "C" fn pier_rt_kernel_main(start_info: u32) -> ! {
    // SAFETY: single CPU, ring 0, before anything else runs: nothing else
    // touches the GDT or the TSS, and the addresses are the image's own.
    unsafe {
        let tss = &raw mut TSS;
        (*tss).rsp[0] = &raw const pier_kernel_stack_top as u64;
        let base = tss as u64;
        let limit = size_of::<Tss>() as u64 - 1;
        // A 16-byte "available 64-bit TSS" descriptor (type 9, present).
        let low = (limit & 0xffff)
            | ((base & 0xff_ffff) << 16)
            | (0x89 << 40)
            | (((limit >> 16) & 0xf) << 48)
            | (((base >> 24) & 0xff) << 56);
        let gdt = &raw mut pier_gdt;
        (*gdt)[5] = low;
        (*gdt)[6] = base >> 32;
        asm!("ltr {0:x}", in(reg) TSS_SELECTOR, options(nostack, preserves_flags));
        super::traps::load();
        super::irq::install_ring0();
        super::clock::register_kvmclock();
        enable_vector_state();
        // The ABI wants rsp + 8 to be 16-byte aligned at a function's
        // first instruction, as after a call.
        let user_stack = &raw const pier_user_stack_top as u64 - 8;
        asm!(
            "push {ss}",
            "push {stack}",
            "push {rflags}",
            "push {cs}",
            "push {rip}",
            "iretq",
            ss = in(reg) USER_DATA,
            stack = in(reg) user_stack,
            rflags = in(reg) USER_RFLAGS,
            cs = in(reg) USER_CODE,
            rip = in(reg) super::start::pier_rt_user_entry as *const () as u64,
            in("rdi") u64::from(start_info),
            options(noreturn)
        );
    }
}
