"""A compiled polyspec for bench/router_ab.py: its per-request modules built by mypyc, the rest as they are.

The **mypyc-hot** A/B run (docs/benchmarks.md, "Single changes side by side") asks whether compiling
polyspec's own per-request logic from its type annotations lowers the router's CPU per request. This
script lays out the working tree as the installed package (``DEST/polyspec/router``, ...), moves the msgspec
Structs of the compiled modules into one module that stays interpreted (mypyc rewrites their ``Any``
annotations, and msgspec then refuses every message), and compiles ``HOT`` with mypyc from .venv-bench
(`bash bench/setup_peers.sh`), against .venv's packages. Then:

    .venv/bin/python bench/mypyc_tree.py /tmp/polyspec-mypyc                      # about 4 minutes
    flock /tmp/polyspec-heavy.lock .venv/bin/python bench/router_ab.py --label mypyc-hot \\
        --candidate-path /tmp/polyspec-mypyc/baseline-pkg --base HEAD --rounds 6

The product is never built this way: this is a measurement, and the run says why it was not taken.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import typer  # noqa: E402
from rich.console import Console  # noqa: E402

from bench.common import BENCH_VENV, ROOT, BenchError, require_bench_venv  # noqa: E402
from bench.router_overhead import baseline_tree  # noqa: E402
from bench.servers import SERVED_LANGUAGES, make_registry, start_backend  # noqa: E402

console = Console(width=150)
HOT = ("router/decision/routing", "router/decision/classify", "router/edge/body", "router/decision/policy",
       "router/decision/speed", "router/engine/job",
       "router/telemetry", "core/counters", "core/domains", "core/langid_script", "core/langid", "core/acceptance")
STRUCTS = "router/_structs.py"  # where the Structs go: a module mypyc is not given
_STRUCT = re.compile(r"^class (\w+)\(msgspec\.Struct\):\n(?:(?:    .*)?\n)+?(?=\n\n\S)", re.M)


def move_structs(pkg: Path) -> list[str]:
    """Move every ``class X(msgspec.Struct)`` of the HOT modules into STRUCTS, imported back where it was."""
    moved: list[str] = []
    blocks: list[str] = []
    for name in HOT:
        path = pkg / f"{name}.py"
        text = path.read_text()
        found = list(_STRUCT.finditer(text))
        for match in reversed(found):  # from the end, so earlier offsets stay valid
            imported = f"from polyspec.router._structs import {match.group(1)}  # noqa: E402\n"
            text = text[:match.start()] + imported + text[match.end():]
        blocks += [m.group(0) for m in found]
        moved += [f"{name}.{m.group(1)}" for m in found]
        path.write_text(text)
    (pkg / STRUCTS).write_text("from typing import Any\n\nimport msgspec\n\n\n" + "\n\n".join(blocks) + "\n")
    return moved


# Routes every bench body (bench.router_overhead.request_bodies) through `route` and prints a digest of the
# decisions (language, confidence, domain, pools). polyspec is imported before the repository joins sys.path:
# the repository's own polyspec/ folder would otherwise shadow the tree on PYTHONPATH.
_DIGEST = """
import hashlib, json, sys
import polyspec.router.decision.routing as routing
sys.path.append(sys.argv[2])
from bench.router_budget import _runtime
from bench.router_overhead import request_bodies
rt = _runtime(sys.argv[1])
out = []
for body in request_bodies(40):
    r = routing.route(rt, json.dumps(body).encode(), {"content-type": "application/json"}, "chat")
    out.append([r.decision.language, round(r.decision.confidence, 6), r.decision.domain, [p.key for p in r.pools]])
print(routing.__file__, len(out), hashlib.sha1(json.dumps(out).encode()).hexdigest())
"""


def same_decisions(pkg_root: Path) -> str:
    """The compiled tree's routing decisions on the bench bodies against the working tree's: BenchError if
    any differs; else what was compared."""
    with tempfile.TemporaryDirectory(prefix="polyspec-mypyc-") as tmp:
        backend = start_backend(Path(tmp), None)
        try:
            registry = make_registry(Path(tmp), [("bench", backend.url, SERVED_LANGUAGES, True)])
            digests = []
            for path in (None, pkg_root):
                env = {**os.environ, **({"PYTHONPATH": str(path)} if path else {})}
                out = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", _DIGEST, registry, str(ROOT)],
                                     capture_output=True, text=True, env=env, cwd=tmp, check=False)
                if out.returncode != 0:
                    raise BenchError(f"routing the bench bodies failed:\n{out.stderr[-1500:]}")
                digests.append(out.stdout.split())
        finally:
            backend.stop()
    (plain_file, n, plain), (built_file, _, built) = digests
    if not built_file.endswith(".so") or plain_file.endswith(".so"):
        raise BenchError(f"expected the compiled and the plain module, got {built_file} and {plain_file}")
    if plain != built:
        raise BenchError(f"the compiled tree routes the {n} bench bodies differently ({built} != {plain})")
    return f"the same routing decisions on all {n} bench bodies (digest {plain[:12]})"


def main(dest: Path = typer.Argument(..., help="Empty or new folder; the tree goes to DEST/baseline-pkg.")) -> None:
    """Lay out the working tree as the package and compile its per-request modules with mypyc."""
    try:
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise BenchError(f"{dest} is not an empty folder")
        require_bench_venv("mypyc")
        dest.mkdir(parents=True, exist_ok=True)
        pkg_root = baseline_tree(dest, "HEAD", set())  # every folder from the working tree
        moved = move_structs(pkg_root / "polyspec")
        console.print(f"moved to {STRUCTS}: {', '.join(moved)}")
        cmd = [str(BENCH_VENV / "bin" / "mypyc"), "--python-executable", str(ROOT / ".venv" / "bin" / "python"),
               "--ignore-missing-imports", "--follow-imports=silent", *(f"polyspec/{m}.py" for m in HOT)]
        with console.status(f"mypyc: {len(HOT)} modules"):
            out = subprocess.run(cmd, cwd=pkg_root, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise BenchError("mypyc failed:\n" + "\n".join((out.stdout + out.stderr).splitlines()[-20:]))
        built = sorted(p.relative_to(pkg_root) for p in pkg_root.glob("polyspec/**/*.so"))
        missing = [m for m in HOT if not any(str(b).startswith(f"polyspec/{m}.") for b in built)]
        if missing:
            raise BenchError(f"mypyc built no extension for {', '.join(missing)}")
        with console.status("routing the bench bodies with both trees"):
            same = same_decisions(pkg_root)
    except BenchError as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(1) from None
    console.print(f"built {len(built)} modules; {same}; candidate tree: {pkg_root}")


if __name__ == "__main__":
    typer.run(main)
