"""Shared fixtures of flashgen's Python tests.

- ``flashgen_bin``: the binary (``FLASHGEN_BIN``, else ``cargo build --release``; skip without cargo).
- ``nvcc``: the pinned PyPI nvcc (``FLASHGEN_NVCC``, else the project venv's; skip without one).
- ``wheel``: a small wheel (``FLASHGEN_TEST_WHEEL``, else ``flashgen build-wheel`` filtered to one
  instance for sm_90a), ``installed``: it unpacked with ``pip install --target``.
- ``run_py``: run a snippet in a fresh interpreter against the installed wheel, with a private
  ``FLASHGEN_CACHE_DIR`` (tests never touch ``~/.cache``).
- ``FakeCudaTensor``: a DLPack producer that claims to live on a CUDA device, for validation
  tests on machines without a GPU (no real CUDA tensor exists there).
- ``NO_JIT``: ``FLASHGEN_TEST_DISABLE_JIT=1`` runs every test with ``FLASHGEN_DISABLE_JIT=1``
  (the GPU suites against an installed release: nothing may compile at run time). A test that
  needs the JIT (a user variant) then checks ``JITDisabledError`` instead, through ``needs_jit``.
- ``compile_ahead``: a GPU suite's instances built in parallel threads before its first test;
  ``gpu_suite_cache``: the fixtures of a suite that keeps one JIT cache for its module, built so.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

REPO = Path(__file__).resolve().parents[2]
PYTHON_SRC = REPO / "python"
NO_JIT = os.environ.get("FLASHGEN_TEST_DISABLE_JIT") == "1"
# The caller's flashgen settings, which no test inherits (each test states what it needs).
INHERITED_SETTINGS = ("FLASHGEN_DISABLE_JIT", "FLASHGEN_CUDA_ARCH_LIST", "TORCH_CUDA_ARCH_LIST",
                      "FLASHGEN_DEVICE_CC", "FLASHGEN_MANYLINUX")
# The small wheel CI builds: one instance, one arch.
SMALL_WHEEL_ARGS = ["--arch", "9.0a", "--module", "single_decode", "--where", "dtype=bf16",
                    "--where", "head_dim=128", "--where", "pos_encoding=none", "--where", "variant=default",
                    "--where", "backend=portable"]  # one instance (single_decode has two backends)

def _installed_elsewhere() -> bool:
    """A flashgen already importable from outside this checkout (a wheel on PYTHONPATH, as on
    the GPU machine) is the one under test; otherwise the checkout's python/ is."""
    import importlib.util

    spec = importlib.util.find_spec("flashgen")
    return spec is not None and spec.origin is not None and not Path(spec.origin).resolve().is_relative_to(REPO)


