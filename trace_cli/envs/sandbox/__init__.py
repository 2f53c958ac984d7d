"""Sandboxed execution of untrusted environment modules: the OS sandbox (`jail`), the child program that
runs inside it (`child`), the parent's side of the pipe (`protocol`), and the parent-side worker and checks
(`worker`).

The jail (bubblewrap namespaces, a read-only minimal filesystem, masked extension modules, a bounded work
tmpfs, a seccomp filter) is the security boundary. The child's audit hook is defence in depth: it gives
clear reasons for what a module tried and closes what it can (files outside the sandbox, processes,
network, raw bytecode, sub-interpreters, introspection of the hook), but it runs in the module's own
interpreter, so nothing here relies on it alone.
"""

from trace_cli.envs.sandbox.worker import (
    UNSAFE_ENV,
    Limits,
    ModuleVerdict,
    SandboxedEnv,
    SandboxError,
    SandboxViolation,
    SandboxWorker,
    check_module,
    isolation,
    module_env_factory,
)

__all__ = [
    "UNSAFE_ENV",
    "Limits",
    "ModuleVerdict",
    "SandboxError",
    "SandboxViolation",
    "SandboxWorker",
    "SandboxedEnv",
    "check_module",
    "isolation",
    "module_env_factory",
]
