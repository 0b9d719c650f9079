//! The console: COM1, a 16550 UART at I/O port 0x3f8, written from ring 3
//! (the boot layer's TSS I/O bitmap opens these ports to it).
//!
//! Every port access is a VM exit, which costs 10–80 µs on a nested host,
//! so the console writes each byte with one `out` and does not poll the
//! line-status register first: the hypervisors pier runs under (pier-vmm's
//! vm-superio UART, QEMU's) accept a byte at any time. Nor is the UART set
//! up at boot: an emulated UART has no line whose rate or framing could
//! matter, and both come out of reset ready to send (DLAB clear, so a
//! write to the base port is a byte; no interrupts; no loopback), while
//! setting one up is seven writes, seven exits: half a millisecond of boot
//! on a nested Intel host. stdout and stderr both go here.

use core::fmt;

const COM1: u16 = 0x3f8;

fn outb(port: u16, value: u8) {
    // SAFETY: an I/O port write, allowed in ring 3 by the TSS bitmap; it
    // touches no memory.
    unsafe {
        core::arch::asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags))
    };
}

/// Writes bytes to COM1, turning `\n` into `\r\n` as a terminal expects.
pub(crate) fn write_bytes(bytes: &[u8]) {
    for &b in bytes {
        if b == b'\n' {
            outb(COM1, b'\r');
        }
        outb(COM1, b);
    }
}

/// The console as a `fmt::Write`, for the print macros.
#[derive(Debug)]
pub struct Console;

impl fmt::Write for Console {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        write_bytes(s.as_bytes());
        Ok(())
    }
}

/// Prints formatted text on the console; the print macros' platform.
#[doc(hidden)]
pub fn print(args: fmt::Arguments<'_>) {
    let _ = fmt::Write::write_fmt(&mut Console, args);
}