if not _installed_elsewhere() and str(PYTHON_SRC) not in sys.path:
    sys.path.insert(0, str(PYTHON_SRC))


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every test gets its own cache folder and no inherited flashgen settings."""
    for var in INHERITED_SETTINGS:
        monkeypatch.delenv(var, raising=False)
    if NO_JIT:
        monkeypatch.setenv("FLASHGEN_DISABLE_JIT", "1")
    monkeypatch.setenv("FLASHGEN_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    yield
    for name in ("flashgen._install", "flashgen._matrix", "flashgen._loader", "flashgen._common", "flashgen._op",
                 "flashgen._variant", "flashgen._merge"):
        mod = sys.modules.get(name)
        if mod is not None:
            mod._reset_for_tests()  # type: ignore[attr-defined]


def compile_ahead(cache_dir: str, calls: list[tuple[str, Callable[[], Any]]]) -> list[str]:
    """Run ``calls`` ((label, call): each loads or JIT-builds an instance) in parallel threads
    (``FLASHGEN_TEST_JIT_THREADS``, default 16; the loader locks per instance, so different
    instances build side by side) into ``cache_dir``, with the settings a test gets from this
    file; returns a line per call that raised (the test that needs the instance reports it)."""
    from concurrent.futures import ThreadPoolExecutor

    names = ("FLASHGEN_CACHE_DIR", *INHERITED_SETTINGS)
    saved = {n: os.environ.pop(n, None) for n in names}
    os.environ["FLASHGEN_CACHE_DIR"] = cache_dir
    if NO_JIT:
        os.environ["FLASHGEN_DISABLE_JIT"] = "1"
    failed: list[str] = []

    def one(item: tuple[str, Callable[[], Any]]) -> None:
        try:
            item[1]()
        except BaseException as exc:  # noqa: BLE001 - the test reports it (a skip included)
            failed.append(f"{item[0]}: {type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}")

    try:
        with ThreadPoolExecutor(max_workers=int(os.environ.get("FLASHGEN_TEST_JIT_THREADS", "16"))) as ex:
            list(ex.map(one, calls))
    finally:
        for n, val in saved.items():
            if val is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = val
    return failed


def needs_jit(call: Callable[[], Any]) -> None:
    """Run ``call``, which compiles a user variant; under ``NO_JIT`` it must fail with
    ``JITDisabledError`` naming the switch instead (a release without a toolchain)."""
    if not NO_JIT:
        call()
        return
    import flashgen

    with pytest.raises(flashgen.JITDisabledError, match="FLASHGEN_DISABLE_JIT=1"):
        call()


# ---- toolchain ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def flashgen_bin() -> Path:
    env = os.environ.get("FLASHGEN_BIN")
    if env:
        return Path(env)
    cargo = shutil.which("cargo")
    if cargo is None:
        pytest.skip("cargo is not installed and FLASHGEN_BIN is not set: cannot build the flashgen binary")
    proc = subprocess.run([cargo, "build", "--release", "-q"], cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.fail(f"cargo build --release failed:\n{proc.stderr}")
    return REPO / "target" / "release" / "flashgen"


@pytest.fixture(scope="session")
def nvcc() -> Path:
    env = os.environ.get("FLASHGEN_NVCC")
    candidates = [Path(env)] if env else []
    candidates += sorted((REPO / ".venv").glob("lib/python3*/site-packages/nvidia/cu13/bin/nvcc"))
    for c in candidates:
        if c.is_file():
            return c
    pytest.skip("no nvcc: set FLASHGEN_NVCC or install ci/requirements-cuda.txt into .venv")


@pytest.fixture(scope="session")
def build_env(nvcc: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Environment for running flashgen builds with the pinned nvcc and a session build cache."""
    env = dict(os.environ)
    env["FLASHGEN_NVCC"] = str(nvcc)
    env.setdefault("FLASHGEN_SESSION_CACHE", str(tmp_path_factory.mktemp("build-cache")))
    env["FLASHGEN_CACHE_DIR"] = env["FLASHGEN_SESSION_CACHE"]
    for var in INHERITED_SETTINGS:
        env.pop(var, None)
    return env


@pytest.fixture(scope="session")
def wheel(flashgen_bin: Path, build_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = os.environ.get("FLASHGEN_TEST_WHEEL")
    if env:
        return Path(env)
    out = tmp_path_factory.mktemp("dist")
    cmd = [str(flashgen_bin), "--config", str(REPO / "variants.json"), "build-wheel", "--out", str(out),
           "--build-dir", str(tmp_path_factory.mktemp("wheel-build")), "--quiet", *SMALL_WHEEL_ARGS]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=build_env)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    wheels = sorted(out.glob("flashgen-*.whl"))
    assert len(wheels) == 1, f"expected one wheel in {out}, found {wheels}"
    return wheels[0]


