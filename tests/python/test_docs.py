"""The docs against the code: the README's and the user guide's Python examples run against the
real API, every relative link leads to a file (and heading) that exists, and the CLI reference
holds the binary's own help text and every environment variable the code reads.

The examples run two ways:

- Everywhere: each example is parsed, every ``flashgen.<name>(...)`` it calls must exist and
  accept its arguments (``inspect.signature(...).bind``), then the example runs statement by
  statement against the real matrix (the binary's ``describe``) with a stand-in ``torch`` whose
  tensors are CUDA-shaped DLPack metadata with no memory. Every flashgen call must get through
  all of its checks (shapes, dtypes, variants and their parameters, backends) and stop exactly
  where it first needs the GPU driver.
- Where torch and a CUDA GPU exist: the examples run as written, to the end.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any, Iterator

import pytest

from conftest import NO_JIT, REPO, FakeCudaTensor

EXAMPLE_DOCS = ["README.md", "docs/user-guide.md"]
# Links to files another change is adding: accepted while the file is absent, checked once it exists.
PENDING_FILES = {"include/flashgen/README.md"}


def _docs() -> list[Path]:
    return [REPO / "README.md", REPO / "DEVELOPERS.md", REPO / "BENCHMARKS.md", REPO / "CHANGELOG.md",
            REPO / "benches" / "NOTES-history.md", *sorted((REPO / "docs").glob("*.md"))]


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """The fenced ```python blocks of a Markdown file: (line of the first code line, code)."""
    out, lines, i = [], path.read_text().split("\n"), 0
    while i < len(lines):
        if lines[i].strip() == "```python":
            start, i = i + 1, i + 1
            while lines[i].strip() != "```":
                i += 1
            out.append((start + 1, "\n".join(lines[start:i])))
        i += 1
    return out


def _program(doc: str) -> ast.Module:
    """A doc's examples as one program (a later block may use names an earlier one set), each
    statement keeping its line in the Markdown file."""
    body: list[ast.stmt] = []
    for line, code in python_blocks(REPO / doc):
        tree = ast.parse(code, filename=doc)
        ast.increment_lineno(tree, line - 1)
        body.extend(tree.body)
    return ast.Module(body=body, type_ignores=[])


def _flashgen_calls(tree: ast.AST) -> Iterator[ast.Call]:
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "flashgen"):
            yield node


@pytest.mark.parametrize("doc", EXAMPLE_DOCS)
def test_examples_name_the_real_api(doc: str) -> None:
    import flashgen

    calls = list(_flashgen_calls(_program(doc)))
    assert calls, f"{doc} has no flashgen call in its python examples"
    for call in calls:
        where = f"{doc}:{call.lineno}"
        name = call.func.attr  # type: ignore[attr-defined]
        assert name in flashgen.__all__, f"{where}: flashgen.{name} is not public API"
        fn = getattr(flashgen, name)
        sig = inspect.signature(fn)
        kwargs = {k.arg: None for k in call.keywords if k.arg is not None}
        try:
            sig.bind(*[None] * len(call.args), **kwargs)
        except TypeError as exc:
            pytest.fail(f"{where}: flashgen.{name}{sig} does not take these arguments: {exc}")
        named = {p.name for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD}
        extra = set(kwargs) - named
        if extra:  # only a variant's parameters go to **variant_params
            assert "variant" in kwargs, f"{where}: {sorted(extra)} given without a variant="


class _ReachedGPU(Exception):
    """Raised where a call first needs the CUDA driver: everything before it was checked."""


class _Tensor(FakeCudaTensor):
    def __getitem__(self, index: slice) -> "_Tensor":
        n = len(range(*index.indices(self.shape[0])))
        return _Tensor((n, *self.shape[1:]), self.dtype, strides=self.strides)


def _stand_in_torch() -> types.ModuleType:
    """The few torch calls the examples make, giving CUDA-shaped tensors without memory."""
    torch = types.ModuleType("torch")

    class Tensor:  # nothing is an instance: the examples' tensors go through DLPack
        pass

    torch.Tensor = Tensor  # type: ignore[attr-defined]
    torch.float16, torch.bfloat16, torch.float32, torch.int32 = "f16", "bf16", "f32", "i32"  # type: ignore[attr-defined]
    torch.uint8 = "u8"  # type: ignore[attr-defined]
    torch.bool = "bool"  # type: ignore[attr-defined]

    def randn(*shape: int, dtype: str = "f32", device: Any = None) -> _Tensor:
        return _Tensor(tuple(shape), dtype)

    torch.randn = randn  # type: ignore[attr-defined]
    torch.randn_like = lambda t: _Tensor(t.shape, t.dtype)  # type: ignore[attr-defined]
    torch.tensor = lambda data, dtype="f32", device=None: _Tensor((len(data),), dtype)  # type: ignore[attr-defined]
    torch.arange = lambda n, dtype="i64", device=None: _Tensor((n,), dtype)  # type: ignore[attr-defined]
    torch.full = lambda shape, value, dtype="f32", device=None: _Tensor(tuple(shape), dtype)  # type: ignore[attr-defined]
    torch.empty = lambda n, dtype="f32", device=None: _Tensor((n,), dtype)  # type: ignore[attr-defined]
    return torch


def _calls_a_wrapper(stmt: ast.stmt, namespace: dict[str, Any]) -> bool:
    """Whether the statement calls a method of a flashgen object (a wrapper's plan() or run())."""
    for node in ast.walk(stmt):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)):
            obj = namespace.get(node.func.value.id)
            if obj is not None and type(obj).__module__.startswith("flashgen."):
                return True
    return False


