//! A BPF array of `u64` created with `BPF_F_MMAPABLE` (Linux 5.5), mapped into this
//! process: its slots are read and written without a system call each.

use std::os::fd::AsFd as _;
use std::os::fd::AsRawFd as _;
use std::ptr::NonNull;

use aya::maps::MapData;

pub struct MappedArray {
    slots: NonNull<u64>,
    len: usize,
    bytes: usize,
    /// Keeps the map alive as long as the mapping (the mapping holds it too).
    _map: MapData,
}

impl MappedArray {
    /// Maps the first `len` slots of `map`, an array of `u64` with at least `len`
    /// entries created with `BPF_F_MMAPABLE`.
    pub fn new(map: MapData, len: usize) -> std::io::Result<MappedArray> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let bytes = (len * 8).div_ceil(page).max(1) * page;
        // SAFETY: a fresh shared mapping of the map's descriptor; the kernel checks that
        // the map is mappable and `bytes` within it.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map.fd().as_fd().as_raw_fd(),
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let slots = NonNull::new(address.cast::<u64>()).ok_or_else(|| {
            std::io::Error::other("mmap returned a null address for the BPF array")
        })?;
        Ok(MappedArray {
            slots,
            len,
            bytes,
            _map: map,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Writes slot `index` (ignored past the end).
    pub fn set(&mut self, index: usize, value: u64) {
        if index < self.len {
            // SAFETY: inside the mapping; a program reads the slots only while this
            // process runs it (`BPF_PROG_TEST_RUN`), never concurrently with this write.
            unsafe { self.slots.as_ptr().add(index).write_volatile(value) }
        }
    }

    /// Slot `index`'s address, for atomic access (panics past the end).
    pub fn slot_ptr(&self, index: usize) -> *mut u64 {
        assert!(index < self.len, "slot {index} of {}", self.len);
        // SAFETY: inside the mapping, which lives as long as `self`.
        unsafe { self.slots.as_ptr().add(index) }
    }

    /// Reads slot `index` (0 past the end).
    pub fn get(&self, index: usize) -> u64 {
        if index < self.len {
            // SAFETY: as in `set`.
            unsafe { self.slots.as_ptr().add(index).read_volatile() }
        } else {
            0
        }
    }
}

impl Drop for MappedArray {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.slots.as_ptr().cast(), self.bytes) };
    }
}

// SAFETY: the mapping is plain memory owned by this value; access goes through `&mut
// self` for writes.
unsafe impl Send for MappedArray {}