@pytest.fixture(scope="session")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel unpacked by pip into a folder to put on PYTHONPATH."""
    target = tmp_path_factory.mktemp("site")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
         "--target", str(target), str(wheel)],
        capture_output=True, text=True,
    )
    if proc.returncode != 0:
        pytest.fail(f"pip install --target failed:\n{proc.stderr}")
    assert (target / "flashgen" / "__init__.py").is_file()
    return target


@pytest.fixture(scope="session")
def wheel_manifest(installed: Path) -> dict[str, Any]:
    return whole_manifest(lambda rel: (installed / "flashgen" / rel).read_text())


def whole_manifest(read: Callable[[str], str | bytes]) -> dict[str, Any]:
    """A wheel's package manifest as one document, read through ``read`` (a path inside the
    package -> its text): the header with the rows the wheel keeps in a file per module
    (``module_rows``, ``_aot/rows/<module>.json``) put back into ``instances``."""
    manifest: dict[str, Any] = json.loads(read("_aot/manifest.json"))
    rows = list(manifest.get("instances", []))
    for module, count in (manifest.get("module_rows") or {}).items():
        shard = json.loads(read(f"_aot/rows/{module}.json"))
        assert len(shard) == count, f"{module}: {len(shard)} rows, the header says {count}"
        rows += shard
    manifest["instances"] = rows
    return manifest


def whole_matrix(read: Callable[[str], str | bytes]) -> dict[str, Any]:
    """A wheel's ``_data/matrix.json`` with each module's instances (kept in a file per module,
    ``_data/instances/<module>.json``) put back into ``instances``."""
    matrix: dict[str, Any] = json.loads(read("_data/matrix.json"))
    matrix["instances"] = [row for module in matrix["modules"]
                           for row in json.loads(read(f"_data/instances/{module}.json"))]
    return matrix


RunPy = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def run_py(installed: Path, build_env: dict[str, str], tmp_path: Path) -> RunPy:
    """``run_py(code, **env)``: run ``code`` in a fresh interpreter that imports the installed
    wheel, with FLASHGEN_CACHE_DIR = tmp_path/'cache' unless given."""

    def run(code: str, *, check: bool = True, timeout: float = 900, **env_vars: str) -> subprocess.CompletedProcess[str]:
        env = dict(build_env)
        env["PYTHONPATH"] = str(installed)
        env["FLASHGEN_CACHE_DIR"] = str(tmp_path / "cache")
        env.pop("FLASHGEN_BIN", None)
        env.update(env_vars)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env=env, timeout=timeout, cwd=tmp_path)
        if check and proc.returncode != 0:
            pytest.fail(f"snippet failed ({proc.returncode}):\n{code}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
        return proc

    return run


def wheel_files(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as zf:
        return zf.namelist()


# ---- fake CUDA tensors (DLPack) -------------------------------------------------------------------


FAKE_TENSOR_SRC = r'''
import ctypes
from typing import Any


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
        ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
        ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64),
        ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
    ]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

_DTYPES = {"f16": (2, 16), "bf16": (4, 16), "f32": (2, 32), "i32": (0, 32), "i64": (0, 64), "f64": (2, 64),
           "u8": (1, 8), "bool": (6, 8), "fp8_e4m3": (10, 8), "fp8_e5m2": (12, 8)}


class FakeCudaTensor:
    """Metadata of a tensor on ``cuda:device`` exported through DLPack, with no memory behind it.
    Enough for everything the API checks before it touches the GPU."""

    def __init__(self, shape: tuple[int, ...], dtype: str = "bf16", device: int = 0,
                 strides: tuple[int, ...] | None = None, device_type: int = 2) -> None:
        self.shape = tuple(shape)
        if strides is None:
            acc, rev = 1, []
            for n in reversed(self.shape):
                rev.append(acc)
                acc *= n
            strides = tuple(reversed(rev))
        self.strides = tuple(strides)
        self.dtype = dtype
        self.device = device
        self.device_type = device_type
        self.streams_seen: list[Any] = []
        n = len(self.shape)
        self._shape_arr = (ctypes.c_int64 * max(n, 1))(*self.shape)
        self._stride_arr = (ctypes.c_int64 * max(n, 1))(*self.strides)
        code, bits = _DTYPES[dtype]
        self._managed = _DLManagedTensor(0x10000, device_type, device, n, code, bits, 1,
                                         self._shape_arr, self._stride_arr, 0, None, None)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (self.device_type, self.device)

    def __dlpack__(self, stream: Any = None) -> Any:
        self.streams_seen.append(stream)
        return _capsule_new(ctypes.addressof(self._managed), b"dltensor", None)
'''
exec(FAKE_TENSOR_SRC)  # defines FakeCudaTensor here; test_wheel runs the same text in a bare venv
FakeCudaTensor: type = globals()["FakeCudaTensor"]


@pytest.fixture
def fake_tensor() -> type:
    return FakeCudaTensor


# A tiny matrix in the shape of `flashgen describe`, for validation tests that need no binary.
FAKE_MATRIX: dict[str, Any] = {
    "flashgen_version": "0.0.0-test",
    "archs": ["8.0", "9.0a"],
    "variants": {
        "default": {"params": []},
        "soft_cap": {"params": [{"name": "logits_soft_cap", "type": "float"}]},
        "alibi": {"params": [{"name": "alibi_slopes", "type": "const float*", "len": "num_qo_heads"}]},
        "sliding_window": {"params": [{"name": "window_left", "type": "int32_t"}]},
        "attention_sink": {"params": [{"name": "sinks", "type": "const float*", "len": "num_qo_heads"},
                                      {"name": "window_left", "type": "int32_t"}]},
    },
    "modules": {
        "single_decode": {"entry_points": [], "axes": [
            {"name": "dtype", "type": "dtype", "values": ["f16", "bf16"]},
            {"name": "head_dim", "type": "int", "values": [64, 128]},
            {"name": "pos_encoding", "type": "enum", "values": ["none", "rope_llama"]},
            {"name": "variant", "type": "variant", "values": ["default", "soft_cap", "alibi", "sliding_window", "attention_sink"]},
        ]},
        "batch_decode": {"entry_points": [], "axes": [
            {"name": "dtype", "type": "dtype", "values": ["f16", "bf16"]},
            {"name": "head_dim", "type": "int", "values": [64, 128, 256]},
            {"name": "page_size", "type": "int", "values": [1, 16]},
            {"name": "pos_encoding", "type": "enum", "values": ["none", "rope_llama"]},
            {"name": "variant", "type": "variant", "values": ["default", "soft_cap", "alibi", "sliding_window", "attention_sink"]},
            {"name": "kv_dtype", "type": "enum", "values": ["same", "fp8_e4m3", "fp8_e5m2"]},
        ]},
        **{mod: {"entry_points": [], "axes": [
            {"name": "dtype", "type": "dtype", "values": ["f16", "bf16"]},
            {"name": "head_dim", "type": "int", "values": [64, 128]},
            *([{"name": "page_size", "type": "int", "values": [1, 16]}] if mod.endswith("paged") else []),
            {"name": "mask", "type": "enum", "values": ["none", "causal"]},
            {"name": "pos_encoding", "type": "enum", "values": ["none", "rope_llama"]},
            {"name": "variant", "type": "variant", "values": ["default", "soft_cap", "alibi", "sliding_window", "attention_sink"]},
            {"name": "kv_dtype", "type": "enum", "values": ["same", "fp8_e4m3", "fp8_e5m2"]},
        ]} for mod in ("single_prefill", "batch_prefill_ragged", "batch_prefill_paged")},
        "merge_state": {"entry_points": [], "axes": [  # no variant axis, no backend axis
            {"name": "dtype", "type": "dtype", "values": ["f16", "bf16"]},
        ]},
    },
    "instances": [],
    "reserved_words": ["class", "float", "int", "struct", "template"],
    # As `flashgen describe --json` prints the binary's one table of variant parameter types.
    "param_types": [
        row
        for c, ct, dt in [("float", "c_float", "f32"), ("double", "c_double", "f64"), ("bool", "c_bool", "bool"),
                          ("int32_t", "c_int32", "i32"), ("int64_t", "c_int64", "i64"),
                          ("uint32_t", "c_uint32", "u32"), ("uint64_t", "c_uint64", "u64")]
        for row in ({"c": c, "ctypes": ct, "dtype": dt}, {"c": f"const {c}*", "ctypes": "c_void_p", "dtype": dt},
                    {"c": f"{c}*", "ctypes": "c_void_p", "dtype": dt})
    ],
}


def _fill_fake_instances() -> None:
    # The modules' C ABI, as the real matrix declares it (describe ships these declarations).
    # Their unsupported combinations too, which are no instances (as describe leaves them out).
    real = json.loads((REPO / "variants.json").read_text())["modules"]
    for mod, spec in FAKE_MATRIX["modules"].items():
        spec["args"] = real[mod]["args"]
        if "unsupported" in real[mod]:
            spec["unsupported"] = real[mod]["unsupported"]
    for mod, spec in FAKE_MATRIX["modules"].items():
        axes = spec["axes"]

        def rec(i: int, params: dict[str, Any]) -> None:
            if i == len(axes):
                if mod == "batch_decode" and params["head_dim"] == 256 and params["page_size"] == 1:
                    return
                if any(all(params[a] in values for a, values in u["where"].items())
                       for u in spec.get("unsupported", ())):
                    return
                uri = mod + "".join(f"_{k}_{v}" for k, v in params.items())
                codes = {a["name"]: (params[a["name"]] if a["type"] == "int" else a["values"].index(params[a["name"]]))
                         for a in axes}
                FAKE_MATRIX["instances"].append({"uri": uri, "module": mod, "params": dict(params),
                                                 "codes": codes,
                                                 "aot": params.get("variant", "default") == "default"})
                return
            for v in axes[i]["values"]:
                rec(i + 1, {**params, axes[i]["name"]: v})

        rec(0, {})


_fill_fake_instances()


@pytest.fixture(scope="session")
def described(flashgen_bin: Path) -> dict[str, Any]:
    """The repository's ``flashgen describe --json``."""
    proc = subprocess.run([str(flashgen_bin), "--config", str(REPO / "variants.json"), "describe", "--json"],
                          capture_output=True, text=True, check=True)
    data: dict[str, Any] = json.loads(proc.stdout)
    return data


