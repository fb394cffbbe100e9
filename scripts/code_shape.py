"""The shape of the package's functions: the largest ones and the long signatures.

``python scripts/code_shape.py [--top 20] [--max-params 8] [ROOT]`` prints two Markdown tables: the
``--top`` largest functions of ``buildctl`` (lines, from ``def`` to the last line of the body) and
every function that takes more than ``--max-params`` parameters (``self``/``cls`` not counted). A
typer command (a function with a ``typer.Option`` or ``typer.Argument`` default) is marked: its
parameters are the command's flags, which is where the guide allows a long list.
Issue #51's closing note gives this script's output before and after the restructuring.
"""

from __future__ import annotations

import argparse
import ast
from pathlib import Path


def _is_typer(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    defaults = [*fn.args.defaults, *[d for d in fn.args.kw_defaults if d is not None]]
    return any(isinstance(d, ast.Call) and "typer" in ast.unparse(d.func) for d in defaults) or any(
        "typer." in ast.unparse(d) for d in defaults if isinstance(d, ast.Name))


def _params(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    names = [p.arg for p in [*a.posonlyargs, *a.args, *a.kwonlyargs]]
    names = [n for n in names if n not in ("self", "cls")]
    return len(names) + (a.vararg is not None) + (a.kwarg is not None)


def functions(root: Path):
    for path in sorted((root / "buildctl").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        rel = path.relative_to(root).as_posix()
        stack: list[tuple[ast.AST, str]] = [(tree, "")]
        while stack:
            node, prefix = stack.pop()
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    name = prefix + child.name
                    yield rel, name, child.end_lineno - child.lineno + 1, _params(child), _is_typer(child)
                    stack.append((child, name + "."))
                elif isinstance(child, ast.ClassDef):
                    stack.append((child, prefix + child.name + "."))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default=".", type=Path)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--max-params", type=int, default=8)
    args = ap.parse_args()
    rows = list(functions(args.root))
    print(f"| {args.top} largest functions | lines |\n|---|---:|")
    for rel, name, lines, _, _ in sorted(rows, key=lambda r: (-r[2], r[0], r[1]))[: args.top]:
        print(f"| `{rel}:{name}` | {lines} |")
    long = sorted((r for r in rows if r[3] > args.max_params), key=lambda r: (-r[3], r[0], r[1]))
    print(f"\n| more than {args.max_params} parameters | parameters | typer command |\n|---|---:|---|")
    for rel, name, _, params, typer_cmd in long:
        print(f"| `{rel}:{name}` | {params} | {'yes' if typer_cmd else ''} |")
    print(f"\n{len(long)} functions take more than {args.max_params} parameters, "
          f"{sum(1 for r in long if not r[4])} of them outside the typer commands.")


if __name__ == "__main__":
    main()
