"""An import-linter contract of our own: only the store writes the trace.

`lint-imports` (make test) checks it beside the layer and cycle contracts (pyproject.toml,
`[tool.importlinter]`): no module of the container outside the writers may

- call a write (create, bulk_create, update, delete, save, ...) on a chain that names a
  trace model (Step, Checkpoint, the graph rows), or build one of those rows;
- set a column that makes a step durable and exclusive (the fencing token, the lease, the
  session's seq, a step's superseded mark), by assignment or in an `update()`;
- spell the fence's columns in SQL that writes (UPDATE, INSERT, DELETE).

A name bound to what such a chain returns (`step = Step.objects.get(...)`, `for model in
(GraphWrite, ...)`) counts as the model: `step.save()` is a write. A line that builds a row
only to show it, never to store it, says so with a `# not stored` comment.

It reads each module's source (imports inside functions and all), as the other contracts
read its imports. `write_sites` is the check itself, on one module's source.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

from importlinter import Contract, ContractCheck, fields, output

WRITE_METHODS = frozenset(
    {
        "create",
        "bulk_create",
        "bulk_update",
        "update",
        "delete",
        "save",
        "get_or_create",
        "update_or_create",
        "_raw_delete",
    }
)
# Columns only a trace row has: a save() that names one writes a step or checkpoint.
ROW_COLUMNS = frozenset({"payload", "state"})
# The fence's columns: SQL that writes and names one of them moves a lease.
FENCE = ("fencing_token", "lease_owner", "lease_expires_at")
SQL_WRITE = re.compile(r"\b(UPDATE|INSERT\s+INTO|DELETE\s+FROM)\b", re.IGNORECASE)


@dataclass(frozen=True)
class Site:
    module: str
    line: int
    what: str


def _names_in(node: ast.AST) -> set[str]:
    """Every bare name in an expression's receiver chain (`Step.objects.filter(...)`)."""
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _model_aliases(tree: ast.AST, models: frozenset[str]) -> set[str]:
    """The names the module binds the trace models to (`Checkpoint as RespawnCheckpoint`)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and "models" in node.module:
            for alias in node.names:
                if alias.name in models:
                    found.add(alias.asname or alias.name)
    return found


def write_sites(
    source: str, module: str, models: frozenset[str], columns: frozenset[str]
) -> list[Site]:
    """Where `source` (module `module`) writes a trace row or a fenced column."""
    tree = ast.parse(source)
    bound = _model_aliases(tree, models)
    tainted = _tainted(tree, bound)
    exempt = {n for n, line in enumerate(source.splitlines(), start=1) if "# not stored" in line}
    sites: list[Site] = []

    def site(node: ast.AST, what: str) -> None:
        sites.append(Site(module, getattr(node, "lineno", 0), what))

    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in bound:
                site(node, f"builds a {func.id} row")
            if isinstance(func, ast.Attribute) and func.attr in WRITE_METHODS:
                named = _names_in(func.value) & bound
                receiver = func.value
                if (
                    not named
                    and isinstance(receiver, ast.Name)
                    and receiver.id in tainted
                    and func.attr in ("save", "delete", "_raw_delete")
                ):
                    named = {receiver.id}
                if (
                    not named
                    and _names_in(func.value) & tainted
                    and ".objects" in ast.unparse(func.value)
                ):
                    named = _names_in(func.value) & tainted
                if named:
                    site(node, f"{func.attr}() on {', '.join(sorted(named))}")
                fenced = {k.arg for k in node.keywords if k.arg} & columns
                if func.attr in ("update", "bulk_update") and fenced:
                    site(node, f"{func.attr}() sets {', '.join(sorted(fenced))}")
                if func.attr == "save":
                    for keyword in node.keywords:
                        if keyword.arg == "update_fields":
                            named_fields = {
                                c.value
                                for c in ast.walk(keyword.value)
                                if isinstance(c, ast.Constant) and isinstance(c.value, str)
                            }
                            if named_fields & (columns | ROW_COLUMNS):
                                written = sorted(named_fields & (columns | ROW_COLUMNS))
                                site(node, "save() writes " + ", ".join(written))
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, ast.Attribute) and part.attr in columns:
                        site(node, f"sets .{part.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if SQL_WRITE.search(text) and any(c in text for c in FENCE):
                site(node, "SQL that writes a fenced column")
        elif isinstance(node, ast.JoinedStr):
            text = "".join(
                v.value
                for v in node.values
                if isinstance(v, ast.Constant) and isinstance(v.value, str)
            )
            if SQL_WRITE.search(text) and any(c in text for c in FENCE):
                site(node, "SQL that writes a fenced column")
    # A constant inside an f-string is walked twice (as itself and as the f-string's).
    return sorted({s for s in sites if s.line not in exempt}, key=lambda s: s.line)


def _root(node: ast.AST) -> str | None:
    """The name a chain starts from: `Step` in `Step.objects.filter(...).first()`."""
    while True:
        if isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Attribute | ast.Subscript):
            node = node.value
        elif isinstance(node, ast.Name):
            return node.id
        else:
            return None


def _tainted(tree: ast.AST, bound: set[str]) -> set[str]:
    """Names bound to a trace model's rows or class (an assignment from a chain that
    starts at one, a for loop over such chains), to a fixed point."""
    tainted: set[str] = set()
    while True:
        before = len(tainted)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign):
                values, targets = [node.value], node.targets
            elif isinstance(node, ast.For):
                iterable = node.iter
                values = list(iterable.elts) if isinstance(iterable, ast.Tuple) else [iterable]
                targets = [node.target]
            else:
                continue
            if {_root(v) for v in values} & (bound | tainted):
                for target in targets:
                    if isinstance(target, ast.Name):
                        tainted.add(target.id)
        if len(tainted) == before:
            return tainted


def module_file(module: str, root: Path) -> Path | None:
    base = root.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


class OnlyStoreWrites(Contract):
    """Options: `container` (the package checked), `writers` (its modules allowed to write:
    the store, the migrations, the models themselves), `models` (the trace's model names)
    and `columns` (the fence's columns and a step's superseded mark)."""

    type_name = "only_store_writes"

    container = fields.StringField()
    writers = fields.SetField(subfield=fields.StringField())
    models = fields.SetField(subfield=fields.StringField())
    columns = fields.SetField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        container = str(self.container)
        writers = {str(w) for w in self.writers}  # type: ignore[attr-defined]
        models = frozenset(str(m) for m in self.models)  # type: ignore[attr-defined]
        columns = frozenset(str(c) for c in self.columns)  # type: ignore[attr-defined]
        root = Path.cwd()
        sites: list[Site] = []
        checked = 0
        for module in sorted(graph.find_descendants(container) | {container}):
            if any(module == w or module.startswith(w + ".") for w in writers):
                continue
            path = module_file(module, root)
            if path is None:
                continue
            checked += 1
            sites.extend(write_sites(path.read_text(), module, models, columns))
        output.verbose_print(verbose, f"Read {checked} modules of {container}.")
        return ContractCheck(
            kept=not sites,
            metadata={"sites": [(s.module, s.line, s.what) for s in sites]},
        )

    def render_broken_contract(self, check: ContractCheck) -> None:
        for module, line, what in check.metadata["sites"]:
            output.print_error(f"{module}:{line} {what}", bold=False)
        output.new_line()
        output.print(
            "Write steps, checkpoints and graph rows, and move a fencing token or a lease, "
            "through sessions_app.store (store/writes.py, store/graph.py)."
        )