@pytest.fixture
def fake_matrix(monkeypatch: pytest.MonkeyPatch, described: dict[str, Any]) -> dict[str, Any]:
    """Make the in-process flashgen read FAKE_MATRIX instead of asking a binary (its C ABI and
    wheel layout are the binary's)."""
    from flashgen import _install, _matrix

    for key in ("abi", "wheel", "capabilities"):
        FAKE_MATRIX[key] = described[key]
    for mod, spec in FAKE_MATRIX["modules"].items():
        spec["args_struct"] = described["modules"][mod]["args_struct"]
    _matrix._reset_for_tests()
    monkeypatch.setattr(_install, "_matrix_cache", FAKE_MATRIX)
    return FAKE_MATRIX



def gpu_suite_cache(name: str, instances: Callable[[], list[tuple[str, dict[str, Any]]]]) -> tuple[Any, Any]:
    """The fixtures of a GPU suite with one JIT cache for its module, to assign to module names:
    ``_gpu_cache`` (module scope: ``FLASHGEN_TEST_CACHE_DIR``, else a temporary folder, with
    every (module, params) of ``instances()`` built in it first, in parallel) and
    ``_shared_cache`` (every test's ``FLASHGEN_CACHE_DIR``), so each instance compiles once."""

    @pytest.fixture(scope="module", name="_gpu_cache")
    def gpu_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
        from flashgen import _loader

        path = os.environ.get("FLASHGEN_TEST_CACHE_DIR") or str(tmp_path_factory.mktemp(f"{name}-gpu-cache"))
        compile_ahead(path, [(f"{m} {p}", lambda m=m, p=p: _loader.load(m, p)) for m, p in instances()])
        return path

    @pytest.fixture(autouse=True, name="_shared_cache")
    def shared_cache(_gpu_cache: str, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setenv("FLASHGEN_CACHE_DIR", _gpu_cache)

    return gpu_cache, shared_cache


# The RFC's FlashSigmoid example (../shared/seeds/rfc-unifying-aot-and-jit-via-c-macros.txt),
# unchanged apart from its name, as the kernel tests keep it: a user-written variant the JIT must
# compile as it stands.
FLASH_SIGMOID_FILE = Path(__file__).with_name("custom_variants") / "flash_sigmoid.cuh"
FLASH_SIGMOID_PARAMS = [("logits_scale", "float"), ("sigmoid_bias", "float")]


def flash_sigmoid_source() -> str:
    if not FLASH_SIGMOID_FILE.is_file():
        pytest.skip(f"{FLASH_SIGMOID_FILE} is missing")
    return FLASH_SIGMOID_FILE.read_text()
