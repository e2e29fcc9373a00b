"""Where a process's main thread sits in the kernel: the system call it is blocked in, on what,
and the kernel's word for the wait (``probes/kernel_wait.py``)."""
from __future__ import annotations

from dataclasses import dataclass

# the calls that wait on a file, a pipe, a device or the network: a blocked one is I/O that does
# not come (a lock, a sleep or a child's end is told by the Python stack already)
IO_CALLS = frozenset({
    "read", "write", "pread64", "pwrite64", "readv", "writev", "open", "openat", "close",
    "stat", "lstat", "fstat", "newfstatat", "statx", "fsync", "fdatasync", "msync", "flock",
    "fcntl", "ioctl", "mkdir", "mkdirat", "unlink", "unlinkat", "rename", "renameat",
    "getdents64", "sendfile", "recvfrom", "recvmsg", "sendto", "sendmsg", "connect", "accept",
    "accept4"})


@dataclass(frozen=True)
class KernelWait:
    """The main thread blocked in ``call`` (its name, or "syscall N" for a number not known
    here) on ``target`` (a path, "pipe", "TCP to host:port", ...: '' when the call names none
    that can be read), in the kernel's wait ``wchan`` ('' when the kernel does not say), the
    process ``state`` as ps shows it (S sleeping, D uninterruptible)."""

    call: str
    target: str = ""
    wchan: str = ""
    state: str = ""

    @property
    def io(self) -> bool:
        """Blocked in I/O: a file, pipe, device or socket call, or uninterruptible (D)."""
        return self.call in IO_CALLS or self.state == "D"

    def words(self) -> str:
        """'blocked in openat(/mnt/ckpt/step_100.pt) (kernel: wait_for_partner)'."""
        state = ["uninterruptible (D)"] if self.state == "D" else []
        how = [f"kernel: {self.wchan}"] if self.wchan else []
        said = f" ({', '.join(how + state)})" if how or state else ""
        on = f"({self.target})" if self.target else ""
        return f"blocked in {self.call}{on}{said}"
