"""Kernel-wait probe: the system call a process's main thread is blocked in, read on a stall.

A rank whose Python stack stops in a C call (``torch.save`` opening its file, a read from a
mount that no longer answers, a socket receive) says where in the program it waits, not on what.
Linux says the rest: ``/proc/PID/syscall`` holds the call's number and arguments while the thread
is blocked in it, ``/proc/PID/wchan`` the kernel function it sleeps in, ``/proc/PID/stat`` its
state (D: uninterruptible, a file system or device that does not answer). A call on a file
descriptor names what the descriptor is (``/proc/PID/fd/N``: a path, a pipe, a TCP connection);
a call on a path names the path, read from the process's memory (``process_vm_readv``, the
permission py-spy already needs). Nothing is written to the process, nothing stops it.

Reading these needs the same permission as reading its stack; without it, or off Linux, or for
a thread that is running, there is nothing to say (None)."""
from __future__ import annotations

import ctypes
import os
import platform
from typing import Mapping

from stalldoc.model.kernel import KernelWait
from stalldoc.probes.connections import TcpSocket, socket_table

# the system calls a blocked thread sits in, by number, on the two architectures GPU nodes run
_X86_64 = {0: "read", 1: "write", 2: "open", 3: "close", 4: "stat", 5: "fstat", 6: "lstat",
           7: "poll", 16: "ioctl", 17: "pread64", 18: "pwrite64", 19: "readv", 20: "writev",
           23: "select", 26: "msync", 35: "nanosleep", 40: "sendfile", 42: "connect",
           43: "accept", 44: "sendto", 45: "recvfrom", 46: "sendmsg", 47: "recvmsg",
           61: "wait4", 72: "fcntl", 73: "flock", 74: "fsync", 75: "fdatasync", 82: "rename",
           83: "mkdir", 87: "unlink", 202: "futex", 217: "getdents64", 230: "clock_nanosleep",
           232: "epoll_wait", 247: "waitid", 257: "openat", 258: "mkdirat", 262: "newfstatat",
           263: "unlinkat", 264: "renameat", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait",
           288: "accept4", 332: "statx"}
_AARCH64 = {22: "epoll_pwait", 25: "fcntl", 29: "ioctl", 32: "flock", 34: "mkdirat",
            35: "unlinkat", 38: "renameat", 56: "openat", 57: "close", 61: "getdents64",
            63: "read", 64: "write", 65: "readv", 66: "writev", 67: "pread64", 68: "pwrite64",
            71: "sendfile", 72: "pselect6", 73: "ppoll", 79: "newfstatat", 80: "fstat",
            82: "fsync", 83: "fdatasync", 95: "waitid", 98: "futex", 101: "nanosleep",
            115: "clock_nanosleep", 202: "accept", 203: "connect", 206: "sendto",
            207: "recvfrom", 211: "sendmsg", 212: "recvmsg", 227: "msync", 242: "accept4",
            260: "wait4", 291: "statx"}
SYSCALLS = {"x86_64": _X86_64, "aarch64": _AARCH64}.get(platform.machine(), {})

# which argument is a file descriptor, and which a path (the ``*at`` calls: the second)
_FD_FIRST = frozenset({"read", "write", "pread64", "pwrite64", "readv", "writev", "close",
                       "fstat", "fsync", "fdatasync", "flock", "fcntl", "ioctl", "getdents64",
                       "recvfrom", "recvmsg", "sendto", "sendmsg", "connect", "accept",
                       "accept4"})
_PATH_ARG = {"open": 0, "stat": 0, "lstat": 0, "mkdir": 0, "unlink": 0, "rename": 0,
             "openat": 1, "newfstatat": 1, "statx": 1, "mkdirat": 1, "unlinkat": 1,
             "renameat": 1}
PATH_MAX = 4096


def kernel_wait(pid: int, sockets: Mapping[int, TcpSocket] | None = None) -> KernelWait | None:
    """Where the main thread of ``pid`` is blocked; None when it runs, is not in a system call,
    or cannot be read (gone, no permission, not Linux). ``sockets``: the TCP socket table
    (``socket_table()``), read once for many processes; else read here when needed."""
    try:
        with open(f"/proc/{pid}/syscall") as handle:
            fields = handle.read().split()
    except OSError:
        return None
    if not fields or not fields[0].lstrip("-").isdigit() or int(fields[0]) < 0:
        return None   # "running", or blocked outside a system call
    number, args = int(fields[0]), [int(a, 16) for a in fields[1:7]]
    call = SYSCALLS.get(number, f"syscall {number}")
    return KernelWait(call, _target(pid, call, args, sockets), _wchan(pid), _state(pid))


def _target(pid: int, call: str, args: list[int],
            sockets: Mapping[int, TcpSocket] | None) -> str:
    if call in _FD_FIRST and args:
        return fd_target(pid, args[0], sockets)
    if call in _PATH_ARG and len(args) > _PATH_ARG[call]:
        return _c_string(pid, args[_PATH_ARG[call]])
    return ""


def fd_target(pid: int, fd: int, sockets: Mapping[int, TcpSocket] | None = None) -> str:
    """What descriptor ``fd`` of ``pid`` is: its path, "pipe", "TCP to host:port", "a TCP
    socket", ... ('' when it cannot be read)."""
    try:
        link = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return ""
    if link.startswith("socket:["):
        return _socket(int(link[8:-1]), sockets)
    if link.startswith("pipe:["):
        return "a pipe"
    if link.startswith("anon_inode:"):
        return f"an {link[len('anon_inode:'):].strip('[]')} descriptor"
    return link


def _socket(inode: int, sockets: Mapping[int, TcpSocket] | None) -> str:
    table = sockets if sockets is not None else socket_table({inode}) or {}
    found = table.get(inode)
    if found is None:
        return "a socket"   # a Unix socket, UDP, or a table not readable
    if found.remote is None:
        return f"a TCP socket on port {found.local[1]}"
    host, port = found.remote
    return f"TCP to {host}:{port}"


def _c_string(pid: int, address: int) -> str:
    """The NUL-terminated string at ``address`` in ``pid``'s memory ('' when unreadable)."""
    if not address:
        return ""
    buffer = ctypes.create_string_buffer(PATH_MAX)
    local = _IoVec(ctypes.cast(buffer, ctypes.c_void_p), PATH_MAX)
    remote = _IoVec(ctypes.c_void_p(address), PATH_MAX)
    try:
        got = _libc().process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    except (AttributeError, OSError):
        return ""
    if got <= 0:   # a read across the end of a mapping: try the rest of its page
        remote.iov_len = 4096 - address % 4096
        got = _libc().process_vm_readv(pid, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
    if got <= 0:
        return ""
    return buffer.raw[:got].split(b"\0", 1)[0].decode("utf-8", "replace")


class _IoVec(ctypes.Structure):
    _fields_ = [("iov_base", ctypes.c_void_p), ("iov_len", ctypes.c_size_t)]


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.process_vm_readv.restype = ctypes.c_ssize_t
    libc.process_vm_readv.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_ulong,
                                      ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    return libc


def _wchan(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/wchan") as handle:
            text = handle.read().strip()
    except OSError:
        return ""
    return "" if text in ("", "0") else text


def _state(pid: int) -> str:
    """The process's state letter (R, S, D, T, Z...), from ``/proc/PID/stat``."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            text = handle.read()
    except OSError:
        return ""
    after = text.rpartition(")")[2].split()
    return after[0] if after else ""
