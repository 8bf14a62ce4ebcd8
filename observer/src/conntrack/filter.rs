//! A classic BPF socket filter for destroy-event sockets: the kernel drops the destroy
//! events of TCP entries that had already closed (TIME_WAIT, CLOSE) before they are
//! queued, copied and parsed. observer ignores those anyway (`ConntrackMatcher::matters`):
//! the kernel programs saw such a close, and connections found at start are asked
//! about in turn and end by their TIME_WAIT or CLOSE state (`ConntrackMatcher::checked`).
//! With connect-and-close churn they are one event per connection.
//!
//! The filter walks ctnetlink's attributes with the netlink ancillary loads
//! (`SKF_AD_NLATTR`, `SKF_AD_NLATTR_NEST`): `CTA_PROTOINFO` -> `CTA_PROTOINFO_TCP` ->
//! `CTA_PROTOINFO_TCP_STATE`. Anything else (other messages, other protocols, an
//! attribute missing) passes.

use std::io;
use std::os::fd::RawFd;

use super::tcp_state;

/// `struct sock_filter`: one classic BPF instruction.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SockFilter {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

const LD_H_ABS: u16 = 0x28;
const LD_W_ABS: u16 = 0x20;
const LD_B_IND: u16 = 0x50;
const LD_IMM: u16 = 0x00;
const LDX_IMM: u16 = 0x01;
const JEQ_K: u16 = 0x15;
const TAX: u16 = 0x07;
const RET_K: u16 = 0x06;
/// `SKF_AD_OFF + SKF_AD_NLATTR` / `+ SKF_AD_NLATTR_NEST`.
const AD_NLATTR: u32 = (-0x1000i32 + 12) as u32;
const AD_NLATTR_NEST: u32 = (-0x1000i32 + 16) as u32;
/// `nlmsghdr` + `nfgenmsg`: where a ctnetlink message's attributes start.
const ATTRS: u32 = 20;
/// `(NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE`, as `ldh` reads the host-order
/// `nlmsg_type` (network order).
const DELETE: u32 = u16::from_be_bytes(0x0102u16.to_ne_bytes()) as u32;
const CTA_PROTOINFO: u32 = 4;
const CTA_PROTOINFO_TCP: u32 = 1;
const CTA_PROTOINFO_TCP_STATE: u32 = 1;

const fn op(code: u16, jt: u8, jf: u8, k: u32) -> SockFilter {
    SockFilter { code, jt, jf, k }
}

/// The program; `ACCEPT` is instruction 16, `DROP` 17.
pub const DROP_CLOSED_TCP_DESTROYS: [SockFilter; 18] = [
    op(LD_H_ABS, 0, 0, 4),
    op(JEQ_K, 0, 14, DELETE),
    op(LD_IMM, 0, 0, ATTRS),
    op(LDX_IMM, 0, 0, CTA_PROTOINFO),
    op(LD_W_ABS, 0, 0, AD_NLATTR),
    op(JEQ_K, 10, 0, 0),
    op(LDX_IMM, 0, 0, CTA_PROTOINFO_TCP),
    op(LD_W_ABS, 0, 0, AD_NLATTR_NEST),
    op(JEQ_K, 7, 0, 0),
    op(LDX_IMM, 0, 0, CTA_PROTOINFO_TCP_STATE),
    op(LD_W_ABS, 0, 0, AD_NLATTR_NEST),
    op(JEQ_K, 4, 0, 0),
    op(TAX, 0, 0, 0),
    // The state is the attribute's payload, after its 4-byte header.
    op(LD_B_IND, 0, 0, 4),
    op(JEQ_K, 2, 0, tcp_state::TIME_WAIT as u32),
    op(JEQ_K, 1, 0, tcp_state::CLOSE as u32),
    op(RET_K, 0, 0, u32::MAX),
    op(RET_K, 0, 0, 0),
];

/// Attaches `DROP_CLOSED_TCP_DESTROYS` to the socket `fd`.
pub fn attach(fd: RawFd) -> io::Result<()> {
    #[repr(C)]
    struct SockFprog {
        len: u16,
        filter: *const SockFilter,
    }
    let program = SockFprog {
        len: DROP_CLOSED_TCP_DESTROYS.len() as u16,
        filter: DROP_CLOSED_TCP_DESTROYS.as_ptr(),
    };
    // SAFETY: `program` is a valid `struct sock_fprog` pointing at a static array of
    // `len` instructions; the kernel copies them during the call.
    let ret = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&raw const program).cast(),
            std::mem::size_of::<SockFprog>() as u32,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
