"""Sandboxed execution of untrusted environment modules: the OS sandbox (`jail`), the child program that
runs inside it (`child`), and the parent-side worker and checks (`worker`)."""

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