@pytest.mark.parametrize("doc", EXAMPLE_DOCS)
def test_examples_pass_every_check_up_to_the_gpu(doc: str, flashgen_bin: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from flashgen import _cuda, _tensor

    monkeypatch.setenv("FLASHGEN_BIN", str(flashgen_bin))  # the real matrix, from the binary
    monkeypatch.setitem(sys.modules, "torch", _stand_in_torch())
    monkeypatch.setattr(_tensor, "_torch_tensor", None)
    monkeypatch.setattr(_tensor, "_by_type", {})

    def no_driver(*_: Any) -> Any:
        raise _ReachedGPU

    # The same on a machine with a GPU (whose compute capability an earlier test may have cached).
    monkeypatch.setattr(_cuda, "driver", no_driver)
    monkeypatch.setattr(_cuda, "compute_capability", no_driver)
    program = _program(doc)
    namespace: dict[str, Any] = {}
    reached = 0
    for stmt in program.body:
        code = compile(ast.Module(body=[stmt], type_ignores=[]), doc, "exec")
        calls_flashgen = any(True for _ in _flashgen_calls(stmt)) or _calls_a_wrapper(stmt, namespace)
        try:
            exec(code, namespace)
        except _ReachedGPU:
            assert calls_flashgen, f"{doc}:{stmt.lineno}: reached the GPU without a flashgen call"
            reached += 1
        except Exception as exc:  # a check refused the example: the doc is wrong
            pytest.fail(f"{doc}:{stmt.lineno}: {type(exc).__name__}: {exc}")
    kernel_calls = sum(1 for c in _flashgen_calls(program)
                       if c.func.attr.startswith(("single_", "batch_")))  # type: ignore[attr-defined]
    assert reached >= kernel_calls > 0, f"{doc}: {reached} statements reached the GPU, {kernel_calls} kernel calls"


def _torch_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.skipif(not _torch_cuda(), reason="needs torch and a CUDA GPU")
@pytest.mark.parametrize("doc", EXAMPLE_DOCS)
def test_examples_run_on_the_gpu(doc: str) -> None:
    import flashgen
    import torch

    namespace: dict[str, Any] = {}
    for stmt in _program(doc).body:
        code = compile(ast.Module(body=[stmt], type_ignores=[]), doc, "exec")
        try:
            exec(code, namespace)
        except flashgen.JITDisabledError:
            # A release without a toolchain: only a user variant may need the JIT.
            if not (NO_JIT and "variant=my" in ast.unparse(stmt)):
                raise
        torch.cuda.synchronize()
    out = namespace["o"]
    assert out.is_cuda and bool(torch.isfinite(out).all()), f"{doc}: the last output is not finite"


# ---- links -------------------------------------------------------------------------------------

_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, flags=re.M)}


def _links(path: Path) -> Iterator[tuple[int, str]]:
    text = path.read_text()
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"``.*?``|`[^`\n]*`", "", text)
    for m in _LINK.finditer(text):
        yield text.count("\n", 0, m.start()) + 1, m.group(1)


@pytest.mark.parametrize("doc", [p.relative_to(REPO).as_posix() for p in _docs()])
def test_relative_links_lead_somewhere(doc: str) -> None:
    path = REPO / doc
    bad = []
    for line, target in _links(path):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        rel = dest.relative_to(REPO).as_posix() if dest.is_relative_to(REPO) else str(dest)
        if not dest.exists():
            if rel not in PENDING_FILES:
                bad.append(f"{doc}:{line}: {target}: no file {rel}")
            continue
        if anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            bad.append(f"{doc}:{line}: {target}: no heading #{anchor} in {rel}")
    assert not bad, "broken links:\n" + "\n".join(bad)


# ---- the CLI reference -------------------------------------------------------------------------

COMMANDS = ["list-variants", "describe", "generate", "build", "build-wheel", "clean", "doctor", "jit", "warm"]


def test_cli_reference_holds_each_commands_help(flashgen_bin: Path) -> None:
    page = (REPO / "docs" / "cli.md").read_text()
    for args in [[], *([c] for c in COMMANDS)]:
        out = subprocess.run([str(flashgen_bin), *args, "--help"], capture_output=True, text=True,
                             check=True, env={**os.environ, "COLUMNS": "100"}).stdout.rstrip()
        assert out in page, (f"docs/cli.md does not hold the output of `flashgen {' '.join(args)} --help` "
                             "as it is now (COLUMNS=100): paste it into the command's ```text block")


def _grep(pattern: str, *folders: str) -> set[str]:
    found: set[str] = set()
    for folder in folders:
        for f in (REPO / folder).rglob("*"):
            if f.is_file() and f.suffix in {".rs", ".py", ".sh", ".txt", ".cuh", ".cu", ".h", ""}:
                found |= set(re.findall(pattern, f.read_text(errors="replace")))
    return found


def test_cli_reference_names_every_environment_variable() -> None:
    page = (REPO / "docs" / "cli.md").read_text()
    names = _grep(r"FLASHGEN_[A-Z0-9_]+", "src", "python", "ci")
    c_names = _grep(r"FLASHGEN_[A-Z0-9_]+", "include", "csrc") | _grep(r"#define (FLASHGEN_[A-Z0-9_]+)", "src")
    env = {n for n in names - c_names if not n.endswith("_")}
    env |= _grep(r"FLASHGEN_TEST_[A-Z0-9_]+|FLASHGEN_TOOLS_VENV", "tests/python")
    assert {"FLASHGEN_CACHE_DIR", "FLASHGEN_DISABLE_JIT", "FLASHGEN_TEST_WHEEL"} <= env
    missing = sorted(n for n in env if f"`{n}`" not in page)
    assert not missing, f"docs/cli.md does not describe {missing}"
