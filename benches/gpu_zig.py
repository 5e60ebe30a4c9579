"""GPU-machine checks of a manylinux_2_17 (zig-built) flashgen wheel installed on PYTHONPATH.

    python3 benches/gpu_zig.py parity   # JIT one of the wheel's instances into an empty cache, compare bytes
    python3 benches/gpu_zig.py dlclose  # run a kernel, then dlclose it and every _aot .so; exit must be 0
"""

import hashlib
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import flashgen
from flashgen import _install, _loader


def sections(data: bytes) -> dict:
    """name -> (sha256[:16], size) of each ELF64 section with file contents."""
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    stro = hdrs[shstrndx][4]
    out = {}
    for h in hdrs:
        name_off, typ, off, size = h[0], h[1], h[4], h[5]
        name = data[stro + name_off:data.index(b"\0", stro + name_off)].decode()
        if typ != 8 and size:  # not NOBITS
            out[name] = (hashlib.sha256(data[off:off + size]).hexdigest()[:16], size)
    return out


def parity() -> int:
    manifest = _install.aot_manifest()
    print("wheel manifest: manylinux =", manifest.get("manylinux"), "| host_compiler =",
          manifest["toolchain"]["host_compiler"], "| nvcc", manifest["toolchain"]["nvcc_version"])
    inst = next(i for p in _install.aot_packages() for i in p.rows("single_decode")
                if i["module"] == "single_decode" and i["params"]["dtype"] == "bf16" and i["params"]["head_dim"] == 128)
    os.environ["FLASHGEN_CUDA_ARCH_LIST"] = "8.0 9.0a"  # the wheel's archs
    os.environ["FLASHGEN_CACHE_DIR"] = "/tmp/fg-parity-cache"
    import time
    t0 = time.time()
    loaded = _loader.load(inst["module"], inst["params"], prefer_aot=False)
    jit = Path(loaded.path).read_bytes()
    aot = _install.aot_file(inst["path"]).read_bytes()
    print(f"JIT of {inst['uri']}: source={loaded.source} in {time.time() - t0:.1f} s")
    # What the JIT's toolchain was: the same build, answered from the cache it just filled.
    cmd = [str(_install.binary()), "--config", str(_install.variants_json()), "build", "--json", "--quiet",
           "--manylinux", manifest["manylinux"], "--arch", "8.0 9.0a", "--out", "/tmp/fg-parity-out",
           "--module", inst["module"]] + [a for k, v in inst["params"].items() for a in ("--where", f"{k}={v}")]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, FLASHGEN_PYTHON=sys.executable))
    if proc.returncode == 0:
        b = json.loads(proc.stdout)
        tc = json.loads(Path("/tmp/fg-parity-out/manifest.json").read_text())["toolchain"]
        print("JIT toolchain: host_compiler =", tc["host_compiler"], "| nvcc", tc["nvcc_version"],
              "at", tc["nvcc"], "| built", b["built"], "cached", b["cached"])
        print("key: wheel", inst["fingerprint"][:16], "JIT", b["instances"][0]["fingerprint"][:16],
              "same" if inst["fingerprint"] == b["instances"][0]["fingerprint"] else "DIFFERENT")
    else:
        print("build (to show the toolchain) failed:", proc.stderr[-600:])
    same = jit == aot
    print(f"bytes: wheel sha256 {inst['sha256'][:16]} ({len(aot)} B), JIT {hashlib.sha256(jit).hexdigest()[:16]} "
          f"({len(jit)} B): {'IDENTICAL' if same else 'DIFFERENT'}")
    if not same:
        sa, sj = sections(aot), sections(jit)
        for name in sorted(set(sa) | set(sj)):
            mark = "same" if sa.get(name) == sj.get(name) else "DIFF"
            print(f"  {name:24} wheel {sa.get(name)} JIT {sj.get(name)} {mark}")
    return 0


def dlclose() -> int:
    import _ctypes
    import ctypes

    import torch

    q = torch.randn(32, 128, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(4096, 8, 128, dtype=torch.bfloat16, device="cuda")
    o = flashgen.single_decode(q, k, k)
    torch.cuda.synchronize()
    params = {"dtype": "bf16", "head_dim": 128, "pos_encoding": "none", "variant": "default"}
    loaded = _loader.load("single_decode", params)
    print("ran", loaded.uri, "from", loaded.source, "| finite:", bool(torch.isfinite(o).all()))
    _ctypes.dlclose(loaded.kernels._lib._handle)
    n = 0
    for so in sorted(_install.aot_dir().glob("*.so")):
        for _ in range(2):
            _ctypes.dlclose(ctypes.CDLL(str(so))._handle)
        n += 1
    torch.cuda.synchronize()
    print(f"dlclosed the kernel that ran, and dlopen+dlclose x2 of {n} wheel .so files; exiting")
    return 0


if __name__ == "__main__":
    sys.exit({"parity": parity, "dlclose": dlclose}[sys.argv[1]]())
