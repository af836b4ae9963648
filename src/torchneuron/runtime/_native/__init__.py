"""Build, cache and load the runtime's small, optional C++ library.

The sources next to this file make one shared library:

- `neuron_generator.cpp` registers C++ PrivateUse1 hooks that answer what the Python hooks
  cannot (`getNewGenerator`, `getDefaultGenerator`: `torch.Generator(device="neuron")`), the
  device guard, an allocator and pinned host memory;
- `fastpath.cpp` is the eager hot path: the PrivateUse1 kernel that runs view ops and known
  executables without entering Python, and the C type of storage payloads
  (runtime/fastpath.py, runtime/storage.py);
- `host_kernels.cpp` exports PyTorch's CPU convolution kernels as XLA FFI handlers, which
  programs on XLA's CPU client call instead of XLA's slower convolutions
  (lowerings/host_kernels.py); it compiles against the FFI headers jaxlib ships.

It is compiled on first import, against the installed torch, with the compiler and paths
`torch.utils.cpp_extension` reports (no ninja, no network), and cached under the user cache
directory:

    $TORCHNEURON_CACHE_DIR, else $XDG_CACHE_HOME/torchneuron, else ~/.cache/torchneuron
        ext/torchneuron_native-<key>.so      key: sources, torch build, Python ABI, flags

Concurrent first imports are safe: one process builds under an exclusive `flock` on
`<key>.lock`, writes to a temporary name and renames it into place; the others wait on the
lock and then load the finished file. A failed build leaves `<key>.failed` (with the compiler
output) so later imports with the same compiler ($CXX, else c++) do not retry; delete it, or
set TORCHNEURON_REBUILD_EXTENSION=1, to try again. TORCHNEURON_NATIVE_LIBRARY=0 skips the
library altogether.

Without the library everything but explicit device generators works, more slowly: ops take
the Python path, on the pure-Python generator in `runtime/rng.py`;
`torch.Generator(device="neuron")` then raises PyTorch's NotImplementedError (a RuntimeError)
and the reason is given by `build_error()`.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import subprocess
import sys
import sysconfig
import tempfile
import warnings
from pathlib import Path

import torch

from ... import config

SOURCES = tuple(Path(__file__).with_name(name)
                for name in ("neuron_generator.cpp", "fastpath.cpp", "host_kernels.cpp"))
ABI_VERSION = 8
# The XLA FFI handlers host_kernels.cpp exports: kernel name -> symbol.
HOST_KERNELS = {
    "convolution": "torchneuron_host_convolution",
    "convolution_backward": "torchneuron_host_convolution_backward",
}
_FLAGS = ("-O2", "-std=c++20", "-fPIC", "-shared", "-w")

_library: ctypes.PyDLL | None = None
_error: str | None = None
_loaded = False
_hooks_registered = False
_fastpath = None


def enabled() -> bool:
    return config.flag("TORCHNEURON_NATIVE_LIBRARY")


def cache_dir() -> Path:
    return config.cache_root()


def _abi_define() -> str:
    return f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}"


def cache_key() -> str:
    """What the built library depends on: source, torch build, Python ABI, flags, platform."""
    digest = hashlib.sha256()
    for part in (
        *(source.read_bytes() for source in SOURCES),
        torch.__version__.encode(),
        str(torch.version.git_version).encode(),
        _jaxlib_version().encode(),
        sys.implementation.cache_tag.encode(),
        sysconfig.get_platform().encode(),
        " ".join((*_FLAGS, _abi_define())).encode(),
        str(ABI_VERSION).encode(),
    ):
        digest.update(part)
        digest.update(b"\0")
    return digest.hexdigest()[:20]


def _jaxlib_version() -> str:
    import jaxlib

    return jaxlib.__version__


def _ffi_include_dir() -> str:
    import jax.ffi

    return jax.ffi.include_dir()


def library_path() -> Path:
    return cache_dir() / "ext" / f"torchneuron_native-{cache_key()}.so"


def _compiler() -> str:
    from torch.utils import cpp_extension

    return cpp_extension.get_cxx_compiler()


def _failed_with(marker: Path) -> str:
    """The compiler an earlier failed build used (a new compiler deserves a new try)."""
    try:
        return marker.read_text().split("\n", 1)[0]
    except OSError:
        return ""


def _compile_command(output: Path) -> list[str]:
    from torch.utils import cpp_extension

    command = [_compiler(), *_FLAGS, _abi_define()]
    command += [f"-I{p}" for p in cpp_extension.include_paths()]
    command.append(f"-I{sysconfig.get_paths()['include']}")
    command.append(f"-I{_ffi_include_dir()}")
    command += [*(str(source) for source in SOURCES), "-o", str(output)]
    for lib_dir in cpp_extension.library_paths():
        command += [f"-L{lib_dir}", f"-Wl,-rpath,{lib_dir}"]
    command += ["-lc10", "-ltorch_cpu", "-ltorch_python"]
    if sys.platform == "darwin":
        command += ["-undefined", "dynamic_lookup"]
    return command


class _FileLock:
    """An exclusive advisory lock on a file, released by the OS if the process dies."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def __enter__(self):
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            import fcntl

            fcntl.flock(self.fd, fcntl.LOCK_EX)
        except ImportError:  # no fcntl (Windows): builds may race, renames stay atomic
            pass
        return self

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            os.close(self.fd)  # closing releases the flock
            self.fd = None


