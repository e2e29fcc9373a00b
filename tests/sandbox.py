"""Run a command under a seccomp filter that denies ptrace and process_vm_readv (EPERM), as a
container's seccomp profile does where CAP_SYS_PTRACE was not given: a real kernel refusal, for
py-spy and everything else the command starts. Standard library only (ctypes).

Usage: python sandbox.py CMD [ARGS...]  (the filter is kept across exec, by children too)."""
from __future__ import annotations

import ctypes
import os
import platform
import struct
import sys

# syscall numbers by machine: (ptrace, process_vm_readv)
SYSCALLS = {"x86_64": (101, 310), "aarch64": (117, 270)}
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
RET_ALLOW, RET_ERRNO_EPERM = 0x7FFF0000, 0x00050000 | 1
LD_NR, JEQ, RET = 0x20, 0x15, 0x06   # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_RET|K


def install() -> None:
    ptrace, readv = SYSCALLS[platform.machine()]
    program = [(LD_NR, 0, 0, 0),            # A = seccomp_data.nr
               (JEQ, 2, 0, ptrace),         # ptrace -> deny
               (JEQ, 1, 0, readv),          # process_vm_readv -> deny
               (RET, 0, 0, RET_ALLOW),
               (RET, 0, 0, RET_ERRNO_EPERM)]
    raw = b"".join(struct.pack("HBBI", *insn) for insn in program)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    prog = Prog(len(program), ctypes.addressof(buf))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or \
            libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(prog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "seccomp filter refused")


if __name__ == "__main__":
    install()
    os.execvp(sys.argv[1], sys.argv[1:])
