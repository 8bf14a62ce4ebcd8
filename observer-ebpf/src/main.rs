#![no_std]
#![no_main]

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo<'_>) -> ! {
    // SAFETY: the verifier rejects any program that could reach this; it only exists
    // because `no_std` binaries need a panic handler.
    unsafe { core::hint::unreachable_unchecked() }
}
