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

use libc::{
    BPF_ABS, BPF_B, BPF_H, BPF_IMM, BPF_IND, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD, BPF_LDX, BPF_MISC,
    BPF_RET, BPF_TAX, BPF_W, SKF_AD_NLATTR, SKF_AD_NLATTR_NEST, SKF_AD_OFF, sock_filter,
    sock_fprog,
};

use super::tcp_state;

/// The instruction codes the program uses, as classic BPF composes them.
const LD_H_ABS: u32 = BPF_LD | BPF_H | BPF_ABS;
const LD_W_ABS: u32 = BPF_LD | BPF_W | BPF_ABS;
const LD_B_IND: u32 = BPF_LD | BPF_B | BPF_IND;
const LD_IMM: u32 = BPF_LD | BPF_IMM;
const LDX_IMM: u32 = BPF_LDX | BPF_IMM;
const JEQ_K: u32 = BPF_JMP | BPF_JEQ | BPF_K;
const TAX: u32 = BPF_MISC | BPF_TAX;
const RET_K: u32 = BPF_RET | BPF_K;
/// The netlink ancillary loads: a negative offset the kernel reads as an operation.
const AD_NLATTR: u32 = (SKF_AD_OFF + SKF_AD_NLATTR) as u32;
const AD_NLATTR_NEST: u32 = (SKF_AD_OFF + SKF_AD_NLATTR_NEST) as u32;
/// `nlmsghdr` + `nfgenmsg`: where a ctnetlink message's attributes start.
const ATTRS: u32 = 20;
/// `(NFNL_SUBSYS_CTNETLINK << 8) | IPCTNL_MSG_CT_DELETE`, as `ldh` reads the host-order
/// `nlmsg_type` (network order).
const DELETE: u32 = u16::from_be_bytes(0x0102u16.to_ne_bytes()) as u32;
const CTA_PROTOINFO: u32 = 4;
const CTA_PROTOINFO_TCP: u32 = 1;
const CTA_PROTOINFO_TCP_STATE: u32 = 1;

/// One instruction (libc's `BPF_STMT`/`BPF_JUMP` are not `const`).
const fn op(code: u32, jt: u8, jf: u8, k: u32) -> sock_filter {
    sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// The program; `ACCEPT` is instruction 16, `DROP` 17.
pub static DROP_CLOSED_TCP_DESTROYS: [sock_filter; 18] = [
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
    let program = sock_fprog {
        len: DROP_CLOSED_TCP_DESTROYS.len() as u16,
        // The kernel only reads the program (sock_fprog's field is not const).
        filter: DROP_CLOSED_TCP_DESTROYS.as_ptr().cast_mut(),
    };
    // SAFETY: `program` is a valid `struct sock_fprog` pointing at a static array of
    // `len` instructions; the kernel copies them during the call.
    let ret = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_ATTACH_FILTER,
            (&raw const program).cast(),
            std::mem::size_of::<sock_fprog>() as u32,
        )
    };
    if ret < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests;