def build(force: bool = False) -> Path:
    """The path of the built library, compiling it first if the cache has none.

    Raises RuntimeError (with the compiler's output) when the build fails.
    """
    target = library_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    failed = target.with_suffix(".failed")
    force = force or config.flag("TORCHNEURON_REBUILD_EXTENSION")
    if target.exists() and not force:
        return target
    with _FileLock(target.with_suffix(".lock")):
        if target.exists() and not force:
            return target  # another process built it while we waited
        compiler = _compiler()
        if failed.exists() and not force and _failed_with(failed) == compiler:
            raise RuntimeError(
                f"an earlier build failed (see {failed}; delete it or set "
                "TORCHNEURON_REBUILD_EXTENSION=1 to retry)"
            )
        fd, tmp_name = tempfile.mkstemp(prefix=target.stem + ".", suffix=".tmp", dir=target.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        try:
            command = _compile_command(tmp)
            try:
                proc = subprocess.run(command, capture_output=True, text=True, timeout=600)
                output, ok = proc.stdout + proc.stderr, proc.returncode == 0
            except (OSError, subprocess.SubprocessError) as err:
                output, ok = f"{type(err).__name__}: {err}", False
            if not ok:
                failed.write_text(compiler + "\n" + " ".join(command) + "\n\n" + output)
                raise RuntimeError(f"compiling the native library failed (details in {failed}):\n{output[-2000:]}")
            os.chmod(tmp, 0o755)
            os.replace(tmp, target)
            failed.unlink(missing_ok=True)
        finally:
            tmp.unlink(missing_ok=True)
    return target


def load() -> ctypes.PyDLL | None:
    """The loaded library, building it if needed; None (see `build_error()`) if unavailable."""
    global _library, _error, _loaded
    if _loaded:
        return _library
    _loaded = True
    if not enabled():
        _error = "disabled by TORCHNEURON_NATIVE_LIBRARY=0"
        return None
    try:
        lib = ctypes.PyDLL(str(build()))
        if lib.torchneuron_generator_abi_version() != ABI_VERSION:
            raise RuntimeError("the cached library was built from other sources")
        lib.torchneuron_register_hooks.restype = ctypes.c_int
        lib.torchneuron_default_generator.restype = ctypes.py_object
        lib.torchneuron_default_generator.argtypes = [ctypes.c_int]
        lib.torchneuron_fastpath_module.restype = ctypes.py_object
        _library = lib
    except Exception as err:  # never let an optional build break the import
        _error = f"{type(err).__name__}: {err}"
        warnings.warn(
            "torchneuron: the C++ library is unavailable, so eager ops run slower (the Python "
            "path) and torch.Generator(device='neuron') will not work; seeded device RNG "
            f"through torch.manual_seed / torch.neuron still does. Reason: {_error}",
            RuntimeWarning,
            stacklevel=2,
        )
        _library = None
    return _library


def loaded_path() -> Path | None:
    """The file of the library this process loaded (None when it runs without one)."""
    return None if _library is None else Path(_library._name)


def build_error() -> str | None:
    """Why the library is not in use (None when it is, or before `load()`)."""
    return _error


def register_hooks() -> bool:
    """Register the C++ PrivateUse1 hooks; True if they are (now) the process's hooks."""
    global _error, _hooks_registered
    if _hooks_registered:
        return True
    lib = load()
    if lib is None:
        return False
    status = lib.torchneuron_register_hooks()
    if status != 1:
        _error = (
            "other PrivateUse1 hooks were registered first"
            if status == 0
            else "registering the C++ PrivateUse1 hooks failed"
        )
        return False
    _hooks_registered = True
    return True


def hooks_registered() -> bool:
    return _hooks_registered


def default_generator(index: int) -> torch.Generator:
    """The `torch.Generator` ATen uses as the default generator of neuron:`index`."""
    if _library is None:
        raise RuntimeError(f"torchneuron: no C++ generator library ({_error})")
    return _library.torchneuron_default_generator(index)


def host_kernels() -> dict:
    """The XLA FFI handlers of host_kernels.cpp as PyCapsules, by kernel name (empty without
    the library)."""
    if load() is None:
        return {}
    import jax.ffi

    return {name: jax.ffi.pycapsule(getattr(_library, symbol))
            for name, symbol in HOST_KERNELS.items()}


def fastpath():
    """The fast path's Python module (fastpath.cpp), or None without the library."""
    global _fastpath
    if _fastpath is None and load() is not None:
        _fastpath = _library.torchneuron_fastpath_module()
    return _fastpath
